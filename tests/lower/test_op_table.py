"""The math-op table (`kiln.lower.op_table`) against the lower stage's readers of it.

Every row is an `ops.<name>` method, the evaluator computes it as eager does (its ATen op or eager
spelling, on fresh random operands in its domain) with the dtype its result rule says, and the
lowering rules lower its ATen op onto it. A new row is covered here without a new test; the Triton
side is tests/codegen/test_triton_math.py.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from kiln.lower import op_table
from kiln.lower.evaluate import run_ir
from kiln.lower.op_table import BOOL, MATH_OPS, MathOp
from kiln.lower.ops import BINARY_OPS, UNARY_OPS, OpsHandler
from kiln.lower.rules.pointwise import ELEMENTWISE
from tests.lower.op_cases import dtypes_for, eager, one_op_graph, operands

ROWS = list(MATH_OPS.values())


def _cases():
    for op in ROWS:
        for dtype in dtypes_for(op):
            yield pytest.param(op, dtype, id=f"{op.name}-{str(dtype)[6:]}")


def test_ops_vocabulary_is_the_table():
    assert UNARY_OPS is op_table.UNARY_OPS and BINARY_OPS is op_table.BINARY_OPS
    assert UNARY_OPS + BINARY_OPS == tuple(MATH_OPS)
    assert all(MATH_OPS[n].arity == 1 for n in UNARY_OPS)
    assert all(MATH_OPS[n].arity == 2 for n in BINARY_OPS)
    for name in MATH_OPS:
        assert callable(getattr(OpsHandler, name)), name
    assert op_table.BOOL_RESULT == {op.name for op in ROWS if op.result == BOOL}
    assert {"eq", "isnan", "logical_not"} <= op_table.BOOL_RESULT


def test_rows_refuse_a_missing_triton_form():
    with pytest.raises(ValueError, match="no Triton form"):
        MathOp("nothing", 1, torch.neg)
    with pytest.raises(ValueError, match="arity 3"):
        MathOp("ternary", 3, torch.neg, "{0}")


def test_lowering_maps_each_aten_op_onto_its_row():
    by_row: dict[str, set] = {}
    for overload, (name, kind) in ELEMENTWISE.items():
        assert overload._schema.name == f"aten::{MATH_OPS[name].aten}"
        assert kind == MATH_OPS[name].promotion
        by_row.setdefault(name, set()).add(overload)
    assert set(by_row) == {op.name for op in ROWS if op.aten is not None}
    assert torch.ops.aten.div.Tensor in ELEMENTWISE and torch.ops.aten.eq.Scalar in ELEMENTWISE
    assert not any(o._schema.is_mutable for o in ELEMENTWISE)  # add_ / mul_ are not functional


@pytest.mark.parametrize("op,dtype", list(_cases()))
def test_evaluator_matches_eager(op: MathOp, dtype: torch.dtype, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op.name}{dtype}".encode()))
    inputs = operands(op, dtype, gen, device=device)
    graph = one_op_graph(op, dtype, inputs[0].numel(), device)
    (got,) = run_ir(graph, inputs)
    want = eager(op)(*inputs)
    assert got.dtype == want.dtype == op.result_dtype(dtype)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(op.reference(*inputs), want, rtol=0, atol=0, equal_nan=True)
    if want.dtype != torch.bool:
        assert want.float().std() > 0  # the operands exercise the op (not a constant result)
