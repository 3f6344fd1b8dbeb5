"""The seed block as the backend sees it (kiln.compile + aot_compile), scheduled: inference
loses its q/k/v copies and fits in few steps; the training forward and backward graphs
schedule, explain every not-fused neighbour pair, and still run like eager."""
from __future__ import annotations

import pytest
import torch
from schedule_graphs import (
    assert_as_close_to_float64_as_eager,
    assert_runs_like_eager,
    assert_valid_order,
    real_inputs,
    seed_block_graphs,
)

from kiln.lower import lower_graph
from kiln.lower.evaluate import run_ir
from kiln.lower.ir import ComputedBuffer, Extern
from kiln.schedule import schedule, trivial_schedule


@pytest.fixture(scope="module")
def inference():
    (gm, example), = seed_block_graphs(training=False)
    return gm, example, lower_graph(gm, example)


@pytest.fixture(scope="module")
def training():
    return [(gm, ex, lower_graph(gm, ex)) for gm, ex in seed_block_graphs(training=True)]


def _eager(gm, inputs):
    out = gm(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def test_inference_qkv_copies_are_elided(inference) -> None:
    gm, example, graph = inference
    sched = schedule(graph)
    attention = next(n for n in sched.graph.nodes if isinstance(n, Extern)
                     and n.kind == "attention")
    producers = {o.name: n.kind for n in sched.graph.externs for o in n.output_buffers()}
    q, k, v = attention.args[:3]
    assert [producers.get(a.name) for a in (q, k, v)] == ["addmm"] * 3
    out_proj = sched.graph.nodes[sched.graph.nodes.index(attention) + 1]
    assert out_proj.kind == "addmm" and out_proj.args[1].name == attention.outputs[0].name
    assert len(sched.elided) >= 4
    assert all(name not in sched.graph.buffers for name in sched.elided)


def test_inference_step_count(inference) -> None:
    _, _, graph = inference
    before = len(trivial_schedule(graph).steps)
    after = len(schedule(graph).steps)
    assert after <= 10 < before  # 19 -> 10: copies elided, LayerNorms fused
    assert_valid_order(schedule(graph))


@pytest.mark.explicit_device  # module-scoped CPU seed-block graphs
def test_inference_runs_like_eager(inference) -> None:
    gm, example, graph = inference
    inputs = real_inputs(example)
    assert_runs_like_eager(schedule(graph), inputs, _eager(gm, inputs))


def test_inference_layernorms_are_one_kernel_each(inference) -> None:
    _, _, graph = inference
    sched = schedule(graph)
    reductions = [g for g in sched.groups if g.is_reduction]
    assert len(reductions) == 2
    for group in reductions:
        kinds = [n.data.reduction_type if n.is_reduction else "pointwise" for n in group.nodes]
        assert kinds == ["sum", "sum", "pointwise"]
        assert group.stores == (group.nodes[-1].name,)


@pytest.mark.explicit_device  # module-scoped CPU seed-block graphs
def test_training_graphs_schedule_and_explain(training) -> None:
    for gm, example, graph in training:
        sched = schedule(graph)
        assert_valid_order(sched)
        assert len(sched.steps) < len(trivial_schedule(graph).steps)
        not_fused = [d for d in sched.decisions if not d.fused]
        assert not_fused and all(d.reason.strip() for d in not_fused)
        computed = [n.name for n in graph.nodes if isinstance(n, ComputedBuffer)]
        pairs = {(d.a, d.b) for d in sched.decisions}
        assert all(p in pairs for p in zip(computed, computed[1:]))
        inputs = real_inputs(example)
        # random stand-ins for saved activations make values up to ~4e4, whose float32
        # rounding differs by op order: judged against float64, no worse than eager's own error
        assert_as_close_to_float64_as_eager(sched, gm, inputs)
        assert_runs_like_eager(sched, inputs, run_ir(graph, inputs), rtol=1e-6, atol=1e-6)


def test_unfused_schedule_still_elides(inference) -> None:
    _, _, graph = inference
    sched = schedule(graph, fuse=False)
    assert all(len(g.nodes) == 1 for g in sched.groups)
    assert sched.elided
    assert all(not d.fused and d.reason == "fusion disabled" for d in sched.decisions)


@pytest.mark.explicit_device  # module-scoped CPU seed-block graphs
def test_lowered_graph_alone_runs_like_eager(inference) -> None:
    """The lower stage copies an SDPA operand whose head dim is not contiguous (the CPU flash
    kernel reads such a k wrongly), so even the unscheduled IR matches eager."""
    gm, example, graph = inference
    inputs = real_inputs(example)
    got = run_ir(graph, inputs)
    for g, e in zip(got, _eager(gm, inputs)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    for ext in graph.externs:
        if ext.kind == "attention":
            assert all(a.stride[-1] == 1 for a in ext.tensor_args() if len(a.size) == 4)
