"""torch.profiler over a few steady calls (`profile_calls`), and per-kernel times of a compiled
call from it (`kernel_times`).

How a kernels.json step gets its time, in order of preference:
1. a profiler range named exactly like the step (`torch.profiler.record_function(step name)`
   around the launch, which the wrapper may add): its device time on CUDA (kernels launched
   inside it, children included), its CPU time on the CPU;
2. on CUDA, device kernels whose name equals the step's name (generated Triton kernels keep the
   `@triton.jit` function's name);
3. on CUDA, extern calls (cuBLAS/cuDNN kernels, launched by an ATen op): the device time of the
   outermost ATen op whose name contains the step's op word ("extern:addmm" -> aten::addmm), in
   launch order, cycling through the extern steps once per call.
A step none of these reach has no time; the note says which rules applied.

torch.profiler is imported only when a profile is taken, never at kiln import time.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
import sys
import tempfile
from typing import Any, Callable, Iterator

import torch

__all__ = ["Profiled", "is_device_event", "kernel_times", "op_word", "outermost",
           "profile_calls"]

log = logging.getLogger("kiln.tools.report")

# kineto writes these stage lines straight to file descriptor 2 when a trace starts and stops
_KINETO_CHATTER = re.compile(r"^(USDT|STAGE):\S* \S+ \d+:\d+ \S+\.cpp:\d+\]")


@dataclasses.dataclass
class Profiled:
    """What torch.profiler saw over `calls` steady calls (one warm-up call outside): `events`
    (torch's FunctionEvents), on `device` ("cuda..." or "cpu"). On CUDA each call ended with a
    synchronize, so a call's ProfilerStep range covers its device work."""
    events: list
    device: str
    calls: int

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def wall_us(self) -> float | None:
        """Mean microseconds per call of the ProfilerStep ranges (profiler overhead included)."""
        steps = [e.cpu_time_total for e in self.events if e.name.startswith("ProfilerStep")
                 and not _on_device(e)]  # the GPU timeline's copy of the range
        return sum(steps) / len(steps) if steps else None


@contextlib.contextmanager
def _kineto_chatter_dropped() -> Iterator[None]:
    """Keep kineto's stage lines off the terminal (the report is quiet by default); anything
    else written to fd 2 meanwhile goes to the log as a warning."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (an embedding host): nothing to keep off
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
    for line in text.splitlines():
        if line.strip() and not _KINETO_CHATTER.match(line):
            log.warning("torch.profiler: %s", line)


def profile_calls(run: Callable[[], Any], device: str, calls: int = 3) -> Profiled:
    """Profile `calls` calls of `run` after one warm-up call outside the profile (compiles,
    autotunes, allocator) and one inside that the profiler discards (its own start-up cost)."""
    from torch.profiler import ProfilerActivity, profile, schedule
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    step = (lambda: (run(), torch.cuda.synchronize())) if cuda else run  # noqa: E731
    step()
    calls = max(calls, 1)
    prof = profile(activities=activities, acc_events=True,
                   schedule=schedule(wait=0, warmup=1, active=calls, repeat=1))
    with _kineto_chatter_dropped():
        prof.__enter__()
    try:
        for _ in range(calls + 1):
            step()
            with _kineto_chatter_dropped():
                prof.step()
    finally:
        with _kineto_chatter_dropped():
            prof.__exit__(None, None, None)
    return Profiled(list(prof.events()), device, calls)


def _on_device(event: Any) -> bool:
    return getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA


def is_device_event(event: Any) -> bool:
    """A kernel or copy that ran on the GPU. Not a user annotation's device-side range: torch
    puts each `ProfilerStep#N` (and every `record_function`) on the GPU timeline too, spanning
    the step's kernels, and counting it would count the step twice (seen on the H200)."""
    if not _on_device(event):
        return False
    return not (getattr(event, "is_user_annotation", False)
                or event.name.startswith("ProfilerStep"))


def outermost(events: list, is_op: Callable[[Any], bool]) -> list:
    """The CPU events for which `is_op` holds and no ancestor's does, in start order."""
    found = []
    for e in events:
        if is_device_event(e) or not is_op(e):
            continue
        parent = e.cpu_parent
        while parent is not None and not is_op(parent):
            parent = parent.cpu_parent
        if parent is None:
            found.append(e)
    return sorted(found, key=lambda e: e.time_range.start)


def _is_aten(event: Any) -> bool:
    return event.name.startswith("aten::")


def kernel_times(profiled: Profiled, steps: list[dict]) -> tuple[dict[str, float], str]:
    """Seconds per call for each step name in `steps` that the profile can attribute, and a
    one-line note on how they were attributed."""
    if not steps:
        return {}, "no kernels to time"
    events, calls, cuda = profiled.events, profiled.calls, profiled.cuda
    names = {s["name"] for s in steps}
    times: dict[str, float] = collections.defaultdict(float)
    ranges = [e for e in events if not is_device_event(e) and e.name in names]
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
    matched = [e for e in events if is_device_event(e) and e.name in names]
    for e in matched:
        times[e.name] += e.time_range.elapsed_us() * 1e-6
    if matched:
        how.append("device kernels with the step's name")
    externs = [s for s in pending if s["name"] not in times]
    if by_order and externs and _attribute_extern_ops(events, externs, times, calls):
        how.append("extern calls by their ATen op's device time, in launch order")
    return how


def op_word(kind: str) -> str:
    """The word an extern step's ATen op name contains: "extern:addmm" -> "addmm",
    "fallback:sort.default" -> "sort"."""
    return kind.split(":", 1)[-1].split(".")[0].lower()


def _attribute_extern_ops(events: list, externs: list[dict], times: dict[str, float],
                          calls: int) -> bool:
    """Rule 3: walk the outermost ATen ops that ran device work, in start order, and give each
    extern step (cycling through them once per call) the next op whose name contains its op
    word, e.g. aten::addmm for "extern:addmm", aten::_scaled_dot_product_efficient_attention
    for "extern:attention". All or nothing: False (nothing attributed) when a step is missing."""
    ops = [e for e in outermost(events, _is_aten) if e.device_time_total > 0]
    found: dict[str, float] = collections.defaultdict(float)
    position = 0
    for _ in range(calls):
        for step in externs:
            word = op_word(step.get("kind", ""))
            while position < len(ops) and word not in ops[position].name.lower():
                position += 1
            if position == len(ops):
                return False
            found[step["name"]] += ops[position].device_time_total * 1e-6
            position += 1
    for name, seconds in found.items():
        times[name] += seconds
    return True
