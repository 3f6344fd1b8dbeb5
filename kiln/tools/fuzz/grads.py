"""The oracle's gradient check, for programs whose module sets `GRADS = True` (the generator's
`--grad`): float inputs require grad (`inputs.collecting_leaves`), and after the outputs
compare, eager's and kiln's gradients of one fixed random linear function of the outputs are
compared, for every input leaf and every parameter of the program's modules. So kiln's joint
forward/backward graph, its partitioner and its handling of inputs that require grad and are
written in place, viewed or returned meet every construct of the generator.
"""
from __future__ import annotations

import types
from typing import Any, Sequence

import torch

__all__ = ["parameters_of", "gradients"]


def parameters_of(module: types.ModuleType) -> list[torch.nn.Parameter]:
    """The parameters of the program's nn modules (its globals), in a fixed order."""
    found: list[torch.nn.Parameter] = []
    for name in sorted(vars(module)):
        value = getattr(module, name)
        if isinstance(value, torch.nn.Module):
            found.extend(value.parameters())
    return found


def _differentiable(outputs: Sequence[Any]) -> list[int]:
    return [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)
            and o.requires_grad and o.is_floating_point()]


def gradients(outputs: Sequence[Any], wrt: Sequence[torch.Tensor],
              dtype: torch.dtype = torch.float32) -> list[Any] | BaseException | None:
    """d/d`wrt` of `sum_i (outputs[i] * w_i).sum()` over the outputs that require grad, with
    `w_i` random but fixed by i and the output's shape (the same for eager, kiln and the fp64
    run, whose outputs are cast to `dtype` first); None for a leaf no output depends on. None
    when no output requires grad; the exception when backward raises (compared like a
    forward one)."""
    chosen = _differentiable(outputs)
    if not chosen or not wrt:
        return None
    loss = 0
    for i in chosen:
        out = outputs[i]
        gen = torch.Generator().manual_seed(7919 * (i + 1) + out.numel())
        weight = torch.randn(tuple(out.shape), generator=gen).to(device=out.device, dtype=dtype)
        loss = loss + (out.to(dtype) * weight).sum()
    try:
        return list(torch.autograd.grad(loss, list(wrt), allow_unused=True))
    except Exception as exc:  # the program's own backward error is a result
        return exc
