"""Input tensors for generated programs, built the same way on every call.

A program's `make_inputs(device)` calls `make_tensor` once per input with a fixed generator seed,
so the eager run and the kiln run each get their own fresh, bit-identical inputs with the same
layout (strides and storage offset included), which `clone()` would not preserve.
"""
from __future__ import annotations

import torch

__all__ = ["LAYOUTS", "make_tensor"]

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
    """A tensor of `shape` and `dtype` with random values, laid out as `layout` on `device`."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        flipped = shape[:-2] + (shape[-1], shape[-2])
        return _values(flipped, dtype, gen).to(device).transpose(-1, -2)
    if layout == "offset":
        numel = 1
        for size in shape:
            numel *= size
        return _values((numel + 3,), dtype, gen).to(device)[3:].view(shape)
    if layout == "stepped" and len(shape) >= 1:
        wide = shape[:-1] + (shape[-1] * 2,)
        return _values(wide, dtype, gen).to(device)[..., ::2]
    return _values(shape, dtype, gen).to(device)
