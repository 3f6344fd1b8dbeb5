"""The seed block, nanoGPT and TinyResNet at tiny sizes, inference and training (the joint
forward+backward graph), lowered and run by the reference evaluator, equal to eager (fp32 rtol
1e-4, atol 1e-5); also with the attention rewrite off, and through the printed IR."""
from __future__ import annotations

import pytest
import torch

from kiln.lower import lower_graph
from kiln.lower.evaluate import run_ir, run_printed
from lower_graphs import MODELS, cached_model_graph

RTOL, ATOL = 1e-4, 1e-5
CASES = [(name, training) for name in MODELS for training in (False, True)]


def _assert_equal_to_eager(got: list, eager: list) -> None:
    assert len(got) == len(eager)
    for g, e in zip(got, eager):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)
            assert all(a == b for s, a, b in zip(g.shape, g.stride(), e.stride()) if s > 1)
        else:
            assert g == e


@pytest.mark.parametrize("name,training", CASES, ids=[f"{n}-{'train' if t else 'infer'}"
                                                      for n, t in CASES])
def test_model_lowers_and_matches_eager(name: str, training: bool) -> None:
    mg = cached_model_graph(name, training)
    graph = lower_graph(mg.gm)
    _assert_equal_to_eager(run_ir(graph, mg.inputs), mg.eager)


@pytest.mark.parametrize("training", [False, True])
def test_seed_block_without_attention_rewrite(training: bool) -> None:
    mg = cached_model_graph("block", training)
    graph = lower_graph(mg.gm, attention_rewrite=False)
    assert not any(e.kind.startswith("attention") for e in graph.externs)
    _assert_equal_to_eager(run_ir(graph, mg.inputs), mg.eager)


def test_printed_ir_runs_and_matches() -> None:
    mg = cached_model_graph("block", True)
    graph = lower_graph(mg.gm)
    _assert_equal_to_eager(run_printed(str(graph), graph, mg.inputs), mg.eager)


def test_lowering_leaves_the_callers_graph_alone() -> None:
    mg = cached_model_graph("block", True)
    before = mg.gm.code
    lower_graph(mg.gm)
    assert mg.gm.code == before


def test_every_ir_node_records_its_fx_origins() -> None:
    mg = cached_model_graph("gpt", True)
    names = {n.name for n in mg.gm.graph.nodes}
    graph = lower_graph(mg.gm)
    for node in graph.nodes:
        assert node.origins, node
        assert all(o.node in names or o.op.startswith("aten._scaled") for o in node.origins)


def test_reset_clears_the_stage_caches() -> None:
    import kiln.lower
    from kiln.lower import decomposition_tables, index

    mg = cached_model_graph("block", False)
    lower_graph(mg.gm)
    assert decomposition_tables._traced
    kiln.lower.reset()
    assert not decomposition_tables._traced and not index._affine_cache
    _assert_equal_to_eager(run_ir(lower_graph(mg.gm), mg.inputs), mg.eager)
