"""`Batch`: one draw of a suite model's inputs and its training target."""
from __future__ import annotations

import dataclasses

import torch

__all__ = ["Batch"]


@dataclasses.dataclass(frozen=True)
class Batch:
    """inputs: the positional arguments of `model(*inputs)`; target: what `loss` compares to."""
    inputs: tuple[torch.Tensor, ...]
    target: torch.Tensor

    def to(self, device: str | torch.device | None = None,
           dtype: torch.dtype | None = None) -> Batch:
        """Moves every tensor to `device`; casts the floating ones to `dtype`."""
        def move(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if dtype is not None and t.is_floating_point() else None
            return t.to(device=device, dtype=cast)
        return Batch(tuple(move(t) for t in self.inputs), move(self.target))
