"""kiln: a PyTorch 2-style compiler in Python. `kiln.compile(model)` captures the model's bytecode
into FX graphs with guards and a cache, and hands each graph to a backend.

Pipeline (stage folders): capture -> autograd -> lower -> schedule -> codegen -> runtime; the
backends "eager", "aot_eager" and "kiln" (the default) choose how far down a graph goes. The floor
plan (which module may import which): docs/architecture.md.
"""
from __future__ import annotations

from kiln import config as _config_module  # noqa: F401  (reads KILN_* first)
from kiln import logs  # noqa: F401
from kiln.api import (allow_in_graph, compile, disable, graph_break, is_compiling, mark_dynamic,
                      mark_static, maybe_mark_dynamic, reset)
from kiln.backends import list_backends, register_backend
from kiln.tools.explain import ExplainOutput, explain
from kiln.version import __version__

config = _config_module

__all__ = ["__version__", "compile", "explain", "ExplainOutput", "disable", "allow_in_graph",
           "graph_break", "is_compiling", "mark_dynamic", "maybe_mark_dynamic", "mark_static",
           "reset", "config",
           "logs", "list_backends", "register_backend"]

