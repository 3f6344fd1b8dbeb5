"""kiln's built-in model suite: plain PyTorch models with random weights (no downloads), each
at a GPU ("full") and a CPU ("small") size, with an inference and a training configuration.
Used by `kiln bench` and the suite tests; see `model_registry.py`.
"""
from __future__ import annotations

from kiln.tools.suite.model_registry import SIZES, SUITE, Batch, ModelSpec, get, infer, train_step

__all__ = ["Batch", "ModelSpec", "SIZES", "SUITE", "get", "infer", "train_step"]
