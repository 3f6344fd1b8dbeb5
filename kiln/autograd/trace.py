"""trace: the joint trace's entry points, and its stage 1 (the raw joint).

`trace_joint` / `trace_inference` run both stages. Stage 1 (`trace_raw`, here) replays the
captured torch-level graph under the `ATenTracer` (`tracer.py`) on fake tensors and, for
training, calls `torch.autograd.grad` inside the trace (`backward.py`), so the backward's ATen
ops land in the same graph: the *raw joint*, which still mutates. Stage 2 (`functionalize.py`)
re-traces the raw joint into the functional `JointGraph` (`joint.py`) the partitioner and the
runtime consume.

Never: traces on plain meta tensors (factories inside real modules then disagree about devices),
or calls into torch's AOTAutograd.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx

from kiln import records
from kiln._util import is_hashable

from kiln.autograd import _compat
from kiln.autograd.backward import BackwardTrace, SavedTensorModified
from kiln.autograd.decompositions import FUNCTION_FIXES, decomposition_table
from kiln.autograd.functionalize import functionalize_raw
from kiln.autograd.joint import AutogradUnsupported, JointGraph, OutputInfo, RawTrace, TensorSpec
from kiln.autograd.mutation import MutationWatch, StandIns, SyntheticBase, alias_groups
from kiln.autograd.symbolic import SymbolicUnsupported, is_symbolic_graph, is_symbolic_value
from kiln.autograd.tracer import PROVENANCE_KEYS, ATenTracer

__all__ = ["lifted_attributes", "trace_inference", "trace_joint", "trace_raw"]


def trace_joint(gm: torch.fx.GraphModule, example_inputs: list, *,
                decompositions: dict | None = None, symbolic: bool = False) -> JointGraph:
    """The functional joint forward+backward graph of `gm` for inputs like `example_inputs`
    (gradients for the inputs that require grad). Returns an inference graph (training=False)
    when no output needs a gradient. `symbolic`: inputs whose placeholder has symbolic sizes
    are traced with them (`symbolic.py`), so the graphs serve every size; else with the
    examples' sizes."""
    return _trace(gm, example_inputs, training=True, decompositions=decompositions,
                  symbolic=symbolic)


def trace_inference(gm: torch.fx.GraphModule, example_inputs: list, *,
                    decompositions: dict | None = None, symbolic: bool = False) -> JointGraph:
    """The functional forward-only ATen graph of `gm` (no autograd in the trace); `symbolic`
    as for `trace_joint`."""
    return _trace(gm, example_inputs, training=False, decompositions=decompositions,
                  symbolic=symbolic)


def _trace(gm: torch.fx.GraphModule, example_inputs: list, *, training: bool,
           decompositions: dict | None, symbolic: bool) -> JointGraph:
    symbolic = symbolic and is_symbolic_graph(gm)
    records.emit("autograd_traces", records.AutogradTraceRecord(
        training, symbolic, tuple(_shape_of(x) for x in example_inputs)))
    raw = trace_raw(gm, example_inputs, training=training, symbolic=symbolic)
    table = decomposition_table() if decompositions is None else decompositions
    return functionalize_raw(raw, table)


