"""Host time of a compiled call with its kernel launches stubbed out, on the CPU (issue 17).

  python benchmarks/host_path.py [--case seed_block|gpt2|gpt2_12] [--profile] [--dynamic 8,12,16]

At batch 1 a GPU step costs about what its host path costs: dispatcher and guards, the
autograd wrapper, the generated wrapper (views, allocations, library calls) and one launch per
kernel. On a machine without a GPU this measures all of it but the launches: the model is
compiled with the kiln backend (kernels built for Triton's interpreter), every `Launcher` call
then returns at once, and calls are timed at a size where the CPU library calls are cheap.
Eager at the same size is printed beside it for scale (its time includes its CPU kernels).
Medians of 7 x 2000 calls, no_grad. `--profile` adds the top functions by own time.
`--dynamic L1,L2,...`: one `dynamic=True` compile called at each sequence length (dim 1 of the
input) beside a static compile per length, so the symbolic wrapper's own cost (sizes, strides
and grids computed per call) shows next to a static one.

It is a proxy: on the GPU machine allocations and library calls cost more (CUDA caching
allocator, cuBLAS setup) and each launch adds ~3-5 us; `gpu_round.sh latency` measures the real
thing. Use it to find and check host-side cuts between GPU sessions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.runtime import launcher  # noqa: E402


def build(case: str) -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(0)
    if case == "seed_block":
        from kiln.tools.seed_model import TransformerBlock
        return TransformerBlock(64, 4).eval(), (torch.randn(1, 8, 64),)
    if case in ("gpt2", "gpt2_12"):  # 2 layers, or GPT-2's 12
        import transformers
        cfg = transformers.GPT2Config(n_layer=2 if case == "gpt2" else 12, n_embd=64, n_head=4,
                                      vocab_size=100)
        cfg.use_cache = False
        return transformers.GPT2LMHeadModel(cfg).eval(), (torch.randint(0, 100, (1, 8)),)
    raise SystemExit(f"unknown case {case!r}: seed_block, gpt2 or gpt2_12")


def per_call_us(fn, inputs: tuple, calls: int = 2000) -> float:
    for _ in range(200):
        fn(*inputs)
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def at_length(inputs: tuple, length: int) -> tuple:
    """The inputs with dim 1 (sequence) cut or tiled to `length`."""
    x = inputs[0]
    return (x.repeat(1, -(-length // x.shape[1]), *([1] * (x.dim() - 2)))[:, :length],)


def dynamic(model: torch.nn.Module, inputs: tuple, lengths: list[int]) -> None:
    compiled = kiln.compile(model, backend="kiln", dynamic=True)
    with torch.no_grad():
        for n in lengths:  # compile, and one real (interpreted) run per length
            compiled(*at_length(inputs, n))
        static = {}
        for n in lengths:
            static[n] = kiln.compile(model, backend="kiln", dynamic=False)
            static[n](*at_length(inputs, n))
        real_call = launcher.Launcher.__call__
        launcher.Launcher.__call__ = lambda self, *a, **k: None
        try:
            for n in lengths:
                args = at_length(inputs, n)
                print(f"length {n}: dynamic {per_call_us(compiled, args):.1f} us, static "
                      f"{per_call_us(static[n], args):.1f} us, eager "
                      f"{per_call_us(model, args):.1f} us per call")
        finally:
            launcher.Launcher.__call__ = real_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="seed_block")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--dynamic", default="", help="sequence lengths, e.g. 8,12,16")
    args = parser.parse_args()
    config.cpu_codegen = "triton_interpret"
    model, inputs = build(args.case)
    if args.dynamic:
        dynamic(model, inputs, [int(n) for n in args.dynamic.split(",")])
        return
    compiled = kiln.compile(model, backend="kiln")
    with torch.no_grad():
        compiled(*inputs)  # compile, and one real (interpreted) run
        launcher.Launcher.__call__ = lambda self, *a, **k: None  # launches cost nothing now
        eager, ours = per_call_us(model, inputs), per_call_us(compiled, inputs)
        print(f"{args.case}: eager {eager:.1f} us per call (CPU kernels included), kiln host "
              f"path without launches {ours:.1f} us")
        if args.profile:
            import cProfile
            import pstats
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(3000):
                compiled(*inputs)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
