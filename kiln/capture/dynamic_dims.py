"""Which tensor dims a capture makes symbolic, and which dims a failed guard says changed.

Three inputs decide (docs/dynamic_shapes.md, stage A):
- `kiln.compile(dynamic=...)`: True makes every dim of every input symbolic from the first call,
  False none (today's specialization, marks included), None (the default) only the dims below.
- automatic dynamic: a dim whose size changed between calls (a shape guard of the newest entry
  failed on it) is symbolic in every later capture of that code (`CodeCache.dynamic_dims`).
- marks on the tensor, read at capture time: `kiln.mark_dynamic` / `maybe_mark_dynamic` /
  `mark_static`. They use torch's attribute names, so `torch._dynamo.mark_dynamic` works for kiln
  and `kiln.mark_dynamic` for torch.compile.

Parameters always stay static (as torch.compile's `force_parameter_static_shapes`): their shapes
change only when the model does. Sizes 0 and 1 stay static whatever is asked (torch's ShapeEnv
specializes them; a broadcast dim must not turn into a size-n one).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

__all__ = ["DynamicPolicy", "DimChange", "DYNAMIC_ATTR", "WEAK_DYNAMIC_ATTR", "STATIC_ATTR",
           "mark_dims", "changed_dims", "changed_strides"]

DYNAMIC_ATTR = "_dynamo_dynamic_indices"  # mark_dynamic
WEAK_DYNAMIC_ATTR = "_dynamo_weak_dynamic_indices"  # maybe_mark_dynamic
STATIC_ATTR = "_dynamo_static_indices"  # mark_static


def mark_dims(tensor: torch.Tensor, attr: str, dims: Any) -> None:
    """Add `dims` (an int, or a list of them; negative counts from the end) to the tensor's mark
    `attr`; a dim marked static is no longer marked dynamic, and the reverse."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(tensor).__name__}")
    wanted = {d % tensor.dim() if tensor.dim() else d
              for d in ([dims] if isinstance(dims, int) else dims)}
    bad = [d for d in wanted if not 0 <= d < max(tensor.dim(), 1)]
    if bad:
        raise IndexError(f"dim {bad[0]} is out of range for a tensor of {tensor.dim()} dims")
    opposite = (DYNAMIC_ATTR, WEAK_DYNAMIC_ATTR) if attr == STATIC_ATTR else (STATIC_ATTR,)
    for other in opposite:
        if hasattr(tensor, other):
            getattr(tensor, other).difference_update(wanted)
    if not hasattr(tensor, attr):
        setattr(tensor, attr, set())
    getattr(tensor, attr).update(wanted)


def _marked(tensor: torch.Tensor, attr: str) -> set[int]:
    return set(getattr(tensor, attr, ()))


@dataclasses.dataclass(frozen=True)
class DynamicPolicy:
    """`mode`: kiln.compile's `dynamic`; `automatic`: per source expression, the dims that
    changed between calls of this code."""

    mode: bool | None = None
    automatic: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)
    # per source expression, the dims whose stride changed between calls while the sizes held
    # (a slice of a growing buffer: `seq[:, -1:]`)
    strides: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)

    def stride_dims_for(self, value: torch.Tensor, source_expr: str) -> set[int]:
        """The dims of `value` whose stride is a symbol of its own in this capture (automatic
        dynamic only: torch.compile's `dynamic=True` does not make strides symbolic either)."""
        if self.mode is False or isinstance(value, torch.nn.Parameter):
            return set()
        return {d for d in self.strides.get(source_expr, ()) if 0 <= d < value.dim()}

    def dims_for(self, value: torch.Tensor, source_expr: str,
                 module_state: bool) -> dict[int, str]:
        """The dims of `value` (read from `source_expr`) to make symbolic in this capture, each
        with why (shown by explain)."""
        if self.mode is False or isinstance(value, torch.nn.Parameter):
            return {}
        why: dict[int, str] = {}
        if self.mode is True and not module_state:  # buffers, like parameters, stay static
            why.update((d, "dynamic=True") for d in range(value.dim()))
        why.update((d, "its size changed between calls")
                   for d in self.automatic.get(source_expr, ()))
        why.update((d, "maybe_mark_dynamic") for d in _marked(value, WEAK_DYNAMIC_ATTR))
        why.update((d, "mark_dynamic") for d in _marked(value, DYNAMIC_ATTR))
        static = _marked(value, STATIC_ATTR)
        return {d: reason for d, reason in why.items() if 0 <= d < value.dim() and
                d not in static}


@dataclasses.dataclass(frozen=True)
class DimChange:
    """A dim whose size differed from the newest entry's guard: `user` is how the user names it
    (`x.shape[0]`), `expr` the tensor's source expression, `old` / `new` the sizes."""

    expr: str
    dim: int
    user: str
    old: int
    new: int

    def render(self) -> str:
        return f"{self.user} changed from {self.old} to {self.new}"


def changed_strides(guards: list, namespace: dict[str, Any]) -> list[DimChange]:
    """The dims whose stride guard failed in `namespace` while the tensor kept its number of
    dims: stride guards read `<tensor expr>.stride()` and expect a tuple, or (a symbolic
    tensor's) the source of one in terms of the call's sizes."""
    found: list[DimChange] = []
    for guard in guards:
        if guard.kind != "stride" or guard.failure(namespace) is None:
            continue
        expr = guard.value.removesuffix(".stride()")
        try:
            actual = tuple(eval(guard.value, namespace))  # noqa: S307 - our own expressions
            expected = tuple(eval(guard.expected_src, namespace))  # noqa: S307
        except Exception:  # noqa: BLE001 - no longer a tensor, or a size guard fails first
            continue
        if len(actual) != len(expected):
            continue
        name = guard.user.removesuffix(".stride()")
        found.extend(DimChange(expr, d, f"{name}.stride({d})", old, new)
                     for d, (old, new) in enumerate(zip(expected, actual)) if old != new)
    return found


def changed_dims(guards: list, namespace: dict[str, Any]) -> list[DimChange]:
    """The dims whose size guard failed in `namespace` (a call's arguments): shape guards carry
    `shape_of = (tensor source expr, dim or None for the whole shape)`. A tensor whose number
    of dims changed reports nothing: that is a new program, not a new size."""
    found: list[DimChange] = []
    for guard in guards:
        if guard.shape_of is None or guard.failure(namespace) is None:
            continue
        expr, dim = guard.shape_of
        try:
            actual = tuple(eval(f"tuple({expr}.shape)", namespace))  # noqa: S307 - our own expr
        except Exception:  # noqa: BLE001 - no longer a tensor: the type guard says why
            continue
        name = guard.user.rsplit(".shape", 1)[0]
        if dim is not None:
            if dim < len(actual):
                found.append(DimChange(expr, dim, f"{name}.shape[{dim}]", guard.expected,
                                       actual[dim]))
            continue
        if len(actual) == len(guard.expected):
            found.extend(DimChange(expr, d, f"{name}.shape[{d}]", old, new)
                         for d, (old, new) in enumerate(zip(guard.expected, actual))
                         if old != new)
    return found
