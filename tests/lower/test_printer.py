'''Golden printed IR (a pointwise chain, a softmax), the printed form runs, and the dependency
collector reads the same bodies.'''
from __future__ import annotations

import textwrap

import torch

from kiln.lower import lower_graph
from kiln.lower.decomposition_tables import trace_aten
from kiln.lower.deps import MemoryDep, read_writes
from kiln.lower.evaluate import run_ir, run_printed

HEADER = """\
# kiln.lower IR graph. exec() it, then call(*inputs, constants=graph.constants) runs it on the
# CPU with the reference evaluator (kiln.lower.evaluate.PrintedRun); ops.* is the ops handler.
import torch
from kiln.lower.evaluate import PrintedRun
from kiln.lower.ops import ops
aten = torch.ops.aten

"""

CHAIN = HEADER + textwrap.dedent("""
    def call(x_1, y_1, constants=None):
        rt = PrintedRun(constants)
        rt.bind('x_1', x_1, torch.float32, (4, 8), (8, 1), 0)
        rt.bind('y_1', y_1, torch.float32, (8,), (1,), 0)
        # buf0: Pointwise float32[4, 8] stride=(8, 1)  <- mul, add, sigmoid
        def buf0_body(x0, x1):
            t0 = ops.load('x_1', 8*x0 + x1)
            t1 = ops.constant(2.0, torch.float32)
            t2 = ops.mul(t0, t1)
            t3 = ops.load('y_1', x1)
            t4 = ops.add(t2, t3)
            t5 = ops.sigmoid(t4)
            ops.store('buf0', 8*x0 + x1, t5)
        rt.pointwise('buf0', buf0_body, (4, 8), torch.float32, (4, 8), (8, 1), 0)
        return [rt.tensor('buf0', (4, 8), (8, 1), 0)]
    """)

SOFTMAX = HEADER + textwrap.dedent("""
    def call(x_1, constants=None):
        rt = PrintedRun(constants)
        rt.bind('x_1', x_1, torch.bfloat16, (4, 8), (8, 1), 0)
        # buf0: Reduction max float32[4, 1] stride=(1, 1)  <- _softmax
        def buf0_body(x0, x1, r0):
            t0 = ops.load('x_1', r0 + 8*x0)
            t1 = ops.to_dtype(t0, torch.float32)
            t2 = ops.reduction(torch.float32, torch.float32, 'max', t1)
            ops.store_reduction('buf0', x0, t2)
        rt.reduction('buf0', buf0_body, (4, 1), (8,), torch.float32, (4, 1), (1, 1), 0)
        # buf1: Reduction sum float32[4, 1] stride=(1, 1)  <- _softmax
        def buf1_body(x0, x1, r0):
            t0 = ops.load('x_1', r0 + 8*x0)
            t1 = ops.to_dtype(t0, torch.float32)
            t2 = ops.load('buf0', x0)
            t3 = ops.sub(t1, t2)
            t4 = ops.exp(t3)
            t5 = ops.reduction(torch.float32, torch.float32, 'sum', t4)
            ops.store_reduction('buf1', x0, t5)
        rt.reduction('buf1', buf1_body, (4, 1), (8,), torch.float32, (4, 1), (1, 1), 0)
        # buf2: Pointwise bfloat16[4, 8] stride=(8, 1)  <- _softmax
        def buf2_body(x0, x1):
            t0 = ops.load('x_1', 8*x0 + x1)
            t1 = ops.to_dtype(t0, torch.float32)
            t2 = ops.load('buf0', x0)
            t3 = ops.sub(t1, t2)
            t4 = ops.exp(t3)
            t5 = ops.load('buf1', x0)
            t6 = ops.truediv(t4, t5)
            t7 = ops.to_dtype(t6, torch.bfloat16)
            ops.store('buf2', 8*x0 + x1, t7)
        rt.pointwise('buf2', buf2_body, (4, 8), torch.bfloat16, (4, 8), (8, 1), 0)
        return [rt.tensor('buf2', (4, 8), (8, 1), 0)]
    """)


def _chain(x, y):
    return torch.sigmoid(x * 2.0 + y)


def _softmax(x):
    return torch.softmax(x, -1)


def test_golden_pointwise_chain_is_one_buffer():
    x, y = torch.randn(4, 8), torch.randn(8)
    graph = lower_graph(trace_aten(_chain, x, y))
    assert str(graph) == CHAIN
    torch.testing.assert_close(run_printed(CHAIN, graph, [x, y])[0], _chain(x, y))


def test_golden_softmax_bf16_computes_in_fp32_and_rounds_once():
    x = torch.randn(4, 8).bfloat16()
    graph = lower_graph(trace_aten(_softmax, x))
    assert str(graph) == SOFTMAX
    torch.testing.assert_close(run_printed(SOFTMAX, graph, [x])[0], _softmax(x))


def test_printed_masked_bodies_run():
    def fn(x):
        return torch.nn.functional.pad(torch.cat([x, x * 2], 1), (1, 1))

    x = torch.randn(3, 4)
    graph = lower_graph(trace_aten(fn, x))
    text = str(graph)
    assert "def masked_body0():" in text and "ops.masked(" in text
    torch.testing.assert_close(run_printed(text, graph, [x])[0], fn(x))
    torch.testing.assert_close(run_ir(graph, [x])[0], fn(x))


def test_printed_indirect_loads_run():
    def fn(w, i):
        return torch.nn.functional.embedding(i, w) * 2

    w, i = torch.randn(10, 4), torch.randint(0, 10, (3,))
    graph = lower_graph(trace_aten(fn, w, i))
    text = str(graph)
    assert "i0 = ops.indirect_indexing(" in text and "ops.load('w_1', 4*i0 + x1)" in text
    torch.testing.assert_close(run_printed(text, graph, [w, i])[0], fn(w, i))


def test_read_writes_of_softmax_body():
    graph = lower_graph(trace_aten(_softmax, torch.randn(4, 8)))
    last = graph.computed[-1]
    deps = read_writes(last)
    x0, x1 = last.loop_vars()[0]
    assert deps.reads == (MemoryDep("x_1", 8 * x0 + x1), MemoryDep("buf0", x0),
                          MemoryDep("buf1", x0))
    assert deps.writes == (MemoryDep("buf2", 8 * x0 + x1),)
    assert deps.ops == 3 and not deps.indirect


def test_user_locations_travel_to_buffers_and_print():
    gm = trace_aten(_chain, torch.randn(4, 8), torch.randn(8))
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "call_function"):
        node.meta["user_location"] = f"model.py:{10 + i}"
    graph = lower_graph(gm)
    (buf,) = graph.computed
    assert [(o.node, o.user_location) for o in buf.origins] == [
        ("mul", "model.py:10"), ("add", "model.py:11"), ("sigmoid", "model.py:12")]
    assert buf.user_location == "model.py:12"
    assert "# buf0: Pointwise float32[4, 8] stride=(8, 1)  <- mul (model.py:10), " \
           "add (model.py:11), sigmoid (model.py:12)" in str(graph)
