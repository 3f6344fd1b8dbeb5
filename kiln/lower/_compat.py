"""The lower stage's only door to private torch APIs (checked on torch 2.11 and 2.13).

Tracing (`make_fx`), fake tensors, torch's decomposition tables and its elementwise type
promotion live behind the small functions here, so a torch upgrade that moves one of them breaks
in exactly one place.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln.capture._compat import new_fake_mode  # one factory for every stage (capture's floor)

__all__ = [
    "OpOverload",
    "PROMOTION",
    "core_aten_decompositions",
    "elementwise_dtypes",
    "fake_tensor_like",
    "full_decomposition_table",
    "fake_mode_of",
    "guard_count",
    "make_aten_graph",
    "make_symbolic_aten_graph",
    "symbol_hint",
    "symbol_range",
    "symint_parts",
    "sympy_kind",
    "new_fake_mode",
    "storage_key",
    "trace_fake",
    "tree_flatten",
    "tree_leaves",
    "tree_unflatten",
]

OpOverload = torch._ops.OpOverload
tree_flatten = torch.utils._pytree.tree_flatten
tree_leaves = torch.utils._pytree.tree_leaves
tree_unflatten = torch.utils._pytree.tree_unflatten


def storage_key(tensor: torch.Tensor) -> Any:
    """Equal for two tensors exactly when they share a storage (fake tensors too)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor.untyped_storage())


def core_aten_decompositions() -> dict:
    """torch's Core ATen decomposition table as a plain dict."""
    from torch._decomp import core_aten_decompositions as table

    return dict(table().items())


def full_decomposition_table() -> dict:
    """Every decomposition torch registers (`torch._decomp.decomposition_table`)."""
    from torch._decomp import decomposition_table

    return decomposition_table


def _promotion_kinds() -> Any:
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND

    return ELEMENTWISE_TYPE_PROMOTION_KIND


PROMOTION = _promotion_kinds()


def elementwise_dtypes(*args: Any, kind: Any) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of an elementwise op over `args` (tensors — fake or
    meta are fine — and Python scalars), torch's type promotion."""
    from torch._prims_common import elementwise_dtypes as promote

    from kiln.lower.index import Expr

    # a symbolic size (an `Expr` while lowering symbolically) is an int: only types promote
    args = tuple(0 if isinstance(a, Expr) else a for a in args)
    return promote(*args, type_promotion_kind=kind)


def fake_tensor_like(mode: Any, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                     device: torch.device, offset: int = 0) -> torch.Tensor:
    with mode:
        t = torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device=device)
        if offset:
            t = torch.as_strided(t, tuple(size), tuple(stride), offset)
    return t


def trace_fake(fn: Callable[..., Any], args: Sequence[Any], decompositions: dict,
               mode: Any) -> torch.fx.GraphModule:
    """Trace `fn(*args)` (fake tensors of `mode`) into an ATen FX graph, applying
    `decompositions`; every node gets `meta["val"]`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with mode:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*args)


def make_symbolic_aten_graph(fn: Callable[..., Any], inputs: Sequence[Any],
                             decompositions: dict | None = None,
                             dynamic: dict[int, set[int]] | None = None) -> torch.fx.GraphModule:
    """make_fx of `fn(*inputs)` with symbolic sizes (tests of the symbolic path; the autograd
    stage makes such graphs from a symbolic capture): `dynamic` maps input positions to the
    dims that are symbolic; None makes every size symbolic."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.capture._compat import new_symbolic_fake_mode, symbolic_dispatch, symbolic_fake

    fn = torch.func.functionalize(fn, remove="mutations")
    if dynamic is None:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="symbolic")(*inputs)
    mode = new_symbolic_fake_mode()
    fakes = [symbolic_fake(mode, t, dynamic.get(i, set()), f"arg{i}")
             if isinstance(t, torch.Tensor) else t for i, t in enumerate(inputs)]
    with mode, symbolic_dispatch(True):  # composite ops keep SymInts, as in capture
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*fakes)


