"""driver: runs the lower stage — graph passes, inputs, the interpreter, outputs.

`build_graph` is `lower_graph`'s body: it copies the FX graph (passes never touch the caller's),
eliminates dead code, computes 0-dim CPU values beside accelerator tensors on the accelerator
(`host_scalars`), rewrites explicit attention, pads misaligned large matmuls on CUDA
(`padding`), computes convolution graphs channels-last on CUDA (`channels_last`), binds
placeholders to `InputBuffer`s and `get_attr` tensors to `ConstantBuffer`s, runs the `Interpreter`, and turns each output into a strided view of a buffer with eager's
strides (read before the passes; copying only when no view has them).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln.lower import _compat, attention, channels_last, padding, rules, symbolic  # noqa: F401 (rules: the rule table)
from kiln.lower.host_scalars import host_scalar, move_host_scalars
from kiln.lower.deps import read_writes
from kiln.lower.index import Expr, size_names
from kiln.lower.ir import (
    ComputedBuffer,
    ConstantBuffer,
    Extern,
    InputBuffer,
    IRGraph,
    Layout,
    Origin,
    TensorArg,
)
from kiln.lower.lowering import GraphBuilder, Interpreter, LoweringError
from kiln.passes import Pass, PassList
from kiln.lower.values import BufferValue, PointwiseValue, TensorValue, strided_view

__all__ = ["PASSES", "build_graph", "copy_graph_module"]

log = logging.getLogger("kiln.lower")


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new GraphModule with a copy of `gm`'s graph (node meta dicts copied shallowly)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _rewrite_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    attention.rewrite_attention(gm)
    return gm


def _pad_matmuls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    padding.pad_matmuls(gm)
    return gm


def _channels_last(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    channels_last.use_channels_last(gm)
    return gm


def _print_fx(gm: torch.fx.GraphModule) -> str:
    return gm.code


# The lower stage's graph passes on the ATen graph, before it is interpreted into the IR
# (kiln.passes: timed, dumped under KILN_DEBUG_DIR, `KILN_DISABLE_PASSES=channels_last`).
PASSES = PassList("lower", [
    Pass("host_scalars", move_host_scalars, "0-dim CPU values computed beside accelerator "
         "tensors are computed on the accelerator (kernels cannot touch host memory)",
         required=True),
    Pass("attention_rewrite", _rewrite_attention, "explicit softmax(q @ kᵀ) @ v attention "
         "becomes one SDPA call", flag="attention_rewrite"),
    Pass("pad_matmuls", _pad_matmuls, "large matmuls with rows not 16-byte aligned run on "
         "zero-padded operands (CUDA)"),
    Pass("channels_last", _channels_last, "convolution graphs computed in NHWC memory order "
         "(CUDA)"),
], _print_fx)


def build_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, *,
                attention_rewrite: bool = True) -> IRGraph:
    start = time.perf_counter()
    gm = copy_graph_module(gm)
    gm.graph.eliminate_dead_code()
    metas = _output_metas(gm)  # before the passes: outputs keep the strides eager gives them
    gm = PASSES.run(gm, flags={"attention_rewrite": attention_rewrite})
    builder = GraphBuilder()
    if symbolic.is_symbolic_graph(gm):
        with symbolic.symbolic_lowering(gm):
            _interpret(gm, None, builder, symbolic.lower_metas(metas))
        builder.graph.symbolic = True
    else:
        _interpret(gm, example_inputs, builder, metas)
    log.debug("lowered %d FX nodes into %r in %.3f s", len(gm.graph.nodes), builder.graph,
              time.perf_counter() - start)
    return builder.graph


def _interpret(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None,
               builder: GraphBuilder, metas: list) -> None:
    """Run the interpreter over `gm` into `builder`'s graph, outputs included. A symbolic
    graph (`example_inputs` None) binds its inputs to the placeholders' symbolic metas."""
    interp = Interpreter(builder)
    _bind_inputs(gm, example_inputs, builder, interp)
    outputs = interp.run_nodes(list(gm.graph.nodes))
    values = _compat.tree_leaves(outputs, is_leaf=_is_leaf)
    builder.graph.outputs = _outputs(builder, values, metas,
                                     lambda key: _covering_value(gm, interp.env, key))
    _drop_unread_empties(builder.graph)


