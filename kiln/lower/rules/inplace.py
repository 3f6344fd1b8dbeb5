"""inplace: in-place ATen ops, lowered as their functional form.

The interpreter calls `lower_inplace` for a mutating op with no rule of its own, then rebinds the
mutated FX node to the result (and records an update of a graph input); it refuses a mutation of
a tensor that other nodes alias. `copy`/`copy_` broadcast and convert the source.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from kiln.lower.index import Expr
from kiln.lower.rule_table import Call, LoweringError, lowerings, register
from kiln.lower.rules.helpers import loader_as, pointwise
from kiln.lower.values import TensorValue

aten = torch.ops.aten


@register(aten.copy.default)
def lower_copy(call: Call, dst: TensorValue, src: Any, non_blocking: bool = False) -> TensorValue:
    out = call.out
    if not isinstance(src, TensorValue):
        raise LoweringError(f"copy from a non-tensor in {call.origin.node}")
    load = loader_as(src, dst.compute_dtype, dst.size, into=dst.dtype)
    if src.dtype != dst.dtype and dst.compute_dtype != dst.dtype:
        from kiln.lower.ops import ops

        inner_load = load

        def load(index: Sequence[Expr]) -> Any:  # noqa: F811 - round through dst's dtype
            return ops.to_dtype(ops.to_dtype(inner_load(index), dst.dtype), dst.compute_dtype)

    return pointwise(call, out.shape, load, out.dtype, [src])


def lower_inplace(call: Call, *args: Any, **kwargs: Any) -> Any:
    if call.op is aten.copy_.default:
        return lower_copy(call, *args, **kwargs)
    name = call.op._schema.name.split("::")[1]
    packet = getattr(aten, name.rstrip("_"), None) if name.endswith("_") else None
    functional = getattr(packet, call.op._overloadname, None) if packet is not None else None
    for checker, fn in lowerings.get(functional, ()):
        fcall = dataclasses.replace(call, op=functional)
        if checker(fcall, *args, **kwargs):
            return fn(fcall, *args, **kwargs)
    raise LoweringError(f"no lowering for the in-place op {call.op} (node {call.origin.node})",
                        hint="functionalize the graph before lowering (the autograd stage does)")
