"""`Batch`: one draw of a suite model's inputs and its training target, and the batch makers
and losses several suite models share (token models, image classifiers)."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

__all__ = ["Batch", "classification_loss", "image_batch", "next_token_loss", "token_batch"]


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


def token_batch(vocab_size: int, batch: int, seq: int) -> Batch:
    """Random token ids and random next-token labels, both [batch, seq]."""
    ids = torch.randint(0, vocab_size, (batch, seq))
    return Batch((ids,), torch.randint(0, vocab_size, (batch, seq)))


def image_batch(batch: int, image: int, num_classes: int) -> Batch:
    """Random RGB images [batch, 3, image, image] and class labels."""
    images = torch.randn(batch, 3, image, image)
    return Batch((images,), torch.randint(0, num_classes, (batch,)))


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
