"""`python -m kiln bench`: the built-in suite's models under eager, kiln and (with
`--compare torch`) torch.compile, side by side in one run.

Per model and variant (one row each): an accuracy verdict against eager and against an fp64
reference, the median time of one step, the speedup over eager, the compile time, the first
call, the recompile time in the warm process, peak memory and its ratio to eager's, kiln's
graph and break counts, and the input shapes.
Rendering (table, CSV, JSON, plot, summary line) lives in `kiln.tools.bench_report`.

Accuracy. Every tensor a step produces (inference: the outputs; training: the loss and every
parameter's gradient) is compared as a normalized error, max|x - ref| / max|ref| (with 1e-3 of
the largest reference magnitude as the least denominator), and the worst tensor counts. The fp64 reference is the model run in float64 on a CPU copy. A compiled variant
passes when its fp64 error is at most max(1.5 x eager's own fp64 error, floor) and its error
against eager is at most max(2 x eager's fp64 error, floor) (the floor per dtype is `FLOORS`).

Compile time (one definition, `kiln.tools.compile_time`): for kiln, the stages it recorded during
the first call after `kiln.reset()` (capture, autograd, lower+schedule, codegen, kernel compile),
summed; for torch.compile, which records no kiln stages, the first call minus a steady call.
"first call": the wall time of that first call (= compile + first run). "recompile (warm
process)": the compile time again after another reset, on a fresh copy of the model.

Timing: `triton.testing.do_bench` medians on CUDA; medians of `--repeat` timeit runs on the CPU.

Peak memory: of one warm step, above what was allocated before it (what the step keeps, its
outputs and gradients, included): `torch.cuda.max_memory_allocated` on CUDA (with the library
workspaces it sees); on the CPU `kiln.tools.memory_meter` (live tensor storages, no library
scratch; cycles collected when Triton's interpreter runs kiln's kernels, which leaves each
launch's arguments in a reference cycle). `mem_ratio` is a variant's peak / eager's.
A crash in one model or variant is caught and reported in its row as "error: <type>: <msg>".
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import torch

from kiln import api
from kiln.tools.compile_time import timed_first_call
from kiln.tools.explain import explain
from kiln.tools.memory_meter import measure_peak
from kiln.tools.suite.model_registry import SUITE, ModelSpec, get, infer, train_step

__all__ = ["COLUMNS", "FLOORS", "MODES", "BenchConfig", "input_shapes", "max_error", "run_bench",
           "step_outputs", "unknown_models"]

MODES = ("default", "max-autotune")
# max-autotune adds CUDA graphs (torch's and, since kiln.runtime.cudagraphs, kiln's): the bench
# measures both compilers' kernels and launches without them, like with like, comparable with
# earlier results (torch's graph outputs are also overwritten by the next call, so the accuracy
# check could not hold them). mode="reduce-overhead" is not benched yet.
TORCH_MODES = {"max-autotune": "max-autotune-no-cudagraphs"}
KILN_MODES = TORCH_MODES

FLOORS = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 1e-2,
          torch.float16: 1e-3}
COLUMNS = ("model", "variant", "input", "verdict", "err_vs_eager", "err_vs_fp64", "median_ms",
           "speedup", "compile_s", "first_call_s", "recompile_warm_s", "peak_mem_mb",
           "mem_ratio", "graphs", "breaks")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What one bench run measures. backend: a registered kiln backend name or a callable
    `(gm, example_inputs) -> callable`; mode: None, "default" or "max-autotune", given to
    kiln.compile (which hands it to backends that take `mode=`) and to torch.compile
    ("max-autotune" as "max-autotune-no-cudagraphs" to both: CUDA graphs off, like with like);
    compare: ("torch",) adds torch.compile."""
    models: tuple[str, ...] = tuple(SUITE)
    backend: Any = "eager"
    mode: str | None = None
    dtype: torch.dtype = torch.float32
    train: bool = False
    size: str = "small"
    compare: tuple[str, ...] = ()
    repeat: int = 5
    device: str = "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def variants(self) -> tuple[str, ...]:
        return ("eager", "kiln") + (("torch.compile",) if "torch" in self.compare else ())


