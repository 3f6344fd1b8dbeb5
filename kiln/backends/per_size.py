"""Backends that compile per concrete size, under a graph captured with symbolic sizes.

Capture can hand a backend a graph whose inputs have symbolic dims (`x.shape[0]` is `s0`, see
docs/dynamic_shapes.md, stage A). The autograd stage and the code generator still trace and emit
for static sizes (stages B and C), so until then `per_size` compiles the graph once per set of
input sizes, behind one capture: a small cache keyed by the sizes of the symbolic inputs. A size
that fails to compile, or one beyond the cache's bound, runs the graph as torch ops (eager's
answer) with a warning, never a wrong one.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from kiln import records
from kiln._util import error_line
from kiln.autograd.size_variants import PerSizeVariants
from kiln.autograd.symbolic import symbolic_positions

__all__ = ["MAX_SIZES", "SymbolicCompiled", "per_size", "symbolic_inputs",
           "symbolic_or_per_size"]

log = logging.getLogger("kiln.backends")

MAX_SIZES = 64  # compiled sizes per graph; beyond, calls run the graph as torch ops

Compile = Callable[[torch.fx.GraphModule, list], Callable[..., Any]]


def symbolic_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders whose example (`meta["val"]`) has a symbolic size."""
    return symbolic_positions(gm)


def per_size(compile_static: Compile, gm: torch.fx.GraphModule,
             example_inputs: list) -> Callable[..., Any]:
    """`compile_static(gm, inputs)` for a static graph; for a symbolic one, a callable that
    compiles it for each new set of input sizes (see the module docstring)."""
    dynamic = symbolic_inputs(gm)
    if not dynamic:
        return compile_static(gm, example_inputs)
    return SizeCache(compile_static, gm, dynamic, example_inputs)


class SizeCache:
    """One compiled callable per input sizes (the sizes and strides of the symbolic inputs are
    the key: capture's guards fix every other size and stride): the
    autograd stage's `PerSizeVariants` over the backend's `compile_static`, whose bound and
    eager fallback it shares. The first size compiles at construction, so a backend error
    surfaces at capture as for a static graph."""

    def __init__(self, compile_static: Compile, gm: torch.fx.GraphModule, dynamic: list[int],
                 example_inputs: list) -> None:
        def compile_for(args: list) -> Callable[[list], Any]:
            fn = compile_static(gm, list(args))
            return lambda call_args: fn(*call_args)

        self.gm = gm
        self.sizes = PerSizeVariants(compile_for, dynamic, lambda args: gm(*args),
                                     max_sizes=lambda: MAX_SIZES)
        self.sizes.variants[self.sizes.key(example_inputs)] = compile_for(example_inputs)

    @property
    def compiled(self) -> dict[tuple, Callable[[list], Any]]:
        return self.sizes.variants

    def __call__(self, *args: Any) -> Any:
        return self.sizes(list(args))


def symbolic_or_per_size(compile_symbolic: Compile, compile_static: Compile,
                         gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """One compile with sizes as kernel arguments (`compile_symbolic`, stage C) when the
    pipeline supports the graph; else `per_size` over `compile_static`, as without it."""
    try:
        compiled = compile_symbolic(gm, list(example_inputs))
    except Exception as err:  # noqa: BLE001 - per-size compiles are always right
        reason = error_line(err)
        log.info("kiln backend: a graph with symbolic sizes compiles per size: the symbolic "
                 "path failed (%s)", reason)
        records.emit("per_size", f"kiln backend: {reason}")
        return per_size(compile_static, gm, example_inputs)
    return SymbolicCompiled(compiled, compile_static, gm)


class SymbolicCompiled:
    """A graph compiled once for every size. A call whose sizes the symbolic kernels cannot
    index (an extent of 2**31 elements or more: they use int32) goes per size."""

    def __init__(self, compiled: Callable[..., Any], compile_static: Compile,
                 gm: torch.fx.GraphModule) -> None:
        self.compiled = compiled
        self.compile_static = compile_static
        self.gm = gm
        self.per_size: SizeCache | None = None

    def __call__(self, *args: Any) -> Any:
        from kiln.runtime.symbolic import SymbolicSizeOverflow

        try:
            return self.compiled(*args)
        except SymbolicSizeOverflow:  # raised before any kernel ran
            if self.per_size is None:
                self.per_size = SizeCache(self.compile_static, self.gm,
                                          symbolic_inputs(self.gm), list(args))
            return self.per_size(*args)
