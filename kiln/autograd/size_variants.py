"""size_variants: how a `CompiledGraph` over a graph with symbolic sizes picks what runs a call.

- `SymbolicVariant`: the variant traced once with symbolic sizes (`symbolic.py`); it serves
  every call whose sizes keep the facts its trace added to the ShapeEnv after capture
  (`SizeConditions`, usually none).
- `PerSizeVariants`: the fallback, one variant traced for the sizes of a call, keyed by the
  shapes and strides of the inputs with symbolic sizes or strides.
  It serves the calls a `SymbolicVariant`'s conditions reject, and every call of a variant
  whose symbolic trace failed (the reason is logged at debug level). Beyond `MAX_SIZES` sizes,
  and for sizes whose compile fails, calls run the captured graph as torch ops, with a warning:
  eager's answer, never a wrong one.

Never: runs a symbolic variant for sizes its conditions reject.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

from kiln.autograd.symbolic import SizeConditions
from kiln.logs import warn_once

__all__ = ["MAX_SIZES", "PerSizeVariants", "SymbolicVariant", "unwrap_variants"]

log = logging.getLogger("kiln.autograd")

MAX_SIZES = 64  # variants traced per size for one graph; beyond, calls run it eagerly

Variant = Callable[[list], Any]


class PerSizeVariants:
    """`compile_for(args)` once per set of sizes of the inputs at `positions`; `eager` for
    sizes beyond `max_sizes()` (MAX_SIZES) and for sizes whose compile fails. The kiln
    backend's per-size compiles (`backends/per_size.SizeCache`) are one of these too."""

    def __init__(self, compile_for: Callable[[list], Variant], positions: Sequence[int],
                 eager: Variant, max_sizes: Callable[[], int] = lambda: MAX_SIZES) -> None:
        self.compile_for = compile_for
        self.positions = tuple(positions)
        self.eager = eager
        self.max_sizes = max_sizes  # read per compile: tests lower the module's bound
        self.variants: dict[tuple, Variant] = {}

    def key(self, args: Sequence[Any]) -> tuple:
        """The sizes and strides of the tensors at `positions`, and the values of the ints
        there (an int argument with a symbol: a per-size variant is traced with its value).
        Strides count: a stride can be a symbol of its own (a slice of a growing buffer), and
        a variant's kernels index its inputs by the strides it was traced with."""
        return tuple((tuple(args[i].shape), args[i].stride())
                     if isinstance(args[i], torch.Tensor) else args[i] for i in self.positions)

    def __call__(self, args: list) -> Any:
        key = self.key(args)
        variant = self.variants.get(key)
        if variant is None:
            variant = self.variants[key] = self._compile(key, args)
        return variant(args)

    def _compile(self, key: tuple, args: list) -> Variant:
        limit = self.max_sizes()
        if len(self.variants) >= limit:
            warn_once(("autograd-per-size-limit", id(self)),
                      f"kiln: a graph with symbolic sizes was compiled for {limit} sizes; "
                      "new sizes run it as torch ops (eager)", log)
            return self.eager
        log.debug("tracing a graph with symbolic sizes for sizes %s", key)
        try:
            return self.compile_for(args)
        except Exception as err:  # noqa: BLE001 - eager's answer beats a failed call
            # this compile runs inside a user's call, where capture's fallback cannot reach
            warn_once(("autograd-per-size-failed", id(self), type(err).__name__),
                      f"kiln: compiling a graph with symbolic sizes for sizes {key} failed "
                      f"({type(err).__name__}: {err}); such calls run it as torch ops (eager)",
                      log)
            return self.eager


class SymbolicVariant:
    """`variant` (traced with symbolic sizes) for calls whose sizes keep `conditions` (None:
    every call), `fallback` for the others."""

    def __init__(self, variant: Variant, conditions: SizeConditions | None,
                 fallback: PerSizeVariants) -> None:
        self.variant = variant
        self.conditions = conditions
        self.fallback = fallback

    def __call__(self, args: list) -> Any:
        if self.conditions is None or self.conditions.holds(args):
            return self.variant(args)
        log.debug("sizes outside the symbolic trace's conditions (%s): traced per size",
                  self.conditions)
        return self.fallback(args)


def unwrap_variants(variant: Any) -> list[Any]:
    """The variants behind `variant`: itself, or those a SymbolicVariant / PerSizeVariants holds."""
    if isinstance(variant, SymbolicVariant):
        return [variant.variant, *unwrap_variants(variant.fallback)]
    if isinstance(variant, PerSizeVariants):
        return list(variant.variants.values())
    return [variant]
