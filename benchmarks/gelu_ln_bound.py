"""How fast can x + b → GELU → LayerNorm go on this GPU? (needs CUDA; one JSON row per line)

    python benchmarks/gelu_ln_bound.py [--out FILE]

The fused kernel kiln emits for the micro-kernel of ANCHORS.md, hand-instantiated with three
erf choices — libdevice's erff (what torch.compile uses), kiln's `_erf_f32`
(`kiln/codegen/fast_math.py`) and none at all (wrong results: the memory-only bound of the same
kernel) — over a grid of rows per program × warps, at [16384, 1024] and [131072, 1024] bf16, next
to the measured copy ceiling. benchmarks/RESULTS.md quotes it: the kernel is ALU-bound, so exact
erf-GELU cannot reach the copy ceiling however it is tiled.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = str(Path(__file__).resolve().parents[1])
for _path in (ROOT, str(Path(__file__).resolve().parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from kiln.codegen.fast_math import FAST_MATH_HELPERS  # noqa: E402

KERNEL = '''
import triton
import triton.language as tl
''' + FAST_MATH_HELPERS + '''

@triton.jit
def gelu_ln(in0, in1, in2, in3, out0, ERF: tl.constexpr, XBLOCK: tl.constexpr,
            RBLOCK: tl.constexpr):
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r0 = tl.arange(0, RBLOCK)[None, :]
    t = tl.load(in0 + (r0 + RBLOCK * x0)).to(tl.float32) + tl.load(in1 + r0).to(tl.float32)
    u = t * 0.7071067811865476
    if ERF == 0:
        e = tl.erf(u)
    elif ERF == 1:
        e = _erf_f32(u)
    else:
        e = u
    g = (t * 0.5) * (1.0 + e)
    mean = tl.sum(g, 1)[:, None] / RBLOCK
    c = g - mean
    var = tl.sum(c * c, 1)[:, None] / RBLOCK
    y = c * tl.rsqrt(var + 1e-5) * tl.load(in2 + r0).to(tl.float32) + tl.load(in3 + r0).to(tl.float32)
    tl.store(out0 + (r0 + RBLOCK * x0), y.to(tl.bfloat16))
'''

ERFS = ("libdevice", "kiln _erf_f32", "none (wrong: memory-only bound)")
CONFIGS = ((1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8))


def load_kernel():
    """triton.jit needs a real source file: write the kernel module and import it."""
    path = Path(tempfile.mkdtemp(prefix="kiln-gelu-ln-")) / "gelu_ln_kernel.py"
    path.write_text(KERNEL)
    spec = importlib.util.spec_from_file_location("gelu_ln_kernel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gelu_ln_kernel"] = module
    spec.loader.exec_module(module)
    return module.gelu_ln


def main() -> None:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    out_path = ap.parse_args().out
    rows = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    from backend_gpu import copy_gbps  # the same ceiling measurement as the micro-kernels

    kernel = load_kernel()
    ceiling = copy_gbps()
    emit({"copy_GBps": round(ceiling), "device": torch.cuda.get_device_name()})
    for n in (16384, 131072):
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        b, w, lb = (torch.randn(1024, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(x)
        ref = F.layer_norm(F.gelu(x.double() + b.double()), (1024,), w.double(), lb.double())
        nbytes = 2 * x.numel() * 2
        emit({"n": n, "variant": "eager", "ms": do_bench(
            lambda: F.layer_norm(F.gelu(x + b), (1024,), w, lb))})
        for erf, name in enumerate(ERFS):
            for xb, warps in CONFIGS:
                def run() -> None:
                    kernel[(n // xb,)](x, b, w, lb, out, ERF=erf, XBLOCK=xb, RBLOCK=1024,
                                       num_warps=warps)
                run()
                err = (out.double() - ref).abs().max().item()
                ms = do_bench(run)
                emit({"n": n, "erf": name, "XBLOCK": xb, "warps": warps, "ms": round(ms, 4),
                      "pct_copy": round(100 * nbytes / (ms * 1e-3) / 1e9 / ceiling, 1),
                      "max_err_vs_fp64": err})
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
