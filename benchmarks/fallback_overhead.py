"""What a model kiln cannot capture costs: eager vs kiln with every capture failing (CPU).

    python benchmarks/fallback_overhead.py [arch] [--profile]

Capture is forced to fail on every frame (as if every forward held an unsupported construct
that cannot be resumed), so every frame runs its route-only copy and every call it makes is
routed through kiln: the worst case of issue 13 item 4. Prints medians of warm calls and, with
--profile, the kiln functions that cost the most.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
import warnings

import torch

import kiln
from kiln.capture import convert
from kiln.capture.unsupported import Unsupported
from kiln.tools.suite import hf


def _always_fail(*args, **kwargs):
    raise Unsupported("forced", "capture forced to fail (benchmarks/fallback_overhead.py)")


def _median_ms(fn, inputs: dict, n: int) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn(**inputs)
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn(**inputs)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("arch", nargs="?", default="t5")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("-n", type=int, default=30)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    arch = hf.get(args.arch)
    model = hf.build(arch)
    inputs = hf.make_inputs(arch, gen=torch.Generator().manual_seed(0))
    convert._capture_with_break = _always_fail
    compiled = kiln.compile(model, backend="eager")
    eager = min(_median_ms(model, inputs, args.n), _median_ms(model, inputs, args.n))
    routed = _median_ms(compiled, inputs, args.n)
    print(f"{arch.name}: eager {eager:.2f} ms, kiln (nothing captured) {routed:.2f} ms, "
          f"ratio {routed / eager:.3f}")
    if args.profile:
        profile = cProfile.Profile()
        with torch.no_grad():
            profile.runcall(lambda: [compiled(**inputs) for _ in range(10)])
        stats = pstats.Stats(profile)
        rows = [(key, value) for key, value in stats.stats.items()
                if "kiln" in key[0] and "suite" not in key[0]]
        total = sum(value[2] for _, value in rows)
        print(f"kiln's own time: {total / 10 * 1e3:.2f} ms per call (profiled)")
        for key, value in sorted(rows, key=lambda kv: -kv[1][2])[:12]:
            print(f"  {value[1]:6d} calls {value[2] * 1e3 / 10:7.3f} ms/call  {key[2]} "
                  f"({key[0].split('/')[-1]}:{key[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
