"""lowering: the FX interpreter that turns an ATen graph into an `IRGraph`.

Each `call_function` node goes through one dispatch, in this order:

1. the rule table `lowerings[op]`: a list of `(checker, lowering)` pairs; the first pair whose
   checker accepts the call lowers it (rules live in `kiln/lower/rules/`, one file per family);
2. in-place ATen ops (`add_`, `copy_`): their functional form, then the mutated name is rebound
   (a graph input's update is recorded in `IRGraph.mutations`);
3. a decomposition from `decomposition_tables.lowering_table()`, traced and lowered in place;
4. a `Fallback` node calling the op (the fallback census in tests pins which ops get here).

An op that reads or makes a complex tensor skips all four: it is a `Fallback` (`lower_complex`).

A lowering receives a `Call` (the builder, the FX node, its fake-tensor metadata, provenance) and
the node's arguments with every FX node replaced by what it lowered to (`TensorValue`s, tuples),
and returns a `TensorValue`, a tuple of them, or a Python value.

The `GraphBuilder` owns buffer naming, realization (turning a lazy value into a buffer) and the
inlining heuristic: a pointwise value stays inlined into its consumers unless it is used several
times and is costly (> 4 loads or > 30 ops: Inductor's thresholds), or its body grew too big.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
import torch.fx

from kiln.lower import _compat, decomposition_tables, symbolic
from kiln.lower.ir import (
    ComputedBuffer,
    Extern,
    ExternKernel,
    ExternOutput,
    IRGraph,
    Layout,
    Origin,
    Pointwise,
    Reduction,
    TensorArg,
    contiguous_strides,
    map_nested,
)
from kiln.lower.rule_table import Call, LoweringError, lowerings, register
from kiln.lower.values import (
    BufferValue,
    PointwiseValue,
    TensorValue,
    base_of,
    inlined_origins,
    strided_view,
)

__all__ = ["Call", "GraphBuilder", "Interpreter", "LoweringError", "lowerings", "register"]

REALIZE_READS = 4        # a multi-user pointwise with more loads than this is realized
REALIZE_OPS = 30         # ... or with more ops than this
MAX_INLINE_READS = 8     # any pointwise whose inlined body loads more than this is realized
MAX_INLINE_OPS = 64


class GraphBuilder:
    """Builds an `IRGraph`: names buffers, realizes lazy values, creates kernel nodes."""

    def __init__(self) -> None:
        self.graph = IRGraph()
        self._next = 0
        self._copies: dict[tuple[int, tuple[int, ...]], tuple[TensorValue, BufferValue]] = {}

    def new_name(self) -> str:
        name = f"buf{self._next}"
        self._next += 1
        return name

    # -- computed buffers ----------------------------------------------------------------------

    def add_computed(self, data: Pointwise | Reduction, layout: Layout,
                     origins: Sequence[Origin]) -> BufferValue:
        """A buffer computed by `data`; one with no elements (a resumed graph's boolean-mask
        result can be empty) is only allocated: a loop nest over nothing is not a kernel."""
        if layout.numel == 0:
            return self.empty(layout, origins)
        buf = ComputedBuffer(self.new_name(), layout, data, _dedup(origins))
        self.graph.add_buffer(buf)
        self.graph.nodes.append(buf)
        return BufferValue(buf)

    def empty(self, layout: Layout, origins: Sequence[Origin]) -> BufferValue:
        """An `Extern` of kind "empty": `empty_strided` with `layout` (nothing to compute)."""
        out = ExternOutput(self.new_name(), layout, _dedup(origins))
        self.graph.add_buffer(out)
        kwargs = {"dtype": layout.dtype, "device": layout.device}
        node = Extern("empty", torch.ops.aten.empty_strided.default,
                      (list(layout.size), list(layout.stride)), kwargs, [out], out.origins)
        self.graph.nodes.append(node)
        return BufferValue(out)

    def reduction(self, data: Reduction, out_dtype: torch.dtype, device: torch.device,
                  origins: Sequence[Origin], stride: Sequence[int] | None = None) -> BufferValue:
        layout = _layout(out_dtype, device, data.ranges, stride)
        return self.add_computed(data, layout, origins)

    def realize(self, value: TensorValue, stride: Sequence[int] | None = None) -> BufferValue:
        """A buffer holding `value`: itself if it is one; a pointwise value is computed into a
        buffer with eager's strides (and stays realized for its other consumers); a view is
        copied (into `stride`, or contiguous)."""
        if isinstance(value, BufferValue):
            return value
        if isinstance(value, PointwiseValue):
            if value.realized is None:
                layout = _layout(value.dtype, value.device, value.size,
                                 stride if stride is not None else value.stride_hint)
                value.realized = self.add_computed(value.data, layout, value.origins)
            return value.realized
        return self.copy(value, stride)

    def copy(self, value: TensorValue, stride: Sequence[int] | None = None) -> BufferValue:
        """A new buffer holding `value` (one per value and layout: a view copied for two kernel
        calls is copied once)."""
        layout = _layout(value.dtype, value.device, value.size, stride)
        key = (id(value), layout.stride)
        if key not in self._copies:
            data = Pointwise(value.size, value.loader(), value.compute_dtype)
            origins = inlined_origins([value]) or value.origins
            self._copies[key] = (value, self.add_computed(data, layout, origins))
        return self._copies[key][1]

    def maybe_realize(self, value: Any, n_users: int) -> None:
        """The inlining heuristic, applied to every node's value once it is lowered."""
        if not isinstance(value, PointwiseValue) or value.realized is not None:
            return
        loads, n_ops = value.stats()
        if n_users > 1 and (loads > REALIZE_READS or n_ops > REALIZE_OPS):
            self.realize(value)
        elif loads > MAX_INLINE_READS or n_ops > MAX_INLINE_OPS:
            self.realize(value)

    # -- kernel calls --------------------------------------------------------------------------

    def tensor_arg(self, value: TensorValue) -> TensorArg:
        """A strided view for a kernel call: the value itself when it is a strided view of a
        buffer, else a realized buffer (a permutation of a lazy value realizes that value)."""
        arg = strided_view(value)
        if arg is not None:
            return arg
        base, _ = base_of(value)
        if isinstance(base, PointwiseValue) and base.numel == value.numel:
            self.realize(base)
            arg = strided_view(value)
            if arg is not None:
                return arg
        return self.realize(value).buffer.as_arg()

    def attention_arg(self, value: TensorValue) -> TensorArg:
        """`tensor_arg` for SDPA ops, whose fused kernels assume a unit stride along the head
        dim without checking it (the CPU flash kernel silently reads a transposed k wrongly):
        such a view is copied contiguous instead."""
        arg = self.tensor_arg(value)
        if len(arg.size) == 4 and arg.stride[-1] != 1 and arg.size[-1] != 1:
            arg = self.copy(value).buffer.as_arg()
        return arg

    def call_kernel(self, cls: type[ExternKernel], kind: str, call: Call, args: tuple,
                    kwargs: dict) -> Any:
        """Add an `Extern`/`Fallback` node calling `call.op(*args, **kwargs)`; returns its
        outputs as values (mirroring `call.out`'s structure)."""
        to_arg = self.attention_arg if kind.startswith("attention") else self.tensor_arg
        kargs = map_nested(args, TensorValue, to_arg)
        kkwargs = map_nested(kwargs, TensorValue, to_arg)
        metas = list(call.out) if isinstance(call.out, (tuple, list)) else [call.out]
        outputs: list[Any] = []
        for meta in metas:
            if isinstance(meta, torch.Tensor):
                layout = Layout(meta.dtype, meta.device, tuple(meta.shape), tuple(meta.stride()),
                                meta.storage_offset())
                out = ExternOutput(self.new_name(), layout, call.origins)
                self.graph.add_buffer(out)
                outputs.append(out)
            else:
                outputs.append(meta)
        node = cls(kind, call.op, kargs, kkwargs, outputs, call.origins)
        self.graph.nodes.append(node)
        values = [BufferValue(o) if isinstance(o, ExternOutput) else o for o in outputs]
        return tuple(values) if isinstance(call.out, (tuple, list)) else values[0]