def _drop_unread_empties(graph: IRGraph) -> None:
    """Zero-element buffers (`Extern` "empty") that nothing reads: an empty value's readers are
    mostly empty themselves and read nothing, so the chain leaves unused allocations behind."""
    read = {o.name for o in graph.outputs if isinstance(o, TensorArg)}
    read |= {arg.name for _, arg in graph.mutations}
    for node in graph.nodes:
        if isinstance(node, ComputedBuffer):
            read.update(read_writes(node).read_names)
        else:
            read.update(a.name for a in node.tensor_args())
    for node in [n for n in graph.nodes if isinstance(n, Extern) and n.kind == "empty"]:
        (out,) = node.output_buffers()
        if out.name not in read:
            graph.nodes.remove(node)
            del graph.buffers[out.name]


def _output_metas(gm: torch.fx.GraphModule) -> list:
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    return _compat.tree_leaves(
        torch.fx.node.map_arg(out_node.args[0], lambda n: n.meta.get("val")),
        is_leaf=lambda x: x is None)


def _is_leaf(x: Any) -> bool:
    return x is None or isinstance(x, TensorValue)


def _bind_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None,
                 builder: GraphBuilder, interp: Interpreter) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [_input_value(n, i, example_inputs) for i, n in enumerate(placeholders)]
    device = _compute_device(values)
    for node, val in zip(placeholders, values):
        if isinstance(val, torch.Tensor):
            where = val.device
            if _host_scalar(val, device):
                where = device
                builder.graph.moved_inputs.append(node.name)
            # offset 0: kernels address an input from its first element (InputBuffer)
            layout = Layout(val.dtype, where, tuple(val.shape), tuple(val.stride()), 0)
            builder.graph.input_offsets[node.name] = val.storage_offset()
            buf = InputBuffer(node.name, layout, (_origin(node),))
            builder.graph.add_buffer(buf)
            builder.graph.inputs.append(buf)
            interp.env[node] = BufferValue(buf)
        else:
            if isinstance(val, Expr) and size_names(val):
                builder.graph.size_inputs[len(builder.graph.inputs)] = val
            builder.graph.inputs.append(None)
            interp.env[node] = val
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise LoweringError(f"get_attr {node.target} is not a tensor")
            if _host_scalar(value, device):  # `x[:, 1:] = 2.0` lifts a CPU scalar tensor
                value = value.to(device)
            layout = Layout(value.dtype, value.device, tuple(value.shape), tuple(value.stride()),
                            value.storage_offset())
            buf = ConstantBuffer(node.name, layout, value, (_origin(node),))
            builder.graph.add_buffer(buf)
            builder.graph.constants[node.name] = buf
            interp.env[node] = BufferValue(buf)


def _input_value(node: torch.fx.Node, i: int, example_inputs: Sequence[Any] | None) -> Any:
    if example_inputs is not None and i < len(example_inputs) and \
            isinstance(example_inputs[i], torch.Tensor):
        return example_inputs[i]
    val = node.meta.get("val")
    return symbolic.lower_metas(val) if symbolic.active() else val


def _compute_device(values: Sequence[Any]) -> torch.device | None:
    """The accelerator the graph computes on, if any input lives on one."""
    return next((v.device for v in values
                 if isinstance(v, torch.Tensor) and v.device.type != "cpu"), None)


def _host_scalar(value: torch.Tensor, device: torch.device | None) -> bool:
    """A 0-dim CPU tensor in a graph on an accelerator: eager allows the mix, a generated
    kernel would dereference a host pointer on the device (an illegal memory access)."""
    return device is not None and host_scalar(value)


def _origin(node: torch.fx.Node) -> Origin:
    return Origin(node.name, node.op, node.meta.get("user_location"))


def _outputs(builder: GraphBuilder, values: list, metas: list,
             covering: Callable[[Any], tuple | None]) -> list:
    """Each output as a strided view of a buffer. Outputs that share a storage in eager (a view
    and its base) become views of one buffer, so an in-place op on one shows through the other:
    the base is realized first and the others are placed in it by their eager geometry. When no
    output of a group is dense (two strided slices of one intermediate), the intermediate they
    are views of is realized at eager's geometry and every output placed in it."""
    out: list[Any] = [None] * len(values)
    for group in _alias_groups(metas):
        base = max(group, key=lambda i: (_is_dense(metas[i]), metas[i].numel()))
        holds_all = _is_dense(metas[base]) and all(_inside(metas[i], metas[base]) for i in group)
        cover = None if holds_all else covering(_compat.storage_key(metas[base]))
        if cover is not None:
            base_arg = _output(builder, *cover)  # realized with eager's strides
            base_meta = cover[1]
        else:
            out[base] = base_arg = _output(builder, values[base], metas[base])
            base_meta = metas[base]
        for i in group:
            if out[i] is None:
                out[i] = _alias_of(base_arg, base_meta, metas[i]) or \
                    _output(builder, values[i], metas[i])
    for i, (value, meta) in enumerate(zip(values, metas)):
        if out[i] is None:
            out[i] = _output(builder, value, meta)
    return out