# -- symbolic sizes (torch's SymInt / ShapeEnv / sympy) --------------------------------------------

def symint_parts(value: Any) -> tuple[Any, Any] | None:
    """(sympy expression, ShapeEnv) of a symbolic `torch.SymInt`, None for a plain int."""
    if not isinstance(value, torch.SymInt):
        return None
    node = value.node
    if not hasattr(node, "expr") or node.shape_env is None:
        return None
    expr = node.shape_env.replace(node.expr)
    return (expr, node.shape_env) if not expr.is_number else None


def symbol_range(shape_env: Any, symbol: Any) -> tuple[int, int | None]:
    """(lower, upper) bound the ShapeEnv knows for `symbol`; upper None when unbounded."""
    ranges = shape_env.var_to_range.get(symbol)
    if ranges is None:
        return 2, None
    return max(_finite_int(ranges.lower) or 2, 2), _finite_int(ranges.upper)


def symbol_hint(shape_env: Any, symbol: Any) -> int | None:
    """The example's value of a backed `symbol` (what the trace ran with)."""
    values = getattr(shape_env, "backed_var_to_val", None)  # torch 2.13; var_to_val before
    value = (values if values is not None else shape_env.var_to_val).get(symbol)
    return None if value is None else int(value)


def _finite_int(value: Any) -> int | None:
    import sympy

    return int(value) if isinstance(value, (int, sympy.Integer)) else None


def fake_mode_of(fakes: Sequence[torch.Tensor]) -> Any:
    """The FakeTensorMode the fake tensors belong to."""
    from torch._subclasses.fake_tensor import FakeTensor

    for t in fakes:
        if isinstance(t, FakeTensor):
            return t.fake_mode
    raise ValueError("no fake tensor among the arguments")


def guard_count(shape_env: Any) -> int:
    """How many guards the ShapeEnv recorded (a new one means code specialized a size)."""
    return len(shape_env.guards)


def sympy_kind(expr: Any) -> str:
    """"symbol", "integer", "add", "mul", "power" (a positive integer exponent), "floordiv",
    "ceildiv" (operands: `ceildiv_operands`), "mod", "max", "min" or "other" for a sympy size."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod

    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return "power"  # s0**2: the stride of an [L, L] block
    if ceildiv_operands(expr) is not None:
        return "ceildiv"
    kinds = ((sympy.Symbol, "symbol"), (sympy.Integer, "integer"), (sympy.Add, "add"),
             (sympy.Mul, "mul"), (FloorDiv, "floordiv"), ((Mod, PythonMod), "mod"),
             ((sympy.Max, Max), "max"), ((sympy.Min, Min), "min"))
    for cls, kind in kinds:
        if isinstance(expr, cls):
            return kind
    return "other"


def ceildiv_operands(expr: Any) -> tuple[Any, Any] | None:
    """(a, b) of `CeilToInt(IntTrueDiv(a, b))`, torch's ceil of an integer division (the
    efficient attention kernel's logsumexp rows are padded to `32*ceil(L/32)`); else None."""
    from torch.utils._sympy import functions

    ceil, div = getattr(functions, "CeilToInt", None), getattr(functions, "IntTrueDiv", None)
    if ceil is None or div is None or not isinstance(expr, ceil) or \
            not isinstance(expr.args[0], div):
        return None
    return tuple(expr.args[0].args)


def make_aten_graph(fn: Callable[..., Any], inputs: Sequence[Any], decompositions: dict,
                    functionalize: bool) -> torch.fx.GraphModule:
    """make_fx of `fn(*inputs)` (real inputs) with `decompositions`, functionalized first when
    `functionalize` (views stay views); `decomposition_tables.trace_aten` picks the table."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if functionalize:
        fn = torch.func.functionalize(fn, remove="mutations")
    return make_fx(fn, decomposition_table=decompositions)(*inputs)
