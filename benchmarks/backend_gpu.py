"""The kiln backend on the GPU: eager vs kiln vs torch.compile, side by side in one run.

    python benchmarks/backend_gpu.py [--parts seed,micro,launches,warm] [--out DIR]
                                     [--kiln-mode default|max-autotune]

- seed: the seed's TransformerBlock (d_model 1024, 16 heads, x [32, 512, 1024]) in bf16
  inference, bf16 train step (forward + `out.float().pow(2).mean().backward()`, the anchor
  harness) and fp32 inference: median ms (`triton.testing.do_bench`) and first-call seconds.
- micro: the four memory-bound micro-kernels of ANCHORS.md at their sizes and at >= 256 MB
  per input tensor: median ms, GB/s, % of the copy bandwidth measured in the same run.
- launches: CUDA kernels launched per call (torch.profiler) for bf16 inference.
- warm: first-call time of bf16 inference in a new process with empty cache dirs (cold), then
  in a second new process with the caches the first filled (warm); the script re-runs itself
  with `--child-warm`. (The first-call times of the seed part share one process, so whichever
  compiler runs first there also pays Triton's start-up.)

Prints one JSON line per row and a table at the end; `--out DIR` also writes `backend_gpu.json`.
Needs CUDA. Numbers belong in benchmarks/RESULTS.md with the date, commit and command.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import kiln  # noqa: E402
from kiln.tools.seed_model import TransformerBlock  # noqa: E402

ROWS: list[dict] = []


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)
    ROWS.append(row)


def bench_ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def reset_all() -> None:
    kiln.reset()
    torch._dynamo.reset()


def compile_variant(variant: str, model: Any, kiln_mode: str | None) -> Any:
    if variant == "eager":
        return model
    if variant == "torch.compile":
        return torch.compile(model)
    if variant == "kiln":
        return kiln.compile(model, backend="kiln", mode=kiln_mode)
    raise ValueError(variant)


def seed_step(fn: Any, x: torch.Tensor, phase: str) -> Callable[[], Any]:
    def step() -> Any:
        if phase == "infer":
            with torch.no_grad():
                return fn(x)
        out = fn(x)
        out.float().pow(2).mean().backward()
        return out
    return step


def seed_model(dtype: torch.dtype, phase: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The seed block at the seed's sizes on CUDA (eval mode for inference) and its input."""
    torch.manual_seed(0)
    model = TransformerBlock().cuda().to(dtype)
    if phase == "infer":
        model.eval()
    return model, torch.randn(32, 512, 1024, device="cuda", dtype=dtype)


def seed_case(dtype: torch.dtype, phase: str, variant: str, kiln_mode: str | None) -> dict:
    reset_all()
    model, x = seed_model(dtype, phase)
    step = seed_step(compile_variant(variant, model, kiln_mode), x, phase)
    start = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    ref = seed_step(model, x, phase)() if variant != "eager" else out
    err = (out.float() - ref.float()).abs().max().item()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ms = bench_ms(step)
    from kiln.runtime import binaries, wrapper
    return {"part": "seed", "dtype": str(dtype).replace("torch.", ""), "phase": phase,
            "variant": variant, "ms": round(ms, 4), "first_s": round(first, 2),
            "max_abs_err_vs_eager": float(f"{err:.3g}"),
            "relayout_copies": wrapper.relayout_copies[0],
            "binaries_recalled": binaries.STATS["recalled"]}


def part_seed(kiln_mode: str | None) -> None:
    for dtype, phase in ((torch.bfloat16, "infer"), (torch.bfloat16, "train"),
                         (torch.float32, "infer")):
        for variant in ("eager", "torch.compile", "kiln"):
            try:
                emit(seed_case(dtype, phase, variant, kiln_mode))
            except Exception as e:  # one failing variant must not stop the run
                emit({"part": "seed", "dtype": str(dtype), "phase": phase, "variant": variant,
                      "error": repr(e)[:400]})


# -- micro-kernels ---------------------------------------------------------------------------------

D = 1024


def add_gelu_ln(x, b, w, lb):
    return F.layer_norm(F.gelu(x + b), (D,), w, lb)


def softmax(x):
    return torch.softmax(x * 0.125, dim=-1)


