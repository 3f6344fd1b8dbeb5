"""Pointwise kernels through a transpose: eager vs torch.compile vs kiln (2-D tiled and 1-D).

    python benchmarks/transpose_pointwise.py [--json PATH] [--autotune] [--no-inductor]

Issue 16: convnext's hottest generated kernel (layer scale + residual through a permute, NHWC
read and NCHW write) ran at 5.6 % of the copy roofline as a 1-D kernel. Cases:

- convnext layer scale + residual: a linear's [N*H*W, C] output viewed NHWC, permuted to NCHW,
  times gamma[C], plus the NCHW shortcut, (64, 96, 56, 56) bf16;
- convnext block entry: an NCHW activation permuted to NHWC, times w[C], plus b[C], contiguous;
- a 2-D transpose plus add, 8192 x 8192, bf16 and float32.

Columns: median ms (`triton.testing.do_bench`, return_mode="median"), GB/s of the bytes the
function must move (inputs read once, output written once), and kiln's generated kernels (kind
and config). "kiln 1-D" is kiln with the tiling decision switched off (the previous code path),
for the before/after in one run (`KILN_TILE_POINTWISE=0`). Every compiled result is checked against eager first.

Without CUDA it runs tiny shapes through Triton's interpreter and only checks correctness (the
times printed there mean nothing).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

CUDA_WANTED = "--cpu" not in sys.argv
if not CUDA_WANTED or not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln.config import config  # noqa: E402


# -- the functions -------------------------------------------------------------------------------

def layer_scale_residual(y, gamma, shortcut):
    """convnext: NHWC linear output → NCHW, times gamma, plus the shortcut."""
    n, c, h, w = shortcut.shape
    return y.view(n, h, w, c).permute(0, 3, 1, 2) * gamma.reshape(1, -1, 1, 1) + shortcut


def permute_mul_add(x, w, b):
    """NCHW → NHWC, times w, plus b (what a channels-last block entry does)."""
    return (x.permute(0, 2, 3, 1) * w + b).contiguous()


def transpose_add(a, b):
    return (a.t() + b).contiguous()


def cases(device: str, tiny: bool) -> list[tuple[str, Callable, list[torch.Tensor]]]:
    n, c, h, w = (2, 16, 9, 7) if tiny else (64, 96, 56, 56)
    side = 45 if tiny else 8192
    bf16 = torch.bfloat16

    def rand(*shape, dtype=bf16):
        return torch.randn(*shape, device=device, dtype=dtype)

    out = [("convnext layer scale + residual (NHWC->NCHW) bf16", layer_scale_residual,
            [rand(n * h * w, c), rand(c), rand(n, c, h, w)]),
           ("convnext permute * w + b (NCHW->NHWC) bf16", permute_mul_add,
            [rand(n, c, h, w), rand(c), rand(c)])]
    for dtype in (bf16, torch.float32):
        name = f"transpose + add {side}x{side} {str(dtype).removeprefix('torch.')}"
        out.append((name, transpose_add, [rand(side, side, dtype=dtype),
                                          rand(side, side, dtype=dtype)]))
    return out


# -- measuring -------------------------------------------------------------------------------------

@contextlib.contextmanager
def recorded_kernels():
    """The kiln backend's generated `KernelSpec`s while the block runs."""
    from kiln.runtime import pipeline

    specs: list[Any] = []
    original = pipeline.emit_group

    def spy(*args, **kwargs):
        specs.append(original(*args, **kwargs))
        return specs[-1]

    pipeline.emit_group = spy
    try:
        yield specs
    finally:
        pipeline.emit_group = original


@contextlib.contextmanager
def tiling_off():
    """kiln as before the 2-D tiles (`KILN_TILE_POINTWISE=0`): 1-D pointwise kernels only."""
    config.tile_pointwise = False
    try:
        yield
    finally:
        config.tile_pointwise = True


