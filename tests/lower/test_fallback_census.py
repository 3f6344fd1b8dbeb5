"""Fallback census: the three models lower with exactly the pinned set of ATen fallbacks.

A new fallback (a torch upgrade changing a decomposition, a lowering rule that stopped matching)
fails here, and so does a pinned one that disappears (update the pin and say why)."""
from __future__ import annotations

import collections

import pytest
import torch

import models
from kiln.lower import lower_graph
from lower_graphs import MODELS, cached_model_graph, model_graph

# Expected fallbacks, with the reason each stays one.
INDEXED_ACCUMULATE = "aten.index_put.default"  # embedding backward: a scatter-add (atomics/sort)
RANDOM = "aten.bernoulli.p"                    # dropout's mask: random ops run through torch
EXPECTED = {
    ("block", False): {}, ("block", True): {},
    ("gpt", False): {}, ("gpt", True): {INDEXED_ACCUMULATE: 2},
    ("gpt_generate", False): {}, ("gpt_generate", True): {INDEXED_ACCUMULATE: 3},
    ("resnet", False): {}, ("resnet", True): {},
}


def _census(graph) -> dict[str, int]:
    return dict(collections.Counter(str(node.op) for node in graph.fallbacks))


@pytest.mark.parametrize("name,training", sorted(EXPECTED), ids=[
    f"{n}-{'train' if t else 'infer'}" for n, t in sorted(EXPECTED)])
def test_no_unexpected_fallback(name: str, training: bool) -> None:
    graph = lower_graph(cached_model_graph(name, training).gm)
    assert _census(graph) == EXPECTED[name, training]


def test_every_model_is_pinned() -> None:
    assert {name for name, _ in EXPECTED} == set(MODELS)


@pytest.mark.explicit_device  # CPU's dropout form (bernoulli); CUDA traces rand_like
def test_random_ops_fall_back() -> None:
    torch.manual_seed(0)
    gpt = models.GPT(dropout=0.1)
    args = (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    graph = lower_graph(model_graph(gpt, args, training=True).gm)
    assert _census(graph) == {RANDOM: 7, INDEXED_ACCUMULATE: 2}
