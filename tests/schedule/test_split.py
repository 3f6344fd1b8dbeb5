"""Split reductions: long reductions with few outputs become a partial and a final reduction
that still compute eager's result (checked against an fp64 reference); short ones, argmax and
wide ones stay whole."""
from __future__ import annotations

import torch
from schedule_graphs import assert_runs_like_eager, assert_valid_order, lower_fn

from kiln.lower.evaluate import run_ir
from kiln.lower.ir import ComputedBuffer
from kiln.schedule import schedule
from kiln.schedule.split import INNER_WHOLE_RNUMEL, MIN_CHUNK, TARGET_PROGRAMS, plan_split


def _schedule(fn, x):
    graph, eager = lower_fn(fn, x)
    sched = schedule(graph)
    assert_valid_order(sched)
    assert_runs_like_eager(sched, [x], eager)
    reference = fn(x.double())
    got = run_ir(sched.graph, [x])[0]
    torch.testing.assert_close(got.to(reference.dtype), reference, rtol=1e-5, atol=1e-5)
    return graph, sched


def test_column_sum_is_split() -> None:
    """A bias gradient: few columns, many rows, read column-wise."""
    graph, sched = _schedule(lambda x: x.sum(0), torch.randn(2048, 24))
    (name, chunks), = sched.split.items()
    assert chunks > 1 and 2048 // chunks >= MIN_CHUNK
    partial = sched.graph.buffers[f"{name}_partial"]
    # chunk-major: neighbouring partial outputs are neighbouring columns (coalesced partials)
    assert isinstance(partial, ComputedBuffer) and partial.layout.size == (chunks, 24)
    assert sched.graph.buffers[name].layout == graph.buffers[name].layout


def test_full_max_and_min_are_split() -> None:
    for fn in (lambda x: x.amax(), lambda x: x.amin()):
        _, sched = _schedule(fn, torch.randn(128, 256))
        assert list(sched.split.values())[0] > 1


def test_prod_is_split() -> None:
    _, sched = _schedule(lambda x: x.prod(0), 1 + 0.001 * torch.randn(1024, 4))
    assert sched.split


def test_argmax_short_and_wide_reductions_stay_whole() -> None:
    for fn, x in ((lambda x: x.argmax(), torch.randn(64, 64)),
                  (lambda x: x.sum(0), torch.randn(300, 8)),
                  (lambda x: x.sum(1), torch.randn(TARGET_PROGRAMS, 600))):
        graph, sched = _schedule(fn, x)
        assert not sched.split


def test_plan_reaches_the_program_target() -> None:
    graph, _ = lower_fn(lambda x: x.sum(1), torch.randn(4, 32768))
    (node,) = graph.computed
    chunks = plan_split(node)
    # as many chunks as the target asks for, unless chunks would drop under MIN_CHUNK rows
    assert chunks > 1 and 32768 // chunks >= MIN_CHUNK
    assert 4 * chunks >= TARGET_PROGRAMS or 32768 // (2 * chunks) < MIN_CHUNK


def test_short_rows_stay_whole_at_few_outputs() -> None:
    """A LayerNorm at batch 1 (128 rows of 1024) or a decode step's (1 row of 768): one program
    per row is cheap, a split would add a kernel and a round trip per reduction."""
    def layer_norm(x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:])

    for x in (torch.randn(1, 128, 1024), torch.randn(1, 1, 768),
              torch.randn(2, INNER_WHOLE_RNUMEL)):
        _, sched = _schedule(layer_norm, x)
        assert not sched.split, x.shape
    _, sched = _schedule(lambda x: x.sum(), torch.randn(4 * INNER_WHOLE_RNUMEL))
    assert sched.split  # a long row is still split
