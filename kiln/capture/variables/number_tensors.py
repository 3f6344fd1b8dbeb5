"""Value-only Python numbers carried in the graph as 0-dim CPU tensors.

A float argument whose value changed between calls (or an int no size symbol can hold: a
negative int, one past int32) is a graph input that must not be baked in. torch.compile passes
such a float to its backends as a 0-dim float64 tensor; so does kiln, so every backend sees
tensors only (the autograd stage traces tensors and size symbols, nothing else). Each call
wraps the number again (`float_tensor` / `int_tensor`, about 1 us).

Inside the graph the number keeps Python's meaning:

- arithmetic with other numbers is arithmetic on 0-dim tensors in float64 or int64, the
  dtypes of Python's float and int (an int operand is cast to float64 where Python's result is
  a float: `n / 2`, `n * 0.5`);
- a tensor op with one tensor operand gets the number cast to the dtype eager computes in:
  `torch.result_type(x, number)`, or float32 where that is float16/bfloat16 and `x` has dims
  (eager reads a Python scalar in float32 there, its opmath; a 0-dim float32 tensor does not
  promote a float16 tensor with dims). Ops that cast the value to their own dtype
  (`masked_fill`, `fill_`) get it exact (float64 / int64); those and `clamp` raise where a
  Python number does not fit the dtype, so they take an argument's number behind a range guard
  (`-65504.0 <= s <= 65504.0` beside float16) and specialize a number computed from it;
- everything else (a branch, a shape, an op with several tensor operands or another scalar
  argument) specializes it, as before: its sources get equality guards back;
- leaving the graph (returned, handed to the code after a graph break) it is computed again by
  Python from the numbers the frame holds (`host_expression`), or `.item()` of the graph's
  output where a tensor size takes part.
"""
from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx

from kiln.capture.sources import Source
from kiln.capture.variables.base import VT, ConstantVT
from kiln.capture.variables.scalars import SymScalarVT, specialize_all

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["TensorNumberVT", "float_tensor", "int_tensor", "number_dtype",
           "number_arithmetic", "tensor_op_arguments", "number_as_tensor", "host_expression"]

_INT64 = (-2**63, 2**63 - 1)


def float_tensor(value: float) -> torch.Tensor:
    """A float graph input as the graph takes it (per call, in the entry's argument list)."""
    return torch.scalar_tensor(value, dtype=torch.float64)


def int_tensor(value: int) -> torch.Tensor:
    return torch.scalar_tensor(value, dtype=torch.int64)


def number_dtype(value: Any) -> torch.dtype | None:
    """The dtype a value-only number travels in, or None where it cannot (an int past int64
    stays a guarded constant). A comparison's bool is a torch.bool."""
    if type(value) is bool:
        return torch.bool
    if type(value) is float:
        return torch.float64
    if type(value) is int and _INT64[0] <= value <= _INT64[1]:
        return torch.int64
    return None


class TensorNumberVT(SymScalarVT):
    """A value-only number as a 0-dim tensor node: `fake` is the node's fake tensor, `value` the
    Python number of this trace (what specializing reads), `roots` its sources."""

    def __init__(self, node: torch.fx.Node, value: Any, roots: tuple[Source, ...], output: Any,
                 fake: torch.Tensor) -> None:
        super().__init__(node, value, roots, output)
        self.fake = fake
        # an int's largest absolute value for every value the graph will see (None: not yet
        # bounded; `_int_bound` guards an argument's on first use)
        self.bound: float | None = None

    def as_tensor(self) -> VT:
        from kiln.capture.variables.tensor import TensorVT
        return TensorVT(self.node, self.fake)


# Python operators on numbers that stay 0-dim tensor ops (a comparison's bool too: it may feed
# a tensor op, `y + (k != 0)`; a branch on it specializes). math.sqrt of a number arrives as
# torch._sym_sqrt.
_COMPARISONS = {operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne}
_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
               operator.mod, operator.pow, operator.neg, operator.pos, operator.abs,
               torch._sym_sqrt, *_COMPARISONS}
_TENSOR_FORM = {torch._sym_sqrt: torch.sqrt}
_DIVISIONS = {operator.truediv, operator.floordiv, operator.mod}
# int64 arithmetic is Python's only while nothing overflows: an int argument takes part behind
# a guard `-2**31 <= n <= 2**31`, and a result whose bound passes `_INT_LIMIT` specializes
_INT_ROOT_BOUND = 2**31
_INT_LIMIT = 2**62


