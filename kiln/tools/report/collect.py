"""Run a target under kiln and collect a `ReportData`: capture's records (breaks ranked by
cost, recompiles, capture times, as `kiln.explain` collects them), the backend's per-graph
artifacts under a debug dir, per-kernel times from the profiler and the machine's ceilings."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Sequence

import torch

from kiln import records
from kiln.config import config
from kiln.tools.report.artifacts import read_debug_dir
from kiln.tools.report.ceilings import machine_ceilings
from kiln.tools.report.data import ReportData, save_run_json
from kiln.tools.report.profile import Profiled, kernel_times, profile_calls
from kiln.tools.report.variants import VARIANTS, profile_variants

__all__ = ["collect_report"]


class _FreshBackend:
    """A backend under a new identity, so the report never reuses graphs compiled elsewhere
    (cache entries are keyed by backend); keyword options (e.g. mode) reach the backend only
    when it accepts them."""

    def __init__(self, backend: Callable, name: str) -> None:
        self.backend = backend
        self.__name__ = name
        params = inspect.signature(backend).parameters.values()
        self._accepts = {p.name for p in params}
        self._any_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
        kwargs = {k: v for k, v in kwargs.items() if self._any_kwargs or k in self._accepts}
        return self.backend(gm, example_inputs, **kwargs)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(call: Callable[[], Any], device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    return time.perf_counter() - start


def _as_dict(record: Any) -> dict:
    return dataclasses.asdict(record)


@contextlib.contextmanager
def _recording():
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    try:
        yield recorder
    finally:
        records.active_recorders().remove(recorder)


@contextlib.contextmanager
def _debug_dir(path: str):
    """config.debug_dir and KILN_DEBUG_DIR (for any worker process) point at `path`; the
    backend's warm start is off, since a graph rebuilt from the disk cache writes no artifacts
    and has no compile stages to time."""
    old_env = os.environ.get("KILN_DEBUG_DIR")
    os.environ["KILN_DEBUG_DIR"] = path
    patches = {"debug_dir": path}
    if hasattr(config, "warm_start"):
        patches["warm_start"] = False
    try:
        with config.patch(**patches):
            yield
    finally:
        if old_env is None:
            os.environ.pop("KILN_DEBUG_DIR", None)
        else:
            os.environ["KILN_DEBUG_DIR"] = old_env


def _fill_records(data: ReportData, recorder: records.Recorder) -> None:
    from kiln.tools.explain import _unique_by_cost  # one ranking rule for explain and report
    data.breaks = [_as_dict(b) for b in _unique_by_cost(recorder.breaks)]
    data.recompiles = [_as_dict(r) for r in recorder.recompiles]
    data.captures = [{"function": g.function, **g.compile_seconds} for g in recorder.graphs
                     if g.graph is not None]


def _fill_kernel_times(data: ReportData, profiled: Profiled) -> None:
    """Per-step times from kiln's profile, or a note on why there are none."""
    if data.kernels:
        data.kernel_times, data.timing_note = kernel_times(profiled, data.kernels)
        return
    data.timing_note = f"no kernel data: backend {data.backend!r} generated no kernels"
    if data.backend == "kiln" and not data.device.startswith("cuda") and \
            getattr(config, "cpu_codegen", "") == "eager":
        data.notes.append("on CPU tensors the kiln backend runs graphs as torch ops, so no "
                          "kernels were generated; set KILN_CPU_CODEGEN=triton_interpret "
                          "(and TRITON_INTERPRET=1) to run its Triton kernels interpreted")


def collect_report(fn: Callable, args: tuple, *, target: str, backend: str = "eager",
                   mode: str | None = None, device: str = "cpu", debug_dir: str | None = None,
                   calls: int = 3, ceilings: bool = True,
                   after: Callable[[Any], Any] | None = None,
                   variants: Sequence[str] = VARIANTS,
                   torch_backend: Any = "inductor") -> ReportData:
    """Compile `fn` with kiln (backend, mode), call it on `args` with the artifacts written
    under `debug_dir` (a new temporary folder when None), then time it and profile its kernels.
    `after(output)` is part of every timed call (e.g. a loss and its backward for a training
    step). `variants` (of eager, torch.compile, kiln) are profiled side by side, torch.compile
    with `torch_backend`; none skips that section. Saves report.json in the debug dir so
    `--from-debug-dir` rebuilds the same report."""
    from kiln import api
    from kiln.backends import lookup_backend
    debug_dir = debug_dir or tempfile.mkdtemp(prefix="kiln-report-")
    data = ReportData(target=target, device=device, backend=backend, mode=mode,
                      debug_dir=debug_dir)
    if os.path.isdir(debug_dir) and os.listdir(debug_dir):
        data.notes.append(f"the debug dir {debug_dir} was not empty: graphs from earlier runs "
                          "are in the report too")
    fresh = _FreshBackend(lookup_backend(backend), backend)
    with _debug_dir(debug_dir):
        compiled = api.compile(fn, backend=fresh, mode=mode)
        run = (lambda: compiled(*args)) if after is None else (  # noqa: E731
            lambda: after(compiled(*args)))
        with _recording() as recorder:
            data.first_call_s = _timed(run, device)
        data.steady_call_s = statistics.median(_timed(run, device) for _ in range(max(calls, 1)))
    _fill_records(data, recorder)
    data.graphs, _ = read_debug_dir(debug_dir)
    profiled = profile_calls(run, device, calls)
    _fill_kernel_times(data, profiled)
    data.profile = profile_variants(
        fn, args, kiln=profiled, steps=data.kernels, device=device, mode=mode, calls=calls,
        after=after, variants=variants, torch_backend=torch_backend, backend=backend,
    ) if variants else {"skipped": "the side-by-side profile was turned off (--no-profile)"}
    if ceilings:
        data.ceilings = machine_ceilings(device).to_dict()
    save_run_json(data, debug_dir)
    return data