def resid_ln(x, r, w, lb):
    y = x + r
    return y, F.layer_norm(y, (D,), w, lb)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def micro_cases(scale: int) -> dict:
    """name -> (fn, make_args, bytes moved); scale multiplies the row count."""
    n = 32 * 512 * scale
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return {
        "add_gelu_ln": (add_gelu_ln, lambda: (mk(n, D), mk(D), mk(D), mk(D)), 2 * n * D * 2),
        "softmax": (softmax, lambda: (mk(32 * 16 * scale, 512, 512),),
                    2 * 32 * 16 * scale * 512 * 512 * 2),
        "resid_ln": (resid_ln, lambda: (mk(n, D), mk(n, D), mk(D), mk(D)), 4 * n * D * 2),
        "rmsnorm": (rmsnorm, lambda: (mk(n, 4096), mk(4096)), 2 * n * 4096 * 2),
    }


def copy_gbps() -> float:
    x = torch.empty(1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / (ms * 1e-3) / 1e9


def _same(a: Any, b: Any) -> bool:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.allclose(x.float(), y.float(), atol=3e-2, rtol=3e-2) for x, y in zip(a, b))


def part_micro(kiln_mode: str | None) -> None:
    ceiling = copy_gbps()
    emit({"part": "micro", "copy_GBps": round(ceiling)})
    for scale in (1, 8):
        for name, (fn, make_args, nbytes) in micro_cases(scale).items():
            args = make_args()
            ref = fn(*args)
            for variant in ("eager", "torch.compile", "kiln"):
                reset_all()
                try:
                    f = compile_variant(variant, fn, kiln_mode)
                    start = time.perf_counter()
                    out = f(*args)
                    torch.cuda.synchronize()
                    first = time.perf_counter() - start
                    ms = bench_ms(lambda f=f, args=args: f(*args))
                    gbps = nbytes / (ms * 1e-3) / 1e9
                    emit({"part": "micro", "case": name, "MB_per_input": nbytes // 2 // 2**20
                          if name != "resid_ln" else nbytes // 4 // 2**20, "variant": variant,
                          "ok": _same(out, ref), "ms": round(ms, 4), "GBps": round(gbps),
                          "pct_copy": round(100 * gbps / ceiling, 1), "first_s": round(first, 2)})
                except Exception as e:
                    emit({"part": "micro", "case": name, "variant": variant,
                          "error": repr(e)[:400]})
            del args, ref
            torch.cuda.empty_cache()


# -- launches and warm start -----------------------------------------------------------------------

def count_launches(fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def part_launches(kiln_mode: str | None) -> None:
    for variant in ("eager", "torch.compile", "kiln"):
        reset_all()
        model, x = seed_model(torch.bfloat16, "infer")
        step = seed_step(compile_variant(variant, model, kiln_mode), x, "infer")
        try:
            emit({"part": "launches", "variant": variant, "cuda_kernels": count_launches(step)})
        except Exception as e:
            emit({"part": "launches", "variant": variant, "error": repr(e)[:400]})


def child_first_call(variant: str, kiln_mode: str | None) -> None:
    """In a new process: the first call of bf16 inference (caches filled by the parent)."""
    row = seed_case(torch.bfloat16, "infer", variant, kiln_mode)
    print("CHILD " + json.dumps(row), flush=True)


def part_warm(kiln_mode: str | None) -> None:
    """Cold: a new process with empty cache dirs (Inductor's, Triton's, kiln's); warm: a second
    new process with the dirs the first one filled."""
    import tempfile

    for variant in ("torch.compile", "kiln"):
        caches = tempfile.mkdtemp(prefix=f"warm-{variant}-")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(caches, "triton"),
                   KILN_CACHE_DIR=os.path.join(caches, "kiln"))
        for attempt in ("cold", "warm"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child-warm", variant]
            if kiln_mode:
                cmd += ["--kiln-mode", kiln_mode]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")), None)
            if line is None:
                emit({"part": "warm", "variant": variant, "attempt": attempt,
                      "error": proc.stderr[-400:]})
                continue
            row = json.loads(line[6:])
            emit({"part": "warm", "variant": variant, "attempt": attempt,
                  "first_s": row["first_s"], "ms": row["ms"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="seed,micro,launches,warm")
    ap.add_argument("--kiln-mode", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child-warm", default=None)
    a = ap.parse_args()
    mode = None if a.kiln_mode in (None, "default") else a.kiln_mode
    if a.child_warm:
        child_first_call(a.child_warm, mode)
        return
    emit({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "kiln": kiln.__version__, "kiln_mode": a.kiln_mode or "default"})
    parts = {"seed": part_seed, "micro": part_micro, "launches": part_launches,
             "warm": part_warm}
    for name in a.parts.split(","):
        parts[name](mode)
    if a.out:
        with open(os.path.join(a.out, "backend_gpu.json"), "w") as f:
            json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
