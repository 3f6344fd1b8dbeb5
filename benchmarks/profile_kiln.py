"""Where the GPU time goes: per-kernel CUDA time of one call, kiln vs torch.compile.

    python benchmarks/profile_kiln.py [--cases seed_infer,seed_train,rmsnorm,softmax] [--top 25]
    python benchmarks/profile_kiln.py --cases timm:resnet50,timm:resnet50:train

A `timm:NAME` case is that timm model in bf16 at batch 64, 224 px (the zoo's sizes), inference,
or one forward + backward with `:train`. Variants: eager, torch.compile, kiln, and
`kiln_channels_last` (kiln with `config.channels_last` on, grouped convolutions included: its
conv graphs in NHWC), so one process compares the layouts beside torch.compile.

For each case, runs a few warm-up calls, then profiles 5 calls with torch.profiler and prints
the CUDA kernels sorted by total time (µs per call), the kernel count per call, the
end-to-end median ms per call and the peak memory of one call. Set
KILN_DEBUG_DIR to keep kiln's wrappers and kernel sources (and KILN_WARM_START=0, since a
warm-start hit writes none). Needs CUDA.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from kiln.config import config as kiln_config  # noqa: E402
from kiln.lower import channels_last as lower_channels_last  # noqa: E402
from backend_gpu import (bench_ms, compile_variant, micro_cases, reset_all,  # noqa: E402
                         seed_model, seed_step)

CALLS = 5


def profile(fn: Callable[[], Any], top: int) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            totals.setdefault(e.name, []).append(e.device_time)
    rows = sorted(totals.items(), key=lambda kv: -sum(kv[1]))
    count = sum(len(v) for v in totals.values()) / CALLS
    total = sum(sum(v) for v in totals.values()) / CALLS
    print(f"  {count:.0f} kernels/call, {total:.1f} us GPU time/call, "
          f"{bench_ms(fn):.3f} ms per call (median, triton do_bench), "
          f"peak {peak_mib(fn):.0f} MiB")
    for name, times in rows[:top]:
        print(f"  {sum(times) / CALLS:9.1f} us  x{len(times) / CALLS:<4.0f} {name[:110]}")


def peak_mib(fn: Callable[[], Any]) -> float:
    """Peak memory of one call (end-to-end time and peak sit beside the kernel table, so a gap
    between kernel time and what zoo.py reports shows on one page)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def seed(dtype: torch.dtype, phase: str, variant: str) -> Callable[[], Any]:
    model, x = seed_model(dtype, phase)
    return seed_step(compile_variant(variant, model, None), x, phase)


def micro(name: str, variant: str) -> Callable[[], Any]:
    fn, make_args, _ = micro_cases(1)[name]
    args = make_args()
    compiled = compile_variant(variant, fn, None)
    return lambda: compiled(*args)


def timm_case(spec: str, variant: str) -> Callable[[], Any]:
    import timm

    _, name, *phase = spec.split(":")
    train = phase == ["train"]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).cuda().to(torch.bfloat16).train(train)
    x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    return seed_step(compile_variant(variant, model, None), x, "train" if train else "infer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="seed_infer,seed_train,rmsnorm,softmax")
    ap.add_argument("--variants", default="kiln,torch.compile")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    channels_last = kiln_config.channels_last  # KILN_CHANNELS_LAST, for the plain kiln variant
    for case in a.cases.split(","):
        for name in a.variants.split(","):
            reset_all()
            kiln_config.channels_last = channels_last or name == "kiln_channels_last"
            # grouped / depthwise conv graphs too (kept NCHW by default: measured before the
            # tiling fix of 2026-12-05, MobileNetV3 8.1 vs 3.8 ms)
            lower_channels_last.GROUPED_STAY_NCHW = name != "kiln_channels_last"
            variant = "kiln" if name == "kiln_channels_last" else name
            print(f"== {case} / {name}")
            if case.startswith("timm:"):
                fn = timm_case(case, variant)
            elif case.startswith("seed_"):
                phase = case.split("_")[1]
                fn = seed(torch.bfloat16, phase, variant)
            else:
                fn = micro(case, variant)
            profile(fn, a.top)


if __name__ == "__main__":
    main()
