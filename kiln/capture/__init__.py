"""capture: Python function -> torch-level FX graphs + guards + a cached, generated dispatcher.

Input: a Python function (or a module's forward) and the arguments of a call.
Output: for each new set of guarded conditions, an FX GraphModule (parameters and buffers lifted
as placeholders with their sources, FakeTensor `meta["val"]`, user file:line on every node) handed
to the backend, and a cache entry whose guards are inlined into a dispatcher generated with the
user's own signature.

Invariants: never a stale hit (guards cover tensor metadata, Python constants, globals, closures,
module state through a version counter, and ambient grad/autocast/default-dtype state); side
effects are replayed after the graph as eager does them; code capture cannot handle runs eagerly
with the reason recorded (or raises under fullgraph=True).

Never: installs a PEP 523 hook or a C extension, executes user bytecode symbolically with real
tensors, or changes the user's function object.
"""
from __future__ import annotations

from kiln.capture.dispatch import clear_caches, compiling
from kiln.capture.convert import CompileSettings, compile_function
from kiln.capture.variables.builtins import kiln_specials
from kiln.capture.variables.reflection import register_reflection

__all__ = ["compile_function", "CompileSettings", "clear_caches", "compiling"]

kiln_specials()  # here, not in the package root: capture owns its special functions
register_reflection()
