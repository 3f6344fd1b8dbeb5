"""GPU checks of generated kernels at full size (H200): correctness and timing of the column-sum
bias gradient ([16384, 1024] bf16, vs torch.sum(dim=0)) and the fused residual + LayerNorm
kernel ([16384, 1024] bf16, vs eager add + layer_norm), for every candidate config and a sweep.

Skipped without CUDA. Prints a table (run with -s); with KILN_BENCH_OUT set, also writes the
numbers as JSON there.
"""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from kiln.codegen import KernelConfig, candidate_configs, emit_group  # noqa: E402
from kiln.codegen.triton_build import compile_kernel  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.schedule import FusedGroup  # noqa: E402

# KILN_BENCH_SMALL=1 dry-runs the same code on tiny shapes (CPU interpreter, no timing)
SMALL = os.environ.get("KILN_BENCH_SMALL") == "1"
ROWS, COLS = (64, 32) if SMALL else (16384, 1024)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RESULTS: dict[str, dict] = {}


def _bench(fn) -> float:
    import triton.testing

    if SMALL:
        fn()
        return 0.0
    return triton.testing.do_bench(fn, warmup=10, rep=60) * 1000.0  # µs


def _launcher(spec, tensors):
    fn = compile_kernel(spec)
    grid = spec.grid(spec.meta_dict)
    options = spec.launch_options()
    return lambda: fn[grid](*tensors, **options)


def _record(name: str, entry: dict) -> None:
    RESULTS[name] = entry
    print(f"\n== {name}")
    for key, value in entry.items():
        print(f"  {key}: {value}")
    path = os.environ.get("KILN_BENCH_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)


def _sweep(group, graph, tensors, check, extra):
    """{config label: µs}; a config that fails to compile or gives wrong values is recorded
    with its error (and fails the test afterwards) so the other numbers still come back."""
    configs = list(dict.fromkeys(candidate_configs(group, graph) + extra))
    times: dict[str, object] = {}
    for i, config in enumerate(configs):
        label = ("default " if i == 0 else "") + config.short()
        try:
            spec = emit_group(group, graph, config)
            run = _launcher(spec, tensors)
            run()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            check()
            times[label] = round(_bench(run), 1)
        except Exception as exc:  # reported below
            times[label] = f"ERROR {type(exc).__name__}: {str(exc)[:300]}"
    return times


def _assert_all_ran(times: dict) -> list[float]:
    errors = {k: v for k, v in times.items() if isinstance(v, str)}
    assert not errors, errors
    return [v for v in times.values() if isinstance(v, float)]


@pytest.mark.gpu
def test_gpu_bias_grad_column_sum():
    g = torch.randn(ROWS, COLS, device=DEVICE, dtype=torch.bfloat16)
    graph = lower_graph(trace_aten(lambda g: g.sum(0), g.cpu()))
    (node,) = graph.computed
    group = FusedGroup("g0", [node], (COLS,), (ROWS,), (node.name,))
    out = torch.empty(COLS, device=DEVICE, dtype=torch.bfloat16)
    want = g.double().sum(0)

    def check():
        torch.testing.assert_close(out.double(), want, atol=0.5, rtol=1e-2)

    extra = [KernelConfig("looped_reduction", xb, rb, w, s)
             for xb, rb, w, s in ((4, 2048, 8, 1), (8, 1024, 8, 1), (8, 1024, 8, 2),
                                  (8, 2048, 8, 1), (16, 512, 8, 1), (16, 1024, 8, 1),
                                  (16, 512, 4, 3), (32, 256, 8, 1), (32, 512, 8, 1),
                                  (64, 128, 4, 1), (64, 256, 8, 1), (128, 64, 8, 1))]
    assert emit_group(group, graph).args == ("g_1", node.name)
    times = _sweep(group, graph, [g, out], check, extra)
    torch_us = _bench(lambda: g.sum(0))
    entry = {"kernels_us": times, "torch.sum(dim=0)_us": round(torch_us, 1)}
    _record("bias_grad_sum0_16384x1024_bf16", entry)
    try:
        if SMALL:
            raise RuntimeError("dry run")
        compiled = torch.compile(lambda g: g.sum(0))
        compiled(g)
        entry["torch.compile_us"] = round(_bench(lambda: compiled(g)), 1)
    except Exception as exc:  # reference only
        entry["torch.compile_error"] = repr(exc)[:200]
    _record("bias_grad_sum0_16384x1024_bf16", entry)
    assert SMALL or min(_assert_all_ran(times)) < 4 * torch_us


@pytest.mark.gpu
def test_gpu_residual_layer_norm():
    def fn(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (COLS,), w, b)

    args = [torch.randn(ROWS, COLS, dtype=torch.bfloat16) for _ in range(2)]
    args += [torch.randn(COLS, dtype=torch.bfloat16) for _ in range(2)]
    graph = lower_graph(trace_aten(fn, *args))
    outs = tuple(o.name for o in graph.outputs)
    group = FusedGroup("g0", graph.computed, (ROWS,), (COLS,), outs)
    x, r, w, b = (a.to(DEVICE) for a in args)
    h = torch.empty(ROWS, COLS, device=DEVICE, dtype=torch.bfloat16)
    y = torch.empty_like(h)
    h_want, y_want = fn(x.float(), r.float(), w.float(), b.float())
    spec0 = emit_group(group, graph)
    names = {graph.outputs[0].name: h, graph.outputs[1].name: y}
    by_name = {"x_1": x, "r_1": r, "w_1": w, "b_1": b, **names}
    tensors = [by_name[n] for n in spec0.args]

    def check():
        torch.testing.assert_close(h.float(), h_want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(y.float(), y_want, atol=5e-2, rtol=2e-2)

    extra = [KernelConfig("persistent_reduction", 1, 1024, 8, 1),
             KernelConfig("persistent_reduction", 2, 1024, 8, 1),
             KernelConfig("persistent_reduction", 1, 1024, 2, 1),
             KernelConfig("looped_reduction", 1, 512, 4, 1)]
    times = _sweep(group, graph, tensors, check, extra)
    eager_us = _bench(lambda: F.layer_norm(x + r, (COLS,), w, b))
    _assert_all_ran(times) if SMALL else None
    _record("residual_layer_norm_16384x1024_bf16", {
        "kernels_us": times, "eager add+layer_norm_us": round(eager_us, 1),
        "bytes_MB": 4 * ROWS * COLS * 2 / 1e6})
    assert SMALL or min(_assert_all_ran(times)) < 2 * eager_us
