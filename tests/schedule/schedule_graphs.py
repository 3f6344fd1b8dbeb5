"""Test graphs for the schedule stage: small functions traced to ATen and lowered, the seed
block captured the way the backend sees it (kiln.compile + aot_compile, forward and backward
graphs), and helpers that check a schedule against eager and against its own invariants."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import kiln
import kiln.autograd
from kiln.lower import lower_graph
from kiln.lower.decomposition_tables import trace_aten
from kiln.lower.deps import read_writes
from kiln.lower.evaluate import run_ir
from kiln.lower.ir import ComputedBuffer, IRGraph
from kiln.schedule import FusedGroup, Schedule
from kiln.tools.seed_model import TransformerBlock

__all__ = ["assert_runs_like_eager", "assert_valid_order", "lower_fn", "schedule_fn",
           "seed_block_graphs"]


def lower_fn(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[IRGraph, list]:
    """(IR graph of fn, flat eager outputs)."""
    gm = trace_aten(fn, *inputs)
    out = fn(*inputs)
    flat = list(out) if isinstance(out, (tuple, list)) else [out]
    return lower_graph(gm), flat


def assert_runs_like_eager(sched: Schedule, inputs: list, eager: list,
                           rtol: float = 1e-4, atol: float = 1e-5) -> None:
    got = run_ir(sched.graph, inputs)
    assert len(got) == len(eager)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol)


def assert_as_close_to_float64_as_eager(sched: Schedule, gm: torch.fx.GraphModule,
                                        inputs: list, slack: float = 2.0,
                                        atol: float = 1e-5) -> None:
    """Each output's largest error against the graph run in float64 is within `slack` times
    eager's largest error (plus `atol`), as the fuzz oracle judges floats: for graphs whose
    values are large enough that eager's float32 rounding is itself far from exact."""
    def run(args: list) -> list:
        out = gm(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in inputs]
    got, eager, exact = run_ir(sched.graph, inputs), run(inputs), run(wide)
    for g, e, x in zip(got, eager, exact):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            ours, theirs = (g.double() - x).abs().max(), (e.double() - x).abs().max()
            assert ours <= slack * theirs + atol, \
                f"error {ours:.3g} against float64, eager's {theirs:.3g}"


def schedule_fn(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[IRGraph, Schedule]:
    """Lower `fn`, schedule it, and check the schedule's order and its results against eager."""
    from kiln.schedule import schedule

    graph, eager = lower_fn(fn, *inputs)
    sched = schedule(graph)
    assert_valid_order(sched)
    assert_runs_like_eager(sched, list(inputs), eager)
    return graph, sched


def assert_valid_order(sched: Schedule) -> None:
    """Every buffer a step reads exists before it (no cycle was scheduled), every computed
    buffer is in exactly one group, members are in dependency order and every member read
    by a later step, output or mutation is stored."""
    graph = sched.graph
    ready = {b.name for b in graph.inputs if b is not None} | set(graph.constants)
    seen: list[str] = []
    observed = {o.name for o in graph.outputs if hasattr(o, "name")}
    observed |= {a.name for _, a in graph.mutations}
    reads_later: dict[str, int] = {}
    for i, step in enumerate(sched.steps):
        if isinstance(step, FusedGroup):
            local: set[str] = set()
            for node in step.nodes:
                for name in read_writes(node).read_names:
                    assert name in ready or name in local, f"{node.name} reads {name} too early"
                local.add(node.name)
                seen.append(node.name)
                for name in read_writes(node).read_names:
                    if name not in local:
                        reads_later[name] = i
            ready |= local
        else:
            for arg in step.tensor_args():
                assert arg.name in ready, f"{step.kind} reads {arg.name} too early"
            ready |= {o.name for o in step.output_buffers()}
    computed = [n.name for n in graph.nodes if isinstance(n, ComputedBuffer)]
    assert sorted(seen) == sorted(computed)
    for i, step in enumerate(sched.steps):
        if not isinstance(step, FusedGroup):
            continue
        for node in step.nodes:
            needed = node.name in observed or _read_by_other_step(sched, node.name, step)
            assert (node.name in step.stores) == needed, node.name


def _read_by_other_step(sched: Schedule, name: str, own: FusedGroup) -> bool:
    for step in sched.steps:
        if step is own:
            continue
        if isinstance(step, FusedGroup):
            if any(name in read_writes(n).read_names for n in step.nodes):
                return True
        elif any(a.name == name for a in step.tensor_args()):
            return True
    return False


def seed_block_graphs(training: bool, d_model: int = 32, nhead: int = 4,
                      shape: tuple = (2, 8, 32)) -> list[tuple[torch.fx.GraphModule, list]]:
    """The seed block's ATen graphs as the backend receives them: (gm, example inputs) for
    the inference graph, or the forward and backward graphs."""
    torch.manual_seed(0)
    model = TransformerBlock(d_model, nhead)
    graphs: list = []

    def record(gm: torch.fx.GraphModule, example: list) -> Callable:
        graphs.append((gm, example))
        return gm.forward

    compiled = kiln.compile(model, backend=lambda gm, ex: kiln.autograd.aot_compile(
        gm, ex, fw_compiler=record, bw_compiler=record))
    x = torch.randn(*shape, requires_grad=training)
    if training:
        compiled(x).sum().backward()
    else:
        model.eval()
        with torch.no_grad():
            compiled(x)
    return graphs


def real_inputs(example: list) -> list[torch.Tensor]:
    """Fresh random tensors with the example inputs' sizes and strides."""
    return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).normal_()
            if t.is_floating_point() else torch.randint(0, 2, t.shape, dtype=t.dtype)
            for t in example]
