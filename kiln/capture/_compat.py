"""The capture stage's only door to private torch APIs (tested on torch 2.11 and 2.13)."""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["FakeTensor", "FakeTensorMode", "autocast_state", "new_fake_mode", "is_fake",
           "DataDependentError", "enter_autocast", "exit_autocast", "set_grad_enabled"]

try:  # where torch raises when a fake tensor's value would be needed
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    DataDependentError: tuple[type[BaseException], ...] = (
        DataDependentOutputException, DynamicOutputShapeException)
except ImportError:  # pragma: no cover - older torch
    DataDependentError = ()

_AUTOCAST_DEVICES = ("cpu", "cuda")
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def autocast_state() -> tuple:
    """() when no autocast is active, else ((device, dtype), ...) for each active device."""
    if _any_autocast is not None and not _any_autocast():
        return ()
    return tuple((dev, torch.get_autocast_dtype(dev)) for dev in _AUTOCAST_DEVICES
                 if torch.is_autocast_enabled(dev))


def new_fake_mode(*, allow_non_fake_inputs: bool) -> FakeTensorMode:
    """A fresh fake mode with static shapes (no ShapeEnv: every size is a plain int): the one
    factory of every stage that traces on fake tensors (autograd and lower import it through
    their own `_compat`). `allow_non_fake_inputs`: a real tensor that reaches an op becomes a
    constant (autograd's tracer, lower's decomposition traces) instead of an error (capture,
    where every tensor must enter the graph through a tracked source)."""
    return FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs)


def is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


# Graph nodes that switch ambient state inside a captured region (the same functions Dynamo emits).
set_grad_enabled = torch._C._set_grad_enabled
enter_autocast = torch.amp.autocast_mode._enter_autocast
exit_autocast = torch.amp.autocast_mode._exit_autocast
