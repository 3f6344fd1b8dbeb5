"""trace: the ATen tracer and stage 1 of the joint trace.

`ATenTracer` is a TorchDispatchMode stacked over a FakeTensorMode: every ATen op that reaches it
is run on fake tensors (so real devices, shapes and strides are known, no data is touched) and
recorded as a node of an FX graph. Stage 1 replays the captured torch-level graph under it and,
for training, calls `torch.autograd.grad` inside the trace, so the backward's ATen ops land in the
same graph: the *raw joint*, which still mutates. Stage 2 (`functionalize.py`) re-traces the raw
joint into the functional `JointGraph` the partitioner and the runtime consume.

Never: raises from the dispatch handler on metadata queries (a C++ caller can abort the process),
traces on plain meta tensors (factories inside real modules then disagree about devices), or
calls into torch's AOTAutograd.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable

import torch
import torch.fx

from kiln._util import is_hashable

from kiln.autograd import _compat
from kiln.autograd.backward import BackwardTrace, SavedTensorModified
from kiln.autograd.decompositions import keeps
from kiln.autograd.mutation import (MutationWatch, StandIns, SyntheticBase, alias_groups,
                                    mutated_arg_positions)
from kiln.errors import KilnError

__all__ = [
    "ATenTracer",
    "AutogradUnsupported",
    "JointGraph",
    "OutputInfo",
    "TensorSpec",
    "trace_inference",
    "trace_joint",
]

PROVENANCE_KEYS = ("user_location", "stack_trace")


class AutogradUnsupported(KilnError):
    """A graph the autograd stage refuses (the backend then runs it eagerly, never wrongly)."""

    stage = "autograd"


# -- records ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, strides, storage offset, dtype and device of a traced tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    storage_offset: int = 0

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.storage_offset())


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """One flattened output of the captured graph.

    kind: "tensor" (computed by the graph), "input" (is primal `index` itself), "input_view"
    (aliases primal `index`; the runtime regenerates it from the input with `view`'s geometry),
    "duplicate" (the same tensor as output `index`), "constant" (a Python value, `value`).
    "mutation" (the new value of mutated primal `index`; in `JointGraph.input_mutations`).
    `requires_grad`: autograd sees it as differentiable (for a mutation: the write carries
    autograd history, so the runtime writes it back under autograd); `tangent`: its tangent index
    in the joint graph, or None. `backward_error`: eager's backward through this output raises
    this message (a tensor it saved was written in place later); it gets no tangent and the
    compiled backward raises the same error when a gradient reaches it."""

    kind: str
    requires_grad: bool = False
    index: int | None = None
    view: TensorSpec | None = None
    tangent: int | None = None
    value: Any = None
    backward_error: str | None = None


@dataclasses.dataclass(frozen=True)
class JointGraph:
    """A functional ATen graph of forward and backward together (or of the forward alone, when
    `training` is False).

    gm: placeholders `primals_<i>` (every captured-graph input, in order, then parameters and
    buffers the graph read as attributes, named in `lifted_attrs`) then `tangents_<j>`; one output
    node returning `(*forward_outputs, *input_grads)` (inference: `(*forward_outputs,)`).
    forward_outputs = `(*new values of mutated_inputs, *one per tensor entry of outputs)`;
    input_grads[i] is the gradient of primals_i or None. Every node has meta["val"] (FakeTensor or
    Python value), meta["phase"] ("forward", or "backward" when it depends on a tangent) and
    meta["user_location"] where the capture graph knew it. No op in gm mutates.

    outputs: one OutputInfo per flattened captured-graph output (`output_spec` rebuilds the
    structure); input_mutations: one OutputInfo (kind "mutation") per entry of mutated_inputs;
    tangents are numbered over the outputs first, then the mutations; tangent_specs: the layout
    each tangent was traced with (the runtime coerces the incoming gradients to it).
    static_input_indices: primals alive anyway (parameters, buffers, module attributes; never a
    mutated input), free for the partitioner to save.
    synthetic_bases: extra primals after the lifted attributes, one per group of inputs that
    share a storage and of which one is written (`mutation.SyntheticBase`); the graph reads
    the members through their base only, and the runtime passes each base (built from the
    call's members) after the other inputs."""

    gm: torch.fx.GraphModule
    num_fw_outputs: int
    num_primals: int
    num_tangents: int
    primals_requiring_grad: list[bool]
    training: bool = True
    mutated_inputs: tuple[int, ...] = ()
    outputs: tuple[OutputInfo, ...] = ()
    input_mutations: tuple[OutputInfo, ...] = ()
    tangent_specs: tuple[TensorSpec, ...] = ()
    output_spec: Any = None
    input_sources: tuple[str | None, ...] = ()
    lifted_attrs: tuple[str, ...] = ()
    static_input_indices: tuple[int, ...] = ()
    synthetic_bases: tuple[SyntheticBase, ...] = ()

    @property
    def num_user_outputs(self) -> int:
        return self.num_fw_outputs - len(self.mutated_inputs)


# -- the tracer ------------------------------------------------------------------------------------

def _bound_args(op: _compat.OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    values = list(args)
    for arg in _compat.schema(op).arguments[len(args):]:
        values.append(kwargs.get(arg.name))
    return values


_UNKNOWN = object()


class ATenTracer(_compat.TorchDispatchMode):
    """Records the ATen ops that reach it into `self.graph` (see the module docstring).

    Tensors are matched to nodes by identity (strong references keep ids unique for the trace);
    an op that returns its mutated argument (in-place, out=) rebinds it to the op's node. Ops the
    policy keeps are recorded whole; otherwise `decompositions` maps
    ops to Python decompositions, applied by re-entering the tracer; CompositeImplicitAutograd ops
    are expanded the same way. `provenance` is copied onto every new node."""

    def __init__(self, fake_mode: Any, decompositions: dict | None = None) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.graph = torch.fx.Graph()
        self.decompositions = decompositions or {}
        self.provenance: dict[str, Any] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.paused = False
        self.on_mutation: Callable[[_compat.OpOverload, list], None] | None = None
        self.on_input_copy: Callable[[torch.Tensor, torch.Tensor], bool] | None = None
        self.backward_provenance: dict[int, dict[str, Any]] | None = None
        self._nodes: dict[int, torch.fx.Node] = {}
        self._alive: list[Any] = []
        self._expansions: dict[Any, Callable | None] = {}
        self._kept: set[Any] = set()

    # -- tensors and nodes ---------------------------------------------------------------------
    def bind(self, tensor: torch.Tensor, node: torch.fx.Node) -> None:
        self._nodes[id(tensor)] = node
        self._alive.append(tensor)

    def placeholder(self, name: str, value: torch.Tensor) -> torch.fx.Node:
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:
            node = self.graph.placeholder(name)
        else:
            with self.graph.inserting_before(first):
                node = self.graph.placeholder(name)
        node.meta["val"] = value
        self.bind(value, node)
        return node

    def constant(self, real: torch.Tensor, fake: torch.Tensor | None = None) -> torch.Tensor:
        """A get_attr node for a real tensor the trace met; returns its fake stand-in."""
        if fake is None:
            fake = self.fake_mode.from_tensor(real, static_shapes=True)
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = real
        node = self.graph.get_attr(name)
        node.meta["val"] = fake
        node.meta.update(self.provenance)
        self.bind(fake, node)
        return fake

    def _arg_node(self, value: torch.Tensor) -> torch.fx.Node:
        node = self._nodes.get(id(value))
        if node is not None:
            return node
        if not _compat.is_fake(value):
            return self._nodes[id(self.constant(value))]
        real = _compat.fake_constant(value)
        if real is not None:
            self.constant(real, value)
            return self._nodes[id(value)]
        raise RuntimeError(f"kiln.autograd: a {tuple(value.shape)} tensor reached the tracer "
                           "without a known origin")

    def to_nodes(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._arg_node(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_nodes(v) for v in value)
        if isinstance(value, dict):  # keyword arguments (SDPA's attn_mask=): inputs, not constants
            return {k: self.to_nodes(v) for k, v in value.items()}
        return value

    # -- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.paused or func.namespace == "prim":  # metadata queries: never record, never raise
            return func(*args, **kwargs)
        if self.on_input_copy is not None and func is torch.ops.aten.copy_.default \
                and self.on_input_copy(args[0], args[1]):
            return args[0]
        if func not in self._kept and not self._keep(func):
            expanded = self._expand(func, args, kwargs)
            if expanded is not NotImplemented:
                return expanded
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def _keep(self, func: Any) -> bool:
        if keeps(func):
            self._kept.add(func)
            return True
        return False

    def _expand(self, func: Any, args: tuple, kwargs: dict) -> Any:
        expansion = self._expansions.get(func, _UNKNOWN)
        if expansion is _UNKNOWN:
            expansion = self.decompositions.get(func)
            if expansion is None and _compat.has_composite_implicit_kernel(func):
                expansion = func.decompose
            self._expansions[func] = expansion
        if expansion is None:
            return NotImplemented
        with self:
            return expansion(*args, **kwargs)

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        writes = mutated_arg_positions(func)
        if not writes and not _has_tensor(out):
            return  # a pure query (sizes, flags): nothing to record
        if writes and self.on_mutation is not None:
            self.on_mutation(func, _bound_args(func, args, kwargs))
        node = self.graph.create_node("call_function", func, self.to_nodes(args),
                                      self.to_nodes(kwargs), name=func.overloadpacket.__name__)
        node.meta["val"] = out
        node.meta.update(self._current_provenance())
        if isinstance(out, torch.Tensor):
            self.bind(out, node)
        elif isinstance(out, (list, tuple)):
            for i, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    item_node = self.graph.call_function(operator.getitem, (node, i))
                    item_node.meta.update(node.meta)
                    item_node.meta["val"] = item
                    self.bind(item, item_node)

    def _current_provenance(self) -> dict[str, Any]:
        if self.backward_provenance is not None:
            grad_fn = _compat.current_autograd_node()
            if grad_fn is not None:
                found = self.backward_provenance.get(_compat.sequence_nr(grad_fn))
                if found is not None:
                    return found
        return self.provenance

    def label_autograd_nodes(self, value: Any) -> None:
        """Remember the provenance of the autograd nodes that produced `value`, so the backward
        ops they run later carry the same user line."""
        if self.backward_provenance is None:
            return
        stack = [t.grad_fn for t in _tensors(value) if t.grad_fn is not None]
        while stack:
            grad_fn = stack.pop()
            key = _compat.sequence_nr(grad_fn)
            if key in self.backward_provenance:
                continue
            self.backward_provenance[key] = dict(self.provenance)
            stack.extend(fn for fn, _ in grad_fn.next_functions if fn is not None)

    def graph_module(self) -> torch.fx.GraphModule:
        root = torch.nn.Module()
        for name, value in self.constants.items():
            setattr(root, name, value)
        return torch.fx.GraphModule(root, self.graph, class_name="JointGraph")


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


# -- stage 1: the raw joint ------------------------------------------------------------------------

@dataclasses.dataclass
class RawTrace:
    """Stage 1's result: a mutating ATen graph `(*primals, *tangents) -> (*tensor outputs,
    *new values of returned_inputs, *input grads)` (no grads when not training) plus what stage
    2 and the runtime need. `mutations`: the mutated inputs whose write carries autograd history
    (OutputInfo kind "mutation"); `returned_inputs`: inputs the program wrote through a clone
    (`mutation.StandIns`), whose new values stage 2 reads from the outputs, not from a copy_."""

    gm: torch.fx.GraphModule
    constants: dict[str, torch.Tensor]
    fake_mode: Any
    primals: list[torch.Tensor]
    tangents: list[torch.Tensor]
    requires_grad: list[bool]
    outputs: tuple[OutputInfo, ...]
    output_spec: Any
    tangent_specs: tuple[TensorSpec, ...]
    mutated: set[int]
    input_sources: tuple[str | None, ...]
    lifted_attrs: tuple[str, ...]
    static_inputs: tuple[int, ...]
    training: bool = False
    mutations: dict[int, OutputInfo] = dataclasses.field(default_factory=dict)
    returned_inputs: tuple[int, ...] = ()
    synthetic_bases: tuple[SyntheticBase, ...] = ()


def trace_joint(gm: torch.fx.GraphModule, example_inputs: list, *,
                decompositions: dict | None = None) -> JointGraph:
    """The functional joint forward+backward graph of `gm` for inputs like `example_inputs`
    (gradients for the inputs that require grad). Returns an inference graph (training=False)
    when no output needs a gradient."""
    return _trace(gm, example_inputs, training=True, decompositions=decompositions)


def trace_inference(gm: torch.fx.GraphModule, example_inputs: list, *,
                    decompositions: dict | None = None) -> JointGraph:
    """The functional forward-only ATen graph of `gm` (no autograd in the trace)."""
    return _trace(gm, example_inputs, training=False, decompositions=decompositions)


def _trace(gm: torch.fx.GraphModule, example_inputs: list, *, training: bool,
           decompositions: dict | None) -> JointGraph:
    from kiln.autograd.decompositions import decomposition_table
    from kiln.autograd.functionalize import functionalize_raw  # stage 2 builds on this module

    raw = trace_raw(gm, example_inputs, training=training)
    table = decomposition_table() if decompositions is None else decompositions
    return functionalize_raw(raw, table)


def lifted_attributes(gm: torch.fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers `gm` reads as attributes (a symbolically traced module): they become
    primals after the placeholders, so they get gradients and mutations like any input."""
    if not any(n.op in ("get_attr", "call_module") for n in gm.graph.nodes):
        return []
    named = [*gm.named_parameters(remove_duplicate=False),
             *gm.named_buffers(remove_duplicate=False)]
    return [(name, value) for name, value in named if value is not None]


def trace_raw(gm: torch.fx.GraphModule, example_inputs: list, *, training: bool,
              probe: bool = False, groups: tuple[tuple[int, ...], ...] = ()) -> RawTrace:
    """Stage 1: replay `gm` on fake copies of the inputs under the tracer and, for training, call
    autograd.grad inside the trace. Traced again, with `groups`, when inputs that share a
    storage are written (`mutation.SyntheticBase`); with `probe`, when the backward reads a
    tensor the program overwrote after autograd saved it (`backward.backward_errors`)."""
    lifted = lifted_attributes(gm)
    reals = [*example_inputs, *(value for _, value in lifted)]
    if any(not isinstance(real, torch.Tensor) for real in reals):
        kinds = sorted({type(r).__name__ for r in reals if not isinstance(r, torch.Tensor)})
        raise AutogradUnsupported(f"graph inputs that are not tensors ({', '.join(kinds)})",
                                  hint="the graph runs eagerly instead")
    bases = tuple(SyntheticBase.of(len(reals) + k, group, reals) for k, group in enumerate(groups))
    fake_mode = _compat.new_fake_mode()
    tracer = ATenTracer(fake_mode)
    traced = [*reals, *(base.build(reals) for base in bases)]
    primals = [_fake_input(fake_mode, real, training) for real in traced]
    requires_grad = [p.requires_grad for p in primals]
    nodes = [tracer.placeholder(f"primals_{i}", p) for i, p in enumerate(primals)]
    stand_ins = StandIns(primals, traced, bases)
    if training:
        tracer.backward_provenance = {}
    with fake_mode, tracer, torch.set_grad_enabled(training):
        stand_ins.make(tracer, training)
    watch = tracer.on_mutation = MutationWatch(stand_ins)
    attrs = _attr_map(lifted, stand_ins.tensors[len(example_inputs):])
    backward = BackwardTrace(tracer, primals, requires_grad, probe)
    try:
        with fake_mode, tracer, _compat.original_view_tracking(), _compat.python_dispatcher(), \
                torch.set_grad_enabled(training):
            out = _Replay(gm, tracer, attrs).run(*stand_ins.tensors[:len(example_inputs)])
            flat, spec = _compat.tree_flatten(out)
            if not bases:
                _check_aliased_writes(reals, watch.mutated)
            outputs = _classify_outputs(flat, stand_ins)
            mutations = {i: OutputInfo("mutation", True, index=i)
                         for i in sorted(watch.mutated - stand_ins.members) if stand_ins.tracked(i)}
            if training:
                outputs = backward.run(flat, outputs, mutations, stand_ins)
    except _AliasedWrites as found:
        return trace_raw(gm, example_inputs, training=training, probe=probe, groups=found.groups)
    except SavedTensorModified:
        return trace_raw(gm, example_inputs, training=training, probe=True, groups=groups)
    except Exception as err:
        if watch.refusals:
            raise AutogradUnsupported(watch.refusals[0], hint=_REFUSAL_HINT) from err
        raise
    if watch.refusals:
        raise AutogradUnsupported(watch.refusals[0], hint=_REFUSAL_HINT)
    tensor_outs = [flat[k] for k, info in enumerate(outputs) if info.kind != "constant"]
    returned = tuple(sorted(i for i in stand_ins.cloned if i in watch.mutated))
    tracer.graph.output(tracer.to_nodes((*tensor_outs, *(stand_ins.tensors[i] for i in returned),
                                         *(backward.grads if backward.needed else ()))))
    stand_ins.drop_unwritten(nodes, watch.mutated)
    sources = _sources(gm, lifted, bases)
    return RawTrace(tracer.graph_module(), dict(tracer.constants), fake_mode, primals,
                    backward.tangents, requires_grad, tuple(outputs), spec,
                    tuple(TensorSpec.of(t) for t in backward.tangents), watch.mutated, sources,
                    tuple(name for name, _ in lifted), _static_inputs(reals, sources, len(lifted)),
                    training=backward.needed, mutations=mutations, returned_inputs=returned,
                    synthetic_bases=bases)


class _AliasedWrites(Exception):
    def __init__(self, groups: tuple[tuple[int, ...], ...]) -> None:
        super().__init__()
        self.groups = groups


def _check_aliased_writes(reals: list, written: set[int]) -> None:
    """Inputs sharing a storage with a written one: trace again through a synthetic base, or
    refuse when that cannot follow eager (see mutation.alias_groups)."""
    groups, refusal = alias_groups(reals, {i for i in written if i < len(reals)})
    if refusal is not None:
        raise AutogradUnsupported(refusal, hint="the graph runs eagerly instead; pass separate "
                                                "tensors, or clone one")
    if groups:
        raise _AliasedWrites(tuple(groups))


_REFUSAL_HINT = ("the graph runs eagerly instead; move the mutation out of the compiled region "
                 "or onto a tensor that does not require grad")


def _fake_input(fake_mode: Any, real: torch.Tensor, training: bool) -> torch.Tensor:
    fake = fake_mode.from_tensor(real.detach(), static_shapes=True)  # detach: a fresh leaf
    if training and real.requires_grad:
        fake.requires_grad_(True)
    return fake


def _attr_map(lifted: list[tuple[str, torch.Tensor]], fakes: list) -> dict[str, torch.Tensor]:
    first: dict[int, torch.Tensor] = {}
    attrs = {}
    for (name, real), fake in zip(lifted, fakes):
        attrs[name] = first.setdefault(id(real), fake)  # a tied attribute reads one primal
    return attrs


def _sources(gm: torch.fx.GraphModule, lifted: list,
             bases: tuple[SyntheticBase, ...]) -> tuple[str | None, ...]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = (*(n.meta.get("source", n.name) for n in placeholders),
               *(name for name, _ in lifted))
    return (*sources, *(f"<memory of {', '.join(str(sources[m]) for m in base.members)}>"
                        for base in bases))


def _static_inputs(reals: list, sources: tuple, num_lifted: int) -> tuple[int, ...]:
    """Inputs that live as long as their module does: parameters, lifted attributes, and tensors
    capture read through an attribute or item (`self.bn.running_mean`), not a plain argument."""
    first_lifted = len(reals) - num_lifted
    return tuple(i for i, (real, source) in enumerate(zip(reals, sources))
                 if i >= first_lifted or isinstance(real, torch.nn.Parameter)
                 or (source is not None and not source.isidentifier()))


class _FunctionFixes(torch.overrides.TorchFunctionMode):
    """Applies `decompositions.FUNCTION_FIXES` to torch calls of the replayed graph, also those
    made inside a module's forward (nn.LSTM calls `_VF.lstm`)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        from kiln.autograd.decompositions import FUNCTION_FIXES

        fix = FUNCTION_FIXES.get(func) if is_hashable(func) else None
        if fix is not None:
            return fix(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


class _Replay(torch.fx.Interpreter):
    """Runs a torch-level graph node by node, telling the tracer which node is running."""

    def __init__(self, gm: torch.fx.GraphModule, tracer: ATenTracer,
                 attrs: dict[str, torch.Tensor]) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.tracer = tracer
        self.attrs = attrs

    def run_node(self, n: torch.fx.Node) -> Any:
        self.tracer.provenance = {k: n.meta[k] for k in PROVENANCE_KEYS if k in n.meta}
        with _FunctionFixes():
            result = super().run_node(n)
        if n.op not in ("placeholder", "output"):
            self.tracer.label_autograd_nodes(result)
        return result

    def get_attr(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target in self.attrs:
            return self.attrs[target]
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return self.tracer.constant(value)
        return value

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        module = self.fetch_attr(target)
        state = {name: self.attrs[f"{target}.{name}"]
                 for name, _ in [*module.named_parameters(remove_duplicate=False),
                                 *module.named_buffers(remove_duplicate=False)]
                 if f"{target}.{name}" in self.attrs}
        return torch.func.functional_call(module, state, args, kwargs)


def _classify_outputs(flat: list, stand_ins: StandIns) -> list[OutputInfo]:
    """One OutputInfo per flattened output (tangents are numbered later, by BackwardTrace)."""
    by_storage: dict[Any, int] = {}
    for tensors in (stand_ins.tensors, stand_ins.primals):
        for i, t in enumerate(tensors):
            by_storage.setdefault(_compat.storage_key(t), i)
    infos: list[OutputInfo] = []
    seen: dict[int, int] = {}
    for k, out in enumerate(flat):
        if not isinstance(out, torch.Tensor):
            infos.append(OutputInfo("constant", value=out))
            continue
        rg = out.requires_grad
        if id(out) in seen:
            infos.append(OutputInfo("duplicate", rg, index=seen[id(out)]))
            continue
        seen[id(out)] = k
        primal = next((i for i, t in enumerate(stand_ins.tensors) if t is out), None)
        if primal is not None:
            infos.append(OutputInfo("input", rg, index=primal))
        elif _compat.storage_key(out) in by_storage:
            i = by_storage[_compat.storage_key(out)]
            infos.append(OutputInfo("input_view", rg, index=i, view=_input_view(stand_ins, i, out)))
        else:
            infos.append(OutputInfo("tensor", rg))
    return infos


def _input_view(stand_ins: StandIns, i: int, out: torch.Tensor) -> TensorSpec:
    """Where output `out` lies in input i's storage (the runtime views the real input so)."""
    spec = TensorSpec.of(out)
    if i not in stand_ins.cloned:
        return spec
    if not stand_ins.same_layout(i):
        raise AutogradUnsupported(
            f"an output is a view of input primals_{i}, which is written in place and whose "
            "layout a clone does not keep", hint="the graph runs eagerly instead")
    return dataclasses.replace(spec, storage_offset=stand_ins.input_offset(i, spec.storage_offset))
