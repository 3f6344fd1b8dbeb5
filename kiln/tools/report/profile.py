"""Per-kernel times of a compiled call, from torch.profiler over a few calls.

How a kernels.json step gets its time, in order of preference:
1. a profiler range named exactly like the step (`torch.profiler.record_function(step name)`
   around the launch, which the wrapper may add): its device time on CUDA (kernels launched
   inside it, children included), its CPU time on the CPU;
2. on CUDA, device kernels whose name equals the step's name (generated Triton kernels keep the
   `@triton.jit` function's name);
3. on CUDA, extern calls (cuBLAS/cuDNN kernels, launched by an ATen op): the device time of the
   top-level ATen op whose name contains the step's op word ("extern:addmm" -> aten::addmm), in
   launch order, cycling through the extern steps once per call.
A step none of these reach has no time; the note says which rules applied.
"""
from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import torch

__all__ = ["kernel_times"]


def _profile(run: Callable[[], Any], device: str, calls: int) -> Any:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    run()  # warm-up outside the profile (compiles, autotunes, allocator)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=activities) as prof:
            for _ in range(calls):
                run()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    return prof


def _is_device_event(event: Any) -> bool:
    return getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA


def kernel_times(run: Callable[[], Any], steps: list[dict], device: str,
                 calls: int = 3) -> tuple[dict[str, float], str]:
    """Seconds per call for each step name in `steps` that the profile can attribute, and a
    one-line note on how they were attributed."""
    if not steps:
        return {}, "no kernels to time"
    prof = _profile(run, device, calls)
    events = list(prof.events())
    names = {s["name"] for s in steps}
    cuda = device.startswith("cuda")
    times: dict[str, float] = collections.defaultdict(float)
    ranges = [e for e in events if not _is_device_event(e) and e.name in names]
    for e in ranges:
        times[e.name] += (e.device_time_total if cuda else e.cpu_time_total) * 1e-6
    how = ["profiler ranges named after steps"] if ranges else []
    if cuda:
        how += _attribute_device_kernels(events, steps, times, calls, by_order=not ranges)
    result = {name: t / calls for name, t in times.items()}
    if not result:
        where = "device kernels" if cuda else "CPU ranges"
        return {}, (f"no per-kernel times: no {where} matched a kernel name (the wrapper adds no "
                    "record_function ranges named after its steps)")
    return result, "times from " + ", ".join(how) + f"; mean of {calls} profiled calls"


def _attribute_device_kernels(events: list, steps: list[dict], times: dict[str, float],
                              calls: int, by_order: bool) -> list[str]:
    """Rules 2 and 3 for steps that no range reached (rule 3 only when no range matched:
    kernels inside ranges are counted already); returns the rules that applied."""
    pending = [s for s in steps if s["name"] not in times]
    names = {s["name"] for s in pending}
    how = []
    matched = [e for e in events if _is_device_event(e) and e.name in names]
    for e in matched:
        times[e.name] += e.time_range.elapsed_us() * 1e-6
    if matched:
        how.append("device kernels with the step's name")
    externs = [s for s in pending if s["name"] not in times]
    if by_order and externs and _attribute_extern_ops(events, externs, times, calls):
        how.append("extern calls by their ATen op's device time, in launch order")
    return how


def _op_word(kind: str) -> str:
    """The word an extern step's ATen op name contains: "extern:addmm" -> "addmm",
    "fallback:sort.default" -> "sort"."""
    return kind.split(":", 1)[-1].split(".")[0].lower()


def _attribute_extern_ops(events: list, externs: list[dict], times: dict[str, float],
                          calls: int) -> bool:
    """Rule 3: walk the top-level ATen ops that ran device work, in start order, and give each
    extern step (cycling through them once per call) the next op whose name contains its op
    word, e.g. aten::addmm for "extern:addmm", aten::_scaled_dot_product_efficient_attention
    for "extern:attention". All or nothing: False (nothing attributed) when a step is missing."""
    ops = sorted((e for e in events if not _is_device_event(e) and e.cpu_parent is None
                  and e.name.startswith("aten::") and e.device_time_total > 0),
                 key=lambda e: e.time_range.start)
    found: dict[str, float] = collections.defaultdict(float)
    position = 0
    for _ in range(calls):
        for step in externs:
            word = _op_word(step.get("kind", ""))
            while position < len(ops) and word not in ops[position].name.lower():
                position += 1
            if position == len(ops):
                return False
            found[step["name"]] += ops[position].device_time_total * 1e-6
            position += 1
    for name, seconds in found.items():
        times[name] += seconds
    return True
