"""Tensors during capture: an FX node plus its FakeTensor value.

Metadata reads (`x.shape`, `x.dtype`, `x.dim()`) are answered from the fake value at compile time
and become constants (the input guards make that safe); tensor computations become graph nodes.
Anything that needs a tensor's *values* in Python (`.item()`, `bool(x)`, `.tolist()`) stops capture;
with `config.capture_scalar_outputs`, `.item()` / `.tolist()` give data-dependent numbers instead.
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln.capture import _compat
from kiln.capture.sources import Source
from kiln.config import config
from kiln.capture.unsupported import Unsupported, unsupported
from kiln.capture.variables.base import VT, ConstantVT
from kiln.capture.variables.number_tensors import TensorNumberVT, tensor_op_arguments
from kiln.capture.variables.scalars import VALUE_ONLY_TARGETS, SymScalarVT, specialize_all

if TYPE_CHECKING:
    from kiln.capture.translator import Translator

__all__ = ["TensorVT", "TensorMethodVT", "graph_call", "to_graph_args"]

_CONSTANT_ATTRS = frozenset({
    "dtype", "device", "requires_grad", "ndim", "is_cuda", "is_leaf", "layout", "is_sparse",
    "is_quantized", "is_nested", "is_meta", "is_cpu", "is_mps", "is_complex_dtype",
})
_NODE_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag"})
_METADATA_METHODS = frozenset({
    "size", "dim", "stride", "numel", "element_size", "is_contiguous", "is_floating_point",
    "is_complex", "nelement", "ndimension", "get_device", "is_signed", "storage_offset",
})
_VALUE_METHODS = {
    "item": "reads a tensor value into Python",
    "tolist": "converts a tensor into a Python list",
    "numpy": "converts a tensor into a NumPy array",
    "data_ptr": "reads a memory address",
    "__bool__": "needs the truth value of a tensor",
    "__int__": "converts a tensor into a Python int",
    "__float__": "converts a tensor into a Python float",
    "backward": "runs autograd inside the compiled function",
    "register_hook": "registers a tensor hook",
    "retain_grad": "changes autograd state of a tensor",
    "untyped_storage": "reads tensor storage",
}
_INPLACE_KEEP = frozenset({operator.setitem})
# value methods that kiln.config.capture_scalar_outputs captures, with the break's hint
_SCALAR_FLAG = "set kiln.config.capture_scalar_outputs = True (KILN_CAPTURE_SCALAR_OUTPUTS=1) " \
               "to capture it as a data-dependent number, or keep the computation in tensors"
_SCALAR_OUTPUTS = {"item": _SCALAR_FLAG, "tolist": _SCALAR_FLAG}


class TensorVT(VT):
    def __init__(self, node: torch.fx.Node, fake: torch.Tensor, python_type: type = torch.Tensor,
                 source: Source | None = None) -> None:
        self.node = node
        self.fake = fake
        self._type = python_type
        self.source = source

    def python_type(self) -> type:
        return self._type

    def getattr(self, tx: Translator, name: str) -> VT:
        if name == "shape":
            return size_vt(tx, self)
        if name in _CONSTANT_ATTRS:
            return ConstantVT(getattr(self.fake, name))
        if name in _NODE_ATTRS:
            return graph_call(tx, "call_function", getattr, [self, ConstantVT(name)], {})
        if name in ("grad", "data", "grad_fn", "_version"):
            unsupported("tensor-attribute", f"reading tensor.{name} inside a compiled function "
                        "is not supported yet", hint=f"read .{name} outside the compiled function")
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVT(self, name)
        if not hasattr(self._type, name):  # `hasattr(t, "jax")` probes in library code
            unsupported("missing-attribute", f"tensor has no attribute {name!r}",
                        category="user-fixable")
        unsupported("tensor-attribute", f"tensor attribute {name!r} is not supported")

    def call_method(self, tx: Translator, name: str, args: list[VT],
                    kwargs: dict[str, VT]) -> VT:
        return TensorMethodVT(self, name).call(tx, args, kwargs)

    def setattr(self, tx: Translator, name: str, value: VT) -> None:
        unsupported("tensor-setattr", f"setting tensor.{name} inside a compiled function is not "
                    "supported", hint="set it outside the compiled function")

    def unpack(self, tx: Translator) -> list[VT]:
        if self.fake.dim() == 0:
            unsupported("not-iterable", "iteration over a 0-d tensor", category="user-fixable")
        return [graph_call(tx, "call_function", operator.getitem, [self, ConstantVT(i)], {})
                for i in range(self.fake.shape[0])]

    def truth(self, tx: Translator) -> bool:
        unsupported("data-dependent-branch", "a Python branch on a tensor value "
                    "(`if tensor:` or `while tensor:`) needs the value at compile time",
                    hint="use torch.where, or compute the condition outside the compiled function")

    def describe(self) -> str:
        where = f" {self.source.name()}" if self.source is not None else ""
        return f"tensor{where} {tuple(self.fake.shape)} {self.fake.dtype}"


class TensorMethodVT(VT):
    """`x.method` before it is called."""

    def __init__(self, tensor: TensorVT, name: str) -> None:
        self.tensor = tensor
        self.name = name

    def python_type(self) -> type:
        return type(torch.Tensor.add.__get__(torch.empty(0)))

    def call(self, tx: Translator, args: list[VT], kwargs: dict[str, VT]) -> VT:
        name = self.name
        if name == "numpy":  # a traced array sharing the tensor's memory, where eager allows it
            from kiln.capture.variables.ndarray import ndarray_from_tensor
            array = ndarray_from_tensor(tx, self.tensor, args, kwargs)
            if array is not None:
                return array
        if name in _SCALAR_OUTPUTS and config.capture_scalar_outputs and not args and \
                not kwargs:
            return scalar_outputs(tx, self.tensor, name)
        if name in _VALUE_METHODS:
            unsupported(f"tensor-{name.strip('_')}", f"tensor.{name}() {_VALUE_METHODS[name]}",
                        category="fundamental", hint=_SCALAR_OUTPUTS.get(
                            name, "keep the computation in tensors, or move it out of the "
                                  "function"))
        if name in _METADATA_METHODS:
            fake_args, fake_kwargs = _fake_values(args, kwargs)
            result = getattr(self.tensor.fake, name)(*fake_args, **fake_kwargs)
            return metadata_vt(tx, self.tensor, name, (*fake_args, *fake_kwargs.values()),
                               result)
        if name == "type" and not args and not kwargs:
            return ConstantVT(self.tensor.fake.type())
        return graph_call(tx, "call_method", name, [self.tensor, *args], kwargs)


def _check_in_place_cast(op: str, target: Any, args: list[VT], kwargs: dict[str, VT]) -> None:
    """Break where an in-place call's result cannot be cast back to its tensor's dtype
    (`tensor.logit_()`, `torch.Tensor.logit_(t)`, `torch.relu_(t)` on integers): eager raises
    there, and running it eagerly raises the same error."""
    name = target if op == "call_method" else getattr(target, "__name__", "")
    if not (isinstance(name, str) and name.endswith("_") and not name.startswith("_") and args
            and isinstance(args[0], TensorVT)):
        return
    if op == "call_function" and getattr(torch.Tensor, name, None) is not target and \
            getattr(torch, name, None) is not target:
        return
    uncastable = _in_place_result_uncastable(args[0], name, args[1:], kwargs)
    if uncastable is not None:
        unsupported("inplace-uncastable", f"{name}() on a {args[0].fake.dtype} tensor computes "
                    f"{uncastable}, which cannot be cast back in place: eager raises, so this "
                    "call runs eagerly", category="user-fixable",
                    hint=f"call the out-of-place {name[:-1]}() instead")


def _in_place_result_uncastable(tensor: TensorVT, name: str, args: list[VT],
                                kwargs: dict[str, VT]) -> torch.dtype | None:
    """The dtype an in-place method computes when it cannot be cast to its tensor's dtype
    (`long_tensor.logit_()`): eager's kernel raises, but the functional form traced for it
    would cast silently (torch.compile returns garbage there). Checked only where it can
    happen: an integer or bool tensor, or a complex argument."""
    dtype = tensor.fake.dtype
    functional = getattr(torch.Tensor, name[:-1], None)
    if functional is None or dtype.is_complex:
        return None
    fake_args, fake_kwargs = _fake_values(args, kwargs)
    if dtype.is_floating_point and not any(
            isinstance(v, complex) or isinstance(v, torch.Tensor) and v.is_complex()
            for v in [*fake_args, *fake_kwargs.values()]):
        return None
    try:
        result = functional(tensor.fake, *fake_args, **fake_kwargs)
    except Exception:
        return None  # the in-place call itself reports it when traced
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, dtype):
        return result.dtype
    return None


def _fake_values(args: list[VT], kwargs: dict[str, VT]) -> tuple[list, dict]:
    """The arguments as the fake computation takes them (numbers specialized)."""
    return ([to_graph_args(a)[1] for a in specialize_all(args)],
            {k: to_graph_args(v)[1] for k, v in specialize_all(kwargs).items()})


def scalar_outputs(tx: Translator, tensor: TensorVT, name: str) -> VT:
    """`tensor.item()` as a graph node whose value is a data-dependent number (an unbacked
    symbol); `tensor.tolist()` as one `item()` per element (nested lists by static dims)."""
    from kiln.capture.variables.containers import ListVT
    if name == "item" or tensor.fake.dim() == 0:
        return graph_call(tx, "call_method", "item", [tensor], {})
    length = tensor.fake.shape[0]
    if _compat.is_symbolic(length):
        unsupported("tensor-tolist", "tensor.tolist() of a tensor with a symbolic size: the "
                    "list's length is not known while capturing",
                    hint="index the tensor instead of converting it to a list")
    rows = [graph_call(tx, "call_function", operator.getitem, [tensor, ConstantVT(i)], {})
            for i in range(int(length))]
    return ListVT([scalar_outputs(tx, row, name) for row in rows])


def size_vt(tx: Translator, tensor: TensorVT) -> VT:
    """`tensor.shape`: a torch.Size of constants and, for symbolic dims, `sym_size` nodes."""
    from kiln.capture.variables.containers import TupleVT
    return TupleVT([dim_vt(tx, tensor, d) for d in range(tensor.fake.dim())], torch.Size)


def dim_vt(tx: Translator, tensor: TensorVT, dim: int) -> VT:
    """`tensor.shape[dim]`: a constant, or a node reading a symbolic size at run time."""
    size = tensor.fake.shape[dim]
    if not _compat.is_symbolic(size):
        return ConstantVT(int(size))
    return tx.output.size_node(tensor, _compat.SYM_SIZE, (dim % tensor.fake.dim(),), size)


# metadata methods whose answer may be a symbolic size, and the graph op that reads it
_SIZE_OPS = {"stride": _compat.SYM_STRIDE, "numel": _compat.SYM_NUMEL,
             "nelement": _compat.SYM_NUMEL, "storage_offset": _compat.SYM_STORAGE_OFFSET}


def metadata_vt(tx: Translator, tensor: TensorVT, name: str, args: tuple, result: Any) -> VT:
    """The tracker for `tensor.name(*args)` computed on the fake tensor: constants where the
    answer is static, size nodes where it is symbolic (`x.size(0)`, `x.numel()`)."""
    from kiln.capture.variables.containers import TupleVT
    if name == "size":
        return size_vt(tx, tensor) if not args else dim_vt(tx, tensor, args[0])
    if name == "stride" and not args:
        return TupleVT([metadata_vt(tx, tensor, name, (d,), s) for d, s in enumerate(result)])
    if _compat.is_symbolic(result) and name in _SIZE_OPS:
        dims = (args[0] % tensor.fake.dim(),) if args else ()
        return tx.output.size_node(tensor, _SIZE_OPS[name], dims, result)
    if name == "storage_offset":  # a constant from here on: guard where it came from
        for graph_input in tx.output.inputs:
            if isinstance(graph_input.example, torch.Tensor):
                tx.output.guards.storage_offset(graph_input.source, graph_input.example,
                                                location=tx.location())
    if isinstance(result, tuple):  # only sizes are kept symbolic: specialize the rest
        return TupleVT([ConstantVT(_compat.concrete(r)) for r in result])
    return ConstantVT(_compat.concrete(result))


def to_graph_args(vt: Any) -> tuple[Any, Any]:
    """(argument for the FX node, argument for the fake computation) of a tracker."""
    from kiln.capture.variables.containers import ListVT, SliceVT, TupleVT, DictVT
    if isinstance(vt, TensorVT):
        return vt.node, vt.fake
    if isinstance(vt, TensorNumberVT):  # where no op took it as a tensor: its value, guarded
        value = vt.as_constant()
        return value, value
    if isinstance(vt, SymScalarVT):
        return vt.node, vt.value
    if isinstance(vt, ConstantVT):
        return vt.value, vt.value
    if isinstance(vt, TupleVT):
        pairs = [to_graph_args(item) for item in vt.items]
        cls = vt.cls if vt.cls in (tuple, torch.Size) else tuple
        nodes = tuple(p[0] for p in pairs)
        fakes = tuple(p[1] for p in pairs)
        return (nodes, fakes) if cls is tuple else (nodes, cls(fakes))
    if isinstance(vt, ListVT):
        pairs = [to_graph_args(item) for item in vt.items]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(vt, SliceVT):
        parts = [to_graph_args(p) for p in (vt.start, vt.stop, vt.step)]
        return slice(*(p[0] for p in parts)), slice(*(p[1] for p in parts))
    if isinstance(vt, DictVT):
        pairs = {k: to_graph_args(v) for k, v in vt.items.items()}
        return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
    unsupported("graph-argument", f"{vt.describe()} cannot be passed to a tensor operation in "
                "a captured graph")


def graph_call(tx: Translator, op: str, target: Any, args: list[VT], kwargs: dict[str, VT],
               *, keep: bool = False) -> VT:
    """Record `target(*args, **kwargs)` as a node; wrap what it returns.

    Results with no tensor in them become constants and the node is dropped, unless `keep`
    (the call changes state, like `_set_grad_enabled`)."""
    if target not in VALUE_ONLY_TARGETS:  # a symbolic number could decide a shape here
        args, kwargs = specialize_all(list(args)), specialize_all(dict(kwargs))
    else:  # value-only numbers: cast to the dtype the op computes in, or specialized
        args, kwargs = tensor_op_arguments(tx, target, list(args), dict(kwargs))
    _check_in_place_cast(op, target, args, kwargs)
    try:
        return _record_call(tx, op, target, args, kwargs, keep)
    except Unsupported as err:
        # a few kernels take only concrete sizes (F.pad's C++ path): specialize and try again
        if err.code != "op-failed" or not _has_size([*args, *kwargs.values()]):
            raise
    args, kwargs = specialize_all(list(args), sizes=True), specialize_all(dict(kwargs), sizes=True)
    return _record_call(tx, op, target, args, kwargs, keep)


def _has_size(values: list) -> bool:
    from kiln.capture.variables.containers import ListVT, SliceVT, TupleVT
    for vt in values:
        if isinstance(vt, SymScalarVT) and vt.is_size():
            return True
        if isinstance(vt, (TupleVT, ListVT)) and _has_size(vt.items):
            return True
        if isinstance(vt, SliceVT) and _has_size([vt.start, vt.stop, vt.step]):
            return True
    return False


def _record_call(tx: Translator, op: str, target: Any, args: list[VT], kwargs: dict[str, VT],
                 keep: bool) -> VT:
    node_args, fake_args = zip(*(to_graph_args(a) for a in args)) if args else ((), ())
    pairs = {k: to_graph_args(v) for k, v in kwargs.items()}
    node_kwargs = {k: p[0] for k, p in pairs.items()}
    fake_kwargs = {k: p[1] for k, p in pairs.items()}
    if op == "call_method":
        fn = lambda: getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)  # noqa: E731
    else:
        fn = lambda: target(*fake_args, **fake_kwargs)  # noqa: E731
    node, value = tx.output.create_node(op, target, tuple(node_args), node_kwargs, fn)
    return wrap_result(tx, node, value, keep=keep or target in _INPLACE_KEEP)


def wrap_result(tx: Translator, node: torch.fx.Node, value: Any, *, keep: bool = False) -> VT:
    from kiln.capture.variables.containers import ListVT, TupleVT
    if isinstance(value, torch.Tensor):
        known = tx.output.known(value)
        if known is not None:  # an in-place op returns its input object, as in eager
            return known
        vt = TensorVT(node, value)
        tx.output.remember(value, vt)
        return vt
    if isinstance(value, (tuple, list)) and _has_tensor(value):
        items = []
        for i, item in enumerate(value):
            if isinstance(item, torch.Tensor) or (isinstance(item, (tuple, list))
                                                  and _has_tensor(item)):
                sub = tx.output.graph.create_node("call_function", operator.getitem, (node, i))
                sub.meta.update(val=item, **{k: v for k, v in node.meta.items()
                                             if k in ("user_location", "stack_trace")})
                items.append(wrap_result(tx, sub, item))
            else:
                items.append(ConstantVT(item))
        if isinstance(value, list):
            return ListVT(items)
        return TupleVT(items, type(value))
    if isinstance(value, torch.Tensor) or _has_tensor([value]):
        unsupported("graph-result", f"unsupported result type {type(value).__name__}")
    if _compat.is_symbolic(value) or (isinstance(value, torch.Size) and
                                       any(_compat.is_symbolic(d) for d in value)):
        return _wrap_symbolic(tx, node, value)
    if not keep:
        tx.output.graph.erase_node(node)
    if isinstance(value, torch.Size):
        return TupleVT([ConstantVT(int(d)) for d in value], torch.Size)
    return ConstantVT(_compat.concrete(value))


def _wrap_symbolic(tx: Translator, node: torch.fx.Node, value: Any) -> VT:
    """A symbolic size an op returned (`torch.Size` items are read with getitem nodes)."""
    from kiln.capture.variables.containers import TupleVT
    if not isinstance(value, torch.Size):
        return SymScalarVT(node, value, (), tx.output)
    items: list[VT] = []
    for i, size in enumerate(value):
        if not _compat.is_symbolic(size):
            items.append(ConstantVT(int(size)))
            continue
        item = tx.output.graph.create_node("call_function", operator.getitem, (node, i))
        item.meta["val"] = size
        items.append(SymScalarVT(item, size, (), tx.output))
    return TupleVT(items, torch.Size)


def _has_tensor(values: Any) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, (tuple, list)) and _has_tensor(v):
            return True
    return False
