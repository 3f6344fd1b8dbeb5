"""Small-batch latency (issue 17): kiln and torch.compile, default and with CUDA graphs
(`mode="reduce-overhead"`), beside eager, in one process.

  python benchmarks/reduce_overhead.py [--cases seed_block,gpt2] [--modes ...] [--json PATH]
  python benchmarks/reduce_overhead.py --device cpu --size tiny --modes eager,kiln   (a check)
  python benchmarks/reduce_overhead.py --cases gpt2 --modes kiln,inductor --profile 200

Cases (bf16 inference on CUDA, float32 on the CPU check; random weights):
- `seed_block`: the seed's TransformerBlock at batch 1, sequence 128 (d_model 1024, 16 heads).
- `gpt2`: HF GPT-2 (default config) at batch 1, 32 tokens (the anchors' latency row), no cache.
Modes: eager, inductor (torch.compile default), inductor_reduce_overhead, kiln (default) and
kiln_reduce_overhead (kiln's CUDA graphs, `config.cudagraphs_on_gpu` switched on for that
compile). Per row: the median ms of `triton.testing.do_bench` (CUDA) or of a timed loop (CPU),
the first call's seconds, the output's relative error against eager, and for the kiln CUDA
graph rows the private pools' bytes (`CudaGraphRunner.pool_bytes`) and how many calls replayed.
`--profile N`: after each mode's timing, N more calls under cProfile, the functions with the
most own time printed (where a host-bound mode's time goes, kiln's and torch.compile's side by
side: guards, wrapper, launches, library calls).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

import kiln
from kiln.config import config

MODES = ("eager", "inductor", "inductor_reduce_overhead", "kiln", "kiln_reduce_overhead")


def build(case: str, size: str, device: str, dtype: torch.dtype) -> tuple[Any, tuple]:
    """The model (eval, on `device`, in `dtype`) and its inputs."""
    gen = torch.Generator().manual_seed(0)
    if case == "seed_block":
        from kiln.tools.seed_model import TransformerBlock
        d_model, heads, seq = (1024, 16, 128) if size == "full" else (64, 4, 16)
        model = TransformerBlock(d_model, heads)
        inputs = (torch.randn(1, seq, d_model, generator=gen),)
    elif case == "gpt2":
        import transformers as T
        cfg = T.GPT2Config() if size == "full" else T.GPT2Config(n_layer=2, n_embd=64, n_head=4)
        cfg.use_cache = False
        model = T.GPT2LMHeadModel(cfg)
        inputs = (torch.randint(0, cfg.vocab_size, (1, 32 if size == "full" else 8),
                                generator=gen),)
    else:
        raise SystemExit(f"unknown case {case!r}: seed_block or gpt2")
    model = model.to(device).eval().to(dtype)
    inputs = tuple(x.to(device).to(dtype) if x.is_floating_point() else x.to(device)
                   for x in inputs)
    return model, inputs


def compiled(mode: str, model: Any) -> Callable:
    torch._dynamo.reset()
    kiln.reset()
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    if mode == "inductor_reduce_overhead":
        return torch.compile(model, mode="reduce-overhead")
    if mode == "kiln":
        return kiln.compile(model)
    if mode == "kiln_reduce_overhead":
        return kiln.compile(model, mode="reduce-overhead")
    raise SystemExit(f"unknown mode {mode!r}: one of {', '.join(MODES)}")


def median_ms(fn: Callable[[], Any], device: str) -> float:
    if device == "cuda":
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    times = []
    for _ in range(20):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def logits(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output


def rel_err(got: Any, want: Any) -> float:
    got, want = logits(got).float(), logits(want).float()
    return float((got - want).norm() / want.norm().clamp_min(1e-12))


def runners_of(records_seen: list) -> list:
    """The CUDA graph runners of the artifacts compiled since `records_seen` was installed."""
    return [a.cudagraphs for a in records_seen if getattr(a, "cudagraphs", None) is not None]


def host_profile(fn: Callable[[], Any], calls: int, device: str, top: int = 25) -> str:
    """The `top` functions by own time over `calls` calls, per call (us), as text."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]  # type: ignore[attr-defined]
    out = io.StringIO()
    out.write(f"{'own us/call':>12} {'calls/call':>10}  function\n")
    for (filename, line, name), (_, ncalls, own, _cum, _) in rows:
        where = f"{filename.rsplit('/', 1)[-1]}:{line}({name})" if line else name
        out.write(f"{own / calls * 1e6:12.1f} {ncalls / calls:10.1f}  {where}\n")
    return out.getvalue()


def run_row(case: str, mode: str, model: Any, inputs: tuple, want: Any, device: str,
            profile_calls: int = 0) -> dict:
    import kiln.runtime.pipeline as pipeline

    built: list = []
    original = pipeline.compile_graph

    def recording(*args: Any, **kwargs: Any) -> Any:
        built.append(original(*args, **kwargs))
        return built[-1]

    kiln.runtime.compile_graph = recording  # the backend looks it up there at each compile
    saved = config.cudagraphs_on_gpu
    config.cudagraphs_on_gpu = mode == "kiln_reduce_overhead"
    try:
        fn = compiled(mode, model)
        with torch.no_grad():
            began = time.perf_counter()
            first = fn(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            first_s = time.perf_counter() - began
            err = rel_err(first, want)
            ms = median_ms(lambda: fn(*inputs), device)
            if profile_calls:
                print(f"-- host profile: {case} {mode}\n"
                      f"{host_profile(lambda: fn(*inputs), profile_calls, device)}", flush=True)
    finally:
        kiln.runtime.compile_graph = original
        config.cudagraphs_on_gpu = saved
    row = {"case": case, "mode": mode, "ms": round(ms, 4), "first_s": round(first_s, 2),
           "rel_err": float(f"{err:.2e}")}
    runners = runners_of(built)
    if runners:
        row["graph_pool_MiB"] = round(sum(r.pool_bytes for r in runners) / 2**20, 1)
        row["replayed"] = sum(r.stats["replayed"] for r in runners)
        row["without_graphs"] = sum(r.stats["eager"] for r in runners)
        row["blocked"] = sorted({r.blocked for r in runners if r.blocked})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="seed_block,gpt2")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default=None, help="full (default on CUDA) or tiny")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile N calls per mode with cProfile and print the top functions")
    args = ap.parse_args()
    size = args.size or ("full" if args.device == "cuda" else "tiny")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    rows = []
    for case in args.cases.split(","):
        model, inputs = build(case, size, args.device, dtype)
        with torch.no_grad():
            want = model(*inputs)
        for mode in args.modes.split(","):
            try:
                row = run_row(case, mode, model, inputs, want, args.device, args.profile)
            except Exception as err:  # noqa: BLE001 - one failing mode must not hide the rest
                row = {"case": case, "mode": mode, "error": repr(err)[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
