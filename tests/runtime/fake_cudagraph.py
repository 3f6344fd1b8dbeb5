"""A CPU stand-in for torch.cuda.CUDAGraph, for testing kiln's CUDA graph policy without a GPU.

`FakeGraphMechanism` implements `kiln.runtime.cudagraphs.GraphMechanism` the way a CUDA graph
behaves where the policy can get it wrong:

- recording runs the function once, logging every ATen op (`FakeGraph.ops`), under a mode that
  raises as a capturing CUDA stream does on host syncs (`.item()`, `nonzero`); then it fills the
  outputs with garbage (NaN / -7): a CUDA capture computes nothing, so a policy that forgets to
  replay after recording returns garbage here too;
- recording restores the CPU generator: a CUDA capture does not advance torch's generator, each
  replay does (graph-safe philox state);
- `replay()` runs the function again on the *same* static inputs (the recording's buffers; the
  address-stable inputs the policy put in its `inputs` slots for this replay) and writes the
  results into the *same* output tensors the recording returned, as a replay writes the same
  addresses.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

HOST_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.masked_select.default}


class CaptureError(RuntimeError):
    pass


class _Capturing(TorchDispatchMode):
    """Logs ops, raises on host syncs, and tells memory made during capture (`made`) from
    memory that existed before (`external`: inputs, parameters)."""

    def __init__(self, ops: list[str]) -> None:
        super().__init__()
        self.ops = ops
        self.made: set[int] = set()
        self.external: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_SYNCS:
            raise CaptureError(f"operation not permitted when stream is capturing ({func})")
        self.ops.append(str(func))
        self.external |= _storages((args, kwargs)) - self.made
        out = func(*args, **(kwargs or {}))
        self.made |= _storages(out) - self.external
        return out


def _storages(tree: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_leaves(tree)
            if isinstance(t, torch.Tensor)}


class FakeGraph:
    def __init__(self, fn: Callable[[], Sequence[Any]], outputs: Sequence[Any],
                 ops: list[str]) -> None:
        self.fn = fn
        self.outputs = tuple(outputs)
        self.ops = ops
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        with torch.no_grad():
            for static, new in zip(self.outputs, self.fn()):
                if isinstance(static, torch.Tensor) and static is not new:
                    static.copy_(new)


class FakeGraphMechanism:
    """See the module docstring. `device_type`: the device a graph may touch ("cuda" makes
    CPU inputs a fallback reason). `pool_bytes`: what `memory_reserved` grows by per record."""

    def __init__(self, device_type: str = "cpu", pool_bytes: int = 4096) -> None:
        self.device_type = device_type
        self.pool_bytes = pool_bytes
        self.reserved = 0
        self.graphs: list[FakeGraph] = []

    def unavailable(self) -> str | None:
        return None

    def new_pool(self) -> Any:
        return object()

    def record(self, fn: Callable[[], Sequence[Any]], pool: Any, device: torch.device
               ) -> tuple[FakeGraph, Sequence[Any]]:
        ops: list[str] = []
        rng = torch.get_rng_state()
        try:
            with torch.no_grad(), _Capturing(ops) as capturing:
                outputs = tuple(fn())
        finally:
            torch.set_rng_state(rng)
        _poison(outputs, capturing.made)
        graph = FakeGraph(fn, outputs, ops)
        self.graphs.append(graph)
        self.reserved += self.pool_bytes
        return graph, outputs

    def memory_reserved(self, device: torch.device) -> int:
        return self.reserved


def _poison(outputs: Sequence[Any], made: set[int]) -> None:
    """Garbage in the outputs the capture allocated (a capture writes nothing; memory that
    existed before, an input returned as an output, keeps its value)."""
    with torch.no_grad():
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.numel() \
                    and out.untyped_storage().data_ptr() in made:
                out.fill_(float("nan") if out.dtype.is_floating_point else -7)