def number_arithmetic(tx: Translator, op: Any, args: list[VT]) -> VT:
    """`op(*args)` on numbers where one is a TensorNumberVT: a 0-dim tensor of Python's result
    type (float64 for a float, int64 for an int), where the tensor op raises where Python
    does and gives Python's value: a divisor or a square root's argument is an argument of
    the function behind a guard (`s != 0`, `s >= 0`), an exponent a constant int >= 0, ints
    bounded (no int64 overflow). Else the specialized constant."""
    values = [a.value if isinstance(a, SymScalarVT) else a.as_constant() for a in args]
    try:
        result = op(*values)
    except Exception as err:  # ZeroDivisionError and the like: Python raises it, at run time
        from kiln.capture.unsupported import unsupported
        unsupported("op-failed", f"{getattr(op, '__name__', op)} on numbers raised "
                    f"{type(err).__name__}: {err}", category="user-fixable")
    dtype = number_dtype(_python_number(result))
    bound = _checked(tx, op, args, dtype) if op in _ARITHMETIC and dtype is not None else None
    if bound is None:
        return ConstantVT(op(*(a.as_constant() for a in args)))
    # operands in Python's type of the operation: a comparison of an int with a float compares
    # float64s, not bools
    common = dtype if op not in _COMPARISONS else torch.float64 if any(
        _python_type(a) is float for a in args) else torch.int64
    node_args, fake_args = [], []
    for arg in args:
        if isinstance(arg, TensorNumberVT):
            tensor = arg.as_tensor() if arg.fake.dtype == common else \
                _cast(tx, arg.as_tensor(), common)
            node_args.append(tensor.node)
            fake_args.append(tensor.fake)
        elif isinstance(arg, SymScalarVT):  # a size symbol
            node_args.append(arg.node)
            fake_args.append(arg.value)
        else:
            node_args.append(arg.as_constant())
            fake_args.append(arg.as_constant())
    target = _TENSOR_FORM.get(op, op)
    node, fake = tx.output.create_node("call_function", target, tuple(node_args), {},
                                       lambda: target(*fake_args))
    if not isinstance(fake, torch.Tensor) or fake.dim() or fake.dtype != dtype:
        return ConstantVT(op(*(a.as_constant() for a in args)))  # not Python's meaning
    roots = tuple(dict.fromkeys(r for a in args if isinstance(a, SymScalarVT) for r in a.roots))
    number = TensorNumberVT(node, result, roots, tx.output, fake)
    number.bound = bound
    return number


def _checked(tx: Translator, op: Any, args: list[VT], dtype: torch.dtype) -> float | None:
    """Whether the 0-dim tensor op means what Python's does for every value the graph will see:
    the bound of the int result (inf for a float one), after adding the guards that make it
    so; None where it cannot (specialize)."""
    if op in _DIVISIONS and not _guard_root(tx, args[1], "!=", 0):
        return None
    if op is torch._sym_sqrt and not _guard_root(tx, args[0], ">=", 0):
        return None  # math.sqrt raises for a negative number; torch.sqrt gives nan
    if op is operator.pow:  # a negative exponent may divide by zero, a fractional one be complex
        exponent = args[1].as_constant() if args[1].is_constant() else None
        if type(exponent) is not int or exponent < 0 or isinstance(args[1], SymScalarVT):
            return None
    if dtype is torch.bool:
        return 1
    if dtype is not torch.int64:
        return float("inf")
    # bounds from int64's range first (`n % 1000` needs no guard); where that could overflow,
    # from the arguments' guarded int32-like range (`n * n`)
    for guard in (False, True):
        bounds = [_int_bound(tx, a, guard) for a in args]
        if None in bounds:
            return None
        bound = _combined(op, bounds, args)
        if bound <= _INT_LIMIT:
            return bound
    return None


def _combined(op: Any, bounds: list[int], args: list[VT]) -> int:
    """The bound of an int op's result from its operands' bounds."""
    if op is operator.add or op is operator.sub:
        return bounds[0] + bounds[1]
    if op is operator.mul:
        return bounds[0] * bounds[1]
    if op is operator.pow:
        return bounds[0] ** args[1].as_constant()
    if op is operator.mod:
        return bounds[1]
    return bounds[0] + 1  # floordiv (by a nonzero int), neg, pos, abs