# --- one step and its outputs ----------------------------------------------------------------

def step_outputs(model: Any, batch: Any, spec: ModelSpec, train: bool) -> list[torch.Tensor]:
    """One step from fresh gradients; the tensors it produces (outputs, or loss + gradients)."""
    if not train:
        return _flatten(infer(model, batch))
    params = list(model.parameters())
    for p in params:
        p.grad = None
    loss = train_step(model, batch, spec.loss)
    return [loss] + [p.grad for p in params if p.grad is not None]


def _flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.detach()]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _flatten(item)]
    return []


def max_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """Worst normalized error max|g - r| / max(max|r|, 1e-3 * M) over paired tensors, compared
    in float64, where M is the largest magnitude of any reference tensor: a tensor whose true
    value is ~0 (the gradient of an attention key bias) is judged on the common scale."""
    if len(got) != len(ref):
        return float("inf")
    floats = [r.detach().abs().max().item() for r in ref
              if r.is_floating_point() and r.numel()]
    common = 1e-3 * max(floats, default=0.0)
    worst = 0.0
    for g, r in zip(got, ref):
        if g.shape != r.shape:
            return float("inf")
        g64, r64 = g.detach().cpu().double(), r.detach().cpu().double()
        if not r64.is_floating_point() or r64.numel() == 0:
            worst = max(worst, 0.0 if torch.equal(g64, r64) else float("inf"))
            continue
        scale = max(r64.abs().max().item(), common, 1e-12)
        err = (g64 - r64).abs().max().item() / scale
        worst = max(worst, err if not math.isnan(err) else float("inf"))  # NaN counts as a failure
    return worst


# --- timing and memory -------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fns: dict[str, Callable[[], Any]], device: str, repeat: int) -> dict[str, float]:
    """Median milliseconds per call of each fn: do_bench on CUDA; on the CPU, medians of `repeat`
    timeit runs of enough calls to take ~20 ms each, interleaved across the fns so that load from
    other processes hits every variant alike."""
    if device == "cuda":
        import triton.testing
        return {k: float(triton.testing.do_bench(fn, warmup=5, rep=100, return_mode="median"))
                for k, fn in fns.items()}
    number = {}
    for label, fn in fns.items():
        fn()
        once = min(timeit.repeat(fn, number=1, repeat=3))
        number[label] = max(1, min(100, int(0.02 / max(once, 1e-6))))
    runs: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(max(1, repeat)):
        for label, fn in fns.items():
            runs[label].append(timeit.timeit(fn, number=number[label]) / number[label] * 1e3)
    return {label: statistics.median(v) for label, v in runs.items()}


def _peak_mb(fn: Callable[[], Any], device: str) -> float | None:
    if device != "cuda":
        interpreting = os.environ.get("TRITON_INTERPRET") == "1"
        return measure_peak(fn, keep_result=False, collect_cycles=interpreting).peak_mb
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _first_call_s(step: Callable[[], Any], device: str) -> tuple[float, Any]:
    _sync(device)
    start = time.perf_counter()
    out = step()
    _sync(device)
    return time.perf_counter() - start, out


def _compile_s(step: Callable[[], Any], device: str) -> tuple[Any, float, dict[str, float]]:
    """The first call: its outputs, wall seconds, and kiln's recorded compile stages."""
    _sync(device)
    out, wall, stages = timed_first_call(lambda: (step(), _sync(device))[0])
    return out, wall, stages


def _compile_total(variant: str, first_s: float, stages: dict[str, float],
                   step: Callable[[], Any], device: str) -> float:
    """kiln: the recorded stages' sum; torch.compile (no kiln records): first minus steady."""
    if variant == "kiln":
        return sum(stages.values())
    return max(first_s - _steady_s(step, device), 0.0)


