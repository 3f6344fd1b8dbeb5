"""Graphs that still mutate: in-place ops lower as their functional form, updates of graph inputs
(BatchNorm running statistics) are written back, and a mutation of an aliased tensor is refused
with a message that names the stage and what to do."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower import LoweringError, lower_graph
from kiln.lower.decomposition_tables import trace_table
from kiln.lower.evaluate import run_ir


def _trace(fn, *inputs):
    return make_fx(fn, decomposition_table=trace_table())(*[t.clone() for t in inputs])


def test_inplace_ops_on_intermediates():
    def fn(x, y):
        z = x * 2
        z.add_(y).relu_()
        return z.mul_(3)

    x, y = torch.randn(4, 5), torch.randn(5)
    graph = lower_graph(_trace(fn, x, y))
    assert not graph.mutations and not graph.fallbacks
    torch.testing.assert_close(run_ir(graph, [x, y])[0], fn(x, y))


def test_batch_norm_training_updates_running_stats():
    bn = nn.BatchNorm2d(3).train()
    x = torch.randn(2, 3, 4, 4)
    stats = [bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone()]

    def fn(x, mean, var, count):
        out = torch.func.functional_call(bn, {"running_mean": mean, "running_var": var,
                                              "num_batches_tracked": count}, (x,))
        return out.relu_()

    graph = lower_graph(_trace(fn, x, *stats))
    assert len(graph.mutations) == 3
    eager_stats = [t.clone() for t in stats]
    expected = fn(x, *eager_stats)
    ir_stats = [t.clone() for t in stats]
    torch.testing.assert_close(run_ir(graph, [x, *ir_stats])[0], expected)
    for got, want in zip(ir_stats, eager_stats):
        torch.testing.assert_close(got, want)


def test_mutating_an_aliased_tensor_is_refused():
    def fn(x):
        y = x * 1
        view = y[0]
        y.add_(1)
        return view * 2

    with pytest.raises(LoweringError) as err:
        lower_graph(_trace(fn, torch.randn(3, 4)))
    text = str(err.value)
    assert text.startswith("[kiln.lower] in-place update of ")
    assert "hint: functionalize the graph before lowering" in text
