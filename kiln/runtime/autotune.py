"""autotune: pick the fastest of a kernel's candidate configs (mode="max-autotune").

`autotune(candidates, make_args, budget_s=10.0, key=None) -> KernelSpec`:

1. A single candidate, or no GPU (the interpreter times nothing useful), → the first candidate
   (the default config), unbenchmarked; the log says why. Nothing is cached then.
2. The disk cache (`DiskCache("autotune")`) is keyed by `key`, every candidate's fingerprint
   (source, meta, num_warps, num_stages) and `versions()` (device name, toolchain): a hit
   returns the recorded choice without compiling the losers or benchmarking.
3. Otherwise all candidates compile in parallel (`build_launchers`), then each is timed in turn
   on `make_args()` (`triton.testing.do_bench`, median, L2 flushed between runs) until the
   budget is spent; at least the first is always timed. A candidate that fails to compile or
   run is skipped (debug log). The fastest wins (ties: the earlier, i.e. the default).

Progress goes to stderr when it is a terminal, else one INFO line per tuned kernel. `timer`
replaces the benchmark (tests inject a fake one; it also enables tuning without a GPU).
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

import torch

from kiln.codegen.kernel import KernelSpec
from kiln.runtime.disk_cache import DiskCache, cache_key, versions
from kiln.runtime.launcher import Launcher, build_launchers

__all__ = ["autotune", "benchmark_ms", "cached_choice", "fastest", "fingerprint"]

log = logging.getLogger("kiln.runtime")

Timer = Callable[[Launcher, Sequence[torch.Tensor]], float]


def fingerprint(spec: KernelSpec) -> str:
    """What makes two candidates the same compiled kernel."""
    return cache_key(spec.source, spec.meta, spec.num_warps, getattr(spec, "num_stages", None))


def benchmark_ms(launcher: Launcher, args: Sequence[torch.Tensor]) -> float:
    """Median milliseconds of one launch (Triton's do_bench: L2 flushed before every run)."""
    from triton.testing import do_bench

    return float(do_bench(lambda: launcher(*args), warmup=10, rep=40, return_mode="median"))


def autotune(candidates: Sequence[KernelSpec], make_args: Callable[[], list[torch.Tensor]],
             budget_s: float = 10.0, *, key: str | None = None,
             timer: Timer | None = None) -> KernelSpec:
    """The fastest candidate (see the module docstring); `candidates[0]` is the default."""
    if not candidates:
        raise ValueError("autotune needs at least one candidate KernelSpec")
    label = key or candidates[0].name
    if len(candidates) == 1:
        return candidates[0]
    if timer is None and (os.environ.get("TRITON_INTERPRET") == "1"
                          or not torch.cuda.is_available()):
        log.info("autotune %s: no GPU to time on (Triton interpreter or no CUDA); using the "
                 "first of %d candidates unbenchmarked", label, len(candidates))
        return candidates[0]
    prints = [fingerprint(c) for c in candidates]
    cache = DiskCache("autotune")
    disk_key = cache_key("autotune", key, prints, versions())
    chosen = cached_choice(cache.get(disk_key), prints)
    if chosen is not None:
        log.info("autotune %s: cached choice %d of %d", label, chosen, len(candidates))
        return candidates[chosen]
    timings, complete = _benchmark_all(candidates, make_args, budget_s, timer or benchmark_ms,
                                       label)
    best = fastest(timings)
    if best is None:
        log.warning("autotune %s: no candidate ran; using the first", label)
        return candidates[0]
    cache.put(disk_key, {
        "choice": best, "fingerprint": prints[best], "label": label, "complete": complete,
        "timings_ms": [t if math.isfinite(t) else None for t in timings],
        "names": [c.name for c in candidates],
        "configs": [[list(c.meta), c.num_warps, getattr(c, "num_stages", None)]
                    for c in candidates],
    })
    _report(label, candidates, timings, best, complete)
    return candidates[best]


def cached_choice(payload: dict | None, prints: list[str]) -> int | None:
    """The index a disk-cache entry chose, when it names a candidate whose fingerprint is still
    `prints[index]` (autotune's configs, gemm_tuning's library call and templates)."""
    if payload is None:
        return None
    choice = payload.get("choice")
    if isinstance(choice, int) and not isinstance(choice, bool) and 0 <= choice < len(prints) \
            and payload.get("fingerprint") == prints[choice]:
        return choice
    log.debug("autotune: ignoring a cached entry that matches no candidate")
    return None


def fastest(timings: list[float]) -> int | None:
    """The index of the smallest finite timing; ties: the earlier candidate (None: none)."""
    finite = [(t, i) for i, t in enumerate(timings) if math.isfinite(t)]
    return min(finite)[1] if finite else None


def _benchmark_all(candidates: Sequence[KernelSpec], make_args: Callable[[], list],
                   budget_s: float, timer: Timer, label: str) -> tuple[list[float], bool]:
    """Milliseconds per candidate (inf: not timed or failed) and whether all were timed."""
    args = make_args()
    dtypes = {name: t.dtype for name, t in zip(candidates[0].args, args)}
    launchers = build_launchers(list(candidates), dtypes=dtypes)
    timings = [math.inf] * len(candidates)
    start = time.perf_counter()
    progress = _Progress(label, len(candidates))
    for i, launcher in enumerate(launchers):
        if i > 0 and time.perf_counter() - start > budget_s:
            log.info("autotune %s: budget of %.1f s spent after %d of %d candidates",
                     label, budget_s, i, len(candidates))
            progress.done()
            return timings, False
        timings[i] = _time_one(launcher, args, timer)
        progress.update(i + 1, min(timings))
    progress.done()
    return timings, True


def _time_one(launcher: Launcher, args: Sequence[torch.Tensor], timer: Timer) -> float:
    try:
        return float(timer(launcher, args))
    except Exception as exc:  # out of resources, bad config: not a reason to fail the compile
        log.debug("autotune: %s failed: %s: %s", launcher.name, type(exc).__name__, exc)
        return math.inf


class _Progress:
    """A one-line progress display on a terminal; silent otherwise."""

    def __init__(self, label: str, total: int):
        self.label, self.total = label, total
        self.live = sys.stderr.isatty()

    def update(self, done: int, best_ms: float) -> None:
        if self.live:
            best = f"{best_ms * 1e3:.1f} us" if math.isfinite(best_ms) else "-"
            sys.stderr.write(f"\r[kiln autotune] {self.label}: {done}/{self.total}, "
                             f"best {best}")
            sys.stderr.flush()

    def done(self) -> None:
        if self.live:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _report(label: str, candidates: Sequence[Any], timings: list[float], best: int,
            complete: bool) -> None:
    table = ", ".join(f"{dict(c.meta)}/w{c.num_warps}: "
                      + (f"{t * 1e3:.1f}us" if math.isfinite(t) else "-")
                      for c, t in zip(candidates, timings))
    log.info("autotune %s: chose %d of %d%s (%s)", label, best, len(candidates),
             "" if complete else " (budget spent)", table)
