"""timm: `timm:<name>` suite models, any model `timm.create_model` knows, with random weights.

"small" is the model at its default input size at batch 2 (what the GPU-machine tests run),
"full" is batch 64 (the zoo's size, `shared/ANCHORS.md`). The loss is cross-entropy against
random labels. timm imports torchvision, which does not import beside the CPU torch wheel of
the CPU machines; timm is imported lazily, so kiln and the rest of the suite run without it, and
`spec` raises a clear error where it cannot be imported. Nothing is downloaded.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["BATCH", "spec"]

BATCH = {"small": 2, "full": 64}
MODELS = ("resnet18", "resnet50", "efficientnet_b0", "mobilenetv3_large_100", "convnext_tiny",
          "vit_base_patch16_224", "deit_tiny_patch16_224", "swin_tiny_patch4_window7_224",
          "regnetx_002")  # what `kiln bench --models timm` means; any timm name works alone


def _timm() -> Any:
    try:
        import timm
    except Exception as err:  # noqa: BLE001 - ImportError, or torchvision's operator error
        raise RuntimeError(
            f"suite: timm models need the `timm` package, which cannot be imported here "
            f"({type(err).__name__}: {err})",
        ) from err
    return timm


def _name(name: str) -> str:
    model = name.removeprefix("timm:")
    if not _timm().is_model(model):
        raise KeyError(f"suite: timm has no model {model!r} (see timm.list_models())")
    return model


def _input_size(model: torch.nn.Module) -> tuple[int, ...]:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return tuple(cfg.get("input_size", (3, 224, 224)))


def spec(name: str) -> Any:
    """The suite `ModelSpec` for `timm:<name>`."""
    from kiln.tools.suite.batch import Batch, classification_loss
    from kiln.tools.suite.spec import ModelSpec

    model_name = _name(name)
    timm = _timm()
    shape: dict[str, Any] = {}

    def make_model(size: str) -> torch.nn.Module:
        model = timm.create_model(model_name, pretrained=False)
        shape["input"], shape["classes"] = _input_size(model), model.num_classes
        return model

    def make_batch(size: str) -> Batch:
        if not shape:  # the batch is drawn before the model was built: build one to see it
            make_model(size)
        n = BATCH[size]
        images = torch.randn(n, *shape["input"])
        return Batch((images,), torch.randint(0, shape["classes"], (n,)))

    return ModelSpec(f"timm:{model_name}", make_model, make_batch, classification_loss,
                     (torch.float32, torch.bfloat16, torch.float16),
                     f"timm {model_name}, random weights")
