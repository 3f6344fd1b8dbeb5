"""_compat: the runtime's private torch APIs, in one place (the rule: one such module per stage).

- `storage_use_count(t)`: how many references hold `t`'s storage (`torch._C._storage_Use_Count`,
  what torch's CUDA graph trees read to tell whether an output of a replay is still alive). The
  temporary storage object this function makes adds one; callers compare counts taken the same
  way, never absolute values.
- `data_ptrs_equal(tensors, ptrs, indices)`: whether `tensors[i].data_ptr() == ptrs[i]` for each
  `i` in `indices` (`ptrs` by input position), in one C++ call (`torch._C._tensors_data_ptrs_at_indices_equal`, what torch's
  CUDA graph trees check their static inputs with); a Python loop where torch lacks it.
- `alias_view(t, size, stride, offset)`: a view of `t`'s storage without `as_strided`'s bounds
  check and view bookkeeping (`torch._C._dynamo.guards._reinterpret_tensor`, what Inductor's
  wrappers call): half the host cost. `offset` counts from `t`'s own storage offset (as_strided's
  from the storage's start). The wrapper uses it only where it proved the view lies
  inside a buffer it laid out itself (`wrapper._Writer._view`); `as_strided` where torch lacks it.
- `empty_cpu(size, stride, dtype)` / `empty_cuda(size, stride, dtype)`: a new uninitialized
  tensor without the dispatcher's `empty_strided` path (`torch._C._dynamo.guards.
  _empty_strided_cpu` / `_cuda`, what Inductor's wrappers allocate with: 0.4 vs 1.0 us on the
  CPU, 3.9 us per `empty_strided` on the H100 host). `empty_cuda` allocates on the current
  device: the wrapper calls it only inside its `torch.cuda.device` guard, for buffers of that
  device. `torch.empty_strided` with the device where torch lacks them.
- `end_failed_capture(device, pool)`: what `torch.cuda.graph` leaves undone when a capture fails
  (a host sync inside it invalidates the capture, and `capture_end` raises before its cleanup):
  the device's default generator stays in capture mode, so every later random op on the device
  raises "Offset increment outside graph capture encountered unexpectedly"; the caching allocator
  keeps routing the capture's stream to the pool (`torch._C._cuda_endAllocateToPool`) and the
  pool keeps its memory (`torch._C._cuda_releasePool`).
"""
from __future__ import annotations

import torch

__all__ = ["alias_view", "data_ptrs_equal", "empty_cpu", "empty_cuda", "end_failed_capture",
           "storage_use_count"]


def storage_use_count(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


def end_failed_capture(device: torch.device, pool: object) -> None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        return  # the exception came before capture_end ended the capture: nothing to repair
    generator = torch.cuda.default_generators[index]
    # a cloned state is not capturing and keeps the seed and offset (the failed capture drew
    # nothing from the real stream of numbers); after a capture that did end, the same state
    generator.graphsafe_set_state(generator.clone_state())
    end_routing = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end_routing is None:
        return
    try:
        end_routing(index, pool)
    except RuntimeError:
        return  # capture_end got that far: it ended the routing, the graph owns the pool
    torch._C._cuda_releasePool(index, pool)


def _data_ptrs_equal_py(tensors: list, ptrs: list[int], indices: list[int]) -> bool:
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


data_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", _data_ptrs_equal_py)


def _as_strided_from(t: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    return torch.as_strided(t, size, stride, t.storage_offset() + offset)


def _alias_view() -> object:
    try:
        from torch._C._dynamo.guards import _reinterpret_tensor
    except ImportError:
        return _as_strided_from
    return _reinterpret_tensor


alias_view = _alias_view()


def _empty_fn(device_type: str, name: str | None = None) -> object:
    try:
        from torch._C._dynamo import guards
        return getattr(guards, name or f"_empty_strided_{device_type}")
    except (ImportError, AttributeError):
        device = torch.device(device_type)
        return lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype,
                                                               device=device)


empty_cpu = _empty_fn("cpu")
empty_cuda = _empty_fn("cuda")
