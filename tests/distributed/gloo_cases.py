"""The cases of test_ddp_fsdp_gloo.py, run on every rank of a 2-process gloo group.

`run_rank` trains each model with eager DDP/FSDP2 and with kiln under DDP/FSDP2 from the same
weights and data (fresh random inputs per rank and step), then writes one JSON file per rank:
for each case the largest parameter and gradient difference from eager, the graphs kiln ran
and the codes of the graph breaks it reported. The test process reads and asserts on them.
Spawned processes import this module by name (it sits on the parent's sys.path).
"""
from __future__ import annotations

import copy
import json
import os
import sys
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = 3
BACKENDS = ("aot_eager", "kiln")


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 16))


def block() -> nn.Module:
    from kiln.tools.suite import seed_block
    return seed_block.make_model("small")  # d_model 64, 4 heads


class Stack(nn.Module):
    """Two seed blocks and a head: FSDP2 shards each block and the root (the head)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([block(), block()])
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x).tanh()


INPUTS = {"mlp": (4, 16), "block": (2, 16, 64), "stack": (2, 16, 64)}
MAKERS = {"mlp": mlp, "block": block, "stack": Stack}


def _inputs(name: str, rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + 17 * rank + len(name))
    return [torch.randn(INPUTS[name], generator=gen) for _ in range(STEPS)]


def _optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "mlp":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    # eps well above rounding noise: a gradient that is zero in exact arithmetic (the key bias
    # of attention: softmax ignores it) is ~1e-9 noise that Adam would scale up to lr-sized
    # steps of random sign, in eager as much as in kiln
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4)


def _train(run: Callable, params: Any, name: str, rank: int) -> None:
    opt = _optimizer(name, params)
    for x in _inputs(name, rank):
        opt.zero_grad()
        run(x).square().mean().backward()
        opt.step()


def _full(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _diffs(ref: nn.Module, got: nn.Module) -> tuple[float, float]:
    dp = dg = 0.0
    for (name, a), (_, b) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        a_full, b_full = _full(a.detach()), _full(b.detach())
        dp = max(dp, (a_full - b_full).abs().max().item())
        ga, gb = _full(a.grad), _full(b.grad)
        if (ga is None) != (gb is None):
            raise AssertionError(f"{name}: grad is None in only one of eager and kiln")
        if ga is not None:
            dg = max(dg, (ga - gb).abs().max().item())
    return dp, dg


# DDP buckets small enough that each model's graph splits into 3 pieces or more
# (kiln.capture.ddp_split): the MLP's layers hold 2.1-4.2 KB of parameters, the block's 16 KB.
SPLIT_BUCKET_MB = {"mlp": 0.002, "block": 0.02}


def _ddp_case(name: str, wrap: str, backend: str, rank: int,
              split: bool = False) -> tuple[nn.Module, nn.Module]:
    import kiln
    from torch.nn.parallel import DistributedDataParallel as DDP
    options = {"bucket_cap_mb": SPLIT_BUCKET_MB[name]} if split else {}
    if split:  # captured afresh: the split (and its record) happens at capture, in this case
        kiln.reset()
    torch.manual_seed(0)
    base = MAKERS[name]()
    ref = DDP(copy.deepcopy(base), **options)
    _train(ref, ref.parameters(), name, rank)
    inner = copy.deepcopy(base)
    if wrap == "compile(DDP)":
        ddp = DDP(inner, **options)
        run = kiln.compile(ddp, backend=backend)
    else:
        ddp = DDP(kiln.compile(inner, backend=backend), **options)
        run = ddp
    _train(run, ddp.parameters(), name, rank)
    return ref.module, inner


def _shard(model: Stack) -> Stack:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    # A CPU mesh said outright: fully_shard's default mesh takes the accelerator where there is
    # one, and on a one-GPU machine rank 1 then picks cuda:1, which does not exist (SIGSEGV).
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_case(how: str, backend: str, rank: int) -> tuple[nn.Module, nn.Module]:
    import kiln
    torch.manual_seed(0)
    base = Stack()
    ref = _shard(copy.deepcopy(base))
    _train(ref, ref.parameters(), "stack", rank)
    model = _shard(copy.deepcopy(base))
    if how == "layers":  # each sharded layer compiled and assigned back (layer.compile style)
        for i, layer in enumerate(model.layers):
            model.layers[i] = kiln.compile(layer, backend=backend)
        run: Callable = model
    else:  # the whole sharded model: the layer calls break, each layer compiles on its own
        run = kiln.compile(model, backend=backend)
    _train(run, model.parameters(), "stack", rank)
    return ref, model


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
    return {"param": (expected - got).abs().max().item(), "grad": 0.0}


def _cases() -> dict[str, Callable[[int], Any]]:
    cases: dict[str, Callable[[int], Any]] = {}
    for backend in BACKENDS:
        for name in ("mlp", "block"):
            for wrap in ("compile(DDP)", "DDP(compile)"):
                cases[f"ddp-{name}-{wrap}-{backend}"] = (
                    lambda rank, n=name, w=wrap, b=backend: _ddp_case(n, w, b, rank))
                cases[f"ddp-split-{name}-{wrap}-{backend}"] = (
                    lambda rank, n=name, w=wrap, b=backend: _ddp_case(n, w, b, rank, True))
        for how in ("layers", "whole"):
            cases[f"fsdp2-{how}-{backend}"] = (
                lambda rank, h=how, b=backend: _fsdp_case(h, b, rank))
    cases["collectives"] = _collectives
    return cases


CASES = tuple(_cases())


def _run_case(case: Callable[[int], Any], rank: int) -> dict[str, Any]:
    from kiln import records
    from kiln.capture.dispatch import GRAPH_RUNS
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    runs = GRAPH_RUNS[0]
    try:
        result = case(rank)
    finally:
        records.active_recorders().remove(recorder)
    if isinstance(result, dict):
        diffs = result
    else:
        param, grad = _diffs(*result)
        diffs = {"param": param, "grad": grad}
    return {**diffs, "graph_runs": GRAPH_RUNS[0] - runs,
            "breaks": sorted({b.code for b in recorder.breaks}),
            # per graph split at DDP bucket boundaries: its pieces' parameter bytes
            "splits": [[p.nbytes for p in g.ddp_split.pieces]
                       for g in recorder.graphs if g.ddp_split is not None]}


def run_rank(rank: int, world: int, init: str, out_dir: str) -> None:
    """One rank: every case in order (the ranks must make the same collective calls)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        for name, case in _cases().items():
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