def _layout(dtype: torch.dtype, device: torch.device, size: Sequence[int],
            stride: Sequence[int] | None) -> Layout:
    size = tuple(size)
    if stride is not None and len(stride) == len(size):
        layout = Layout(dtype, device, size, tuple(stride), 0)
        if layout.is_dense() and all(st >= 0 for st in stride):
            return layout
    return Layout(dtype, device, size, contiguous_strides(size), 0)


def _dedup(origins: Sequence[Origin]) -> tuple[Origin, ...]:
    return tuple(dict.fromkeys(origins))


# -- the interpreter -------------------------------------------------------------------------------

class Interpreter:
    """Lowers the nodes of one FX graph (the user's, or a traced decomposition's) into the
    builder. `parent` is the origin of the node a decomposition graph stands for."""

    def __init__(self, builder: GraphBuilder, parent: Origin | None = None) -> None:
        self.builder = builder
        self.parent = parent
        self.env: dict[torch.fx.Node, Any] = {}
        self.rebound: dict[torch.fx.Node, torch.fx.Node] = {}

    def origin(self, node: torch.fx.Node) -> Origin:
        op = _op_name(node.target)
        if self.parent is not None:
            return Origin(self.parent.node, f"{self.parent.op}/{op}", self.parent.user_location)
        return Origin(node.name, op, node.meta.get("user_location"))

    def run_nodes(self, nodes: Sequence[torch.fx.Node]) -> Any:
        for node in nodes:
            if node.op == "call_function":
                value = self.lower_node(node)
                self.env[node] = value
                self.builder.maybe_realize(value, len(node.users))
            elif node.op == "output":
                return torch.fx.node.map_arg(node.args[0], self.env.__getitem__)
            elif node.op not in ("placeholder", "get_attr"):
                raise LoweringError(f"unsupported FX node kind {node.op!r} ({node.format_node()})")
        return None

    def lower_node(self, node: torch.fx.Node) -> Any:
        args = torch.fx.node.map_arg(node.args, self.env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, self.env.__getitem__)
        if node.target is operator.getitem:
            return args[0][args[1]]
        op = node.target
        if symbolic.active():
            if not isinstance(op, _compat.OpOverload):
                return symbolic.python_op(node, args)
            args, kwargs = symbolic.lower_metas(args), symbolic.lower_metas(kwargs)
        if not isinstance(op, _compat.OpOverload):
            raise LoweringError(f"lower expects ATen OpOverloads, got {op!r} in node {node.name}",
                                hint="trace the graph to ATen first (the autograd stage)")
        call = Call(self.builder, node, op, _metas(node.args), _metas(node.kwargs),
                    node.meta.get("val"), self.origin(node))
        raw_metas = (call.meta_args, call.meta_kwargs)
        if symbolic.active():
            call = symbolic_call(call)
        if _touches_complex(call):
            return self.lower_complex(call, args, kwargs)
        for checker, fn in lowerings.get(op, ()):
            if checker(call, *args, **kwargs):
                return fn(call, *args, **kwargs)
        if op._schema.is_mutable:
            return self.lower_inplace(call, node, args, kwargs)
        decompose = decomposition_tables.decompose_symbolic if symbolic.active() else \
            decomposition_tables.decompose
        graph = decompose(op, *raw_metas)
        if graph is not None:
            return self.inline(graph, call, args, kwargs)
        return self.builder.call_kernel(_fallback_cls(), "fallback", call, args, kwargs)

    def lower_complex(self, call: Call, args: tuple, kwargs: dict) -> Any:
        """An op reading or making a complex tensor runs as its ATen op (Triton has no
        complex type; Inductor does the same): `torch.polar`, `view_as_complex` and complex
        products in a rotary embedding stay in the graph beside the kernels around them."""
        if call.op._schema.is_mutable:
            raise LoweringError(f"in-place {call.op} on a complex tensor",
                                hint="functionalize the graph before lowering (the autograd "
                                     "stage does)")
        return self.builder.call_kernel(_fallback_cls(), "fallback", call, args, kwargs)

    def inline(self, gm: torch.fx.GraphModule, call: Call, args: tuple, kwargs: dict) -> Any:
        leaves = _compat.tree_leaves((args, kwargs))
        metas = _compat.tree_leaves((call.meta_args, call.meta_kwargs))
        tensors = [v for v, m in zip(leaves, metas) if isinstance(m, torch.Tensor)]
        sub = Interpreter(self.builder, call.origin)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for ph, value in zip(placeholders, tensors):
            sub.env[ph] = value
        result = sub.run_nodes(list(gm.graph.nodes))
        for ph, value in zip(placeholders, tensors):
            if sub.env[ph] is not value:  # the decomposition mutated an argument
                self.mutated(_arg_node(call.node, value, self.env), sub.env[ph])
        return result

    def lower_inplace(self, call: Call, node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
        from kiln.lower.rules.inplace import lower_inplace

        value = lower_inplace(call, *args, **kwargs)
        target = node.args[0]
        if not isinstance(target, torch.fx.Node):
            raise LoweringError(f"in-place op {call.op} on a non-tensor in {node.name}")
        self.mutated(target, value)
        return value

    def mutated(self, target: torch.fx.Node | None, value: Any) -> None:
        """`target`'s tensor now holds `value`: later readers of the node see the new value; a
        graph input's update is recorded as a mutation of the graph."""
        if target is None:
            return
        _check_unaliased(target)
        self.env[target] = value
        if target.op == "placeholder" and self.parent is None:
            buf = self.builder.realize(value)
            stale = [m for m in self.builder.graph.mutations if m[0] == target.name]
            for m in stale:
                self.builder.graph.mutations.remove(m)
            self.builder.graph.mutations.append((target.name, buf.buffer.as_arg()))


def _fallback_cls() -> type[ExternKernel]:
    from kiln.lower.ir import Fallback

    return Fallback


def _touches_complex(call: Call) -> bool:
    metas = _compat.tree_leaves((call.meta_args, call.meta_kwargs, call.out))
    return any(isinstance(m, torch.Tensor) and m.is_complex() for m in metas)


def _arg_node(node: torch.fx.Node, value: Any, env: dict) -> torch.fx.Node | None:
    for arg in node.all_input_nodes:
        if env.get(arg) is value:
            return arg
    return None


def _check_unaliased(target: torch.fx.Node) -> None:
    """Refuse an in-place update of a tensor that is a view, or that has views (their readers
    would need the update too)."""
    if _is_view(target):
        raise LoweringError(f"in-place update of {target.name}, a view of "
                            f"{target.args[0]}", hint=_FUNCTIONALIZE)
    for user in target.users:
        if _is_view(user) and user.args and user.args[0] is target:
            raise LoweringError(f"in-place update of {target.name}, which {user.name} views",
                                hint=_FUNCTIONALIZE)


_FUNCTIONALIZE = "functionalize the graph before lowering (the autograd stage does)"


def _is_view(node: torch.fx.Node) -> bool:
    op = node.target
    if not isinstance(op, _compat.OpOverload) or not op._schema.returns:
        return False
    alias = op._schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def symbolic_call(call: Call) -> Call:
    """`call` with its metas seen through `symbolic.lower_metas` (Expr sizes)."""
    import dataclasses

    return dataclasses.replace(call, meta_args=symbolic.lower_metas(call.meta_args),
                               meta_kwargs=symbolic.lower_metas(call.meta_kwargs),
                               out=symbolic.lower_metas(call.out))


def _metas(value: Any) -> Any:
    return torch.fx.node.map_arg(value, lambda n: n.meta.get("val"))


def _op_name(target: Any) -> str:
    if isinstance(target, _compat.OpOverload):
        return f"{target.namespace}.{target.__name__}"
    return getattr(target, "__name__", str(target))