def input_shapes(inputs: Iterable[Any]) -> list[list[int]]:
    """The shape of each tensor input, e.g. [[2, 16, 64]]."""
    return [list(t.shape) for t in inputs if isinstance(t, torch.Tensor)]


def _steady_s(step: Callable[[], Any], device: str) -> float:
    times = []
    for _ in range(3):
        times.append(_first_call_s(step, device)[0])
    return statistics.median(times)


# --- variants ---------------------------------------------------------------------------------

def _reset_all() -> None:
    api.reset()
    torch._dynamo.reset()


def _compile(variant: str, model: torch.nn.Module, config: BenchConfig) -> Any:
    if variant == "kiln":
        return api.compile(model, backend=config.backend,
                           mode=KILN_MODES.get(config.mode, config.mode))
    if variant == "torch.compile":
        return torch.compile(model, mode=TORCH_MODES.get(config.mode, config.mode))
    return model


def _graph_counts(variant: str, model: torch.nn.Module, batch: Any,
                  train: bool) -> tuple[int | None, int | None]:
    if variant == "eager":
        return None, None
    model.train(train)
    with torch.set_grad_enabled(train):
        if variant == "kiln":
            report = explain(model)(*batch.inputs)
        else:
            report = torch._dynamo.explain(model)(*batch.inputs)
    return report.graph_count, report.graph_break_count


@dataclasses.dataclass
class _Reference:
    """Per model: the base model and batch, eager's outputs and time, and the fp64 outputs."""
    spec: ModelSpec
    model: torch.nn.Module
    batch: Any
    eager_out: list[torch.Tensor]
    fp64_out: list[torch.Tensor]
    eager_ms: float = 0.0
    eager_peak: float | None = None


def _reference(spec: ModelSpec, config: BenchConfig) -> _Reference:
    torch.manual_seed(0)
    model, batch = spec.build(config.size, config.device, config.dtype)
    model64 = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)
    fp64_out = step_outputs(model64, batch.to("cpu", torch.float64), spec, config.train)
    eager_out = step_outputs(copy.deepcopy(model), batch, spec, config.train)
    return _Reference(spec, model, batch, eager_out, fp64_out)


def _measure(variant: str, ref: _Reference,
             config: BenchConfig) -> tuple[dict, Callable[[], Any]]:
    """One row without its time: compile (cold, then warm), check accuracy on the first call's
    outputs, peak memory; and the step to time."""
    spec, batch, device, train = ref.spec, ref.batch, config.device, config.train
    row: dict[str, Any] = {"model": spec.name, "variant": variant,
                           "input": input_shapes(batch.inputs)}
    _reset_all()
    model = _compile(variant, copy.deepcopy(ref.model), config)
    run = lambda: step_outputs(model, batch, spec, train)
    out, row["first_call_s"], stages = _compile_s(run, device)
    if variant != "eager":
        row["compile_s"] = _compile_total(variant, row["first_call_s"], stages, run, device)
        row["compile_stages"] = stages
    row["err_vs_eager"] = max_error(out, ref.eager_out)
    row["err_vs_fp64"] = max_error(out, ref.fp64_out)
    row["peak_mem_mb"] = _peak_mb(run, device)
    if variant != "eager":
        _reset_all()
        fresh = _compile(variant, copy.deepcopy(ref.model), config)
        rerun = lambda: step_outputs(fresh, batch, spec, train)
        _, warm_first, warm_stages = _compile_s(rerun, device)
        row["recompile_warm_s"] = _compile_total(variant, warm_first, warm_stages, rerun,
                                                 device)
        _reset_all()
        row["graphs"], row["breaks"] = _graph_counts(variant, copy.deepcopy(ref.model), batch,
                                                     train)
    return row, run


def _verdict(row: dict, eager_err64: float, dtype: torch.dtype) -> str:
    if row["variant"] == "eager":
        return "pass"
    floor = FLOORS.get(dtype, 1e-4)
    ok64 = row["err_vs_fp64"] <= max(1.5 * eager_err64, floor)
    ok_eager = row["err_vs_eager"] <= max(2.0 * eager_err64, floor)
    if ok64 and ok_eager:
        return "pass"
    which = [name for name, ok in (("fp64", ok64), ("eager", ok_eager)) if not ok]
    return "fail (vs " + ", ".join(which) + ")"


