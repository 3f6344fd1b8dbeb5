"""One definition of compile time, shared by `kiln bench`, `kiln explain` and `kiln report`.

compile = the stages below, summed over every graph compiled during a call:

    capture         bytecode → FX graph + guards            (capture records: "capture")
    autograd        FX graph → ATen inference/fw/bw graphs  (pipeline timings: "trace")
    lower+schedule  ATen graph → loop IR → fused kernels    ("lower" + "schedule")
    codegen         Triton and wrapper source               ("codegen")
    kernel compile  building (and autotuning) the kernels   ("compile_kernels" + "autotune")
    backend         the backend call where the stages above were not timed: a backend that
                    records no pipeline timings, or kiln on CPU running the graph as torch ops

first call = compile + first run: the wall time of the first call, whose remainder after compile
is the first execution of the compiled code (one-time costs included: lazy imports, memory
allocation, the Triton interpreter's set-up).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DEFINITION", "STAGES", "first_call_line", "format_stages", "stage_seconds",
           "timed_first_call"]

STAGES = ("capture", "autograd", "lower+schedule", "codegen", "kernel compile", "backend")
DEFINITION = ("compile = capture + autograd + lower+schedule + codegen + kernel compile, summed "
              "over graphs; first call = compile + first run")

# pipeline timing keys (kiln.runtime.pipeline.STAGES) → the stage they belong to
_PIPELINE = {"trace": "autograd", "lower": "lower+schedule", "schedule": "lower+schedule",
             "codegen": "codegen", "compile_kernels": "kernel compile",
             "autotune": "kernel compile"}


def stage_seconds(captures: Iterable[dict[str, float]],
                  pipelines: Iterable[dict[str, float]]) -> dict[str, float]:
    """Seconds per stage (`STAGES` order, stages that took no time left out) from capture's
    per-graph records ({"capture", "backend"}) and the pipeline's per-graph timings. The
    backend call's time not accounted for by pipeline stages stays under "backend"."""
    totals = dict.fromkeys(STAGES, 0.0)
    backend_call = 0.0
    for c in captures:
        totals["capture"] += c.get("capture", 0.0)
        backend_call += c.get("backend", 0.0)
    for timings in pipelines:
        for key, seconds in timings.items():
            if key in _PIPELINE:
                totals[_PIPELINE[key]] += seconds
    timed = sum(v for k, v in totals.items() if k != "capture")
    totals["backend"] = max(backend_call - timed, 0.0)
    return {k: v for k, v in totals.items() if v > 0.0}


def format_stages(stages: dict[str, float]) -> str:
    """'12.0 ms (capture 10.0, autograd 2.0)': the total and each stage, in milliseconds."""
    if not stages:
        return "0.0 ms (nothing compiled)"
    parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in stages.items())
    return f"{sum(stages.values()) * 1e3:.1f} ms ({parts})"


def timed_first_call(call: Callable[[], Any]) -> tuple[Any, float, dict[str, float]]:
    """Run `call` (a first call of compiled code) under a capture recorder: its output, its wall
    seconds, and the seconds per compile stage recorded meanwhile; the first run is the wall
    time minus the stages' sum."""
    from kiln import records

    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    start = time.perf_counter()
    try:
        out = call()
    finally:
        wall = time.perf_counter() - start
        records.active_recorders().remove(recorder)
    stages = stage_seconds([g.compile_seconds for g in recorder.graphs],
                           recorder.pipeline_timings)
    return out, wall, stages


def first_call_line(wall_s: float, stages: dict[str, float]) -> str:
    """'first call 30 ms = compile 20.0 ms (capture 19.0, backend 1.0) + first run 10 ms'."""
    compile_s = sum(stages.values())
    return (f"first call {wall_s * 1e3:.0f} ms = compile {format_stages(stages)} + first run "
            f"{max(wall_s - compile_s, 0.0) * 1e3:.0f} ms")
