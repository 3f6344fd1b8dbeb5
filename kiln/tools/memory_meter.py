"""memory_meter: peak bytes of tensor storage a call allocates, on any device (the CPU too).

`measure_peak(fn)` runs `fn()` under a `TorchDispatchMode` that sees every ATen op that reaches
the dispatcher (eager's ops, kiln's wrapper's `empty_strided` buffers, library calls, the
autograd engine's gradient math and accumulation). A storage counts as allocated when an op
returns a tensor whose storage is neither already counted nor one of the op's own arguments'
(views, in-place and `out=` ops return storages they were given); it counts as freed when a
weakref callback on its storage object fires (CPython frees storages by reference counting, so
the callback runs at the exact moment eager frees it). The peak is the most bytes alive at once
above what lived when the call started; what `fn` keeps (its outputs) stays counted.

Reference cycles: a storage held only by a cycle is freed when Python's cycle collector runs,
not when its last reader drops it. Triton's interpreter makes one per launch (its recursive
`_to_cpu` / `_from_cpu` closures hold a dict of the launch's argument storages), so on the CPU
every buffer a kernel touched would look alive until the next collection, which no GPU run
has. `collect_cycles=True` collects garbage before every op (cheaply: the objects alive at the
start are frozen out of the collector), so a measurement under the interpreter matches
reference counting alone; `cycle_bytes` reports how much only the collector freed (0 for code
that makes no cycles).

What it does not see, on purpose or not: scratch memory a library op allocates and frees inside
itself (oneDNN workspaces; CUDA's `max_memory_allocated` sees those), the Triton interpreter's
numpy arrays (an artefact of running kernels on the CPU), frees of storages that lived before
the call (the caller's inputs), and allocator rounding. Compiling inside the meter is not
supported (the compiler's FakeTensors run ATen ops too): warm up first, then measure.
"""
from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["MemoryMeter", "Peak", "measure_peak"]


@dataclasses.dataclass(frozen=True)
class Peak:
    """One measured call. peak_bytes: most bytes alive at once above the start; end_bytes:
    bytes still alive when the call returned (its outputs and what it keeps); allocations:
    how many storages it allocated; at_peak / alive_at_end: (op, bytes) of the storages alive
    at the peak / at the end, in allocation order (what to blame); cycle_bytes: bytes only
    the cycle collector freed (with `collect_cycles`); result: what the call returned."""

    peak_bytes: int
    end_bytes: int
    allocations: int
    cycle_bytes: int = 0
    at_peak: tuple[tuple[str, int], ...] = ()
    alive_at_end: tuple[tuple[str, int], ...] = ()
    result: Any = None

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20


class MemoryMeter(TorchDispatchMode):
    """Counts live storages allocated by ATen ops while active; `peak` is the high-water mark
    of `live` (bytes). Frees are seen through weakrefs, so they keep counting after exit.
    collect_cycles: collect garbage before each op (see the module docstring)."""

    def __init__(self, collect_cycles: bool = False) -> None:
        super().__init__()
        self.collect_cycles = collect_cycles
        self.cycle_bytes = 0
        self._collecting = False
        self.live = 0
        self.peak = 0
        self.allocations = 0
        self._alive: dict[int, weakref.ref] = {}  # data_ptr -> the storage's weakref
        self._made_by: dict[int, tuple[str, int]] = {}  # data_ptr -> (op, bytes)
        self.at_peak: list[tuple[str, int]] = []  # (op, bytes) of the storages alive at peak

    def __enter__(self):
        if self.collect_cycles:
            gc.collect()
            gc.freeze()  # what lives now is not ours to collect: keeps each collection cheap
        return super().__enter__()

    def __exit__(self, *exc):
        if self.collect_cycles:
            self._collect()
            gc.unfreeze()
        return super().__exit__(*exc)

    def _collect(self) -> None:
        self._collecting = True
        try:
            gc.collect()
        finally:
            self._collecting = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.collect_cycles:
            self._collect()
        out = func(*args, **(kwargs or {}))
        given = _storage_ptrs(tree_leaves((args, kwargs or {})))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._see(t.untyped_storage(), given, str(func))
        return out

    def _see(self, storage: torch.UntypedStorage, given: set[int], op: str) -> None:
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or ptr in given or ptr in self._alive:
            return
        self._alive[ptr] = weakref.ref(storage, lambda _, p=ptr, n=nbytes: self._free(p, n))
        self.allocations += 1
        self._made_by[ptr] = (op, nbytes)
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live
            self.at_peak = list(self._made_by.values())

    @property
    def alive(self) -> list[tuple[str, int]]:
        """(op, bytes) of the counted storages alive now, in allocation order."""
        return list(self._made_by.values())

    def _free(self, ptr: int, nbytes: int) -> None:
        self._alive.pop(ptr, None)
        self._made_by.pop(ptr, None)
        self.live -= nbytes
        if self._collecting:
            self.cycle_bytes += nbytes


def _storage_ptrs(leaves: list) -> set[int]:
    ptrs = set()
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            ptrs.add(leaf.untyped_storage().data_ptr())
        elif isinstance(leaf, torch.UntypedStorage):
            ptrs.add(leaf.data_ptr())
    return ptrs


def measure_peak(fn: Callable[[], Any], keep_result: bool = True,
                 collect_cycles: bool = False) -> Peak:
    """Run `fn()` under a `MemoryMeter`; its peak, end bytes and (with `keep_result`) result.
    With `keep_result=False` the result is dropped before `end_bytes` is read;
    `collect_cycles`: see the module docstring (use it under Triton's interpreter)."""
    meter = MemoryMeter(collect_cycles)
    with meter:
        result = fn()
    if not keep_result:
        result = None
    return Peak(meter.peak, meter.live, meter.allocations, meter.cycle_bytes,
                tuple(meter.at_peak),
                tuple(meter.alive), result)
