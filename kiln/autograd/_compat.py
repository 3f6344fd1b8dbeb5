"""The autograd stage's only door to private torch APIs (tested on torch 2.11 and 2.13).

Everything here is small and named after what the stage needs, so a torch upgrade that moves one
of these breaks in exactly one place.
"""
from __future__ import annotations

import contextlib
import operator
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kiln.capture._compat import new_fake_mode  # one factory for every stage (capture's floor)
from kiln.capture._compat import (SYM_SIZE, SYM_STORAGE_OFFSET, SYM_STRIDE, SYM_TYPES,
                                  SymbolPrinter, is_symbolic, unbacked_symbols)

__all__ = [
    "SYMPY_CALLS",
    "SYM_SIZE",
    "SYM_STORAGE_OFFSET",
    "SYM_STRIDE",
    "SYM_TYPES",
    "SymbolPrinter",
    "unbacked_symbols",
    "FakeTensor",
    "FakeTensorMode",
    "OpOverload",
    "TorchDispatchMode",
    "core_aten_decompositions",
    "current_autograd_node",
    "fake_constant",
    "fake_mode_sharing",
    "guard_count",
    "replacements",
    "guards_since",
    "is_symbolic",
    "known_equal",
    "shape_env_of",
    "size_hint",
    "sym_expr",
    "has_composite_implicit_kernel",
    "is_fake",
    "new_fake_mode",
    "one_hot_traces_range_checks",
    "original_view_tracking",
    "python_dispatcher",
    "schema",
    "sequence_nr",
    "storage_key",
    "tree_flatten",
    "tree_unflatten",
]

OpOverload = torch._ops.OpOverload

tree_flatten: Callable[[Any], tuple[list[Any], Any]] = pytree.tree_flatten
tree_unflatten: Callable[[list[Any], Any], Any] = pytree.tree_unflatten


def is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


def fake_constant(fake: Any) -> torch.Tensor | None:
    """The real tensor behind a fake one made from a constant (`torch.tensor(...)`), or None."""
    return getattr(fake, "constant", None)


def core_aten_decompositions() -> dict:
    """torch's Core ATen decomposition table as a plain dict (a lazy table object since ~2.6)."""
    from torch._decomp import core_aten_decompositions as table

    return dict(table().items())


def has_composite_implicit_kernel(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


def schema(op: OpOverload) -> Any:
    """The op's FunctionSchema (arguments with alias annotations, name, is_mutable)."""
    return op._schema


def sequence_nr(grad_fn: Any) -> int:
    """The sequence number autograd gave a graph node (shared by the forward op and its
    backward node)."""
    return grad_fn._sequence_nr()


def current_autograd_node() -> Any:
    """The autograd graph node the engine is running now (None outside a backward pass)."""
    return torch._C._current_autograd_node()


@contextlib.contextmanager
def original_view_tracking() -> Iterator[None]:
    """Autograd replays views with their original view ops (slice, select) instead of as_strided,
    so backward formulas of mutations through views stay in the readable view vocabulary."""
    with torch.autograd._force_original_view_tracking(True):
        yield


def python_dispatcher() -> contextlib.AbstractContextManager[None]:
    """Dispatch through torch's Python kernels: ops whose C++ schema hides a mutation
    (native_batch_norm, cudnn_batch_norm) become their correctly annotated variants
    (_native_batch_norm_legit), so functionalization sees the running-stat updates."""
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def storage_key(tensor: torch.Tensor) -> StorageWeakRef:
    """A key equal for two tensors exactly when they share a storage (works on fake tensors)."""
    return StorageWeakRef(tensor.untyped_storage())


# -- symbolic sizes (issue 15, stage B; docs/dynamic_shapes.md) ----------------------------------
# The joint trace of a graph captured with symbolic sizes runs on FakeTensors of the capture's
# ShapeEnv: torch's meta functions and decompositions take SymInts, and every fact the trace
# relies on lands in that ShapeEnv as a guard, which the stage reads back.
import sympy  # noqa: E402 - torch's symbolic sizes are sympy expressions
from torch.fx.experimental import symbolic_shapes as _shapes  # noqa: E402
from torch.utils._sympy import functions as _sympy_fns  # noqa: E402


def fake_mode_sharing(shape_env: Any) -> FakeTensorMode:
    """A fake mode over `shape_env` (the capture's): its tensors may have the capture's symbolic
    sizes; real tensors reaching an op become constants, as in `new_fake_mode`."""
    return FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)


def shape_env_of(values: Any) -> Any:
    """The ShapeEnv behind the first symbolic size among `values` (tensors and numbers), or None."""
    for value in values:
        for size in _sizes_of(value):
            if is_symbolic(size):
                return size.node.shape_env
    return None


