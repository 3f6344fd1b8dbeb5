"""pointwise: elementwise ATen ops → lazy `Pointwise` values.

`ELEMENTWISE` is the table: ATen op → (ops-handler name, torch type-promotion kind), derived from
the math-op table (`op_table.MATH_OPS`: the rows whose `aten` names an op lowered 1:1). Type
promotion is torch's own (`_compat.elementwise_dtypes`): inputs are converted to the
computation dtype (float32 for bf16/fp16), the handler op runs, and the result is kept in the
compute dtype of the output — the store body rounds it once. Ops with extra arguments (`alpha`,
`rounding_mode`, `clamp`, `gelu`) and the creation ops (`full`, `arange`, ...) have their own
lowerings below.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from kiln.lower._compat import PROMOTION, elementwise_dtypes
from kiln.lower.index import Expr
from kiln.lower.ir import compute_dtype
from kiln.lower.op_table import MATH_OPS, MathOp
from kiln.lower.ops import ops
from kiln.lower.rule_table import Call, register
from kiln.lower.rules.helpers import loader_as, pointwise, scalar_loader
from kiln.lower.values import TensorValue

aten = torch.ops.aten

DEFAULT = PROMOTION.DEFAULT
INT_TO_FLOAT = PROMOTION.INT_TO_FLOAT


def _ops(packet: Any, *overloads: str) -> list[Any]:
    return [getattr(packet, o) for o in overloads if hasattr(packet, o)]


_BINARY_OVERLOADS = ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar",
                     "Scalar_Tensor", "Scalar_Scalar")


def _aten_overloads(op: MathOp) -> list[Any]:
    """The functional overloads of the ATen op that `op`'s row lowers 1:1 (`MathOp.aten`)."""
    overloads = ("default",) if op.arity == 1 else _BINARY_OVERLOADS
    return [o for o in _ops(getattr(aten, op.aten), *overloads) if not o._schema.is_mutable]


ELEMENTWISE: dict[Any, tuple[str, Any]] = {
    overload: (op.name, op.promotion)
    for op in MATH_OPS.values() if op.aten is not None
    for overload in _aten_overloads(op)
}


# ops whose eager kernel reads a 0-dim second operand beside a float16/bfloat16 tensor at its
# own precision (ATen's CPU mul/div take `original_scalar_value`), where add, sub and the rest
# round it to the tensor's dtype first; kiln.compile hands a changing Python float to the graph
# as such a 0-dim tensor (`bf16 * 2.842156` was computed with 2.84375)
_SCALAR_AT_FULL_PRECISION = ("mul", "truediv")


def _lower_elementwise(call: Call, name: str, kind: Any, args: Sequence[Any]) -> TensorValue:
    comp, result = elementwise_dtypes(*call.meta_args[:len(args)], kind=kind)
    comp = compute_dtype(comp)
    out = call.out
    size = tuple(out.shape)
    loaders = [loader_as(a, comp, size, into=out.dtype) if isinstance(a, TensorValue) else scalar_loader(a, comp)
               for a in args]
    if name in _SCALAR_AT_FULL_PRECISION and _unrounded_scalar(args[1]):
        loaders[1] = loader_as(args[1], comp, size)
    value_dtype = MATH_OPS[name].result_dtype(comp)
    target = compute_dtype(out.dtype)
    handler = name

    def inner(index: Sequence[Expr]) -> Any:
        value = getattr(ops, handler)(*[load(index) for load in loaders])
        return value if value_dtype == target else ops.to_dtype(value, target)

    return pointwise(call, size, inner, out.dtype, args)


def _unrounded_scalar(b: Any) -> bool:
    """A 0-dim float tensor operand not itself in half precision (its loader differs only
    where the result is float16/bfloat16: there `into` would round it)."""
    return isinstance(b, TensorValue) and len(b.size) == 0 and b.dtype.is_floating_point \
        and b.dtype not in (torch.float16, torch.bfloat16)


def _make_elementwise(name: str, kind: Any) -> Any:
    def lower(call: Call, *args: Any, **kwargs: Any) -> TensorValue:
        return _lower_elementwise(call, name, kind, args)

    lower.__name__ = f"lower_{name}"
    return lower


def _pow_defined(call: Call, a: Any, b: Any) -> bool:
    """Eager raises on an integer tensor to a negative integer scalar power ("Integers to
    negative integer powers are not allowed"): refused, so the ATen op runs and raises."""
    base = call.meta_args[0]
    return not (isinstance(base, torch.Tensor) and not base.is_floating_point()
                and base.dtype != torch.bool and isinstance(b, int) and not isinstance(b, bool)
                and b < 0)


# a row's ATen op whose eager kernel refuses some arguments: the rule's checker
_CHECKERS: dict[str, Any] = {"pow": _pow_defined}

