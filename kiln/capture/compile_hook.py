"""compile_hook: how the code below the frame compiler compiles the functions it meets.

Compiling a frame is recursive in behaviour: the entry code of a frame that breaks calls a
compiled resume function (`breaks.resume_function`), and a route-only frame calls compiled
stand-ins for the user functions and modules it calls (`breaks.Router`, `module_wrapper`); each
of those is compiled by `convert.compile_function`, which builds that entry code. `convert`
imports `breaks` and `entry`, so they cannot import it back: `convert` installs its compile
function here when it is imported. That is before any frame is compiled, since every way in
imports the `kiln.capture` package, whose `__init__` imports `convert`.
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kiln.capture.settings import CompileSettings

__all__ = ["compile_function", "install"]

_compile: Callable[[types.FunctionType, CompileSettings], Callable] | None = None


def install(compile_function: Callable[[types.FunctionType, CompileSettings], Callable]) -> None:
    """Called once, by `convert`, with its `compile_function`."""
    global _compile
    _compile = compile_function


def compile_function(fn: types.FunctionType, settings: CompileSettings) -> Callable:
    """`fn` compiled by kiln with `settings` (`convert.compile_function`)."""
    return _compile(fn, settings)
