"""The machine's measured ceilings: copy bandwidth and matmul FLOP/s, cached per device.

Copy bandwidth: a large device-to-device copy (bytes read + bytes written per second). Matmul:
a large square bf16 matmul on CUDA, fp32 on the CPU (2·n³ FLOPs per call). Both are the best of a
few timed runs, measured once per device and kept in `<kiln cache dir>/ceilings.json` (the cache
dir is `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`), so a report costs
the measurement only the first time. These are achievable numbers, not datasheet peaks: kernels
are compared with what this machine really does.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from typing import Callable

import torch

__all__ = ["Ceilings", "cache_dir", "device_key", "measure_ceilings", "machine_ceilings"]

_SIZES = {"cuda": (1 << 30, 8192), "cpu": (1 << 24, 1024)}  # copy bytes, matmul n


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """bandwidth: bytes/s of a large copy (read + write); flops: FLOP/s of a large matmul in
    `matmul_dtype`; device: the cache key it was measured for."""
    device: str
    bandwidth: float
    flops: float
    matmul_dtype: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cache_dir() -> str:
    """kiln's cache dir (the runtime's `cache_root()`: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or
    ~/.cache/kiln)."""
    try:
        from kiln.paths import cache_root
    except ImportError:  # a kiln without the runtime stage: the same rule, spelled out
        return os.environ.get("KILN_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "kiln")
    return str(cache_root())


def device_key(device: str) -> str:
    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    return f"cpu:{platform.machine()}:{platform.processor() or 'cpu'}:{os.cpu_count()}"


def _best_seconds(fn: Callable[[], object], device: str, repeat: int) -> float:
    """The fastest of `repeat` timed calls after one warm-up. On the GPU each timing is a batch
    of back-to-back calls between two CUDA events, so launch gaps do not count (the profiler's
    kernel times, which the ceilings are compared with, have none)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if device.startswith("cuda"):
            batch = 10
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / batch)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def _copy_seconds(nbytes: int, device: str, repeat: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src), device, repeat)


def measure_ceilings(device: str, repeat: int = 5) -> Ceilings:
    """Measure both ceilings on `device` now (no cache)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    copy_bytes, n = _SIZES[kind]
    copy_s = _copy_seconds(copy_bytes, device, repeat)
    dtype = torch.bfloat16 if kind == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    mm_s = _best_seconds(lambda: torch.mm(a, b), device, repeat)
    return Ceilings(device_key(device), 2 * copy_bytes / copy_s, 2 * n ** 3 / mm_s,
                    str(dtype).replace("torch.", ""))


def machine_ceilings(device: str, refresh: bool = False) -> Ceilings:
    """The cached ceilings of `device`, measured (and cached) when missing or `refresh`."""
    key = device_key(device)
    path = os.path.join(cache_dir(), "ceilings.json")
    try:
        with open(path) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if not refresh and key in cached:
        return Ceilings(**cached[key])
    ceilings = measure_ceilings(device)
    cached[key] = ceilings.to_dict()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(cached, f, indent=2)
    os.replace(tmp, path)
    return ceilings
