"""The built-in model suite's registry: one `ModelSpec` per model, `SUITE` by name, `get(name)`.

A spec builds a model with random weights at a named size ("full": the GPU sizes of
`shared/ANCHORS.md` / `anchors/zoo.py`; "small": a few MB that runs on the CPU in well under a
second), draws a fresh random `Batch` (model inputs and a training target) and computes the
training loss from the model's output. `infer` and `train_step` are the two configurations:
inference (eval + no_grad) and training (train mode, loss, backward). Models are plain PyTorch
with no kiln code; nothing is downloaded.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from kiln.tools.suite.batch import Batch
from kiln.tools.suite.spec import _FLOATS, SIZES, ModelSpec
from kiln.tools.suite import bert, gpt2, llama, mlp, resnet, seed_block, vit

__all__ = ["Batch", "ModelSpec", "SIZES", "SUITE", "get", "infer", "train_step"]

def infer(model: nn.Module, batch: Batch) -> Any:
    """The inference configuration: eval mode, no autograd."""
    model.eval()
    with torch.no_grad():
        return model(*batch.inputs)


def train_step(model: nn.Module, batch: Batch, loss_fn: Callable[[Any, torch.Tensor],
               torch.Tensor]) -> torch.Tensor:
    """The training configuration: train mode, forward, loss, backward (gradients accumulate in
    `.grad`; no optimizer step). Returns the detached loss."""
    model.train()
    loss = loss_fn(model(*batch.inputs), batch.target)
    loss.backward()
    return loss.detach()


def _spec(module: Any, dtypes: tuple[torch.dtype, ...] = _FLOATS) -> ModelSpec:
    summary = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
    return ModelSpec(module.NAME, module.make_model, module.make_batch, module.loss, dtypes,
                     summary)


SUITE: dict[str, ModelSpec] = {
    m.NAME: _spec(m) for m in (seed_block, gpt2, bert, llama, resnet, vit, mlp)
}


def get(name: str) -> ModelSpec:
    """The spec called `name`; an unknown name raises KeyError listing the suite."""
    if name.startswith("hf:"):  # transformers models (need the `transformers` package)
        from kiln.tools.suite import hf
        return hf.spec(name)
    if name.startswith("timm:"):  # timm models (need `timm`, which imports torchvision)
        from kiln.tools.suite import timm_zoo
        return timm_zoo.spec(name)
    try:
        return SUITE[name]
    except KeyError:
        raise KeyError(f"suite: no model {name!r}; the suite has {sorted(SUITE)}") from None