def _covering_value(gm: torch.fx.GraphModule, env: dict, key: Any) -> tuple | None:
    """A lowered intermediate whose eager tensor starts the storage `key` and fills it densely,
    as (value, its meta), else None: outputs placed in it keep eager's aliasing even when none
    of them is dense."""
    for node in gm.graph.nodes:
        raw = node.meta.get("val")
        if node.op != "call_function" or not isinstance(raw, torch.Tensor) \
                or not isinstance(env.get(node), TensorValue) or _compat.storage_key(raw) != key:
            continue
        meta = symbolic.lower_metas(raw)  # sizes as the outputs' metas have them (Exprs)
        if meta.storage_offset() == 0 and _is_dense(meta) and meta.numel() == _storage_numel(raw):
            return env[node], meta
    return None


def _storage_numel(meta: torch.Tensor) -> Any:
    return symbolic.lower_metas(meta.untyped_storage().nbytes()) // meta.element_size()


def _alias_groups(metas: list) -> list[list[int]]:
    """Indices of tensor outputs sharing one storage: groups of two or more, and single outputs
    that are not dense (`t.expand(...)` of an intermediate: a view of it in eager, where a copy
    would differ in strides and could be far larger)."""
    groups: dict[Any, list[int]] = {}
    for i, meta in enumerate(metas):
        if isinstance(meta, torch.Tensor) and not _surely_empty(meta):
            groups.setdefault(_compat.storage_key(meta), []).append(i)
    return [g for g in groups.values() if len(g) > 1 or _surely_not_dense(metas[g[0]])]


def _surely_not_dense(meta: torch.Tensor) -> bool:
    try:
        return not _is_dense(meta)
    except TypeError:  # symbolic strides whose sign depends on the sizes: leave it be
        return False


def _surely_empty(meta: torch.Tensor) -> bool:
    """No elements for every size (dim by dim: the bounds of a product of sizes are too
    loose to order `s0*s0 - s0` against 0). Sizes that may be 0 count as not empty."""
    for d in meta.shape:
        try:
            if d <= 0:
                return True
        except TypeError:  # a symbolic extent whose sign depends on the sizes
            continue
    return False


def _alias_of(base: Any, base_meta: torch.Tensor, meta: torch.Tensor) -> TensorArg | None:
    """`meta` as a view of `base`'s buffer: valid when the base's elements are dense in its
    storage with eager's strides (then storage position p is buffer position p + shift) and
    `meta` lies inside them."""
    if not isinstance(base, TensorArg) or not _same_strides(base, base_meta.stride()) \
            or meta.dtype != base_meta.dtype:
        return None
    if not _is_dense(base_meta):
        return None
    if not _inside(meta, base_meta):
        return None
    offset = base.offset + meta.storage_offset() - base_meta.storage_offset()
    return TensorArg(base.name, base.dtype, tuple(meta.shape), tuple(meta.stride()), offset)


def _inside(meta: torch.Tensor, base_meta: torch.Tensor) -> bool:
    """Every storage position `meta` covers lies in `base_meta`'s span."""
    lo, hi = _span(base_meta)
    mlo, mhi = _span(meta)
    try:
        return bool(lo <= mlo and mhi <= hi)
    except TypeError:  # symbolic extents that order differently for different sizes
        return False


def _is_dense(meta: torch.Tensor) -> bool:
    """Its elements fill its storage span exactly (no holes, no overlaps): a base the others
    can be placed in. An expanded view has more elements than its span, a strided slice fewer."""
    lo, hi = _span(meta)
    return hi - lo + 1 == meta.numel()


def _span(meta: torch.Tensor) -> tuple[int, int]:
    """The lowest and highest storage positions `meta` covers."""
    lo = hi = meta.storage_offset()
    for size, stride in zip(meta.shape, meta.stride()):
        reach = (size - 1) * stride
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return lo, hi


def _output(builder: GraphBuilder, value: Any, meta: Any) -> TensorArg | Any:
    if not isinstance(value, TensorValue):
        return value
    want = tuple(meta.stride()) if isinstance(meta, torch.Tensor) else None
    if isinstance(value, PointwiseValue):
        builder.realize(value, stride=want)
    arg = strided_view(value)
    if arg is None or (want is not None and not _same_strides(arg, want)):
        arg = builder.copy(value, stride=want).buffer.as_arg()
    return arg


def _same_strides(arg: TensorArg, want: Sequence[int]) -> bool:
    return all(a == b for s, a, b in zip(arg.size, arg.stride, want) if s != 1)
