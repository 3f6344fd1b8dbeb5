"""Runtime measurements on a GPU: per-launch CPU cost, parallel kernel compile, autotune.

1. launch: µs of CPU time per launch of a small pointwise kernel (`x + 1` on 1024 floats), by
   route: Triton's `fn[grid](...)`, kiln's generic route, kiln's bound launcher (with and without
   a stream passed), the bound function itself, the CompiledKernel's C launcher called with
   precomputed integers (the floor), and eager `torch.add(out=)` for scale. Launches are timed
   in bursts shorter than the launch queue, synchronized between bursts; median per launch.
2. compile: `build_launchers` on ~12 distinct kernels in fresh processes with fresh Triton and
   kiln caches, once per compile mode (serial / thread / process), then again warm (same caches:
   Triton's disk cache hits). Every built kernel is checked against eager.
3. autotune: a row-max reduction's candidate configs on [8192, 1024] fp32: the choice, timings,
   seconds; a second call must return the same config from disk without benchmarking.

Usage: python benchmarks/launch_overhead.py [--json PATH]   (needs CUDA)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402


def _graph_kernels(fn: Callable, *inputs: torch.Tensor):
    from kiln.codegen import emit_kernel
    from kiln.lower import lower_graph
    from kiln.lower.decomposition_tables import trace_aten

    graph = lower_graph(trace_aten(fn, *inputs))
    specs = [emit_kernel(node, graph) for node in graph.computed]
    dtypes = {name: buf.dtype for name, buf in graph.buffers.items()}
    return graph, specs, dtypes


def many_ops(x, y):
    """~12 unfused kernels of distinct sources (one per computed buffer)."""
    a = torch.sigmoid(x * y)
    b = torch.exp(a) - y
    c = torch.tanh(b) * 3
    d = c.sum(-1)
    e = (x / (d[:, None] + 5)).relu()
    f = torch.where(e > 0.1, e, torch.cos(y))
    g = f.amax(-1) + d
    h = torch.log1p(f.abs()) * torch.sin(x)
    i = torch.softmax(h, -1)
    j = (i * 2 + torch.erf(x)).to(torch.bfloat16)
    return a, b, c, e, f, g, h, j, i.amin(0), (x * y).sum(0), torch.sqrt(x.abs()).amax(0)


# -- 1. launch overhead ----------------------------------------------------------------------

def _per_launch_us(launch: Callable[[], Any], bursts: int = 30, burst: int = 200) -> float:
    for _ in range(50):
        launch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(bursts):
        start = time.perf_counter()
        for _ in range(burst):
            launch()
        samples.append((time.perf_counter() - start) / burst * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def measure_launch() -> dict:
    from kiln.runtime.launcher import build_launchers

    x = torch.randn(1024, device="cuda")
    _, (spec,), dtypes = _graph_kernels(lambda x: x + 1, x.cpu())
    (lc,) = build_launchers([spec], dtypes=dtypes)
    out = torch.empty(1024, device="cuda")
    lc(x, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + 1)
    assert lc.fast, f"launcher not bound: {lc!r}"
    kernel, fn, grid = lc.kernel, lc.fn, lc.grid
    stream = torch.cuda.current_stream().cuda_stream
    px, po = x.data_ptr(), out.data_ptr()
    meta, options = lc.meta, lc.options
    run_args = lc.positional([px, po])
    routes = {
        "triton fn[grid](tensors)": lambda: fn[grid](x, out, **meta, **options),
        "kiln generic route (storage views + fn[grid])": lambda: lc._generic_launch(x, out),
        "kiln launcher(x, out)": lambda: lc(x, out),
        "kiln launcher(x, out, stream=s)": lambda: lc(x, out, stream=stream),
        "kiln bound function (launcher._launch)": lambda: lc._launch(x, out),
        "CompiledKernel.run, precomputed ints (floor)": lambda: kernel.run(
            grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None,
            None, None, *run_args),
        "eager torch.add(x, 1, out=out)": lambda: torch.add(x, 1, out=out),
    }
    result = {name: round(_per_launch_us(launch), 2) for name, launch in routes.items()}
    lc(x, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + 1)
    from triton.testing import do_bench
    result["gpu time of the kernel (do_bench median, us)"] = round(
        do_bench(lambda: lc(x, out), return_mode="median") * 1e3, 2)
    result["launcher source"] = lc.source
    return result


# -- 2. compile: one build per fresh process ---------------------------------------------------

def compile_once() -> dict:
    """In a fresh process: build the many_ops kernels (mode from KILN_COMPILE_MODE)."""
    from kiln.codegen.triton_build import run_graph
    from kiln.runtime.launcher import build_launchers, compile_mode
    import triton
    from triton.runtime.driver import driver

    torch.cuda.init()
    driver.active.get_current_target()  # CUDA and driver setup: not compile time
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    graph, specs, dtypes = _graph_kernels(many_ops, x, y)
    mode = compile_mode(True, len(specs))
    start = time.perf_counter()
    launchers = build_launchers(specs, dtypes=dtypes)
    seconds = time.perf_counter() - start
    got = run_graph(graph, [x.cuda(), y.cuda()],
                    {lc.spec.writes[0]: lc for lc in launchers})
    for g, w in zip(got, many_ops(x.cuda(), y.cuda())):
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)
    return {"mode": mode, "kernels": len(specs), "seconds": round(seconds, 3),
            "bound": sum(lc.fast for lc in launchers),
            "async_compile_mode": hasattr(triton, "AsyncCompileMode")}


def measure_compile() -> list[dict]:
    rows = []
    for mode in ("serial", "thread", "process"):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, KILN_COMPILE_MODE=mode, KILN_CACHE_DIR=tmp,
                       TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
                       KILN_CODEGEN_CACHE_DIR=os.path.join(tmp, "kernels"))
            for state in ("cold", "warm"):
                out = subprocess.run([sys.executable, __file__, "--compile-once"], env=env,
                                     capture_output=True, text=True, timeout=150)
                if out.returncode != 0:
                    rows.append({"mode": mode, "state": state, "error": out.stderr[-2000:]})
                    break
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append({**row, "state": state})
                print(rows[-1], flush=True)
    return rows


# -- 3. autotune -----------------------------------------------------------------------------

def measure_autotune() -> dict:
    from kiln.codegen import candidate_configs, emit_group
    from kiln.lower import lower_graph
    from kiln.lower.decomposition_tables import trace_aten
    from kiln.runtime.autotune import autotune
    from kiln.runtime.launcher import build_launchers
    from kiln.schedule import trivial_schedule

    def fn(x):
        return (x * 2).amax(-1)

    x = torch.randn(8192, 1024)
    graph = lower_graph(trace_aten(fn, x))
    (group,) = trivial_schedule(graph).steps
    cands = [emit_group(group, graph, c) for c in candidate_configs(group, graph)]
    xg = x.cuda()

    def make_args():
        return [xg, torch.empty(8192, device="cuda")]

    timed = []

    def timer(launcher, args):
        from kiln.runtime.autotune import benchmark_ms
        ms = benchmark_ms(launcher, args)
        timed.append((launcher.spec.config.short() if launcher.spec.config else launcher.name,
                       round(ms * 1e3, 2)))
        return ms

    start = time.perf_counter()
    best = autotune(cands, make_args, budget_s=20.0, timer=timer)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    again = autotune(cands, make_args, budget_s=20.0,
                     timer=lambda *a: (_ for _ in ()).throw(AssertionError("re-benchmarked")))
    second_s = time.perf_counter() - start
    (lc,) = build_launchers([best], dtypes={n: torch.float32 for n in best.args})
    args = make_args()
    lc(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(args[1], fn(xg))
    return {"candidates": len(cands), "timed_us": timed, "chosen": cands.index(best),
            "chosen_config": best.config.short() if best.config else best.name,
            "default_config": cands[0].config.short() if cands[0].config else cands[0].name,
            "first_call_s": round(first_s, 3), "cached_call_s": round(second_s, 4),
            "same_choice": again is best}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "out",
                                                       "launch_overhead.json"))
    parser.add_argument("--compile-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_once:
        print(json.dumps(compile_once()))
        return
    if not torch.cuda.is_available():
        sys.exit("launch_overhead.py needs CUDA")
    import triton
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "triton": triton.__version__, "python": sys.version.split()[0]}
    for name, section in (("launch_us", measure_launch), ("compile", measure_compile),
                          ("autotune", measure_autotune)):
        try:
            report[name] = section()
        except Exception as exc:  # report what failed, keep measuring the rest
            import traceback
            report[name] = {"error": traceback.format_exc()[-3000:]}
            print(f"{name} failed: {exc}", file=sys.stderr)
        print(json.dumps({name: report[name]}, indent=1), flush=True)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