def _int_bound(tx: Translator, vt: VT, guard: bool) -> int | None:
    """How large an int operand can be: a constant's own size, a size symbol's int32 bound (its
    guard), a computed number's bound, an int argument's int64 range, or with `guard` the
    tighter `_INT_ROOT_BOUND` behind a guard (None where its value is past it)."""
    if isinstance(vt, TensorNumberVT):
        if vt.bound is not None:
            return vt.bound
        if vt.node.op != "placeholder":
            return None
        if not guard:
            return _INT64[1] + 1
        if abs(vt.value) > _INT_ROOT_BOUND:
            return None
        for root in vt.roots:
            tx.output.guards.within(root, -_INT_ROOT_BOUND, _INT_ROOT_BOUND,
                                    location=tx.location())
        vt.bound = _INT_ROOT_BOUND
        return vt.bound
    if isinstance(vt, SymScalarVT):
        return _INT_ROOT_BOUND
    value = vt.as_constant()
    return abs(int(value)) if type(value) in (int, bool) else None


def _guard_root(tx: Translator, vt: VT, op: str, bound: float) -> bool:
    """`vt op bound` for every value the graph will see: a constant that holds, a size symbol
    (>= 2), or an argument's number that holds now, behind a guard; not a computed number."""
    check = {"!=": operator.ne, ">=": operator.ge}[op]
    if not isinstance(vt, SymScalarVT):
        return check(vt.as_constant(), bound)
    if not isinstance(vt, TensorNumberVT):
        return True
    if vt.node.op != "placeholder" or not check(vt.value, bound):
        return False
    for root in vt.roots:
        tx.output.guards.holds(root, op, bound, location=tx.location())
    return True


def _python_number(value: Any) -> Any:
    """The plain Python number of an example value (a SymFloat from arithmetic with a
    symbolic size counts as a float)."""
    if isinstance(value, torch.SymFloat):
        return 0.0
    if isinstance(value, torch.SymInt):
        return 0
    return value


def _python_type(vt: VT) -> type:
    return vt.python_type() if isinstance(vt, SymScalarVT) else type(vt.as_constant())


def _tensor_vt() -> type:
    from kiln.capture.variables.tensor import TensorVT
    return TensorVT


def _cast(tx: Translator, tensor: VT, dtype: torch.dtype) -> VT:
    from kiln.capture.variables.tensor import graph_call
    return graph_call(tx, "call_method", "to", [tensor, ConstantVT(dtype)], {})


# Value-only targets where a number beside one tensor operand may be a 0-dim tensor with the
# same meaning; the fill-like ones cast the value to their own dtype.
_BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
           operator.mod, operator.pow, operator.lt, operator.le, operator.gt, operator.ge,
           operator.eq, operator.ne, operator.iadd, operator.isub, operator.imul,
           operator.itruediv, torch.add, torch.sub, torch.mul, torch.div, torch.pow,
           torch.clamp, "add", "sub", "mul", "div", "pow", "clamp", "add_", "sub_", "mul_",
           "div_", "clamp_"}
_FILL = {"masked_fill", "masked_fill_", "fill_"}
# ops that check a Python number fits the tensor's dtype (eager raises "value cannot be converted
# to type ... without overflow"): only a tensor of the number's own dtype takes it unchecked
_CHECKED = _FILL | {torch.clamp, "clamp", "clamp_"}
_NUMBER_KWARGS = {"min", "max", "other", "value", "exponent", "input"}
_REDUCED = (torch.float16, torch.bfloat16)