def _error_row(model: str, variant: str, exc: BaseException) -> dict:
    message = " ".join(str(exc).split())[:200]
    return {"model": model, "variant": variant,
            "verdict": f"error: {type(exc).__name__}: {message}"}


def _bench_model(name: str, config: BenchConfig,
                 specs: dict[str, ModelSpec] | None) -> list[dict]:
    try:
        if specs is not None and name not in specs:
            raise KeyError(f"no model {name!r}; the suite has {sorted(specs)}")
        ref = _reference(get(name) if specs is None else specs[name], config)
    except Exception as exc:  # noqa: BLE001  (a broken model is reported, never fatal)
        return [_error_row(name, v, exc) for v in config.variants]
    rows, steps = [], {}
    for variant in config.variants:
        try:
            row, steps[variant] = _measure(variant, ref, config)
        except Exception as exc:  # noqa: BLE001
            _reset_all()
            row = _error_row(name, variant, exc)
        rows.append(row)
    try:
        times = median_ms(steps, config.device, config.repeat)
    except Exception as exc:  # noqa: BLE001
        return [_error_row(name, v, exc) for v in config.variants]
    _finish_rows(rows, times, config.dtype)
    return rows


def _finish_rows(rows: list[dict], times: dict[str, float], dtype: torch.dtype) -> None:
    """Verdicts, times, speedups and memory ratios, all relative to the eager row."""
    eager = next((r for r in rows if r["variant"] == "eager" and "verdict" not in r), None)
    for row in rows:
        if "verdict" in row:
            continue  # an error row
        row["median_ms"] = times[row["variant"]]
        if eager is None:
            row["verdict"] = "error: RuntimeError: eager failed; nothing to compare against"
            continue
        row["verdict"] = _verdict(row, eager["err_vs_fp64"], dtype)
        row["speedup"] = times["eager"] / row["median_ms"]
        if eager.get("peak_mem_mb") and row.get("peak_mem_mb") is not None:
            row["mem_ratio"] = row["peak_mem_mb"] / eager["peak_mem_mb"]


def run_bench(config: BenchConfig, specs: dict[str, ModelSpec] | None = None,
              progress: TextIO | None = sys.stderr) -> list[dict]:
    """Every model in `config.models` under every variant; one dict per (model, variant) with
    the keys of `COLUMNS` (missing measurements are None). `specs` defaults to the suite and
    its families (`model_registry.get`)."""
    rows: list[dict] = []
    for i, name in enumerate(config.models):
        start = time.perf_counter()
        if progress is not None:
            print(f"[{i + 1}/{len(config.models)}] {name} ...", file=progress, flush=True)
        model_rows = _bench_model(name, config, specs)
        rows.extend({**{col: row.get(col) for col in COLUMNS},
                     "compile_stages": row.get("compile_stages")} for row in model_rows)
        if progress is not None:
            verdicts = ", ".join(f"{r['variant']} {r['verdict']}" for r in model_rows)
            print(f"[{i + 1}/{len(config.models)}] {name} done in "
                  f"{time.perf_counter() - start:.1f} s: {verdicts}", file=progress, flush=True)
    _reset_all()
    return rows


def unknown_models(models: Iterable[str], specs: dict[str, ModelSpec] | None = None) -> list[str]:
    """The names in `models` that the suite (or `specs`) does not have. The suite's families
    (`hf:<arch>`, `timm:<name>`) are looked up by `model_registry.get`."""
    if specs is not None:
        return [m for m in models if m not in specs]
    unknown = []
    for m in models:
        try:
            get(m)
        except KeyError:
            unknown.append(m)
    return unknown


def parse_models(text: str | None) -> tuple[str, ...]:
    return tuple(SUITE) if not text else tuple(m.strip() for m in text.split(",") if m.strip())


def names(rows: Iterable[dict]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))