def _sizes_of(value: Any) -> tuple:
    if isinstance(value, torch.Tensor):
        return (*value.shape, *value.stride(), value.storage_offset())
    return (value,)


def sym_expr(value: Any) -> Any:
    """The sympy expression of a symbolic number (with the ShapeEnv's replacements applied)."""
    return value.node.expr


def unreplaced_expr(value: Any) -> Any:
    """The sympy expression a symbolic number was made with, before the ShapeEnv's
    replacements (`s2` where `sym_expr` now says 16)."""
    return value.node._expr


def size_hint(value: Any) -> int:
    """A size as the int it had in the example the trace started from, without recording a
    guard (byte counts, reports); a plain int as it is."""
    if isinstance(value, torch.SymInt):
        node = value.node
        return int(node.hint) if node.hint is not None else int(node.shape_env.size_hint(node.expr))
    return int(value)


def known_equal(a: Any, b: Any) -> bool:
    """a == b for every value of the symbols (decided without recording a guard); a False may
    also mean "not known"."""
    if not isinstance(a, SYM_TYPES) and not isinstance(b, SYM_TYPES):
        return a == b
    return bool(_shapes.statically_known_true(a == b))


def guard_count(shape_env: Any) -> int:
    return len(shape_env.guards)


def replacements(shape_env: Any) -> dict:
    """A copy of `shape_env`'s replacements (symbol -> the expression it equals)."""
    return dict(shape_env.replacements)


def guards_since(shape_env: Any, start: int, replaced: dict | None = None) -> list[Any]:
    """The facts recorded in `shape_env` after its first `start` guards, simplified with its
    replacements; those that became always true are dropped.

    A guard that specializes a size (`Eq(s0, 6)`: C++ code that reads a concrete size) is also
    a replacement `s0 -> 6`, after which it simplifies to true: so every replacement made since
    `replaced` (the replacements when counting started) is a fact of its own, `Eq(s0, 6)` in the
    symbols the inputs hold, or the facts would lose the specialization."""
    found = []
    if replaced is not None:
        for symbol, value in shape_env.replacements.items():
            if replaced.get(symbol) != value:
                fact = sympy.Eq(symbol, value)
                if fact != sympy.true and fact not in found:
                    found.append(fact)
    for guard in shape_env.guards[start:]:
        expr = shape_env.simplify(guard.expr)
        if expr != sympy.true and expr not in found:
            found.append(expr)
    return found


# torch's sympy functions in size expressions -> the Python operation each one is on ints
# (a graph computes a symbolic size with these, from the sizes of its inputs)
SYMPY_CALLS: dict[type, Callable] = {
    _sympy_fns.FloorDiv: operator.floordiv,
    _sympy_fns.CleanDiv: operator.floordiv,
    _sympy_fns.Mod: operator.mod,
    _sympy_fns.PythonMod: operator.mod,
    _sympy_fns.IntTrueDiv: operator.truediv,
    _sympy_fns.FloatTrueDiv: operator.truediv,
    _sympy_fns.PowByNatural: operator.pow,
    _sympy_fns.FloatPow: operator.pow,
    _sympy_fns.ToFloat: torch.sym_float,
    _sympy_fns.OpaqueUnaryFn_sqrt: torch._sym_sqrt,  # math.sqrt of a size (capture's `_sqrt`)
    _sympy_fns.TruncToInt: torch.sym_int,
    _sympy_fns.Max: torch.sym_max,
    _sympy_fns.Min: torch.sym_min,
}


_ONE_HOT_CHECKS: list[bool] = []


def one_hot_traces_range_checks() -> bool:
    """Whether `F.one_hot` on fake tensors records its class range checks (`_assert_async`):
    torch 2.13 does; 2.11 checks only real tensors, so a traced one_hot took a class out of
    range silently (an all-zero row where eager raises). Probed once."""
    if not _ONE_HOT_CHECKS:
        seen: list[Any] = []

        class _Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func)
                return func(*args, **(kwargs or {}))

        # asked mid-trace: the probe must not run under (and record into) the tracer's modes
        with _disable_current_modes(), new_fake_mode(allow_non_fake_inputs=False) as mode:
            labels = mode.from_tensor(torch.zeros(2, dtype=torch.int64))
            with python_dispatcher(), _Watch():  # as the tracer runs
                torch.nn.functional.one_hot(labels, 3)
        asserts = {torch.ops.aten._assert_async.default, torch.ops.aten._assert_async.msg}
        _ONE_HOT_CHECKS.append(any(f in asserts for f in seen))
    return _ONE_HOT_CHECKS[0]
