"""Train step of the seed TransformerBlock: eager vs kiln (backend="aot_eager") vs
torch.compile(backend="aot_eager"), side by side in one run: median time, peak memory and the
activation memory held between forward and backward.

    python benchmarks/aot_train.py [--dtypes float32,bfloat16] [--json PATH]

On a GPU: the seed's sizes (d_model 1024, 16 heads, input [32, 512, 1024]); on the CPU a small
size. Both compiled variants run their ATen graphs with torch ops (no kernel generation), so this
measures what the autograd stage (functionalization, partitioning, runtime) costs or saves.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import kiln  # noqa: E402
from kiln.tools.seed_model import TransformerBlock, seed_sizes  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _median_ms(fn: Callable[[], Any], device: str) -> float:
    if device == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=5, rep=100, return_mode="median"))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        for p in model.parameters():
            p.grad = None
        model(x).float().sum().backward()
    return run


def _activation_bytes(model: torch.nn.Module, x: torch.Tensor, device: str) -> dict:
    """Bytes held between forward and backward, and the step's peak above the resting state."""
    if device != "cuda":
        return {"activations_mb": None, "peak_mb": None}
    for p in model.parameters():
        p.grad = None
    _sync(device)
    torch.cuda.reset_peak_memory_stats()
    rest = torch.cuda.memory_allocated()
    out = model(x)
    held = torch.cuda.memory_allocated() - rest
    out.float().sum().backward()
    _sync(device)
    peak = torch.cuda.max_memory_allocated() - rest
    del out
    return {"activations_mb": held / 2**20, "peak_mb": peak / 2**20}


def bench(dtype: torch.dtype, device: str) -> list[dict]:
    d_model, nhead, shape = seed_sizes(device)
    torch.manual_seed(0)
    base = TransformerBlock(d_model, nhead).to(device=device, dtype=dtype)
    x = torch.randn(*shape, device=device, dtype=dtype)
    variants = {
        "eager": copy.deepcopy(base),
        "kiln aot_eager": kiln.compile(copy.deepcopy(base), backend="aot_eager"),
        "torch.compile aot_eager": torch.compile(copy.deepcopy(base), backend="aot_eager"),
    }
    reference = None
    rows = []
    for name, model in variants.items():
        start = time.perf_counter()
        _step(model, x)()
        _sync(device)
        first_s = time.perf_counter() - start
        grads = [p.grad.float() for p in model.parameters()]
        if reference is None:
            reference = grads
        max_err = max((g - r).abs().max().item() for g, r in zip(grads, reference))
        row = {"variant": name, "dtype": str(dtype).replace("torch.", ""), "first_call_s": first_s,
               "median_ms": _median_ms(_step(model, x), device), "max_grad_diff": max_err}
        row.update(_activation_bytes(model, x, device))
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    eager = {r["dtype"]: r for r in rows if r["variant"] == "eager"}
    lines = ["| dtype | variant | median ms | vs eager | activations MB | peak MB | first call s |"
             " max grad diff vs eager |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = eager[r["dtype"]]["median_ms"] / r["median_ms"]
        act = "—" if r["activations_mb"] is None else f"{r['activations_mb']:.0f}"
        peak = "—" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
        lines.append(f"| {r['dtype']} | {r['variant']} | {r['median_ms']:.3f} | {ratio:.2f}× | "
                     f"{act} | {peak} | {r['first_call_s']:.2f} | {r['max_grad_diff']:.2e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "out", "aot_train.json"))
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for name in args.dtypes.split(","):
        rows += bench(getattr(torch, name), device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"# seed block train step — {name}, torch {torch.__version__}\n")
    print(markdown(rows))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
