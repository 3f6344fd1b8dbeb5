"""Input tensors for generated programs, built the same way on every call.

A program's `make_inputs(device)` calls `make_tensor` once per input with a fixed generator seed,
so the eager run and the kiln run each get their own fresh, bit-identical inputs with the same
layout (strides and storage offset included), which `clone()` would not preserve.

Under `grown(k)` every dim of 2 or more is k larger (a dim of 1 stays 1): the same program at
other sizes, for the oracle's dynamic-shape calls. Equal dims stay equal and size-1 dims stay
broadcastable, so a program that broadcasts at its own sizes still does. Under
`collecting_leaves` float inputs require grad (the oracle's gradient check).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["LAYOUTS", "collecting_leaves", "grown", "make_number", "make_tensor"]

_GROWTH = contextvars.ContextVar("kiln_fuzz_growth", default=0)
_LEAVES: contextvars.ContextVar = contextvars.ContextVar("kiln_fuzz_leaves", default=None)


@contextlib.contextmanager
def grown(k: int) -> Iterator[None]:
    """Inputs made inside are k larger in every dim of 2 or more."""
    token = _GROWTH.set(k)
    try:
        yield
    finally:
        _GROWTH.reset(token)

# contiguous; transposed (strides swapped); offset (a view into a longer storage); stepped (every
# other element of a wider tensor).
LAYOUTS = ("contiguous", "transposed", "offset", "stepped")


def _values(shape: tuple[int, ...], dtype: str, gen: torch.Generator) -> torch.Tensor:
    if dtype == "int64":
        return torch.randint(-4, 5, shape, generator=gen)
    if dtype == "bool":
        return torch.randn(shape, generator=gen) > 0
    return torch.randn(shape, generator=gen).to(getattr(torch, dtype))


def make_tensor(shape: tuple[int, ...], dtype: str, layout: str, gen: torch.Generator,
                device: str) -> torch.Tensor:
    """A tensor of `shape` (grown by `grown`) and `dtype` with random values, laid out as
    `layout` on `device` (inside `collecting_leaves`, a float one requires grad)."""
    growth = _GROWTH.get()
    shape = tuple(size + growth if size >= 2 else size for size in shape)

    def base(size: tuple[int, ...]) -> torch.Tensor:
        return _requiring_grad(_values(size, dtype, gen).to(device))

    if layout == "transposed" and len(shape) >= 2:
        flipped = shape[:-2] + (shape[-1], shape[-2])
        return base(flipped).transpose(-1, -2)
    if layout == "offset":
        numel = 1
        for size in shape:
            numel *= size
        return base((numel + 3,))[3:].view(shape)
    if layout == "stepped" and len(shape) >= 1:
        wide = shape[:-1] + (shape[-1] * 2,)
        return base(wide)[..., ::2]
    return base(shape)


@contextlib.contextmanager
def collecting_leaves() -> Iterator[list[torch.Tensor]]:
    """Inputs made inside require grad: each float one is computed from a leaf (`leaf * 1`, so
    the program may write it in place, as it may any non-leaf), laid out as asked; the leaves,
    in input order, are the list yielded (what the oracle takes gradients for)."""
    leaves: list[torch.Tensor] = []
    token = _LEAVES.set(leaves)
    try:
        yield leaves
    finally:
        _LEAVES.reset(token)


def _requiring_grad(values: torch.Tensor) -> torch.Tensor:
    leaves = _LEAVES.get()
    if leaves is None or not values.is_floating_point():
        return values
    leaf = values.requires_grad_()
    leaves.append(leaf)
    return leaf * 1


def make_number(base: int | float, kind: str) -> int | float:
    """A Python number argument, another value at each growth: a float moves by 0.75 per step,
    a negative int down by 2, an int >= 2 up by 3 (a size symbol's range)."""
    growth = _GROWTH.get()
    if kind == "float":
        return base + 0.75 * growth
    return base - 2 * growth if kind == "negint" else base + 3 * growth
