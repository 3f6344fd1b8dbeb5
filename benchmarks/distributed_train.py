"""Distributed training throughput (issue 20): the seed block stack and GPT-2 under DDP and FSDP2,
eager vs torch.compile vs kiln.compile, in one run on N GPUs (NCCL, one rank per GPU).

  python benchmarks/distributed_train.py --nproc 2 [--models seed_stack,gpt2]
      [--modes eager,inductor,kiln] [--wrap ddp,fsdp2] [--steps 20] [--warmup 5]
      [--profile DIR] [--json PATH]

Spawns the ranks itself; `--nproc 1` runs on one GPU (NCCL with one rank). Without CUDA, NCCL
or --nproc GPUs it exits with a message before starting any rank; the whole run is killed after
--timeout seconds, so a hang fails.

Precision, as torch.compile users train: bf16 compute, fp32 weights and AdamW. Under DDP
`torch.autocast("cuda", torch.bfloat16)` around the forward (AMP; bf16 needs no grad scaler);
under FSDP2 `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` (torchtitan's
default: bf16 all-gathers, gradients reduce-scattered in fp32).

Compilation, as users apply it: DDP: `compile(DDP(model))`, whole (kiln and TorchDynamo split the
graph at DDP's bucket boundaries so all-reduces can overlap the backward); FSDP2: each block and
the root `fully_shard`ed, then each block compiled on its own and assigned back (regional
compilation; the root's embeddings, head and loss run eagerly).

Models (per rank): seed_stack: the seed TransformerBlock (d_model 1024, 16 heads) x --layers,
input [32, 512, 1024], loss mean square; gpt2: transformers' GPT2LMHeadModel, default config
(124M parameters), random weights, 16 x 1024 tokens, its LM loss.

Per (model, wrap, mode) row: first step seconds (compiles included) and compile_s (first step
less the median), median step ms over --steps after --warmup (each step CUDA-synchronized),
tokens/s over all ranks, peak allocated memory per rank, kiln's captured graphs and DDP split
pieces, TorchDynamo's graphs. With --profile DIR: a chrome trace of 3 steps per row and rank
(DIR/<model>-<wrap>-<mode>-rank<r>.json; NCCL kernels beside the backward's), and per trace the
fraction of NCCL kernel time overlapping compute kernels on that GPU. Rank 0 prints one JSON line
per row and a markdown table at the end; --json writes the rows.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from kiln.tools.ranks import free_port, spawn_ranks  # noqa: E402

MODELS = ("seed_stack", "gpt2")
MODES = ("eager", "inductor", "kiln")
WRAPS = ("ddp", "fsdp2")
PROFILE_STEPS = 3
# the ranks' device: --device cpu (gloo) runs this script's paths on a machine without a GPU,
# for checking them; its numbers mean nothing
DEVICE = "cuda"
BATCHES = 4  # distinct inputs drawn once per row, cycled (drawing is not timed)


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(allowed)}")
        return names
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks, one GPU each")
    ap.add_argument("--models", type=_names(MODELS), default=list(MODELS))
    ap.add_argument("--modes", type=_names(MODES), default=list(MODES))
    ap.add_argument("--wrap", type=_names(WRAPS), default=list(WRAPS))
    ap.add_argument("--steps", type=int, default=20, help="timed steps per row")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    ap.add_argument("--layers", type=int, default=8, help="seed blocks in seed_stack")
    ap.add_argument("--batch", type=int, default=None, help="per rank (default: per model)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default: per model)")
    ap.add_argument("--profile", default=None, help="folder for chrome traces")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: gloo ranks, to check the script without a GPU (no measurement)")
    args = ap.parse_args(argv)
    if args.nproc < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--nproc and --steps must be at least 1, --warmup at least 0")
    return args


def check_devices(nproc: int) -> None:
    """Exit with a message unless NCCL and `nproc` GPUs are there (before any rank starts:
    a rank without its GPU would fail or wait in the rendezvous)."""
    if not torch.cuda.is_available():
        raise SystemExit("distributed_train.py needs CUDA GPUs (NCCL, one rank per GPU): "
                         "torch.cuda.is_available() is False here")
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_nccl_available()):
        raise SystemExit("distributed_train.py needs torch.distributed with NCCL")
    found = torch.cuda.device_count()
    if found < nproc:
        raise SystemExit(f"--nproc {nproc} needs {nproc} GPUs; {found} visible "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})")


# -- overlap of NCCL kernels with compute kernels, from a chrome trace's GPU events -------------

def kernel_spans(events: list[dict]) -> tuple[list[tuple[float, float]], list]:
    """(NCCL kernels, other kernels) as (start, end) µs, from the trace's kernel events."""
    nccl, compute = [], []
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        (nccl if "nccl" in str(e.get("name", "")).lower() else compute).append(span)
    return nccl, compute


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of spans as sorted disjoint spans (kernels on several streams overlap)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two merged span lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def nccl_overlap(events: list[dict]) -> dict[str, Any]:
    """NCCL kernel time (µs, union over streams), the part of it during which a compute kernel
    ran, and their ratio (None without NCCL kernels)."""
    nccl, compute = (merge(s) for s in kernel_spans(events))
    nccl_us = sum(end - start for start, end in nccl)
    overlapped = intersection(nccl, compute)
    return {"nccl_us": round(nccl_us, 1), "overlapped_us": round(overlapped, 1),
            "overlap": round(overlapped / nccl_us, 3) if nccl_us else None}


