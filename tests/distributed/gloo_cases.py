"""The cases of test_ddp_fsdp_gloo.py, run on every rank of a 2-process gloo group.

`run_rank` trains each model with eager DDP/FSDP2 and with kiln under DDP/FSDP2 from the same
weights and data (fresh random inputs per rank and step), then writes one JSON file per rank:
for each case the largest parameter, gradient and optimizer-state difference from eager, the
graphs kiln captured and ran and the codes of the graph breaks it reported. The test process
reads and asserts on them. The FSDP2 cases are in `fsdp_cases`, the models and the comparison
in `gloo_common`. Spawned processes import these modules by name (on the parent's sys.path).
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from fsdp_cases import fsdp_cases
from gloo_common import MAKERS, Trained, diffs, train

BACKENDS = ("aot_eager", "kiln")


# DDP buckets small enough that each model's graph splits into 3 pieces or more
# (kiln.capture.ddp_split): the MLP's layers hold 2.1-4.2 KB of parameters, the block's 16 KB;
# the stack's blocks 200 KB each, the GPT-2's too (the single-rank NCCL test's models)
SPLIT_BUCKET_MB = {"mlp": 0.002, "block": 0.02, "stack": 0.1, "gpt2": 0.2}


def ddp_case(name: str, wrap: str, backend: str, rank: int, split: bool = False,
              device: str = "cpu") -> Trained:
    import kiln
    from torch.nn.parallel import DistributedDataParallel as DDP
    options = {"bucket_cap_mb": SPLIT_BUCKET_MB[name]} if split else {}
    if split:  # captured afresh: the split (and its record) happens at capture, in this case
        kiln.reset()
    torch.manual_seed(0)
    base = MAKERS[name]().to(device)  # made on the CPU: the same weights on every device
    ref = DDP(copy.deepcopy(base), **options)
    ref_opt = train(ref, ref, name, rank, device)
    inner = copy.deepcopy(base)
    if wrap == "compile(DDP)":
        ddp = DDP(inner, **options)
        run = kiln.compile(ddp, backend=backend)
    else:
        ddp = DDP(kiln.compile(inner, backend=backend), **options)
        run = ddp
    return Trained(ref.module, inner, ref_opt, train(run, ddp, name, rank, device))


def _collectives(rank: int) -> dict[str, Any]:
    """A compiled function calling c10d collectives (in place: they must not be dropped)."""
    import kiln

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.sin() * 2
        dist.all_reduce(y)
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, y + dist.get_rank())
        return torch.cat(parts).cos()

    x = torch.randn(8, generator=torch.Generator().manual_seed(7 + rank))
    expected = fn(x)
    got = kiln.compile(fn, backend="aot_eager")(x)
    return {"param": (expected - got).abs().max().item(), "grad": 0.0, "state": 0.0}


def _cases() -> dict[str, Callable[[int], Any]]:
    cases: dict[str, Callable[[int], Any]] = {}
    for backend in BACKENDS:
        for name in ("mlp", "block"):
            for wrap in ("compile(DDP)", "DDP(compile)"):
                cases[f"ddp-{name}-{wrap}-{backend}"] = (
                    lambda rank, n=name, w=wrap, b=backend: ddp_case(n, w, b, rank))
                cases[f"ddp-split-{name}-{wrap}-{backend}"] = (
                    lambda rank, n=name, w=wrap, b=backend: ddp_case(n, w, b, rank, True))
    # the suite's GPT-2: DDP's hooks on a tied embedding / lm_head weight
    # one of the four (wrappings x backends): each adds 2-5 s to CI
    cases["ddp-gpt2-compile(DDP)-kiln"] = lambda rank: ddp_case("gpt2", "compile(DDP)", "kiln",
                                                                 rank)
    cases.update(fsdp_cases(BACKENDS))
    cases["collectives"] = _collectives
    return cases


CASES = tuple(_cases())


def _run_case(case: Callable[[int], Any], rank: int) -> dict[str, Any]:
    from kiln import records
    from kiln.capture.dispatch import GRAPH_RUNS
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    runs, start = GRAPH_RUNS[0], time.monotonic()
    try:
        result = case(rank)
    finally:
        records.active_recorders().remove(recorder)
    return {**(result if isinstance(result, dict) else diffs(result)),
            "graph_runs": GRAPH_RUNS[0] - runs, "seconds": round(time.monotonic() - start, 1),
            "breaks": sorted({b.code for b in recorder.breaks}),
            "graphs": [_graph(g) for g in recorder.graphs],
            "recompiles": [r.render() for r in recorder.recompiles],
            # ATen graphs the kiln backend compiled to kernels (none on the CPU's default)
            "pipeline_compiles": len(recorder.pipeline_timings),
            # per graph split at DDP bucket boundaries: its pieces' parameter bytes
            "splits": [[p.nbytes for p in g.ddp_split.pieces]
                       for g in recorder.graphs if g.ddp_split is not None]}


def _graph(record: Any) -> dict[str, Any]:
    """A captured graph: its function, and the dtypes of its inputs read from the module
    (`self.*`: parameters and buffers; under a mixed precision policy, FSDP2's cast copies)."""
    nodes = record.graph.graph.find_nodes(op="placeholder") if record.graph is not None else []
    dtypes = {str(n.meta["val"].dtype) for n in nodes
              if str(n.meta.get("source", "")).startswith("self.")
              and isinstance(n.meta.get("val"), torch.Tensor)}
    return {"function": record.function, "module_dtypes": sorted(dtypes)}


def run_rank(rank: int, world: int, init: str, out_dir: str) -> None:
    """One gloo rank: every case in order."""
    run_cases(_cases(), "gloo", rank, world, init, out_dir)


def run_cases(cases: dict[str, Callable[[int], Any]], backend: str, rank: int, world: int,
              init: str, out_dir: str) -> None:
    """One rank of a process group: `cases` in order (the ranks must make the same collective
    calls), the results written to `out_dir/rank{rank}.json` for `spawn_cases`."""
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        for name, case in cases.items():
            try:
                results[name] = _run_case(case, rank)
            except Exception:  # noqa: BLE001 - reported to the test, which fails on it
                results[name] = {"error": traceback.format_exc()}
                break  # the other rank may now wait in a collective: stop both
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()
    sys.stdout.flush()


def spawn_cases(target: Callable[..., None], world: int, out_dir: Path, env: dict[str, str],
                deadline_s: float) -> list[dict]:
    """`target(rank, world, init, out_dir)` (a `run_rank`) on `world` spawned ranks, killed
    after `deadline_s`; what each rank wrote."""
    from kiln.tools.ranks import free_port, spawn_ranks
    spawn_ranks(target, world, (world, f"tcp://127.0.0.1:{free_port()}", str(out_dir)),
                deadline_s, env)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def case_of(results: list[dict], name: str) -> list[dict]:
    """Case `name`'s results on every rank; fails when a rank did not finish it."""
    per_rank = []
    for rank, found in enumerate(results):
        assert name in found, f"rank {rank} did not reach case {name} (an earlier case failed)"
        assert "error" not in found[name], f"rank {rank}, {name}:\n{found[name]['error']}"
        per_rank.append(found[name])
    return per_rank
