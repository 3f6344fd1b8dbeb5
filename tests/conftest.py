"""Shared test setup: GPU tests skip without CUDA (and Triton runs interpreted); kiln's config, log artifacts and warn-once
registry are restored after every test so tests cannot leak settings into each other."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # CPU machines run Triton kernels in its interpreter (see DESIGN.md); set before triton loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln import logs
from kiln.config import config


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_kiln_state():
    """Every test starts with empty caches and warn-once state and a fixed seed, and leaves the
    config and log artifacts as it found them."""
    import kiln
    saved = config.to_dict()
    saved_logs = sorted(logs._enabled)
    kiln.reset()
    torch.manual_seed(0)
    yield
    kiln.reset()
    for name, value in saved.items():
        setattr(config, name, value)
    logs.set_logs(*saved_logs)
    logs.reset_warnings()