for _op, (_name, _kind) in ELEMENTWISE.items():
    register(_op, checker=_CHECKERS.get(_name))(_make_elementwise(_name, _kind))


@register(*_ops(aten.add, "Tensor", "Scalar"), *_ops(aten.sub, "Tensor", "Scalar"))
def lower_add_sub(call: Call, a: Any, b: Any, alpha: Any = 1) -> TensorValue:
    name = "add" if call.op._schema.name == "aten::add" else "sub"
    if alpha == 1:
        return _lower_elementwise(call, name, DEFAULT, (a, b))
    comp, _ = elementwise_dtypes(*call.meta_args[:2], kind=DEFAULT)
    comp = compute_dtype(comp)
    out = call.out
    la = loader_as(a, comp, out.shape, into=out.dtype) if isinstance(a, TensorValue) else scalar_loader(a, comp)
    lb = loader_as(b, comp, out.shape, into=out.dtype) if isinstance(b, TensorValue) else scalar_loader(b, comp)
    k = scalar_loader(alpha, comp)

    def inner(index: Sequence[Expr]) -> Any:
        scaled = ops.mul(lb(index), k(index))
        value = getattr(ops, name)(la(index), scaled)
        return value if comp == compute_dtype(out.dtype) else \
            ops.to_dtype(value, compute_dtype(out.dtype))

    return pointwise(call, out.shape, inner, out.dtype, (a, b))


@register(*_ops(aten.rsub, "Tensor", "Scalar"))
def lower_rsub(call: Call, a: Any, b: Any, alpha: Any = 1) -> TensorValue:
    swapped = Call(call.builder, call.node, aten.sub.Tensor, (call.meta_args[1],
                   call.meta_args[0]), {}, call.out, call.origin)
    return lower_add_sub(swapped, b, a, alpha)


