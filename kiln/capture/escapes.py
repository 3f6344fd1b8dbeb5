"""kiln's escape hatches for user code, owned by capture (the stage that gives them meaning) and
re-exported by kiln.api: `kiln.graph_break()` and `kiln.is_compiling()`. In eager code they are
plain functions; during capture, variables/builtins.py maps them to their special handlers."""
from __future__ import annotations

from kiln.capture.dispatch import compiling

__all__ = ["graph_break", "is_compiling"]


def graph_break() -> None:
    """Stop capture here (in eager code it does nothing)."""


def is_compiling() -> bool:
    """True while kiln captures the calling code (constant-folded to True inside graphs)."""
    return compiling()