# -- models ------------------------------------------------------------------------------------

class SeedStack(nn.Module):
    """Seed blocks in a row; the loss in the forward, as GPT-2's, so both compile it."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        from kiln.tools.seed_model import TransformerBlock
        self.layers = nn.ModuleList([TransformerBlock(1024, 16) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.float().square().mean()


@dataclasses.dataclass
class Spec:
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], torch.Tensor]  # one rank's input, on its GPU
    loss: Callable[[Callable, torch.Tensor], torch.Tensor]
    blocks: Callable[[nn.Module], nn.ModuleList]  # what FSDP2 shards and compiles per layer
    tokens: int  # per rank and step


def _gpt2() -> nn.Module:
    import transformers
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    model.config.use_cache = False
    return model


SHAPES = {"seed_stack": (32, 512), "gpt2": (16, 1024)}  # (batch per rank, sequence)


def spec(name: str, args: argparse.Namespace) -> Spec:
    batch, seq = args.batch or SHAPES[name][0], args.seq or SHAPES[name][1]
    if name == "seed_stack":
        return Spec(lambda: SeedStack(args.layers),
                    lambda g: torch.randn(batch, seq, 1024, generator=g, device=DEVICE),
                    lambda run, x: run(x), lambda m: m.layers, batch * seq)
    return Spec(_gpt2, lambda g: torch.randint(0, 50257, (batch, seq), generator=g,
                                               device=DEVICE),
                lambda run, x: run(input_ids=x, labels=x).loss, lambda m: m.transformer.h,
                batch * seq)


# -- one row -----------------------------------------------------------------------------------

def _compiler(mode: str) -> Callable[[nn.Module], Callable]:
    if mode == "eager":
        return lambda m: m
    if mode == "inductor":
        return torch.compile
    import kiln
    return kiln.compile


def wrap_model(model: nn.Module, wrap: str, mode: str, s: Spec) -> Callable:
    """The callable a step runs: compile(DDP(model)), or FSDP2 per block and on the root with
    each block then compiled and assigned back."""
    compile_ = _compiler(mode)
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [torch.cuda.current_device()] if DEVICE == "cuda" else None
        return compile_(DDP(model, device_ids=ids))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(DEVICE, (torch.distributed.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = s.blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    # compiled after the root is sharded (compiling each block before fully_shard(root) works
    # too: docs/distributed.md, "Sharding a compiled module")
    for i, block in enumerate(blocks):
        blocks[i] = compile_(block)
    return model


def make_step(run: Callable, model: nn.Module, wrap: str, s: Spec) -> Callable:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp = (lambda: torch.autocast(DEVICE, dtype=torch.bfloat16)) if wrap == "ddp" \
        else contextlib.nullcontext

    def step(x: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with amp():
            loss = s.loss(run, x)
        loss.backward()
        opt.step()
    return step


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _timed(step: Callable, x: torch.Tensor) -> float:
    _sync()
    start = time.perf_counter()
    step(x)
    _sync()
    return time.perf_counter() - start


def measure(step: Callable, batches: list, args: argparse.Namespace) -> dict[str, float]:
    first_s = _timed(step, batches[0])
    for i in range(args.warmup):  # DDP rebuilds its buckets after the first step; recompiles
        step(batches[(i + 1) % len(batches)])
    times = [_timed(step, batches[i % len(batches)]) for i in range(args.steps)]
    median = statistics.median(times)
    return {"first_step_s": round(first_s, 2), "compile_s": round(first_s - median, 2),
            "step_ms": round(median * 1e3, 2)}


def profile_steps(step: Callable, batches: list, path: str) -> dict[str, Any]:
    """PROFILE_STEPS steps under torch.profiler, written as a chrome trace; its NCCL overlap."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    _sync()
    with profile(activities=activities) as prof:
        for i in range(PROFILE_STEPS):
            step(batches[i % len(batches)])
        _sync()
    prof.export_chrome_trace(path)
    with open(path) as f:
        return {"trace": path, **nccl_overlap(json.load(f)["traceEvents"])}


