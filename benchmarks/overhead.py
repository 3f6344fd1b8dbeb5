"""Per-call overhead of capture: eager vs kiln.compile(backend="eager") vs
torch.compile(backend="eager"), side by side in one process.

Cases (steady state, after warm-up):
  add_mul     `a + b * c` on three tiny tensors
  seed_block  the seed TransformerBlock at d_model 64, nhead 4, x [2, 16, 64], eval + no_grad

Per case: median µs per call over `--repeat` timeit runs of `--iters` calls, the overhead each
compiler adds over eager, and kiln_overhead / torch_overhead. With the eager backend the graph
runs the same torch ops, so the difference is the wrapper: guards, dispatch, graph call.

Also measured: the first call (cold: capture + backend, after kiln.reset() / torch._dynamo.reset())
and the steady-state call of the seed block at full width (d_model 1024, nhead 16, seq 512), batch
`--capture-batch` (default 32 on CUDA, 2 on CPU; capture works on fake tensors, so its cost does
not depend on the batch, but the eager compute inside the first call does). Reported separately,
never subtracted silently: capture_s_est = first_call_s - steady_call_s.

Usage: python benchmarks/overhead.py [--iters N] [--repeat R] [--json PATH] [--capture-batch B]
Prints a markdown table; writes JSON (default benchmarks/out/overhead.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit
from typing import Any, Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import kiln  # noqa: E402


from kiln.tools.seed_model import TransformerBlock  # noqa: E402  (the seed's block)


def add_mul(a, b, c):
    return a + b * c


# --- timing ---------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_per_call_us(fns: dict[str, Callable[[], Any]], device: str, iters: int,
                     repeat: int) -> dict[str, dict]:
    """Median (and min) µs per call of each fn over `repeat` runs of `iters` calls. Runs are
    interleaved (eager, kiln, torch, eager, ...) so that load from other processes hits every
    variant alike; each run ends with a device synchronize."""
    def run(fn):
        def loop():
            for _ in range(iters):
                fn()
            _sync(device)
        return loop

    loops = {label: run(fn) for label, fn in fns.items()}
    for loop in loops.values():  # warm-up
        for _ in range(3):
            loop()
    per_call: dict[str, list[float]] = {label: [] for label in loops}
    for _ in range(repeat):
        for label, loop in loops.items():
            per_call[label].append(timeit.timeit(loop, number=1) / iters * 1e6)
    return {label: {"median_us": statistics.median(v), "min_us": min(v)}
            for label, v in per_call.items()}


def _reset_all() -> None:
    kiln.reset()
    torch._dynamo.reset()


def _graph_summary(fn: Callable, args: tuple) -> dict:
    """How kiln captures the case (so a silent eager fallback is never timed as 'compiled')."""
    try:
        out = kiln.explain(fn)(*args)
        return {"graphs": out.graph_count, "breaks": out.graph_break_count,
                "break_reasons": [r.render() for r in out.break_reasons]}
    except Exception as e:  # explain is reported, not required, by this benchmark
        return {"graphs": None, "breaks": None, "error": f"{type(e).__name__}: {e}"[:300]}


class GraphRecorder:
    """A backend identical to "eager" that keeps the graph and its (real) example inputs, so the
    graph alone can be timed: compiled call − graph call = the wrapper's own cost (guards,
    dispatch, argument lifting)."""

    def __init__(self) -> None:
        self.graphs: list[tuple[Any, list]] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return gm.forward

    def graph_call(self) -> Callable[[], Any] | None:
        if len(self.graphs) != 1:
            return None
        gm, inputs = self.graphs[0]
        forward = gm.forward  # what the "eager" backend hands back
        return lambda: forward(*inputs)


def _recorded_graph(compile_fn: Callable, eager_fn: Callable, args: tuple):
    recorder = GraphRecorder()
    try:
        compile_fn(eager_fn, backend=recorder)(*args)
    except Exception:
        return None
    return recorder.graph_call()


def bench_case(name: str, eager_fn: Callable, make_args: Callable[[], tuple], device: str,
               iters: int, repeat: int, no_grad: bool) -> dict:
    args = make_args()
    grad = torch.no_grad() if no_grad else torch.enable_grad()
    row: dict[str, Any] = {"case": name}
    with grad:
        ref = eager_fn(*args)
        variants = {"eager": eager_fn}
        _reset_all()
        row["kiln_capture"] = _graph_summary(eager_fn, args)
        _reset_all()
        try:
            variants["kiln"] = kiln.compile(eager_fn, backend="eager")
        except Exception as e:
            row["kiln"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        variants["torch"] = torch.compile(eager_fn, backend="eager")
        timed = {}
        for label, fn in variants.items():
            try:
                out = fn(*args)  # first call compiles
                # never time a wrong result; graphs may take another (equally valid) kernel path
                torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
                row[f"{label}_max_abs_err"] = (out - ref).abs().max().item()
                timed[label] = lambda fn=fn: fn(*args)
            except Exception as e:
                row[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
        for label, compile_fn in (("kiln_graph", kiln.compile), ("torch_graph", torch.compile)):
            graph = _recorded_graph(compile_fn, eager_fn, args)
            if graph is not None:
                timed[label] = graph
        row.update(time_per_call_us(timed, device, iters, repeat))
    # overhead from medians (the headline) and from minima (robust to load from other processes)
    for stat, suffix in (("median_us", ""), ("min_us", "_min")):
        base = row["eager"].get(stat)
        for label in ("kiln", "torch"):
            t = row.get(label, {}).get(stat)
            row[f"{label}_overhead_us{suffix}"] = None if t is None or base is None else t - base
        k, t = row.get(f"kiln_overhead_us{suffix}"), row.get(f"torch_overhead_us{suffix}")
        row[f"kiln_over_torch_overhead{suffix}"] = None if k is None or not t else k / t
    # the wrapper alone: compiled call minus a direct call of the same captured graph
    for label in ("kiln", "torch"):
        t = row.get(label, {}).get("median_us")
        g = row.get(f"{label}_graph", {}).get("median_us")
        row[f"{label}_wrapper_us"] = None if t is None or g is None else t - g
    k, t = row.get("kiln_wrapper_us"), row.get("torch_wrapper_us")
    row["kiln_over_torch_wrapper"] = None if k is None or not t else k / t
    return row


def bench_first_call(device: str, batch: int, steady_iters: int = 3) -> dict:
    """Cold first call vs steady-state call of the full-width seed block (eval + no_grad)."""
    torch.manual_seed(0)
    model = TransformerBlock(1024, 16).to(device).eval()
    x = torch.randn(batch, 512, 1024, device=device)
    row: dict[str, Any] = {"case": "seed_block_full_first_call", "shape": list(x.shape)}
    with torch.no_grad():
        model(x)  # warm torch's own kernels before anything is timed
        _sync(device)
        row["eager_call_s"] = _steady_s(model, x, device, steady_iters)
        for label, make in (("kiln", lambda: kiln.compile(model, backend="eager")),
                            ("torch", lambda: torch.compile(model, backend="eager"))):
            _reset_all()
            try:
                compiled = make()
                t0 = time.perf_counter()
                compiled(x)
                _sync(device)
                first = time.perf_counter() - t0
                steady = _steady_s(compiled, x, device, steady_iters)
                row[label] = {"first_call_s": first, "steady_call_s": steady,
                              "capture_s_est": first - steady}
            except Exception as e:
                row[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
        _reset_all()
        try:
            times = kiln.explain(model)(x).compile_times
            row["kiln_explain_compile_times"] = (times if isinstance(times, (str, dict))
                                                 else str(times))
        except Exception as e:
            row["kiln_explain_compile_times"] = f"error: {type(e).__name__}: {e}"[:300]
    return row


def _steady_s(fn: Callable, x: torch.Tensor, device: str, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(x)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- report ---------------------------------------------------------------------------------------

def _fmt(v: Any, spec: str = ".2f") -> str:
    return "—" if v is None else format(v, spec)


def markdown(rows: list[dict], first: dict) -> str:
    lines = [
        "| case | kiln graphs/breaks | eager µs | kiln µs | torch.compile µs "
        "| kiln overhead µs | torch overhead µs | kiln/torch overhead | same, from minima |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cap = r["kiln_capture"]
        lines.append(
            f"| {r['case']} | {cap.get('graphs', '—')}/{cap.get('breaks', '—')} "
            f"| {_fmt(r['eager'].get('median_us'))} | {_fmt(r.get('kiln', {}).get('median_us'))} "
            f"| {_fmt(r['torch'].get('median_us'))} | {_fmt(r.get('kiln_overhead_us'))} "
            f"| {_fmt(r.get('torch_overhead_us'))} | {_fmt(r.get('kiln_over_torch_overhead'))} "
            f"| {_fmt(r.get('kiln_overhead_us_min'))} / {_fmt(r.get('torch_overhead_us_min'))} "
            f"= {_fmt(r.get('kiln_over_torch_overhead_min'))} |")
    lines += [
        "",
        "Wrapper cost alone (compiled call − direct call of the same captured graph; the graph "
        "can be faster than eager because it skips eager's Python, e.g. module __call__):",
        "",
        "| case | kiln graph µs | kiln wrapper µs | torch graph µs | torch wrapper µs "
        "| kiln/torch wrapper |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {_fmt(r.get('kiln_graph', {}).get('median_us'))} "
            f"| {_fmt(r.get('kiln_wrapper_us'))} "
            f"| {_fmt(r.get('torch_graph', {}).get('median_us'))} "
            f"| {_fmt(r.get('torch_wrapper_us'))} | {_fmt(r.get('kiln_over_torch_wrapper'))} |")
    for r in rows:
        for label in ("kiln", "torch"):
            if "error" in r.get(label, {}):
                lines.append(f"\n{r['case']} {label}: {r[label]['error']}")
        if r["kiln_capture"].get("break_reasons"):
            lines.append(f"\n{r['case']} kiln breaks: {r['kiln_capture']['break_reasons']}")
    if first.get("skipped"):
        return "\n".join(lines)
    lines += [
        "",
        f"Full-width seed block, input {first['shape']} (eval, no_grad): "
        f"eager call {first['eager_call_s'] * 1e3:.1f} ms",
        "",
        "| compiler | first call s | steady call s | first − steady s |",
        "|---|---|---|---|",
    ]
    for label in ("kiln", "torch"):
        r = first[label]
        if "error" in r:
            lines.append(f"| {label} | error: {r['error'][:80]} | | |")
        else:
            lines.append(f"| {label} | {r['first_call_s']:.3f} | {r['steady_call_s']:.4f} "
                         f"| {r['capture_s_est']:.3f} |")
    lines.append(f"\nkiln.explain compile_times: {first.get('kiln_explain_compile_times')}")
    return "\n".join(lines)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except Exception:
        return None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=1000, help="calls per timed run")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per variant (median taken)")
    p.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "out", "overhead.json"))
    p.add_argument("--capture-batch", type=int, default=None,
                   help="batch of the full-width first-call case (default: 32 on CUDA, 2 on CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1 on CPU: per-call overhead is Python time, "
                        "and one thread keeps other processes' load from stalling the kernels)")
    p.add_argument("--skip-first-call", action="store_true")
    args = p.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = args.threads or (1 if device == "cpu" else torch.get_num_threads())
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    block = TransformerBlock(64, 4).to(device).eval()
    cases = [
        ("add_mul", add_mul, lambda: tuple(torch.randn(8, device=device) for _ in range(3)), False),
        ("seed_block", block, lambda: (torch.randn(2, 16, 64, device=device),), True),
    ]
    rows = [bench_case(name, fn, make, device, args.iters, args.repeat, no_grad)
            for name, fn, make, no_grad in cases]
    batch = args.capture_batch or (32 if device == "cuda" else 2)
    first = ({"case": "seed_block_full_first_call", "skipped": True}
             if args.skip_first_call else bench_first_call(device, batch))

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor()
        or platform.machine(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": _commit(),
        "threads": threads,
        "iters": args.iters,
        "repeat": args.repeat,
        "overhead": rows,
        "first_call": first,
    }
    print(f"# capture overhead — {result['device']}, torch {result['torch']}, "
          f"Python {result['python']}, commit {result['commit']}, {threads} CPU thread(s)\n")
    print(markdown(rows, first))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\nwrote {args.json}")
    return result


if __name__ == "__main__":
    main()
