"""ops: the one ops-handler interface every loop body is written against (Inductor's `V.ops`).

A loop body (`Pointwise.inner_fn`, `Reduction.inner_fn`, a buffer's store body) never computes
anything itself: it calls `ops.<name>(...)` on the module-level proxy `ops`, which forwards to the
handler installed with `use_handler(handler)`. Running the same body under different handlers
gives different things:

| handler | module | what running a body does |
|---|---|---|
| `Evaluator` | `evaluate.py` | computes it with torch tensors over the whole index grid |
| `Printer` | `printer.py` | writes it as Python source (`t3 = ops.exp(t2)`) |
| `DepsCollector` | `deps.py` | records loads/stores (buffer, index) and counts ops |
| `TritonPrinter` | `codegen/triton_printer.py` (math forms: `codegen/triton_math.py`) | writes it as Triton source (`tmp3 = tl.exp(tmp2)`) |

Values are opaque to the body (tensors, names, ...); indices are always `index.Expr`.

The vocabulary (`OpsHandler` documents each):

- memory: `load(name, index)`, `store(name, index, value)`, `store_reduction(name, index, value)`
- leaves: `constant(value, dtype)`, `index_expr(expr, dtype)`, `indirect_indexing(value, size, wrap=...)`
- control: `to_dtype(x, dtype)`, `where(cond, a, b)`, `masked(mask, body, other)`,
  `reduction(dtype, src_dtype, reduction_type, value)`
- math: the names in `UNARY_OPS` and `BINARY_OPS` (`ops.add(a, b)`, `ops.exp(x)`, ...), one
  row each in `op_table.MATH_OPS`, which also says what each means (its torch reference)
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch

from kiln.lower.index import Expr
from kiln.lower.op_table import BINARY_OPS, UNARY_OPS

__all__ = [
    "BINARY_OPS",
    "OpsHandler",
    "REDUCTION_TYPES",
    "UNARY_OPS",
    "current_handler",
    "ops",
    "use_handler",
]

REDUCTION_TYPES: tuple[str, ...] = ("sum", "prod", "max", "min", "argmax", "argmin", "any")


class OpsHandler:
    """The interface. Subclasses implement `math(name, *args)` for the math ops (or override a
    method per op) and the special methods below; every method has the same meaning everywhere.
    """

    def load(self, name: str, index: Expr) -> Any:
        """The element of buffer `name` at flat storage offset `index` (the buffer's dtype)."""
        raise NotImplementedError

    def store(self, name: str, index: Expr, value: Any) -> None:
        """Write `value` (already in the buffer's dtype) at flat storage offset `index`."""
        raise NotImplementedError

    def store_reduction(self, name: str, index: Expr, value: Any) -> None:
        """Write a reduction's result (one per output element) at flat storage offset `index`."""
        raise NotImplementedError

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str,
                  value: Any) -> Any:
        """Reduce `value` over the node's reduction variables; `dtype` is the accumulator and
        result dtype (int64 for argmax/argmin), `src_dtype` the dtype of `value`."""
        raise NotImplementedError

    def constant(self, value: bool | int | float, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> Any:
        """The integer value of an index expression, as a value of `dtype`."""
        raise NotImplementedError

    def indirect_indexing(self, value: Any, size: int, check: bool = True,
                          wrap: bool = True) -> Expr:
        """Turn a loaded integer value into an index symbol over `[0, size)`; `check` asks for a
        bounds check where supported. With `wrap`, negative values wrap once, as in torch
        indexing (`x[idx]`); without, a negative value is out of range, as in `gather`,
        `index_select` and `embedding`, whose eager kernels raise on it."""
        raise NotImplementedError

    def to_dtype(self, x: Any, dtype: torch.dtype) -> Any:
        """Convert (with rounding for floats, truncation toward zero for float → int)."""
        raise NotImplementedError

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | int | float) -> Any:
        """`body()` where `mask` holds, `other` elsewhere; loads inside `body` are never made
        where the mask is false (so their indices may be out of bounds there)."""
        raise NotImplementedError

    def math(self, name: str, *args: Any) -> Any:
        """A math op from UNARY_OPS / BINARY_OPS (`op_table.MATH_OPS[name]`)."""
        raise NotImplementedError


def _math_method(name: str) -> Callable[..., Any]:
    def method(self: OpsHandler, *args: Any) -> Any:
        return self.math(name, *args)

    method.__name__ = name
    method.__doc__ = f"ops.{name}: a math op, `kiln.lower.op_table.MATH_OPS[{name!r}]`."
    return method


for _name in UNARY_OPS + BINARY_OPS:
    setattr(OpsHandler, _name, _math_method(_name))


# -- the virtualized proxy -------------------------------------------------------------------------

_state = threading.local()


def current_handler() -> OpsHandler:
    stack = getattr(_state, "stack", None)
    if not stack:
        raise RuntimeError("no ops handler installed: run loop bodies inside "
                           "kiln.lower.ops.use_handler(handler)")
    return stack[-1]


@contextlib.contextmanager
def use_handler(handler: OpsHandler) -> Iterator[OpsHandler]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(handler)
    try:
        yield handler
    finally:
        stack.pop()


class _OpsProxy:
    """`ops.<name>(...)` forwards to the current handler's method `<name>`."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current_handler(), name)

    def __repr__(self) -> str:
        return "<kiln.lower.ops: forwards to the installed OpsHandler>"


ops = _OpsProxy()
