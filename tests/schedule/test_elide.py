"""Extern layout planning: pure copies read only by library calls become strided views when
the composed index is affine and the library accepts the strides (matmul: a unit stride in
the last two dims; SDPA: unit head-dim stride, other strides and the offset multiples of 8);
otherwise the copy stays. Every rewritten graph still runs like eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from schedule_graphs import lower_fn, schedule_fn

from kiln.lower.ir import ComputedBuffer, TensorArg
from kiln.schedule import schedule
from kiln.schedule.elide import ACCEPTS




def _arg(size, stride, offset=0):
    return TensorArg("b", torch.float32, size, stride, offset)


def test_matrix_stride_rule() -> None:
    ok = ACCEPTS["mm"]
    assert ok(_arg((4, 8), (8, 1))) and ok(_arg((4, 8), (1, 4))) and ok(_arg((4, 8), (16, 1)))
    assert not ok(_arg((4, 8), (2, 2))) and not ok(_arg((4, 8), (4, 1)))
    assert ok(_arg((3, 4, 8), (0, 8, 1)))


def test_attention_stride_rule() -> None:
    ok = ACCEPTS["attention"]
    assert ok(_arg((2, 2, 4, 8), (224, 8, 56, 1), 8))
    assert not ok(_arg((2, 2, 4, 8), (224, 8, 56, 1), 1))      # misaligned base
    assert not ok(_arg((2, 2, 4, 8), (224, 1, 56, 2)))         # head dim not contiguous
    assert not ok(_arg((2, 2, 4, 8), (228, 12, 57, 1)))        # misaligned rows


def test_transposed_copy_into_mm_is_a_view() -> None:
    graph, sched = schedule_fn(lambda x, w: x.t().clone() @ w, torch.randn(8, 4), torch.randn(8, 8))
    assert len(graph.computed) == 1 and not sched.graph.computed
    (mm,) = sched.steps
    assert mm.args[0] == TensorArg("x_1", torch.float32, (4, 8), (1, 4), 0)
    assert list(sched.elided) == [graph.computed[0].name]


def test_non_affine_copy_stays() -> None:
    graph, sched = schedule_fn(lambda x, w: x.t().reshape(3, 8) @ w, torch.randn(4, 6),
                          torch.randn(8, 5))
    assert len(sched.graph.computed) == 1 and not sched.elided


def _attention(p, start):
    """q/k/v as [B, H, L, D] copies of slices of one projection p [B, L, 56]."""
    batch, length = p.shape[:2]

    def heads(lo):
        return p[..., lo:lo + 16].reshape(batch, length, 2, 8).transpose(1, 2).contiguous()

    return F.scaled_dot_product_attention(heads(start), heads(24), heads(40))


def test_aligned_attention_operands_are_views() -> None:
    _, sched = schedule_fn(lambda p: _attention(p, 8), torch.randn(2, 4, 56))
    assert len(sched.elided) == 3 and len(sched.steps) == 1
    assert [a.offset for a in sched.steps[0].args[:3]] == [8, 24, 40]


def test_misaligned_attention_operand_keeps_its_copy() -> None:
    _, sched = schedule_fn(lambda p: _attention(p, 1), torch.randn(2, 4, 56))
    assert len(sched.elided) == 2
    (copy,) = sched.graph.computed
    assert isinstance(copy, ComputedBuffer) and sched.steps[1].args[0].name == copy.name


def test_the_callers_graph_is_untouched() -> None:
    graph, _ = lower_fn(lambda p: _attention(p, 8), torch.randn(2, 4, 56))
    before = (list(graph.nodes), dict(graph.buffers))
    schedule(graph)
    assert (list(graph.nodes), dict(graph.buffers)) == before