def _shape_of(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def lifted_attributes(gm: torch.fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers `gm` reads as attributes (a symbolically traced module): they become
    primals after the placeholders, so they get gradients and mutations like any input."""
    if not any(n.op in ("get_attr", "call_module") for n in gm.graph.nodes):
        return []
    named = [*gm.named_parameters(remove_duplicate=False),
             *gm.named_buffers(remove_duplicate=False)]
    return [(name, value) for name, value in named if value is not None]


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _symbolic_int(node: torch.fx.Node, real: Any) -> bool:
    """An int argument capture made a symbol (`meta["val"]` a SymInt): traced as that symbol,
    or per value (`PerSizeVariants` keys on it). Any other int would be baked into the trace
    for one value with nothing to check it."""
    return type(real) is int and isinstance(node.meta.get("val"), torch.SymInt)


def _refuse_non_tensor_inputs(gm: torch.fx.GraphModule, reals: list) -> None:
    """Raise for graph inputs that are Python numbers but no int symbol: kiln's capture passes
    a changing float (or an int no symbol holds) as a 0-dim tensor, so these come from a graph
    made elsewhere (torch.compile's Dynamo, a hand-built one). The message names them."""
    odd = [(node, real) for node, real in zip(_placeholders(gm), reals)
           if not isinstance(real, torch.Tensor) and not _symbolic_int(node, real)]
    kinds = sorted({type(real).__name__ for _, real in odd})
    names = [str(node.meta.get("source", node.name)) for node, _ in odd]
    raise AutogradUnsupported(
        f"graph inputs that are not tensors ({', '.join(kinds)}): {', '.join(names)}; this "
        "stage traces tensors and int symbols only",
        hint="the graph runs eagerly instead; pass such a number as a tensor "
             "(torch.tensor(x)) to keep it compiled, or keep it constant")


def trace_raw(gm: torch.fx.GraphModule, example_inputs: list, *, training: bool,
              probe: bool = False, groups: tuple[tuple[int, ...], ...] = (),
              symbolic: bool = False) -> RawTrace:
    """Stage 1: replay `gm` on fake copies of the inputs under the tracer and, for training, call
    autograd.grad inside the trace. Traced again, with `groups`, when inputs that share a
    storage are written (`mutation.SyntheticBase`); with `probe`, when the backward reads a
    tensor the program overwrote after autograd saved it (`backward.backward_errors`).
    `symbolic`: the fakes of inputs whose placeholder has symbolic sizes take those sizes, in a
    fake mode sharing the capture's ShapeEnv."""
    lifted = lifted_attributes(gm)
    reals = [*example_inputs, *(value for _, value in lifted)]
    if not all(isinstance(real, torch.Tensor) or _symbolic_int(node, real)
               for node, real in zip(_placeholders(gm), reals)):
        _refuse_non_tensor_inputs(gm, reals)
    bases = tuple(SyntheticBase.of(len(reals) + k, group, reals) for k, group in enumerate(groups))
    examples = _symbolic_examples(gm) if symbolic else []
    fake_mode = (_compat.fake_mode_sharing(_compat.shape_env_of(examples)) if symbolic
                 else _compat.new_fake_mode(allow_non_fake_inputs=True))
    tracer = ATenTracer(fake_mode)
    traced = [*reals, *(base.build(reals) for base in bases)]
    primals = [_fake_input(fake_mode, real, training, examples[i] if i < len(examples) else None)
               for i, real in enumerate(traced)]
    requires_grad = [isinstance(p, torch.Tensor) and p.requires_grad for p in primals]
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
        if symbolic:
            raise SymbolicUnsupported("written inputs that share memory with other inputs",
                                      hint="the graph is compiled per size instead") from None
        return trace_raw(gm, example_inputs, training=training, probe=probe, groups=found.groups)
    except SavedTensorModified:
        return trace_raw(gm, example_inputs, training=training, probe=True, groups=groups,
                         symbolic=symbolic)
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
                    synthetic_bases=bases, symbolic=symbolic)


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


def _fake_input(fake_mode: Any, real: Any, training: bool, example: Any = None) -> Any:
    """The primal for `real`: a fake with its sizes, or with the symbolic sizes of `example`
    (its placeholder's fake value in a symbolic capture). An int argument (capture made it a
    symbol: `symbolic_int`) is its SymInt in a symbolic trace, else its value: a variant traced
    per size is keyed by it (`PerSizeVariants.key`)."""
    if type(real) is int:
        return example if isinstance(example, torch.SymInt) else real
    if is_symbolic_value(example):
        fake = _symbolic_fake(fake_mode, example)
    else:
        fake = fake_mode.from_tensor(real.detach(), static_shapes=True)  # detach: a fresh leaf
    if training and real.requires_grad:
        fake.requires_grad_(True)
    return fake


def _symbolic_examples(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in _placeholders(gm)]


def _symbolic_fake(fake_mode: Any, example: torch.Tensor) -> torch.Tensor:
    """A fresh fake with `example`'s symbolic sizes and strides (a storage of its own: inputs
    that share memory are not traced symbolically)."""
    if not _compat.known_equal(example.storage_offset(), 0):
        raise SymbolicUnsupported("an input that starts inside its storage",
                                  hint="the graph is compiled per size instead")
    with fake_mode:
        return torch.empty_strided(example.shape, example.stride(), dtype=example.dtype,
                                   device=example.device)


def _attr_map(lifted: list[tuple[str, torch.Tensor]], fakes: list) -> dict[str, torch.Tensor]:
    first: dict[int, torch.Tensor] = {}
    attrs = {}
    for (name, real), fake in zip(lifted, fakes):
        attrs[name] = first.setdefault(id(real), fake)  # a tied attribute reads one primal
    return attrs


def _sources(gm: torch.fx.GraphModule, lifted: list,
             bases: tuple[SyntheticBase, ...]) -> tuple[str | None, ...]:
    placeholders = _placeholders(gm)
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
            if isinstance(t, torch.Tensor):  # not an int argument
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
            retyped = out.dtype if out.dtype != stand_ins.tensors[i].dtype else None
            infos.append(OutputInfo("input_view", rg, index=i, view=_input_view(stand_ins, i, out),
                                    view_dtype=retyped))
        else:
            infos.append(OutputInfo("tensor", rg))
    return infos


def _input_view(stand_ins: StandIns, i: int, out: torch.Tensor) -> TensorSpec:
    """Where output `out` lies in input i's storage, its storage offset counted from the
    input's first element (in elements of `out`'s dtype): the runtime views the real input so,
    wherever that input starts in its storage (`xs[0]` traced, `xs[3]` called)."""
    spec = TensorSpec.of(out)
    if i in stand_ins.cloned and not stand_ins.same_layout(i):
        raise AutogradUnsupported(
            f"an output is a view of input primals_{i}, which is written in place and whose "
            "layout a clone does not keep", hint="the graph runs eagerly instead")
    offset = stand_ins.input_offset(i, spec.storage_offset) if i in stand_ins.cloned \
        else spec.storage_offset
    primal = stand_ins.primals[i]
    start = primal.storage_offset() * primal.element_size() // out.element_size()
    return dataclasses.replace(spec, storage_offset=offset - start)
