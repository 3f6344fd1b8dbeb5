"""Fusion structure on small functions: chains, LayerNorm and softmax become one kernel; a
transposed read, an extern in between or a different iteration space keep kernels apart (with
the reason recorded); random small graphs never schedule a cycle and still run like eager."""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from schedule_graphs import lower_fn, schedule_fn

from kiln.lower.ir import loop_vars
from kiln.schedule import (
    fusion_json,
    group_index,
    reduction_passes,
    render_schedule,
    schedule,
)
from kiln.schedule.fusion import group_deps




def test_pointwise_chain_is_one_group() -> None:
    def fn(x):
        a = x.exp() + 1
        return a, a.sin() * 2, (a.cos() - 1).abs()

    graph, sched = schedule_fn(fn, torch.randn(4, 16))
    assert len(graph.computed) == 3
    assert len(sched.steps) == 1 and len(sched.groups[0].nodes) == 3
    assert all(d.fused for d in sched.decisions)


def test_residual_add_layernorm_is_one_group() -> None:
    def fn(x, y, w, b):
        return F.layer_norm(x + y, (32,), w, b)

    inputs = (torch.randn(2, 8, 32), torch.randn(2, 8, 32), torch.randn(32), torch.randn(32))
    graph, sched = schedule_fn(fn, *inputs)
    assert len(graph.computed) >= 3
    (group,) = sched.steps
    assert group.is_reduction and group.numel == 16 and group.rnumel == 32
    assert len(reduction_passes(group)) == 3  # mean, then var, then normalize


def test_softmax_is_one_group() -> None:
    graph, sched = schedule_fn(lambda x: torch.softmax(x, -1), torch.randn(4, 6, 10))
    assert len(graph.computed) == 3
    (group,) = sched.steps
    assert [n.data.reduction_type for n in group.nodes if n.is_reduction] == ["max", "sum"]
    assert group.stores == (group.nodes[-1].name,)


def test_transposed_read_is_not_fused() -> None:
    def fn(*xs):
        a = sum(xs[1:], xs[0])  # over 8 loads: realized, not inlined into its reader
        return a, a.t().contiguous() * 2

    _, sched = schedule_fn(fn, *[torch.randn(8, 4) for _ in range(9)])
    assert len(sched.groups) == 2
    (decision,) = [d for d in sched.decisions if not d.fused]
    assert "transposed" in decision.reason


def test_no_fusion_across_an_extern() -> None:
    def fn(x, w):
        a = x.exp()
        return a, (a @ w) + a.sin()

    _, sched = schedule_fn(fn, torch.randn(8, 8), torch.randn(8, 8))
    kinds = [getattr(s, "kind", "group") for s in sched.steps]
    assert kinds == ["group", "mm", "group"]
    reasons = [d.reason for d in sched.decisions if not d.fused]
    assert any(r.startswith("an extern (mm") for r in reasons)


def test_different_iteration_space_reason() -> None:
    def fn(x):
        a = x.exp()
        return a, a.sum(1), a.repeat(2, 1).sin()

    _, sched = schedule_fn(fn, torch.randn(8, 4))
    reasons = [d.reason for d in sched.decisions if not d.fused]
    assert any("different iteration space" in r for r in reasons)


def test_members_read_each_other_at_the_written_index() -> None:
    _, sched = schedule_fn(lambda x, y: F.layer_norm(x + y, (16,)), torch.randn(4, 16),
                      torch.randn(4, 16))
    for group in sched.groups:
        written = {n.name: group_deps(n, group.x_ranges, group.r_ranges).writes[0].index
                   for n in group.nodes}
        for node in group.nodes:
            for dep in group_deps(node, group.x_ranges, group.r_ranges).reads:
                if dep.name in written and dep.name != node.name:
                    assert dep.index == written[dep.name]


def test_group_index_maps_a_pointwise_member_onto_x_and_r() -> None:
    _, sched = schedule_fn(lambda x: torch.softmax(x, -1), torch.randn(3, 5))
    group = sched.groups[0]
    normalize = group.nodes[-1]
    xv, rv = loop_vars(group.x_ranges, "x"), loop_vars(group.r_ranges, "r")
    index, _ = group_index(normalize, xv, rv, group.x_ranges, group.r_ranges)
    assert [str(i) for i in index] == ["x0", "r0"]


_UNARY = [torch.exp, torch.sin, torch.tanh, lambda t: t * 2 + 1]


def _random_fn(seed: int):
    def fn(x, w):
        rng = random.Random(seed)  # the same graph at trace time and in eager
        values = [x]
        outs = []
        for _ in range(rng.randint(3, 7)):
            a = rng.choice(values)
            op = rng.choice(["unary", "binary", "sum", "softmax", "mm", "transpose", "output"])
            if op == "unary":
                values.append(rng.choice(_UNARY)(a))
            elif op == "binary":
                values.append(a + rng.choice(values))
            elif op == "sum":
                values.append(a - a.sum(-1, keepdim=True))
            elif op == "softmax":
                values.append(torch.softmax(a, -1))
            elif op == "mm":
                values.append(a @ w)
            elif op == "transpose":
                values.append(a.t().contiguous().t() * 0.5)
            else:
                outs.append(a.exp())
        return (*outs, values[-1])

    return fn


def test_random_graphs_schedule_without_cycles() -> None:
    for seed in range(12):
        x, w = torch.randn(6, 6) * 0.5, torch.randn(6, 6) * 0.5
        schedule_fn(_random_fn(seed), x, w)


def test_render_and_fusion_json() -> None:
    def fn(x, w):
        a = x.exp()
        return a, F.layer_norm((a @ w) + a, (8,))

    _, sched = schedule_fn(fn, torch.randn(4, 8), torch.randn(8, 8))
    text = render_schedule(sched)
    for i, step in enumerate(sched.steps):
        assert f"step {i}: " in text
    for d in sched.decisions:
        if not d.fused:
            assert f"{d.a} / {d.b}: {d.reason}" in text
    record = fusion_json(sched)
    assert [g["kernel"] for g in record["groups"]] == [
        s.name if hasattr(s, "nodes") else f"extern:{s.kind}" for s in sched.steps]
    assert {(n["a"], n["b"]) for n in record["not_fused"]} == {
        (d.a, d.b) for d in sched.decisions if not d.fused}
    assert all(g["ops"] and g["nodes"] for g in record["groups"])


def test_fusion_log_artifact(capsys) -> None:
    from kiln import logs

    graph, _ = lower_fn(lambda x: torch.softmax(x, -1), torch.randn(3, 5))
    schedule(graph)
    assert "[kiln:fusion]" not in capsys.readouterr().err
    logs.set_logs("fusion")
    schedule(graph)
    err = capsys.readouterr().err
    assert "[kiln:fusion] schedule: 1 steps (1 kernels, 0 extern calls)" in err
