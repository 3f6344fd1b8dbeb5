"""Horizontal GEMM merge: matmuls of one input against neighbouring blocks of one weight become
one library call; every reader (computed buffers, extern calls, graph outputs) follows the
column slices, and the results still equal eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from schedule_graphs import (
    assert_runs_like_eager,
    assert_valid_order,
    lower_fn,
    real_inputs,
    seed_block_graphs,
)

from kiln.lower import lower_graph
from kiln.schedule import schedule

E = 16


def _gemms(sched):
    return [n for n in sched.graph.externs if n.kind in ("mm", "addmm")]


def test_seed_block_inference_projects_qkv_in_one_gemm() -> None:
    (gm, example), = seed_block_graphs(training=False)
    graph = lower_graph(gm, example)
    sched = schedule(graph)
    gemms = _gemms(sched)
    assert len(gemms) == 4  # q/k/v merged, out_proj, fc1, fc2
    assert gemms[0].output_buffers()[0].layout.size[1] == 3 * 32
    attention = next(n for n in sched.graph.externs if n.kind == "attention")
    assert {a.name for a in attention.args[:3]} == {gemms[0].output_buffers()[0].name}
    assert len(sched.steps) <= 8
    assert_valid_order(sched)
    inputs = real_inputs(example)
    eager = gm(*inputs)
    assert_runs_like_eager(sched, inputs, list(eager) if isinstance(eager, tuple) else [eager])


def _two_projections(x, w, b):
    q = F.linear(x, w[:E], b[:E])
    k = F.linear(x, w[E:2 * E], b[E:2 * E])
    return q.relu() + 2 * k, k


def test_pointwise_readers_and_outputs_follow_the_slices() -> None:
    inputs = [torch.randn(8, E), torch.randn(3 * E, E), torch.randn(3 * E)]
    graph, _ = lower_fn(_two_projections, *inputs)
    sched = schedule(graph)
    assert len(_gemms(sched)) == 1
    assert_valid_order(sched)
    fresh = [torch.randn_like(t) for t in inputs]
    assert_runs_like_eager(sched, fresh, list(_two_projections(*fresh)))


def _gap(x, w):
    return x @ w[:E].t(), x @ w[2 * E:].t()  # blocks 0 and 2: not neighbours


def test_weights_with_a_gap_stay_separate() -> None:
    inputs = [torch.randn(8, E), torch.randn(3 * E, E)]
    graph, _ = lower_fn(_gap, *inputs)
    sched = schedule(graph)
    assert len(_gemms(sched)) == 2
    fresh = [torch.randn_like(t) for t in inputs]
    assert_runs_like_eager(sched, fresh, list(_gap(*fresh)))
