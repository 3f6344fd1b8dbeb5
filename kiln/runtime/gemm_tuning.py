"""gemm_tuning: max-autotune's choice, per matmul with a pointwise epilogue, between the library
call + today's separate epilogue kernel and a Triton GEMM template with the epilogue fused.

`choose_gemm_templates(schedule, specs, budget_s) -> (schedule, specs)`, run by the pipeline
under `options.autotune` only (the default mode never calls it):

1. `kiln.schedule.gemm_epilogue.find_gemm_epilogues` lists the legal candidates; each gets
   `gemm_configs` (≤ 6 tilings) emitted by `kiln.codegen.gemm_template.emit_gemm` (an epilogue
   the tile cannot compute refuses the candidate).
2. `config.gemm_templates`: "never" keeps every library call; "auto" decides by benchmark and,
   where nothing can be timed (the Triton interpreter, no CUDA device), keeps the library call
   (logged once at INFO); "always" takes a template wherever legal: the fastest when it can
   time and a template won, else the first config.
3. The disk cache (`DiskCache("gemm")`) is keyed by every candidate's source (shapes, strides,
   dtypes and the epilogue are specialized into it), the library call's operands and
   `versions()` (device name, toolchain, Triton): a hit takes the recorded choice without
   compiling the losers or benchmarking.
4. Otherwise the candidates compile (in parallel; ≤ 6 templates and the epilogue kernel), the
   library call + epilogue kernel is timed first, then each template in turn, until the graph's
   budget (`options.gemm_autotune_budget_s`: seconds of timing over all its matmuls; compiling
   does not count) is spent: a matmul reached after that keeps the library call, one cut short
   keeps the best it measured. A template that fails to compile or run is skipped.

Progress: one updating stderr line when stderr is a terminal; else an INFO line per matmul
(`kiln.runtime` logger: quiet by default). `gemm_timer(timer)` (a context manager) replaces the
benchmark: tests inject a fake one, which also enables the choice without a GPU.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from kiln.codegen.gemm_template import GemmConfig, emit_gemm, gemm_configs
from kiln.codegen.triton_printer import CodegenError
from kiln.config import config
from kiln.runtime.autotune import cached_choice, fastest, fingerprint
from kiln.runtime.disk_cache import DiskCache, cache_key, versions
from kiln.schedule.gemm_epilogue import (GemmCandidate, GemmOperands, epilogue_signature,
                                         find_gemm_epilogues, fuse_gemm_epilogues)

__all__ = ["LIBRARY", "benchmark_ms", "choose_gemm_templates", "gemm_timer"]

log = logging.getLogger("kiln.runtime")

LIBRARY = "library"  # the label of the library call + separate epilogue kernel
Timer = Callable[[str, Callable[[], None]], float]  # (candidate label, run it once) -> ms
_TIMERS: list[Timer] = []  # gemm_timer's stack (tests)


@contextlib.contextmanager
def gemm_timer(timer: Timer) -> Iterator[None]:
    """Within the block, `choose_gemm_templates` times candidates with `timer(label, run)`
    (milliseconds) instead of benchmarking on the GPU."""
    _TIMERS.append(timer)
    try:
        yield
    finally:
        _TIMERS.remove(timer)


def benchmark_ms(label: str, run: Callable[[], None]) -> float:
    """Median milliseconds of `run()` (Triton's do_bench: L2 flushed before every run)."""
    from triton.testing import do_bench

    return float(do_bench(run, warmup=5, rep=25, return_mode="median"))


def choose_gemm_templates(schedule: Any, specs: dict[str, Any], budget_s: float = 5.0, *,
                          timer: Timer | None = None) -> tuple[Any, dict[str, Any]]:
    """The schedule and kernel specs with the winning templates in place (module docstring)."""
    mode = config.gemm_templates
    if mode == "never":
        return schedule, specs
    cands = _disjoint([c for c in find_gemm_epilogues(schedule) if c.group is not None])
    if not cands:
        return schedule, specs
    timer = timer or (_TIMERS[-1] if _TIMERS else None)
    if timer is None and _can_benchmark(schedule.graph):
        timer = benchmark_ms
    if timer is None and mode == "auto":
        log.info("gemm templates: no GPU to time on (Triton interpreter or no CUDA); %d "
                 "matmul(s) keep the library call", len(cands))
        return schedule, specs
    tuner = _Tuner(schedule, specs, timer, budget_s)
    won = [(cand, spec) for cand in cands
           if (spec := tuner.choose(cand, len(cands))) is not None]
    tuner.progress.done()
    if not won:
        return schedule, specs
    new_specs = dict(specs)
    for cand, spec in won:
        new_specs[cand.group.name] = spec
    return fuse_gemm_epilogues(schedule, [c for c, _ in won]), new_specs


def _disjoint(cands: list[GemmCandidate]) -> list[GemmCandidate]:
    """One matmul per epilogue group (the first): a tile computes one matmul."""
    seen: set[int] = set()
    out = []
    for cand in cands:
        if cand.group_step not in seen:
            seen.add(cand.group_step)
            out.append(cand)
    return out


def _can_benchmark(graph: Any) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return False
    return all(buf.layout.device.type == "cuda" for buf in graph.buffers.values())


class _Tuner:
    """The choices of one graph: its specs, timer, budget and progress line."""

    def __init__(self, schedule: Any, specs: dict[str, Any], timer: Timer | None,
                 budget_s: float) -> None:
        self.schedule, self.graph, self.specs = schedule, schedule.graph, specs
        self.timer, self.budget_s = timer, budget_s
        self.spent = 0.0  # seconds spent timing candidates (compiling them does not count)
        self.cache = DiskCache("gemm")
        self.progress = _Progress()
        self.done = 0

    def choose(self, cand: GemmCandidate, total: int) -> Any:
        """The winning template's spec, or None for the library call (with
        `gemm_templates = "always"`, the first template wherever no template won)."""
        self.done += 1
        label = _label(cand.group)
        templates = self._templates(cand)
        if not templates:
            return None
        choice = self._timed_choice(cand, templates, label, total) if self.timer else None
        if choice:
            return templates[choice - 1][1]
        if config.gemm_templates == "always":
            log.info("gemm %s: template %s (forced)", label, templates[0][0].short())
            return templates[0][1]
        return None

    def _timed_choice(self, cand: GemmCandidate, templates: list[tuple[GemmConfig, Any]],
                      label: str, total: int) -> int | None:
        """0 for the library call, i for template i - 1; None when the budget was spent
        before this matmul or nothing ran. From the disk cache when it has the answer."""
        prints = [self._library_print(cand)] + [fingerprint(s) for _, s in templates]
        key = cache_key("gemm", prints, versions())
        choice = cached_choice(self.cache.get(key), prints)
        names = [LIBRARY] + [c.short() for c, _ in templates]
        if choice is not None:
            log.info("gemm %s: cached choice %s", label, names[choice])
            return choice
        if self.spent > self.budget_s:
            log.info("gemm %s: budget of %.1f s spent; keeps the library call", label,
                     self.budget_s)
            return None
        timings, complete = self._benchmark(cand, templates, f"{self.done}/{total} {label}")
        choice = fastest(timings)  # ties: the library call (first)
        if choice is not None:
            self.cache.put(key, {"choice": choice, "fingerprint": prints[choice],
                                 "label": label, "complete": complete, "candidates": names,
                                 "timings_ms": [t if math.isfinite(t) else None
                                                for t in timings]})
            _report(label, names, timings, choice, complete)
        return choice

    def _templates(self, cand: GemmCandidate) -> list[tuple[GemmConfig, Any]]:
        group = cand.group
        out = []
        for cfg in gemm_configs(group.gemm, group.nodes[0].dtype):
            try:
                out.append((cfg, emit_gemm(group, self.graph, cfg)))
            except CodegenError as exc:  # the epilogue cannot run on the tile: not legal
                log.debug("gemm %s stays a library call: %s", _label(group), exc)
                return []
        return out

    def _library_print(self, cand: GemmCandidate) -> str:
        gemm = cand.group.gemm
        return cache_key(LIBRARY, gemm.kind, gemm.a, gemm.b, gemm.bias,
                         fingerprint(self.specs[cand.group.name]))

    def _benchmark(self, cand: GemmCandidate, templates: list[tuple[GemmConfig, Any]],
                   title: str) -> tuple[list[float], bool]:
        """Milliseconds per candidate (library first; inf: not timed or failed), complete?"""
        from kiln.runtime.launcher import build_launchers

        epilogue = self.specs[cand.group.name]
        specs = [epilogue] + [s for _, s in templates]
        storages = _storages(self.graph, [n for s in specs for n in s.args]
                             + [a.name for a in _operand_args(cand.group.gemm)])
        dtypes = {name: t.dtype for name, t in storages.items()}
        launchers = _compiled(specs, dtypes, build_launchers)
        runs = [_library_run(cand.group.gemm, storages, launchers[0], epilogue)]
        runs += [_kernel_run(lc, storages) for lc in launchers[1:]]
        labels = [LIBRARY] + [c.short() for c, _ in templates]
        timings = [math.inf] * len(runs)
        for i, run in enumerate(runs):
            if i > 0 and self.spent > self.budget_s:
                return timings, False
            if run is not None:
                start = time.perf_counter()
                timings[i] = _time_one(self.timer, labels[i], run)
                self.spent += time.perf_counter() - start
            self.progress.update(title, i + 1, len(runs), timings)
        return timings, True


def _storages(graph: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Random storage for each buffer (integers zero: they may be indices)."""
    out = {}
    for name in dict.fromkeys(names):
        lay = graph.buffers[name].layout
        base = torch.empty(max(1, lay.storage_size()), dtype=lay.dtype, device=lay.device)
        out[name] = base.normal_() if lay.dtype.is_floating_point else base.zero_()
    return out


def _compiled(specs: list[Any], dtypes: dict[str, torch.dtype], build: Callable) -> list[Any]:
    """A launcher per spec (None where it fails to compile)."""
    try:
        return build(specs, dtypes={n: d for n, d in dtypes.items()})
    except Exception as exc:  # one bad config must not cost the others: compile one by one
        log.debug("gemm: compiling together failed (%s); one at a time", exc)
    out = []
    for spec in specs:
        try:
            out.append(build([spec], dtypes=dtypes)[0])
        except Exception as exc:
            log.debug("gemm: %s does not compile: %s", spec.name, exc)
            out.append(None)
    return out


def _operand_args(gemm: GemmOperands) -> list[Any]:
    return [a for a in (gemm.a, gemm.b, gemm.bias) if a is not None]


def _view(storages: dict[str, torch.Tensor], arg: Any) -> torch.Tensor:
    return torch.as_strided(storages[arg.name], arg.size, arg.stride, arg.offset)


def _library_run(gemm: GemmOperands, storages: dict[str, torch.Tensor], launcher: Any,
                 epilogue: Any) -> Callable[[], None] | None:
    """Today's path: the ATen call, then the separate epilogue kernel."""
    if launcher is None:
        return None
    a, b = _view(storages, gemm.a), _view(storages, gemm.b)
    op = {"mm": torch.ops.aten.mm.default, "bmm": torch.ops.aten.bmm.default}.get(gemm.kind)
    bias = _view(storages, gemm.bias) if gemm.bias is not None else None
    args = [storages[n] for n in epilogue.args]

    def run() -> None:
        if op is None:
            torch.ops.aten.addmm.default(bias, a, b)
        else:
            op(a, b)
        launcher(*args)

    return run


def _kernel_run(launcher: Any, storages: dict[str, torch.Tensor]) -> Callable[[], None] | None:
    if launcher is None:
        return None
    args = [storages[n] for n in launcher.spec.args]
    return lambda: launcher(*args)


def _time_one(timer: Timer, label: str, run: Callable[[], None]) -> float:
    try:
        return float(timer(label, run))
    except Exception as exc:  # out of resources, bad config: not a reason to fail the compile
        log.debug("gemm: %s failed: %s: %s", label, type(exc).__name__, exc)
        return math.inf


def _label(group: Any) -> str:
    epilogue = "+".join(epilogue_signature(group)) or "store"
    return f"{group.gemm.describe()} -> {epilogue} ({group.name})"


def _us(ms: float) -> str:
    return f"{ms * 1e3:.1f} us" if math.isfinite(ms) else "-"


class _Progress:
    """One updating stderr line on a terminal; silent otherwise (the INFO report remains)."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self.shown = False

    def update(self, title: str, done: int, total: int, timings: list[float]) -> None:
        if not self.live:
            return
        best = min(timings[1:], default=math.inf)
        sys.stderr.write(f"\r\033[K[kiln gemm] {title}: {done}/{total}, library "
                         f"{_us(timings[0])}, best template {_us(best)}")
        sys.stderr.flush()
        self.shown = True

    def done(self) -> None:
        if self.live and self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _report(label: str, names: list[str], timings: list[float], choice: int,
            complete: bool) -> None:
    table = ", ".join(f"{n}: {_us(t)}" for n, t in zip(names, timings))
    log.info("gemm %s: chose %s%s (%s)", label, names[choice],
             "" if complete else " (budget spent)", table)