def _reset_compilers() -> None:
    """Between rows: no compiled code, counter or cached block carried into the next."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import kiln
    torch._dynamo.reset()
    counters.clear()
    kiln.reset()
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _compiler_stats(mode: str, recorder: Any) -> dict[str, Any]:
    """What the compiler made: kiln's graphs, breaks and DDP split pieces (a kiln row with no
    graph ran eagerly), or TorchDynamo's graph count."""
    if mode == "kiln":
        return {"graphs": sum(g.graph is not None for g in recorder.graphs),
                "breaks": sorted({b.code for b in recorder.breaks}),
                "ddp_pieces": [len(g.ddp_split.pieces) for g in recorder.graphs
                               if g.ddp_split is not None]}
    if mode == "inductor":
        from torch._dynamo.utils import counters
        return {"graphs": counters["stats"]["unique_graphs"]}
    return {}


def _row(name: str, wrap: str, mode: str, args: argparse.Namespace, rank: int) -> dict:
    """This rank's measurements of one row."""
    from kiln import records
    s = spec(name, args)
    torch.manual_seed(0)  # the same weights on every rank (FSDP2 does not broadcast them)
    with torch.device(DEVICE):
        model = s.build()
    gen = torch.Generator(device=DEVICE).manual_seed(1000 + rank)
    batches = [s.batch(gen) for _ in range(BATCHES)]
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    try:
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        step = make_step(wrap_model(model, wrap, mode, s), model, wrap, s)
        row = measure(step, batches, args)
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) \
            if DEVICE == "cuda" else 0.0
        row.update(_compiler_stats(mode, recorder))
    finally:
        records.active_recorders().remove(recorder)
    row["tokens"] = s.tokens
    if args.profile:
        trace = os.path.join(args.profile, f"{name}-{wrap}-{mode}-rank{rank}.json")
        row.update(profile_steps(step, batches, trace))
    return row


def run_row(name: str, wrap: str, mode: str, args: argparse.Namespace, rank: int) -> dict:
    """One (model, wrap, mode) on every rank, gathered: rank 0's view with per-rank lists of
    what differs between ranks (peak memory, overlap). An error is reported, not raised, so
    the other rows still run (a rank stuck in a collective meets NCCL's or --timeout's end)."""
    import torch.distributed as dist
    try:
        mine = _row(name, wrap, mode, args, rank)
    except Exception as e:  # noqa: BLE001 - reported in the row
        traceback.print_exc()
        mine = {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        _reset_compilers()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return _gathered(name, wrap, mode, everyone)


def _gathered(name: str, wrap: str, mode: str, per_rank: list[dict]) -> dict:
    row = {"model": name, "wrap": wrap, "mode": mode, "world": len(per_rank), **per_rank[0]}
    errors = [r["error"] for r in per_rank if "error" in r]
    if errors:
        return {**row, "error": errors[0]}
    for key in ("peak_gib", "overlap", "nccl_us", "overlapped_us"):
        if key in row:
            row[key] = [r[key] for r in per_rank]
    row["tokens_per_s"] = round(row.pop("tokens") * len(per_rank) / row["step_ms"] * 1e3)
    return row


# -- the table ---------------------------------------------------------------------------------

COLUMNS = ("model", "wrap", "mode", "step ms", "tokens/s", "x eager", "first step s",
           "peak GiB", "NCCL overlap")


def _cells(row: dict, eager_ms: float | None) -> list[str]:
    if "error" in row:
        return [row["model"], row["wrap"], row["mode"], "error: " + row["error"][:60],
                "", "", "", "", ""]
    speedup = f"{eager_ms / row['step_ms']:.2f}" if eager_ms else ""
    overlap = ", ".join("-" if o is None else f"{o:.0%}" for o in row.get("overlap", []))
    return [row["model"], row["wrap"], row["mode"], f"{row['step_ms']:.1f}",
            f"{row['tokens_per_s']:,}", speedup, f"{row['first_step_s']:.1f}",
            f"{max(row['peak_gib']):.1f}", overlap]


def table(rows: list[dict]) -> str:
    """Markdown: one line per row, the speed-up over eager of the same model and wrap."""
    eager = {(r["model"], r["wrap"]): r["step_ms"] for r in rows
             if r["mode"] == "eager" and "error" not in r}
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = _cells(row, eager.get((row["model"], row["wrap"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- ranks -------------------------------------------------------------------------------------

def worker(rank: int, args: argparse.Namespace, init: str) -> None:
    import torch.distributed as dist
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", init_method=init,
                            rank=rank, world_size=args.nproc)
    try:
        rows = []
        for name in args.models:
            for wrap in args.wrap:
                for mode in args.modes:
                    rows.append(run_row(name, wrap, mode, args, rank))
                    if rank == 0:
                        print(json.dumps(rows[-1]), flush=True)
        if rank == 0:
            _report(rows, args)
    finally:
        dist.destroy_process_group()


def _report(rows: list[dict], args: argparse.Namespace) -> None:
    print(table(rows), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda":
        check_devices(args.nproc)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    spawn_ranks(worker, args.nproc, (args, f"tcp://127.0.0.1:{free_port()}"), args.timeout)


if __name__ == "__main__":
    main()
