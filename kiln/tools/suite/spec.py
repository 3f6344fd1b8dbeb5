"""spec: `ModelSpec`, what the suite knows about one model, and the `SIZES` it is built at.

Below both the registry of built-in models (`model_registry.py`) and the transformers adapter
(`hf.py`), which build specs; `kiln.tools.suite.model_registry` re-exports both names.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn as nn

from kiln.tools.suite.batch import Batch

__all__ = ["ModelSpec", "SIZES"]

SIZES = ("full", "small")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """name: the suite key; make_model(size) -> nn.Module with random weights; make_batch(size) ->
    a fresh random Batch on the CPU; loss(output, target) -> scalar; dtypes: float dtypes the
    model runs in (weights and floating inputs cast together); description: one line."""
    name: str
    make_model: Callable[[str], nn.Module]
    make_batch: Callable[[str], Batch]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    dtypes: tuple[torch.dtype, ...] = _FLOATS
    description: str = ""

    def build(self, size: str = "small", device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Batch]:
        """A model and a batch at `size`, on `device`, in `dtype`."""
        if size not in SIZES:
            raise ValueError(f"suite: unknown size {size!r} for {self.name}; use one of {SIZES}")
        if dtype not in self.dtypes:
            raise ValueError(f"suite: {self.name} does not run in {dtype}; use one of "
                             f"{self.dtypes}")
        model = self.make_model(size).to(device=device, dtype=dtype)
        return model, self.make_batch(size).to(device, dtype)
