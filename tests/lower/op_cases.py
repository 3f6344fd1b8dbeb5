"""Test cases for the math-op table (`kiln.lower.op_table`), shared by tests/lower/test_op_table.py
(evaluator, lowering) and tests/codegen/test_triton_math.py (Triton printer, interpreter).

For every row: the dtypes it is tested in, fresh random operands in its domain (never zero:
divisors stay nonzero, logs and powers see positive values), its eager spelling (the ATen op it
lowers from, or an entry of `EAGER_SPELLING`), and a one-op `IRGraph` `buf0 = op(a[, b])`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from kiln.lower.ir import ComputedBuffer, InputBuffer, IRGraph, Layout, Pointwise
from kiln.lower._compat import PROMOTION
from kiln.lower.op_table import FLOAT, MathOp
from kiln.lower.ops import ops

aten = torch.ops.aten

# Ops no ATen op is lowered onto 1:1 (a hand-written rule lowers to them): how eager spells them.
EAGER_SPELLING: dict[str, Callable[..., torch.Tensor]] = {
    "square": aten.square.default,
    "add": aten.add.Tensor,
    "sub": aten.sub.Tensor,
    "floordiv": functools.partial(aten.div.Tensor_mode, rounding_mode="floor"),
    "truncdiv": functools.partial(aten.div.Tensor_mode, rounding_mode="trunc"),
}
POSITIVE = {"log", "log2", "log1p", "sqrt", "rsqrt", "pow"}  # operands drawn > 0
INTEGER_ONLY = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor"}
ALSO_BOOL = {"logical_not", "logical_and", "logical_or", "logical_xor", "bitwise_and",
             "bitwise_or", "bitwise_xor", "add", "mul", "eq", "ne"}


def dtypes_for(op: MathOp) -> tuple[torch.dtype, ...]:
    """float32 (unless bitwise), int64 where the loop IR may apply the op to integers (ops that
    promote integers to float see only floats), bool for logical and or/and-like ops."""
    dtypes = [] if op.name in INTEGER_ONLY else [torch.float32]
    if op.promotion != PROMOTION.INT_TO_FLOAT or op.result == FLOAT:
        dtypes.append(torch.int64)
    if op.name in ALSO_BOOL:
        dtypes.append(torch.bool)
    return tuple(dtypes)


def operands(op: MathOp, dtype: torch.dtype, gen: torch.Generator, n: int = 64,
             device: Any = "cpu") -> list[torch.Tensor]:
    """`op.arity` random operands of `dtype`, never zero (bools excepted)."""
    return [_operand(dtype, op.name in POSITIVE, gen, n).to(device) for _ in range(op.arity)]


def _operand(dtype: torch.dtype, positive: bool, gen: torch.Generator, n: int) -> torch.Tensor:
    """Drawn on the CPU (a CPU generator), also where the CUDA suite makes CUDA the default."""
    if dtype == torch.bool:
        return torch.rand(n, generator=gen, device="cpu") > 0.5
    if not dtype.is_floating_point:
        x = torch.randint(1, 9, (n,), generator=gen, dtype=dtype, device="cpu")
        return x if positive else x * (torch.randint(0, 2, (n,), generator=gen, device="cpu") * 2 - 1)
    x = torch.randn(n, generator=gen, device="cpu") * 3
    x = torch.where(x.abs() < 0.1, torch.full_like(x, 0.5), x)
    return (x.abs() if positive else x).to(dtype)


def eager(op: MathOp) -> Callable[..., torch.Tensor]:
    """The eager spelling of `op`: the ATen op it is lowered from, else `EAGER_SPELLING`."""
    if op.aten is not None:
        return getattr(aten, op.aten)
    if op.name not in EAGER_SPELLING:
        raise AssertionError(f"math op {op.name} has no ATen op: add its eager spelling to "
                             f"EAGER_SPELLING in {__file__}")
    return EAGER_SPELLING[op.name]


def one_op_graph(op: MathOp, dtype: torch.dtype, n: int, device: Any = "cpu") -> IRGraph:
    """`buf0[i] = ops.<op>(a[i], b[i])` over `n` elements of `dtype` (b only when binary); the
    output has the row's result dtype."""
    graph = IRGraph()
    in_layout = Layout.contiguous(dtype, torch.device(device), (n,))
    names = ["a", "b"][:op.arity]
    for name in names:
        graph.inputs.append(graph.add_buffer(InputBuffer(name, in_layout)))
    out_dtype = op.result_dtype(dtype)

    def inner(index: Any) -> Any:
        return getattr(ops, op.name)(*[ops.load(name, in_layout.index(index)) for name in names])

    layout = Layout.contiguous(out_dtype, torch.device(device), (n,))
    node = ComputedBuffer("buf0", layout, Pointwise((n,), inner, out_dtype))
    graph.add_buffer(node)
    graph.nodes.append(node)
    graph.outputs.append(node.as_arg())
    return graph