def tensor_op_arguments(tx: Translator, target: Any, args: list[VT],
                        kwargs: dict[str, VT]) -> tuple[list[VT], dict[str, VT]]:
    """The arguments of a value-only tensor op with its TensorNumberVTs replaced: by the number's
    tensor cast to the dtype the op computes in, where the op has one tensor operand and one
    such number; specialized otherwise."""
    numbers = [v for v in (*args, *kwargs.values()) if isinstance(v, TensorNumberVT)]
    if not numbers:
        return args, kwargs
    tensor_vt = _tensor_vt()
    values = [*args, *kwargs.values()]
    tensors = [v for v in values if isinstance(v, tensor_vt)]
    keyword = {k for k, v in kwargs.items() if isinstance(v, TensorNumberVT)}
    others = [v for v in values if not isinstance(v, (tensor_vt, TensorNumberVT)) and
              not (v.is_constant() and (v.as_constant() is None or
                                        type(v.as_constant()) is str))]
    single = len(tensors) == 1 or target in _FILL  # masked_fill's mask is a second tensor
    if len(numbers) != 1 or not single or others or target not in _BINARY | _FILL or \
            keyword - _NUMBER_KWARGS:
        return specialize_all(list(args)), specialize_all(dict(kwargs))
    number = numbers[0]
    if target in _CHECKED and not _guard_fits(tx, number, tensors[0].fake, target):
        return specialize_all(list(args)), specialize_all(dict(kwargs))
    if target in _FILL:
        dtype = number.fake.dtype
    else:
        tensor = tensors[0].fake
        dtype = torch.result_type(tensor, number.value)
        if dtype in _REDUCED and tensor.dim() > 0:
            dtype = torch.float32
    cast = _cast(tx, number.as_tensor(), dtype) if dtype != number.fake.dtype else \
        number.as_tensor()
    swap = lambda v: cast if v is number else v  # noqa: E731
    return [swap(a) for a in args], {k: swap(v) for k, v in kwargs.items()}


def _guard_fits(tx: Translator, number: TensorNumberVT, tensor: torch.Tensor,
                target: Any) -> bool:
    """Whether the number may reach an op that checks it fits a dtype (with a Python number eager
    raises "value cannot be converted to type ... without overflow": `x_fp16.clamp(min=1e6)`,
    where a tensor value would give inf or wrap): always where the dtype holds every value of
    the number's type; else for an argument's own number within the range, behind a guard on
    it. False (specialize) otherwise."""
    dtype = tensor.dtype if target in _FILL else torch.result_type(tensor, number.value)
    if dtype == number.fake.dtype or (dtype.is_floating_point and number.fake.dtype is
                                      torch.int64 and dtype is not torch.float16):
        return True
    if dtype is torch.bool or dtype.is_complex or number.node.op != "placeholder":
        return False
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    low, high = (-info.max, info.max) if dtype.is_floating_point else (info.min, info.max)
    if not low <= number.value <= high:
        return False
    for root in number.roots:
        tx.output.guards.within(root, low, high, location=tx.location())
    return True


def number_as_tensor(tx: Translator, number: TensorNumberVT, dtype: torch.dtype,
                     device: VT | None) -> VT:
    """`torch.tensor(number, dtype=..., device=...)` of a TensorNumberVT: its tensor cast."""
    from kiln.capture.variables.tensor import graph_call
    kwargs = {"dtype": ConstantVT(dtype), **({"device": device} if device is not None else {})}
    return graph_call(tx, "call_method", "to", [number.as_tensor()], kwargs)


# Ops of `number_arithmetic` graphs as Python computes them outside the graph.
_HOST_FORM = {torch.sqrt: math.sqrt}


def host_expression(node: torch.fx.Node, number_input: Callable[[torch.fx.Node], str | None],
                    ref: Callable[[Any], str]) -> str | None:
    """Python source computing a number's value from the numbers the frame holds, where its node
    is arithmetic over number inputs and constants only (`number_input(placeholder)`: the
    number's expression, None for another input; `ref` binds an object): a number leaving the
    graph then costs no kernel launch and no device sync. None where a size of a tensor takes
    part (`.item()` then)."""
    if node.op == "placeholder":
        return number_input(node)
    if node.op == "call_method" and node.target == "to":
        inner = host_expression(node.args[0], number_input, ref)
        cast = {torch.float64: "float", torch.int64: "int"}.get(node.args[1] if len(node.args)
                                                                 > 1 else None)
        return None if inner is None or cast is None else f"{cast}({inner})"
    if node.op != "call_function" or node.kwargs or not (
            node.target in _HOST_FORM or node.target in _ARITHMETIC):
        return None
    parts = []
    for arg in node.args:
        if isinstance(arg, torch.fx.Node):
            part = host_expression(arg, number_input, ref)
            if part is None:
                return None
            parts.append(part)
        elif type(arg) in (int, float, bool):
            parts.append(ref(arg))
        else:
            return None
    return f"{ref(_HOST_FORM.get(node.target, node.target))}({', '.join(parts)})"
