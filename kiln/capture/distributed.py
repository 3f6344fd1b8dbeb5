"""torch.distributed wrappers: which of their frames capture leaves to eager, and why.

DDP and FSDP do their work outside the module's math: DDP's forward prepares its reducer (C++
state that autograd hooks on the parameters drive during backward), FSDP2's forward hooks
all-gather parameters before the forward and free them after. None of that is a tensor
operation a graph can hold, and TorchDynamo does not put it in graphs either (it skips
`torch/nn/parallel/distributed.py` and, by default, FSDP's hooks). kiln does the same:

- `EAGER_WRAPPER_FRAMES`: functions kiln never captures but runs as route-only copies
  (`breaks.route_only`), so the wrapped module they call is still compiled. `DDP.forward` runs
  `_pre_forward`, `_post_forward` and the reducer natively; `_run_ddp_forward`'s call of
  `self.module` is routed to a compiled module.
- `managed_module_reason`: a call of a DDP / FSDP-managed module met during a trace breaks at
  that call; the module is then called natively, through the router, so its hooks run eagerly
  and its own `forward` is compiled as a frame of its own (the per-layer compile of FSDP2).

Parameters that are DTensors (FSDP2 sharded parameters outside its forward, tensor parallel)
are refused as tensor subclasses at graph input (`output_graph.input_for`). A graph captured
under DDP is split at its gradient-bucket boundaries by `ddp_split`.
"""
from __future__ import annotations

import types
from typing import Any

__all__ = ["eager_wrapper_reason", "managed_module_reason", "routes_through"]


def _ddp() -> type | None:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a build without torch.distributed
        return None
    return DistributedDataParallel


def _eager_wrapper_frames() -> dict[types.CodeType, str]:
    ddp = _ddp()
    if ddp is None:
        return {}
    why = ("DistributedDataParallel.forward runs eagerly (its reducer, _pre_forward and "
           "_post_forward are not tensor operations; torch.compile skips this file too)")
    return {ddp.forward.__code__: why, ddp._run_ddp_forward.__code__: why}


_FRAMES: dict[types.CodeType, str] | None = None


def eager_wrapper_reason(fn: types.FunctionType) -> str | None:
    """Why `fn` runs as a route-only copy without being traced, or None."""
    global _FRAMES
    if _FRAMES is None:
        _FRAMES = _eager_wrapper_frames()
    return _FRAMES.get(fn.__code__)


def routes_through(fn: types.FunctionType) -> bool:
    """A library function the router compiles anyway (as a route-only copy): DDP's forward
    path, so the module it wraps is reached."""
    return eager_wrapper_reason(fn) is not None


def managed_module_reason(module: Any) -> str | None:
    """Why a call of `module` inside a traced frame must break, or None for an ordinary module."""
    ddp = _ddp()
    if ddp is not None and isinstance(module, ddp):
        return "a DistributedDataParallel module (its forward runs the reducer eagerly)"
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:
        return None
    if isinstance(module, FSDPModule):
        return ("a module managed by FSDP2 (fully_shard): its hooks all-gather and free "
                "parameters, which kiln runs eagerly")
    if isinstance(module, FullyShardedDataParallel):
        return "an FSDP module: its forward gathers sharded parameters, which kiln runs eagerly"
    return None
