"""Guards: the conditions under which a cache entry may be reused.

A `Guard` is one Python comparison `<value expr> <op> <expected>` over the names a dispatcher sees
(see `sources`). Guards render to source code that the dispatcher inlines, and each can explain its
own failure as the user would read it (`x.shape[0]: expected 8, got 16`).

Guards on module state (attributes, parameters, submodules) are `module` guards: they only need
re-checking when the module version counter moved (see `module_version`), so the fast path checks
one integer instead of every attribute.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

from kiln.capture import _compat
from kiln.capture.ddp_split import bucket_key
from kiln.capture.module_version import watch
from kiln.capture.sources import Source
from kiln.diagnostics import GuardFailure, GuardRecord, UserLocation

__all__ = ["Guard", "GuardSet", "Constants", "AMBIENT_NAMESPACE"]

# Simple values are inlined into guard source as literals; others are bound as `__k<N>`.
_LITERAL_TYPES = (type(None), bool, int, str, bytes)


@dataclasses.dataclass(frozen=True)
class Guard:
    """`value` (a Python expression) compared with `expected` using `op` ("is", "==", "in" ...).

    `user` is how the user would name the value; `kind` is the category shown in reports
    (type, id, constant, dtype, shape, ...); `module` marks guards re-checked only when the module
    version counter changed; `location` is the user line that read the value."""

    value: str
    op: str
    expected_src: str
    expected: Any
    user: str
    kind: str
    module: bool = False
    location: UserLocation | None = None
    display: str | None = None  # how the whole guard reads to the user, when `user op expected` won't
    slot: Any = None  # InstanceSlot of a rebindable module-identity guard (kind "instance")
    # a size guard: (tensor source expr, dim; None for the whole shape), read by automatic
    # dynamic to learn which dims changed (`dynamic_dims.changed_dims`)
    shape_of: tuple[str, int | None] | None = None

    def source(self) -> str:
        if self.slot is not None:  # identity through an InstanceSlot bound as `expected_src`
            return f"{self.expected_src}.holds({self.value})"
        return f"{self.value} {self.op} {self.expected_src}"

    def record(self) -> GuardRecord:
        text = self.display or f"{self.user} {self.op} {_show(self.expected)}"
        return GuardRecord(text, self.kind, self.location)

    def failure(self, namespace: dict[str, Any]) -> GuardFailure | None:
        """None if the guard holds in `namespace`, else what differs."""
        try:
            if eval(self.source(), namespace):  # noqa: S307 - our own generated expression
                return None
            actual = eval(self.value, namespace)  # noqa: S307
        except Exception as err:  # the value is not even readable: that is the failure
            return GuardFailure(self.user, _show(self.expected), f"<{type(err).__name__}: {err}>")
        if self.kind == "range":  # `s: expected != 0, got 0.0`
            return GuardFailure(self.user, f"{self.op} {_show(self.expected)}", _show(actual))
        return _explain(self.user, self.expected, actual)


def _explain(user: str, expected: Any, actual: Any) -> GuardFailure:
    if isinstance(expected, tuple) and isinstance(actual, tuple) and len(expected) == len(actual):
        for dim, (want, got) in enumerate(zip(expected, actual)):
            if want != got:
                return GuardFailure(f"{user}[{dim}]", _show(want), _show(got))
    if isinstance(expected, type) and not isinstance(actual, type):
        actual = type(actual)
    return GuardFailure(user, _show(expected), _show(actual))


def _show(value: Any) -> str:
    if isinstance(value, type):
        return value.__qualname__
    if isinstance(value, _IdentityOf):
        return f"the object seen at compile time ({value.text})"
    if isinstance(value, _SameAs):
        return f"the same object as {value.text}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class InstanceSlot:
    """The module instances an entry's guards were verified for at its module version (weakly
    held). Another instance of the same class whose every other guard holds may reuse the entry:
    the slot then holds it too, so layers of one class that alternate (a decoder stack) each
    pass the inlined identity check (`refs.get(id(x), _DEAD)() is x`) instead of rebinding on
    every call. When the module version moved since the last verification, the instances held
    are dropped: each is verified again on its next call."""

    __slots__ = ("refs", "__weakref__")

    def __init__(self, obj: Any) -> None:
        self.refs: dict[int, weakref.ref] = {}
        self.set(obj, keep=False)

    def holds(self, obj: Any) -> bool:
        return self.refs.get(id(obj), _dead)() is obj

    def set(self, obj: Any, keep: bool = False) -> None:
        """Verified `obj`; `keep`: the others held are still verified (no version move)."""
        if not keep or len(self.refs) >= _MAX_INSTANCES:
            self.refs = {}
        watch(obj)
        self.refs[id(obj)] = weakref.ref(obj)


def _dead() -> None:
    return None


_MAX_INSTANCES = 256  # a model's layers of one class; beyond it, start over (never unbounded)


@dataclasses.dataclass(frozen=True)
class _IdentityOf:
    text: str


@dataclasses.dataclass(frozen=True)
class _SameAs:
    text: str


class Constants:
    """Objects that generated code refers to, bound into its namespace as `__k<N>`."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._index: dict[Any, int] = {}

    def index(self, value: Any) -> int:
        key = id(value)
        if key not in self._index:
            self._index[key] = len(self.values)
            self.values.append(value)
        return self._index[key]

    def ref(self, value: Any) -> str:
        """Modules are held weakly, so a cache never keeps a user's model alive."""
        if isinstance(value, torch.nn.Module):
            return f"__k{self.index_weak(value)}()"
        return f"__k{self.index(value)}"

    def index_weak(self, value: Any) -> int:
        watch(value)  # generated code guards this module: its changes must move the version
        key = ("weak", id(value))
        if key not in self._index or self.values[self._index[key]]() is not value:
            self._index[key] = len(self.values)
            self.values.append(weakref.ref(value))
        return self._index[key]

    def literal_or_ref(self, value: Any) -> str:
        # exact types: a subclass (an IntEnum, a str with its own __repr__) may print as anything
        if type(value) in _LITERAL_TYPES or (type(value) is float and value == value
                                             and value not in (float("inf"), float("-inf"))):
            return repr(value)
        if type(value) is tuple and all(type(v) is int for v in value):
            return repr(value)
        return self.ref(value)

    def namespace(self) -> dict[str, Any]:
        return {f"__k{i}": v for i, v in enumerate(self.values)}