def check(fn: Callable, compiled: Callable, inputs: list[torch.Tensor]) -> float:
    """Max error of `compiled` vs fp64, asserted within 1.5x eager's own (plus an ulp)."""
    got, want = compiled(*inputs), fn(*inputs)
    ref = fn(*[t.double() for t in inputs])
    err = (got.double() - ref).abs().max().item()
    eager_err = (want.double() - ref).abs().max().item()
    ulp = torch.finfo(want.dtype).eps * ref.abs().max().item()
    if got.shape != want.shape or err > 1.5 * eager_err + ulp:
        raise AssertionError(f"compiled error {err:.3g} vs eager's {eager_err:.3g}")
    return err


def median_ms(fn: Callable[[], Any], cuda: bool) -> float:
    if cuda:
        from triton.testing import do_bench
        return do_bench(fn, return_mode="median")
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def compile_variants(fn: Callable, args: argparse.Namespace, cuda: bool):
    """(column name, compiled callable, context to compile it under)."""
    variants = [("eager", fn, contextlib.nullcontext)]
    if args.inductor and cuda:  # Inductor's C++ CPU compile takes minutes on a small box
        variants.append(("torch.compile", torch.compile(fn), contextlib.nullcontext))
    mode = "max-autotune-no-cudagraphs" if args.autotune else None
    variants.append(("kiln", kiln.compile(fn, backend="kiln", mode=mode), contextlib.nullcontext))
    variants.append(("kiln 1-D", kiln.compile(fn, backend="kiln", mode=mode), tiling_off))
    return variants


def run_case(name: str, fn: Callable, inputs: list[torch.Tensor], args, cuda: bool) -> dict:
    moved = sum(t.numel() * t.element_size() for t in inputs)
    moved += fn(*inputs).numel() * inputs[0].element_size()
    row: dict[str, Any] = {"case": name, "shapes": [list(t.shape) for t in inputs],
                           "bytes": moved, "ms": {}, "gbps": {}, "kernels": {}}
    for column, compiled, context in compile_variants(fn, args, cuda):
        kiln.reset()
        with context():  # compiled and timed under it (kiln 1-D: tiles off throughout)
            with recorded_kernels() as specs:
                row.setdefault("max_err", {})[column] = check(fn, compiled, inputs)
            with recorded_kernels() as again:
                ms = median_ms(lambda: compiled(*inputs), cuda)
        if again:
            raise RuntimeError(f"{name}, {column}: kiln compiled again while being timed")
        if specs:
            row["kernels"][column] = [f"{s.name}: {s.config.short()}" for s in specs]
        row["ms"][column] = round(ms, 4)
        row["gbps"][column] = round(moved / ms / 1e6, 1)
    return row


def print_table(rows: list[dict], cuda: bool) -> None:
    columns = list(rows[0]["ms"])
    print(f"{'case':52s}" + "".join(f"{c:>16s}" for c in columns) + "   (ms, GB/s)")
    for row in rows:
        cells = "".join(f"{row['ms'][c]:8.3f} {row['gbps'][c]:6.0f} " for c in columns)
        print(f"{row['case']:52s}{cells}")
        for column, kernels in row["kernels"].items():
            for kernel in kernels:
                print(f"    {column}: {kernel}")
    if not cuda:
        print("(no CUDA: tiny shapes in Triton's interpreter; correctness only, times mean nothing)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--autotune", action="store_true",
                    help="compile kiln with max-autotune-no-cudagraphs (tiles and 1-D tried)")
    ap.add_argument("--no-inductor", dest="inductor", action="store_false")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on CPU even with CUDA")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda" if cuda else "cpu"
    if not cuda:
        config.cpu_codegen = "triton_interpret"
    config.suppress_errors = False
    rows = [run_case(name, fn, inputs, args, cuda)
            for name, fn, inputs in cases(device, tiny=not cuda)]
    print_table(rows, cuda)
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if cuda else "cpu",
                "torch": torch.__version__, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
