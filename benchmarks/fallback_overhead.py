"""What a model kiln cannot capture costs: eager vs kiln with capture failing.

    python benchmarks/fallback_overhead.py [arch ...] [--fail all|NAME,NAME] [-n N] [--profile]
                                           [--device cuda --full --dtype bfloat16]

`--fail all` (the default) makes capture fail on every frame, as if every forward held an
unsupported construct that cannot be resumed: no graph anywhere, the worst case of issue 13
item 4. `--fail T5Stack.forward,...` fails only frames whose qualified name ends with one of
the names, so those frames run route-only and the layers they call are still compiled.

Eager and kiln are timed in the same process, interleaved call by call (the machine may be
loaded), after warm-up; medians of warm calls. With --profile, the kiln functions that cost the
most. `--device cuda --full` measures the base-size model on the GPU (the issue's H200 case:
T5 ran 23.7 ms under kiln with nothing compiled vs 16.6 ms eager), synchronizing after each call.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch

import kiln
from kiln.capture import convert
from kiln.capture.unsupported import Unsupported
from kiln.tools.suite import hf


def _failing(names: list[str] | None) -> Callable:
    """A stand-in for capture that fails on the named frames (every frame when None)."""
    original = convert._capture_with_break

    def capture(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if names is None or any(fn.__qualname__.endswith(name) for name in names):
            raise Unsupported("forced", "capture forced to fail (benchmarks/fallback_overhead.py)")
        return original(fn, *args, **kwargs)
    return capture


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _interleaved_ms(fns: dict[str, Callable], inputs: dict, n: int,
                    device: str = "cpu") -> dict[str, float]:
    """Median ms per call of each function, timed alternately call by call."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(3):
                fn(**inputs)
        for _ in range(n):
            for name, fn in fns.items():
                _sync(device)
                start = time.perf_counter()
                fn(**inputs)
                _sync(device)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def _profile(compiled: Callable, inputs: dict) -> None:
    profile = cProfile.Profile()
    with torch.no_grad():
        profile.runcall(lambda: [compiled(**inputs) for _ in range(10)])
    stats = pstats.Stats(profile)
    rows = [(key, value) for key, value in stats.stats.items()
            if "kiln" in key[0] and "suite" not in key[0]]
    total = sum(value[2] for _, value in rows)
    print(f"  kiln's own time: {total / 10 * 1e3:.3f} ms per call (profiled)")
    for key, value in sorted(rows, key=lambda kv: -kv[1][2])[:12]:
        print(f"  {value[1]:6d} calls {value[2] * 1e3 / 10:7.3f} ms/call  {key[2]} "
              f"({key[0].split('/')[-1]}:{key[1]})")


def _model_and_inputs(arch_name: str, full: bool, device: str, dtype: torch.dtype
                      ) -> tuple[torch.nn.Module, dict]:
    arch = hf.get(arch_name)
    if full:
        import transformers
        torch.manual_seed(0)
        config = hf._full_config(arch)
        model = getattr(transformers, arch.model)(config).eval()
    else:
        config, model = None, hf.build(arch)
    inputs = hf.make_inputs(arch, config, gen=torch.Generator().manual_seed(0), device=device)
    return model.to(device=device, dtype=dtype), inputs


def run(arch_name: str, fail: list[str] | None, n: int, profile: bool, full: bool = False,
        device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, float]:
    model, inputs = _model_and_inputs(arch_name, full, device, dtype)
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad():
        expected, actual = model(**inputs), compiled(**inputs)
    for key in expected.keys():
        if isinstance(expected[key], torch.Tensor):
            torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0)
    medians = _interleaved_ms({"eager": model, "kiln": compiled}, inputs, n, device)
    eager, routed = medians["eager"], medians["kiln"]
    size = "full" if full else "tiny"
    print(f"{arch_name} ({size}, {device}, {dtype}): eager {eager:.3f} ms, kiln {routed:.3f} ms, "
          f"ratio {routed / eager:.3f}, "
          f"overhead {(routed - eager) * 1e3:+.0f} us per call")
    if profile:
        _profile(compiled, inputs)
    return medians


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("archs", nargs="*", default=["t5"])
    parser.add_argument("--fail", default="all",
                        help="'all', or comma-separated qualified names of frames to fail")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--full", action="store_true", help="the base-size config")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    fail = None if args.fail == "all" else args.fail.split(",")
    convert._capture_with_break = _failing(fail)
    print(f"capture forced to fail on: {args.fail}; {args.n} interleaved calls each")
    for name in args.archs:
        kiln.reset()
        run(name, fail, args.n, args.profile, args.full, args.device,
            getattr(torch, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
