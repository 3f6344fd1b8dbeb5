"""sizes: the size queries of a graph with symbolic sizes (`aten.sym_size.int`, ...).

Each returns the queried size of the argument's value as an index expression (an int, or an
`Expr` over `Size` atoms), which later shape arguments (`view(x, [s0, 64])`) take as they are.
"""
from __future__ import annotations

import math

import torch

from kiln.lower.rule_table import Call, register
from kiln.lower.values import TensorValue

aten = torch.ops.aten


@register(aten.sym_size.int)
def sym_size(call: Call, x: TensorValue, dim: int) -> object:
    return x.size[dim]


@register(aten.sym_numel.default)
def sym_numel(call: Call, x: TensorValue) -> object:
    return math.prod(x.size)


@register(aten.sym_stride.int)
def sym_stride(call: Call, x: TensorValue, dim: int) -> object:
    return call.out