class GuardSet:
    """Guards collected while tracing one frame, deduplicated by their source text."""

    def __init__(self, consts: Constants) -> None:
        self.consts = consts
        self.guards: list[Guard] = []
        self._seen: set[str] = set()

    def add(self, guard: Guard) -> None:
        key = guard.source()
        if key not in self._seen:
            self._seen.add(key)
            self.guards.append(guard)

    def _add(self, value: str, op: str, expected: Any, user: str, kind: str, *, module: bool,
             location: UserLocation | None, expected_src: str | None = None) -> None:
        src = expected_src if expected_src is not None else self.consts.literal_or_ref(expected)
        self.add(Guard(value, op, src, expected, user, kind, module, location))

    # -- object guards -------------------------------------------------------------------------
    def type_match(self, source: Source, value: Any, *, module: bool = False,
                   location: UserLocation | None = None) -> None:
        self._add(f"type({source.expr()})", "is", type(value), f"type({source.name()})", "type",
                  module=module, location=location)

    def id_match(self, source: Source, value: Any, *, module: bool = False,
                 location: UserLocation | None = None) -> None:
        self._add(source.expr(), "is", _IdentityOf(source.name()), source.name(), "id",
                  module=module, location=location, expected_src=self.consts.ref(value))

    def same_object(self, source: Source, first: Source,
                    location: UserLocation | None = None) -> None:
        """`source` holds the object `first` holds (a tied weight, `f(x, x)`): guarded as that
        relation, not as the object, so another module instance tied the same way (a layer of
        a stack, a fresh model) or new tensors passed twice reuse the entry. Checked on every
        call: `first` may be an argument, which the module version does not cover."""
        self.add(Guard(source.expr(), "is", first.expr(), _SameAs(first.name()),
                       source.name(), "alias", False, location,
                       display=f"{source.name()} is {first.name()}"))

    def module_instance(self, source: Source, value: torch.nn.Module, *, module: bool = False,
                        location: UserLocation | None = None) -> None:
        """Type always; identity through a rebindable slot (see InstanceSlot)."""
        self.type_match(source, value, module=module, location=location)
        slot = InstanceSlot(value)
        self.add(Guard(source.expr(), "is", self.consts.ref(slot),
                       _IdentityOf(source.name()), source.name(), "instance", module, location,
                       slot=slot))

    def equals(self, source: Source, value: Any, *, module: bool = False,
               location: UserLocation | None = None) -> None:
        """Constant specialization: same type and equal value (a bool must not match 1)."""
        self.type_match(source, value, module=module, location=location)
        op = "is" if value is None or isinstance(value, bool) else "=="
        self._add(source.expr(), op, value, source.name(), "constant", module=module,
                  location=location)

    def within(self, source: Source, low: float, high: float, *,
               location: UserLocation | None = None) -> None:
        """`low <= value <= high`: a number a graph takes as a tensor where eager checks that it
        fits a dtype (`number_tensors`); a value outside compiles again, specialized."""
        self.holds(source, ">=", low, location=location)
        self.holds(source, "<=", high, location=location)

    def holds(self, source: Source, op: str, bound: Any, *,
              location: UserLocation | None = None) -> None:
        """`value op bound` (`s != 0`, `s >= 0`): what a number a graph takes as a tensor must
        satisfy for the tensor op to mean what Python's does (`number_tensors`)."""
        self._add(source.expr(), op, bound, source.name(), "range", module=False,
                  location=location)

    def length(self, source: Source, value: Any, *, module: bool = False,
               location: UserLocation | None = None) -> None:
        self.type_match(source, value, module=module, location=location)
        self._add(f"len({source.expr()})", "==", len(value), f"len({source.name()})", "length",
                  module=module, location=location)

    def dict_keys(self, source: Source, value: dict, *, module: bool = False,
                  location: UserLocation | None = None) -> None:
        self.type_match(source, value, module=module, location=location)
        self._add(f"tuple({source.expr()})", "==", tuple(value), f"{source.name()}.keys()",
                  "dict keys", module=module, location=location)

    def not_in_dict(self, source: Source, attr: str, *, module: bool = True) -> None:
        self.add(Guard(f"({attr!r} in {source.expr()}.__dict__)", "is", "False", False,
                       f"{attr!r} in {source.name()}.__dict__", "no shadowing", module, None,
                       display=f"{attr!r} not in {source.name()}.__dict__"))

    def in_dict(self, source: Source, attr: str, *, module: bool) -> None:
        """The instance attribute is there (the code deletes it)."""
        self.add(Guard(f"({attr!r} in {source.expr()}.__dict__)", "is", "True", True,
                       f"{attr!r} in {source.name()}.__dict__", "attribute present", module, None,
                       display=f"{attr!r} in {source.name()}.__dict__"))

    def tensor_match(self, source: Source, value: torch.Tensor, *, module: bool = False,
                     location: UserLocation | None = None,
                     symbolic_dims: set[int] = frozenset(),
                     symbolic_strides: bool = False) -> None:
        """Type, dtype, device, shape, strides and requires_grad, cheapest first; for a tensor
        with `symbolic_dims`, the shape guard lists only its static dims. The strides of a
        tensor with symbolic sizes or strides are guarded with the symbols (shape_guards)."""
        e, n = source.expr(), source.name()
        self.type_match(source, value, module=module, location=location)
        self._add(f"{e}.dtype", "is", value.dtype, f"{n}.dtype", "dtype", module=module,
                  location=location)
        self._add(f"{e}.device", "==", value.device, f"{n}.device", "device", module=module,
                  location=location)
        self._add(f"{e}.requires_grad", "is", value.requires_grad, f"{n}.requires_grad",
                  "requires_grad", module=module, location=location)
        if symbolic_dims:
            self._symbolic_shape(source, value, symbolic_dims, module=module, location=location)
            return  # the strides of a symbolic tensor are guarded with its sizes (shape_guards)
        self.add(Guard(f"tuple({e}.shape)", "==", repr(tuple(value.shape)), tuple(value.shape),
                       f"{n}.shape", "shape", module, location, shape_of=(e, None)))
        if not symbolic_strides:
            self._add(f"{e}.stride()", "==", tuple(value.stride()), f"{n}.stride()", "stride",
                      module=module, location=location)

    def storage_offset(self, source: Source, value: torch.Tensor, *,
                       location: UserLocation | None = None) -> None:
        """The code read a storage offset (`x.storage_offset()`, a constant in the graph): it
        derives from the inputs' own offsets, which the other guards leave free."""
        self._add(f"{source.expr()}.storage_offset()", "==", value.storage_offset(),
                  f"{source.name()}.storage_offset()", "storage offset", module=False,
                  location=location)

    def _symbolic_shape(self, source: Source, value: torch.Tensor, symbolic_dims: set[int], *,
                        module: bool, location: UserLocation | None) -> None:
        """The exact-shape guard of a tensor with symbolic dims: its number of dims, then each
        static dim (the symbolic ones are guarded by what the trace assumed, `shape_guards`)."""
        e, n = source.expr(), source.name()
        self._add(f"{e}.dim()", "==", value.dim(), f"{n}.dim()", "shape", module=module,
                  location=location)
        for dim, size in enumerate(value.shape):
            if dim not in symbolic_dims:
                self.add(Guard(f"{e}.shape[{dim}]", "==", repr(int(size)), int(size),
                               f"{n}.shape[{dim}]", "shape", module, location,
                               shape_of=(e, dim)))

    # -- ambient state -------------------------------------------------------------------------
    def ambient(self) -> None:
        """Grad mode, autocast, the default dtype and the torch function modes (default device)
        at the time of the call."""
        self._add("__grad_enabled()", "is", torch.is_grad_enabled(), "torch.is_grad_enabled()",
                  "ambient", module=False, location=None)
        self._add("__autocast_state()", "==", _compat.autocast_state(),
                  "autocast state", "ambient", module=False, location=None)
        self._add("__default_dtype()", "is", torch.get_default_dtype(),
                  "torch.get_default_dtype()", "ambient", module=False, location=None)
        # torch function modes: a `torch.device(...)` context or `torch.set_default_device`
        # (factory calls of an ATen graph have the device baked in) and user modes. Without
        # any (the common case) one C call; with some, their types and devices as well
        count = _compat.torch_function_mode_count()
        self._add("__tf_mode_count()", "==", count, "torch function modes active", "ambient",
                  module=False, location=None)
        if count:
            self._add("__tf_modes()", "==", _compat.torch_function_modes(),
                      "torch function modes (default device)", "ambient", module=False,
                      location=None)
        buckets = bucket_key()
        if buckets is not None:  # a graph split for these buckets is not reused under others
            self._add("__ddp_buckets()", "==", buckets, "the running DDP's bucket caps",
                      "ambient", module=False, location=None)


AMBIENT_NAMESPACE: dict[str, Any] = {
    "__grad_enabled": torch.is_grad_enabled,
    "__autocast_state": _compat.autocast_state,
    "__default_dtype": torch.get_default_dtype,
    "__ddp_buckets": bucket_key,
    "__tf_mode_count": _compat.torch_function_mode_count,
    "__tf_modes": _compat.torch_function_modes,
}