@register(*_ops(aten.div, "Tensor_mode", "Scalar_mode"))
def lower_div_mode(call: Call, a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorValue:
    if rounding_mode is None:
        return _lower_elementwise(call, "truediv", INT_TO_FLOAT, (a, b))
    name = "floordiv" if rounding_mode == "floor" else "truncdiv"
    return _lower_elementwise(call, name, DEFAULT, (a, b))


@register(aten.where.self, *_ops(aten.where, "ScalarSelf", "ScalarOther", "Scalar"))
def lower_where(call: Call, cond: Any, a: Any, b: Any) -> TensorValue:
    out = call.out
    comp = compute_dtype(out.dtype)
    size = tuple(out.shape)
    lc = loader_as(cond, torch.bool, size)
    la = loader_as(a, comp, size, into=out.dtype) if isinstance(a, TensorValue) else scalar_loader(a, comp)
    lb = loader_as(b, comp, size, into=out.dtype) if isinstance(b, TensorValue) else scalar_loader(b, comp)
    return pointwise(call, size, lambda i: ops.where(lc(i), la(i), lb(i)), out.dtype,
                     (cond, a, b))


@register(aten.clamp.default, *_ops(aten.clamp, "Tensor"), aten.clamp_min.default,
          aten.clamp_max.default, *_ops(aten.clamp_min, "Tensor"), *_ops(aten.clamp_max, "Tensor"))
def lower_clamp(call: Call, x: TensorValue, *bounds: Any, **kw: Any) -> TensorValue:
    schema = call.op._schema.name
    lo = bounds[0] if schema != "aten::clamp_max" and bounds else kw.get("min")
    hi = (bounds[1] if len(bounds) > 1 else kw.get("max")) if schema == "aten::clamp" else \
        (bounds[0] if schema == "aten::clamp_max" else None)
    out = call.out
    comp = compute_dtype(out.dtype)
    size = tuple(out.shape)
    lx = loader_as(x, comp, size, into=out.dtype)

    def bound(b: Any) -> Any:
        if b is None:
            return None
        return loader_as(b, comp, size, into=out.dtype) if isinstance(b, TensorValue) else scalar_loader(b, comp)

    llo, lhi = bound(lo), bound(hi)

    def inner(index: Sequence[Expr]) -> Any:
        value = lx(index)
        if llo is not None:
            value = ops.maximum(value, llo(index))
        if lhi is not None:
            value = ops.minimum(value, lhi(index))
        return value

    return pointwise(call, size, inner, out.dtype, (x, lo, hi))


@register(aten.relu.default)
def lower_relu(call: Call, x: TensorValue) -> TensorValue:
    comp = compute_dtype(x.dtype)
    lx = loader_as(x, comp)
    zero = scalar_loader(0, comp)
    return pointwise(call, x.size, lambda i: ops.maximum(lx(i), zero(i)), x.dtype, (x,))


@register(aten.gelu.default)
def lower_gelu(call: Call, x: TensorValue, approximate: str = "none") -> TensorValue:
    comp = compute_dtype(x.dtype)
    lx = loader_as(x, comp)

    def c(v: float) -> Any:
        return ops.constant(v, comp)

    def inner(index: Sequence[Expr]) -> Any:
        v = lx(index)
        if approximate == "tanh":
            cube = ops.mul(ops.mul(v, v), v)
            arg = ops.mul(c(math.sqrt(2.0 / math.pi)), ops.add(v, ops.mul(c(0.044715), cube)))
            return ops.mul(ops.mul(c(0.5), v), ops.add(c(1.0), ops.tanh(arg)))
        cdf = ops.add(c(1.0), ops.erf(ops.mul(v, c(math.sqrt(0.5)))))
        return ops.mul(ops.mul(v, c(0.5)), cdf)

    return pointwise(call, x.size, inner, x.dtype, (x,))


@register(aten._to_copy.default,
          checker=lambda call, x, **kw: kw.get("device") in (None, x.device))
def lower_to_copy(call: Call, x: TensorValue, **kwargs: Any) -> TensorValue:
    """A cast. Loads already give `compute_dtype(x.dtype)`, so an upcast of a stored value is
    free (a fused half-precision value is rounded first: `loader_as`); a cast to a
    low-precision dtype rounds (`to_dtype(to_dtype(v, bf16), f32)`): explicit casts round even
    inside a fused body."""
    dst = call.out.dtype
    leaving_half = x.dtype in (torch.float16, torch.bfloat16)  # entering one rounds below
    lx = loader_as(x, x.compute_dtype, into=dst if leaving_half else None)
    if compute_dtype(dst) == x.compute_dtype and (dst == x.dtype or compute_dtype(dst) == dst):
        return pointwise(call, x.size, lx, dst, (x,))

    def store(index: Sequence[Expr]) -> Any:
        return ops.to_dtype(lx(index), dst)

    def inner(index: Sequence[Expr]) -> Any:
        value = store(index)
        return value if compute_dtype(dst) == dst else ops.to_dtype(value, compute_dtype(dst))

    value = pointwise(call, x.size, inner, dst, (x,))
    value.data.store_fn = store
    return value


@register(aten.clone.default, aten.lift_fresh_copy.default)
def lower_clone(call: Call, x: TensorValue, **kwargs: Any) -> TensorValue:
    return pointwise(call, x.size, x.loader(), x.dtype, (x,))


@register(aten.alias.default, aten.detach.default)
def lower_alias(call: Call, x: TensorValue) -> TensorValue:
    return x


# -- creation ops ----------------------------------------------------------------------------------

def _constant(call: Call, value: Any) -> TensorValue:
    out = call.out
    load = scalar_loader(value, compute_dtype(out.dtype))
    return pointwise(call, out.shape, load, out.dtype)


@register(aten.full.default)
def lower_full(call: Call, size: Any, fill_value: Any, **kwargs: Any) -> TensorValue:
    return _constant(call, fill_value)


@register(aten.full_like.default)
def lower_full_like(call: Call, x: Any, fill_value: Any, **kwargs: Any) -> TensorValue:
    return _constant(call, fill_value)


@register(aten.scalar_tensor.default)
def lower_scalar_tensor(call: Call, s: Any, **kwargs: Any) -> TensorValue:
    return _constant(call, s)


@register(aten.zeros_like.default, aten.empty_like.default, aten.empty.memory_format,
          aten.empty_strided.default, aten.zeros.default, aten.new_zeros.default,
          aten.new_empty.default, aten.empty_permuted.default)
def lower_zeros(call: Call, *args: Any, **kwargs: Any) -> TensorValue:
    return _constant(call, 0)  # empty tensors hold arbitrary values: zeros are one choice


@register(aten.ones_like.default, aten.ones.default, aten.new_ones.default)
def lower_ones(call: Call, *args: Any, **kwargs: Any) -> TensorValue:
    return _constant(call, 1)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def lower_arange(call: Call, *args: Any, **kwargs: Any) -> TensorValue:
    # by position, not by type: a symbolic end (an Expr) is no int, and filtering the ints
    # took arange(-1, s0 + 1)'s start for a lone `end` (start 0: wrong for every size)
    start = 0 if call.op is aten.arange.default else args[0]
    step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    out = call.out
    comp = compute_dtype(out.dtype)
    c_start, c_step = scalar_loader(start, comp), scalar_loader(step, comp)

    def inner(index: Sequence[Expr]) -> Any:
        i = ops.index_expr(index[0], comp)
        return ops.add(ops.mul(i, c_step(index)), c_start(index))

    return pointwise(call, out.shape, inner, out.dtype)
