"""triton_types: Triton dtype names and printed values (`TV`), shared by the ops handler
(`triton_printer.py`) and the reduction forms it prints with (`reductions.py`), below both.
"""
from __future__ import annotations

import dataclasses

import torch

from kiln.errors import CodegenError

__all__ = ["TV", "triton_dtype"]


_TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}


def triton_dtype(dtype: torch.dtype) -> str:
    try:
        return _TL_DTYPES[dtype]
    except KeyError:
        raise CodegenError(f"no Triton dtype for {dtype}") from None


@dataclasses.dataclass(frozen=True)
class TV:
    """A printed value: the Triton variable (or literal) `name` and its torch `dtype`."""

    name: str
    dtype: torch.dtype | None

    def __str__(self) -> str:
        return self.name
