"""Launch-bound sizes (issue 17): at batch 1 a step's cost is mostly its launches, so the
schedule must not add kernels there. The seed block at one sequence of 128 (rows of 1024) and a
GPT-2 decode-size call (a residual stream realized for two readers) keep one kernel per
LayerNorm; the schedules still compute eager's values."""
from __future__ import annotations

import pytest
import torch
from schedule_graphs import assert_runs_like_eager, assert_valid_order, real_inputs, seed_block_graphs

import kiln
import kiln.autograd
from kiln.lower import lower_graph
from kiln.schedule import schedule

pytestmark = pytest.mark.explicit_device  # CPU graphs, scheduled only (no kernels run)


def _kernels(sched) -> int:
    return sum(1 for step in sched.steps if hasattr(step, "nodes"))


def test_seed_block_at_batch_one_keeps_one_kernel_per_layer_norm() -> None:
    """Rows of 1024 at 128 rows used to be split (a partial and a final mean and variance per
    LayerNorm: 11 kernels in inference, where 3 do)."""
    (gm, example), = seed_block_graphs(training=False, d_model=1024, nhead=16,
                                        shape=(1, 128, 1024))
    sched = schedule(lower_graph(gm, example))
    assert not sched.split
    assert _kernels(sched) == 3  # LayerNorm 1, GELU, LayerNorm 2
    assert_valid_order(sched)


def test_seed_block_training_at_batch_one_is_not_split() -> None:
    fwd, bwd = [schedule(lower_graph(gm, ex)) for gm, ex in
                seed_block_graphs(training=True, d_model=1024, nhead=16, shape=(1, 128, 1024))]
    assert _kernels(fwd) <= 7 and _kernels(bwd) <= 11


def _gpt2_graph():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=32)
    cfg.use_cache = False
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    graphs = []

    def record(gm, example):
        graphs.append((gm, example))
        return gm.forward

    compiled = kiln.compile(model, backend=lambda gm, ex: kiln.autograd.aot_compile(
        gm, ex, fw_compiler=record, bw_compiler=record))
    with torch.no_grad():
        compiled(torch.randint(0, 97, (1, 16)))
    (gm, example), = graphs
    return gm, example


def test_gpt2_residual_stream_fuses_with_each_layer_norm() -> None:
    """GPT-2's residual (embedding gathers + the block outputs) is realized for its two
    readers; the LayerNorm over it reads its row's first element as the shifted mean's pivot.
    Each LayerNorm is one kernel with the residual add before it, not two."""
    gm, example = _gpt2_graph()
    graph = lower_graph(gm, example)
    sched = schedule(graph)
    norms = [g for g in sched.groups if g.is_reduction]
    assert len(norms) == 5  # ln_1 and ln_2 of each layer, ln_f
    pointwise = [g for g in sched.groups if not g.is_reduction]
    assert len(pointwise) <= 5, pointwise  # masks and positions, one GELU per layer
    assert not [d for d in sched.decisions if "different index" in d.reason]
    inputs = real_inputs(example)
    inputs = [torch.randint(0, 97, t.shape) if not t.is_floating_point() else t for t in inputs]
    assert_runs_like_eager(sched, inputs, list(gm(*inputs)))
