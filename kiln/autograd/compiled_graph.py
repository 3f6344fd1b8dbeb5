"""compiled_graph: compiled forward/backward graphs -> the callable a backend returns.

`CompiledGraph` is called like the captured graph. Per call it picks a variant — training (grad
mode on and some input requires grad) or inference — keyed by which inputs require grad, traces
and compiles that variant the first time, and runs it:

- training: one `torch.autograd.Function` per compiled graph. Its forward runs the compiled
  forward graph and saves what the partition chose; its backward coerces the incoming gradients
  to the traced tangent layouts (zeros for None), compiles the backward graph on first use and
  runs it. `retain_graph=True` works; a backward under `create_graph=True` raises.
- inference: the compiled forward-only graph, without autograd.

Then the epilogue (`epilogue.py`), outside autograd.Function: new values of mutated inputs are
written back into the inputs, outputs that alias inputs are rebuilt as views of the real inputs,
and the captured graph's output structure is restored. A training output that is a view of a tensor made inside
the forward leaves the Function as its base and is viewed again outside (`_ViewOfIntermediate`):
autograd forbids in-place writes on views created inside a custom Function, which eager allows.

A variant the autograd stage refuses (AutogradUnsupported), and a call whose mutated inputs share
memory with another input, run the captured graph eagerly instead, with the reason logged; so
does every variant of a graph with data-dependent sizes (unbacked symbols: `nonzero`, `item()`,
docs/dynamic_shapes.md stage D), logged once at INFO.

Symbolic sizes (`symbolic=True` and a graph captured with symbolic sizes): each variant is
traced once with the capture's symbolic sizes and serves every size (`SymbolicVariant`); the
layouts the runtime needs (tangents, outputs viewing inputs, returned sizes) are evaluated for
each call's sizes. When that trace fails, or a call's sizes break a fact the trace added to the
ShapeEnv, the variant is traced for the call's sizes instead (`size_variants.PerSizeVariants`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import operator
import time
from typing import Any, Callable

import torch
import torch.fx

from kiln.autograd import _compat
from kiln.autograd.epilogue import Epilogue
from kiln.autograd.mutation import is_leaf_write, layout_keeping_clone
from kiln.autograd.joint import AutogradUnsupported, JointGraph, TensorSpec
from kiln.autograd.size_variants import PerSizeVariants, SymbolicVariant, unwrap_variants
from kiln.autograd.symbolic import (SizeConditions, SizeFunction, has_unbacked_sizes,
                                    is_symbolic_graph, symbolic_positions)
from kiln.autograd.trace import lifted_attributes, trace_inference, trace_joint
from kiln.config import config
from kiln.errors import KilnError
from kiln import records
from kiln._util import error_line
from kiln.logs import artifact_enabled, artifact_logger, info_once, warn_once

__all__ = ["Compilers", "CompiledGraph", "DoubleBackwardError", "EagerVariant", "InferenceVariant",
           "TrainingVariant", "identity_compiler"]

log = logging.getLogger("kiln.autograd")

Compiler = Callable[[torch.fx.GraphModule, list], Callable[..., Any]]
JointPass = Callable[[JointGraph], JointGraph]


def identity_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """Run the graph as torch code (the "aot_eager" compilers)."""
    return gm


@dataclasses.dataclass(frozen=True)
class Compilers:
    """What a backend plugs into the autograd stage.

    fw_compiler / bw_compiler: `(gm, example fake inputs) -> callable` for the partitioned
    forward and backward graphs; inference_compiler for the forward-only graph (default: the
    fw_compiler). joint_passes run in order on every JointGraph before partitioning.
    partition_policy: "min_cut" or "default"."""

    fw_compiler: Compiler = identity_compiler
    bw_compiler: Compiler = identity_compiler
    inference_compiler: Compiler | None = None
    joint_passes: tuple[JointPass, ...] = ()
    partition_policy: str = "min_cut"


class DoubleBackwardError(KilnError):
    stage = "autograd"


class CompiledGraph:
    """The callable for one captured graph (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list,
                 compilers: Compilers, *, symbolic: bool = False) -> None:
        self.gm = gm
        self.compilers = compilers
        self.lifted = [name for name, _ in lifted_attributes(gm)]
        self.variants: dict[tuple, Callable[[list], Any]] = {}
        # with symbolic sizes in the captured graph, each variant is traced once for every
        # size (`symbolic.py`), falling back to a trace per size (`size_variants.py`)
        self.symbolic = symbolic and is_symbolic_graph(gm)
        # data-dependent sizes (stage D) are followed by neither trace: run the graph as is
        self.unbacked = has_unbacked_sizes(gm)
        # the capture's guards end here: what any trace adds later is checked per call
        self.shape_env = _compat.shape_env_of(_fake_args(gm)) if self.symbolic else None
        self.capture_guards = _compat.guard_count(self.shape_env) if self.symbolic else 0
        self.capture_replacements = _compat.replacements(self.shape_env) if self.symbolic else {}
        self.variant_for(self._full_args(list(example_inputs)))  # compile errors surface now

    def __call__(self, *args: Any) -> Any:
        full = self._full_args(list(args))
        return self.variant_for(full)(full)

    def _full_args(self, args: list) -> list:
        if not self.lifted:
            return args
        return [*args, *(_fetch(self.gm, name) for name in self.lifted)]

    def variant_for(self, args: list) -> Callable[[list], Any]:
        if not torch.is_grad_enabled():  # inference calls (no_grad): skip the per-input scan
            variant = self.variants.get((False, ()))
            if variant is not None:
                return variant
        # per input: no grad, a leaf that requires grad, or a non-leaf that does (written
        # through a clone when the graph writes it; see mutation.StandIns)
        requires = tuple(0 if not (isinstance(a, torch.Tensor) and a.requires_grad)
                         else 1 if a.is_leaf else 2 for a in args)
        training = torch.is_grad_enabled() and any(requires)
        key = (training, requires if training else ())
        variant = self.variants.get(key)
        if variant is None:
            variant = self.variants[key] = self._compile(args, training)
        return variant

    def traced_variants(self) -> list[Any]:
        """Every variant made so far, those behind a symbolic variant and per-size ones
        included: TrainingVariant, InferenceVariant or EagerVariant objects."""
        found: list[Any] = []
        for variant in self.variants.values():
            found.extend(unwrap_variants(variant))
        return found

    def compiled_inference(self) -> tuple[Any, Epilogue] | None:
        """What the inference compiler returned and the epilogue that finishes its outputs, when
        the inference variant was compiled, reads no module attributes and writes no input (so
        it needs no argument but the call's and no aliasing check): a backend may then store
        both and call them without this object (the kiln backend's warm start). Else None."""
        variant = self.variants.get((False, ()))
        if not isinstance(variant, InferenceVariant):
            return None
        if variant.joint.lifted_attrs or variant.joint.mutated_inputs:
            return None
        return variant.fn, variant.epilogue

    def _compile(self, args: list, training: bool) -> Callable[[list], Any]:
        if self.unbacked:
            return self._unbacked_variant(args)
        if not self.symbolic:
            return self._compile_static(args, training)
        per_size = PerSizeVariants(functools.partial(self._compile_static, training=training),
                                   symbolic_positions(self.gm),
                                   EagerVariant(self.gm, len(args) - len(self.lifted)))
        symbolic = self._compile_symbolic(args, training)
        if symbolic is None:
            return per_size
        variant, conditions = symbolic
        return SymbolicVariant(variant, conditions, per_size)

    def _unbacked_variant(self, args: list) -> EagerVariant:
        """The captured graph as torch ops (eager autograd gives its gradients): its sizes
        depend on values (`nonzero`), which neither the symbolic trace (no input carries them)
        nor a trace per input size (the same input sizes give other output sizes) can follow."""
        info_once("autograd-unbacked",
                  "kiln: a graph with data-dependent sizes (nonzero, masked_select, item(), "
                  "...) runs as torch ops: the autograd stage does not trace unbacked sizes yet",
                  log)
        return EagerVariant(self.gm, len(args) - len(self.lifted))

    def _compile_symbolic(self, args: list, training: bool
                          ) -> tuple[Variant, SizeConditions | None] | None:
        """The variant traced with symbolic sizes and the facts the traces added to the
        capture's ShapeEnv (None: none); None when the symbolic trace fails (then: per size).
        The facts of every trace since capture count, not only this one's: the ShapeEnv knows
        them, so this trace may have relied on them without recording them again."""
        began = time.perf_counter()
        user_args = args[:len(args) - len(self.lifted)]
        try:
            trace = trace_joint if training else trace_inference
            variant = self._variant(trace(self.gm, user_args, symbolic=True))
            if isinstance(variant, TrainingVariant):
                # what its compiler assumes is checked per call too; a failure means per size
                variant.compile_backward(fallback=False)
            facts = _compat.guards_since(self.shape_env, self.capture_guards,
                                         self.capture_replacements)
            conditions = SizeConditions(facts, variant.joint.size_symbols) if facts else None
        except Exception as err:  # noqa: BLE001 - the per-size traces give eager's answer
            reason = error_line(err)
            log.info("kiln: a graph with symbolic sizes is traced per size: the symbolic "
                     "autograd trace failed (%s)", reason)
            log.debug("the symbolic autograd trace's failure", exc_info=True)
            records.emit("per_size", f"autograd stage: {reason}")
            return None
        log.debug("compiled %s variant with symbolic sizes in %.3f s%s",
                  "training" if training else "inference", time.perf_counter() - began,
                  f"; it holds where {conditions}" if conditions is not None else "")
        return variant, conditions

    def _compile_static(self, args: list, training: bool) -> Callable[[list], Any]:
        start = time.perf_counter()
        user_args = args[:len(args) - len(self.lifted)]
        try:
            trace = trace_joint if training else trace_inference
            joint = trace(self.gm, user_args)
        except AutogradUnsupported as err:
            warn_once(("autograd-refused", id(self.gm), str(err)),
                      f"kiln: the autograd stage refused a graph; running it eagerly. {err}",
                      log)
            return EagerVariant(self.gm, len(user_args))
        except RuntimeError as err:
            if not is_leaf_write(err):
                raise
            log.debug("the graph writes into a leaf that requires grad; eager raises: %s", err)
            return EagerVariant(self.gm, len(user_args))  # raises eager's own error
        variant = self._variant(joint)
        log.debug("compiled %s variant in %.3f s", "training" if joint.training else "inference",
                  time.perf_counter() - start)
        return variant

    def _variant(self, joint: JointGraph) -> Variant:
        for joint_pass in self.compilers.joint_passes:
            joint = joint_pass(joint)
        if joint.training:
            return TrainingVariant(joint, self.compilers, self.gm)
        return InferenceVariant(joint, self.compilers, self.gm)


def _fetch(root: torch.nn.Module, dotted: str) -> Any:
    return functools.reduce(getattr, dotted.split("."), root)


def _fake_args(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


class EagerVariant:
    """The captured graph itself, for graphs the autograd stage refused."""

    def __init__(self, gm: torch.fx.GraphModule, num_user_args: int) -> None:
        self.gm = gm
        self.num_user_args = num_user_args

    def __call__(self, args: list) -> Any:
        return self.gm(*args[:self.num_user_args])


class Variant:
    """What training and inference share: the aliasing check and the epilogue."""

    def __init__(self, joint: JointGraph, gm: torch.fx.GraphModule) -> None:
        self.joint = joint
        self.eager = EagerVariant(gm, joint.num_primals - len(joint.lifted_attrs)
                                  - len(joint.synthetic_bases))
        self.members = {base.index: set(base.members) for base in joint.synthetic_bases}
        self.epilogue = Epilogue.of(joint)

    def prepare(self, args: list) -> list | None:
        """The call's arguments followed by its synthetic bases; None when the inputs alias
        differently from the traced ones (the graph then runs eagerly)."""
        if self.joint.synthetic_bases:
            built = [base.build(args) for base in self.joint.synthetic_bases]
            if any(base is None for base in built):
                warn_once(("autograd-base", id(self)),
                          "kiln: inputs that shared memory when the graph was compiled do not at "
                          "this call; running the graph eagerly", log)
                return None
            args = [*args, *built]
        return None if self.aliases_mutated_input(args) else args

    def aliases_mutated_input(self, args: list) -> bool:
        """Mutated inputs must not share memory with other inputs (it was so at trace time;
        nothing guards it between calls), except a synthetic base with its members."""
        if not self.joint.mutated_inputs:
            return False
        keys = [_compat.storage_key(a) if isinstance(a, torch.Tensor) else None for a in args]
        for i in self.joint.mutated_inputs:
            if any(j != i and keys[j] is not None and keys[j] == keys[i]
                   and j not in self.members.get(i, ())
                   for j in range(len(args))):
                warn_once(("autograd-alias", id(self)),
                          f"kiln: mutated input {self.joint.input_sources[i]} shares memory with "
                          "another input at this call; running the graph eagerly", log)
                return True
        return False


class InferenceVariant(Variant):
    def __init__(self, joint: JointGraph, compilers: Compilers,
                 gm: torch.fx.GraphModule) -> None:
        super().__init__(joint, gm)
        compiler = compilers.inference_compiler or compilers.fw_compiler
        _log_graph("inference", joint.gm)
        _mark_static_inputs(joint.gm, _static_names(joint.gm, joint.static_input_indices))
        self.fn = compiler(joint.gm, _fake_args(joint.gm))

    def __call__(self, args: list) -> Any:
        full = self.prepare(args)
        if full is None:
            return self.eager(args)
        with torch.no_grad():
            outs = self.fn(*full)
        return self.epilogue(full, tuple(outs))


class TrainingVariant(Variant):
    def __init__(self, joint: JointGraph, compilers: Compilers,
                 gm: torch.fx.GraphModule) -> None:
        from kiln.autograd.partition import partition_joint

        super().__init__(joint, gm)
        _log_graph("joint", joint.gm)
        self.partition = partition_joint(joint, policy=compilers.partition_policy)
        _log_graph("forward", self.partition.fw_gm)
        report = self.partition.report()
        records.emit("saved", report)
        if artifact_enabled("aot_graphs"):
            artifact_logger("aot_graphs").info("saved for backward:\n%s", report)
        self.compilers = compilers
        static = _static_names(self.partition.fw_gm, joint.static_input_indices)
        _mark_static_inputs(self.partition.fw_gm, static)
        _mark_static_inputs(self.partition.bw_gm, static)
        self.fw = compilers.fw_compiler(self.partition.fw_gm, _fake_args(self.partition.fw_gm))
        self.bw: Callable[..., Any] | None = None
        self.function = _make_function(self)
        self.num_fw = joint.num_fw_outputs
        user = [info for info in joint.outputs if info.kind != "constant"]
        self.returned = [info.kind == "tensor" for info in user]
        # one entry per Function output slot: the mutated inputs' new values, then the outputs
        slots = [*joint.input_mutations, *user]
        self.differentiable = [info.kind in ("tensor", "mutation") and info.requires_grad
                               for info in slots]
        tangent_slot = {info.tangent: k for k, info in enumerate(slots)
                        if info.tangent is not None}
        self.tangent_slots = [tangent_slot[j] for j in range(joint.num_tangents)]
        self.backward_errors = [(k, info.backward_error) for k, info in enumerate(slots)
                                if info.backward_error]
        self.grad_tangents = _tangents_per_output(self.partition.bw_gm, joint.num_tangents)
        self.saved_needs = _tangents_per_saved(self.partition.bw_gm, joint.num_tangents)
        self.unreached = _inputs_reaching_no_output(self.partition.fw_gm, self.num_fw)
        # symbolic sizes: the tangents' layouts for the sizes of each call
        self.tangent_layouts = SizeFunction(
            [(spec.shape, spec.stride, spec.storage_offset) for spec in joint.tangent_specs],
            joint.size_symbols) if joint.symbolic else None

    def __call__(self, args: list) -> Any:
        full = self.prepare(args)
        if full is None:
            return self.eager(args)
        views: list[_ViewOfIntermediate] = []
        outs = self.function.apply(views, *_detached(full, self.unreached))
        return self.epilogue(full, _view_again(outs, views))

    # -- autograd.Function bodies --------------------------------------------------------------
    def forward(self, ctx: Any, views: list, args: tuple) -> tuple:
        results = tuple(self.fw(*args))
        outs, saved = results[:self.num_fw], results[self.num_fw:]
        # the epilogue overwrites mutated inputs: what the backward reads of one is cloned, also
        # where the compiled forward hands it back as a view (the kiln wrapper's as_strided of
        # an input, made here under no_grad: unpacking it after the epilogue's write raised
        # "a view was created in no_grad mode ...", fuzz --grad seed 3600659)
        mutated = {_compat.storage_key(args[i]) for i in self.joint.mutated_inputs
                   if isinstance(args[i], torch.Tensor)}
        saved = tuple(layout_keeping_clone(s) if isinstance(s, torch.Tensor) and
                      _compat.storage_key(s) in mutated else s for s in saved)
        ctx.tangent_specs = self._tangent_specs(args)
        # A saved graph input is held as it is, with its version: the program may write it in
        # place later, and only a backward that reads it must refuse then, as eager's own
        # nodes each check only what they saved (save_for_backward would check every saved
        # tensor on any backward: fuzz seed 3501465 with --grad, `t = layer_norm(x); y = -x;
        # <break>; x.clamp_(-1, 1)` raised for a gradient that needs only `-x`).
        inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}
        ctx.slots = [_INPUT if isinstance(v, torch.Tensor) and id(v) in inputs else
                     _TENSOR if isinstance(v, torch.Tensor) else _OTHER for v in saved]
        ctx.saved_inputs = [(v, v._version) for v, kind in zip(saved, ctx.slots)
                            if kind is _INPUT]
        ctx.others = [v for v, kind in zip(saved, ctx.slots) if kind is _OTHER]
        ctx.save_for_backward(*(v for v, kind in zip(saved, ctx.slots) if kind is _TENSOR))
        ctx.set_materialize_grads(False)
        num_mutated = len(self.joint.mutated_inputs)
        returned = [*outs[:num_mutated],
                    *(o if keep else None for o, keep in zip(outs[num_mutated:], self.returned))]
        views.extend(_bases_for_views(returned, num_mutated))
        ctx.views = tuple(views)
        for view in views:  # the hidden base in its view's slot, or None beside a returned base
            returned[view.slot] = returned[view.slot]._base if view.base_slot == view.slot \
                else None
        frozen = [o for o, diff in zip(returned, self.differentiable)
                  if isinstance(o, torch.Tensor) and not diff]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return tuple(returned)

    def compile_backward(self, fallback: bool = True) -> Callable[..., Any]:
        """The compiled backward graph, compiled on first use. `fallback`: a failure runs the
        traced graph's ATen ops instead (with a warning) unless errors are not suppressed; off
        where the caller has a better answer to a failure (a symbolic variant: per size)."""
        if self.bw is None:
            bw_gm = self.partition.bw_gm
            _log_graph("backward", bw_gm)
            try:
                self.bw = self.compilers.bw_compiler(bw_gm, _fake_args(bw_gm))
            except Exception as err:
                if not (fallback and config.suppress_errors):
                    raise
                # the forward already ran compiled: its saved tensors fit the traced backward
                # graph, which torch's own kernels can run op by op
                log.warning("kiln: compiling a backward graph failed (%s); it runs as its "
                            "traced ATen ops (eager kernels) instead. Set KILN_SUPPRESS_ERRORS=0 "
                            "to raise.", error_line(err)[:240])
                self.bw = bw_gm
        return self.bw

    def _tangent_specs(self, args: tuple) -> tuple[TensorSpec, ...]:
        if self.tangent_layouts is None:
            return self.joint.tangent_specs
        return tuple(dataclasses.replace(spec, shape=shape, stride=stride, storage_offset=offset)
                     for spec, (shape, stride, offset)
                     in zip(self.joint.tangent_specs, self.tangent_layouts(args)))

    def backward(self, ctx: Any, grads: tuple) -> tuple:
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                "double backward (create_graph=True) through a compiled graph is not supported",
                hint="call backward without create_graph, or run this code without kiln")
        if all(g is None for g in grads):
            # autograd still calls a node every incoming gradient of which is None (a later
            # graph returned None for the input this one's output became); eager's nodes are
            # never reached then, so neither read nor check what they saved (a saved output
            # the program wrote in place since: fuzz seed 4102250 with --grad)
            return tuple(None for _ in self.grad_tangents)
        for slot, message in self.backward_errors:
            if grads[slot] is not None:  # eager's backward reads an overwritten saved tensor
                raise RuntimeError(message)
        grads = _view_gradients(grads, ctx.views)
        reached = sum(1 << j for j, slot in enumerate(self.tangent_slots)
                      if grads[slot] is not None)
        args = _saved(ctx, [needs & reached for needs in self.saved_needs]) + [
            _coerce(grads[slot], spec)
            for slot, spec in zip(self.tangent_slots, ctx.tangent_specs)]
        # eager frees each node's saved tensors once it ran; here one node runs the whole
        # backward, so let go of ctx's references (not under retain_graph) and hand ours to
        # the wrapper, which drops each saved activation after its last reader
        ctx.maybe_clear_saved_tensors()
        bw = self.compile_backward()
        boxed = getattr(bw, "call_boxed", None)
        outs = boxed(args) if boxed is not None else bw(*args)
        # an input whose gradient reads only tangents no gradient reached gets None, as in
        # eager (autograd never reaches it), not zeros
        return tuple(None if needs and not needs & reached else grad
                     for grad, needs in zip(outs, self.grad_tangents))


_TENSOR, _INPUT, _OTHER = "tensor", "input", "other"  # how the forward kept a saved value


def _saved(ctx: Any, needed: list[int]) -> list:
    """The forward's saved values in order: tensors from ctx.saved_tensors, graph inputs as
    held (`needed[k]`: value k feeds a gradient this backward computes, so an input written
    in place since must refuse, with eager's error), others from ctx.others."""
    tensors, inputs, others = iter(ctx.saved_tensors), iter(ctx.saved_inputs), iter(ctx.others)
    values = []
    for kind, need in zip(ctx.slots, needed):
        if kind is _INPUT:
            value, version = next(inputs)
            if need and value._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: [{value.type()} {list(value.shape)}], an input "
                    f"of a kiln-compiled graph, is at version {value._version}; expected "
                    f"version {version} instead.")
            values.append(value)
        else:
            values.append(next(tensors) if kind is _TENSOR else next(others))
    return values


def _tangents_per_saved(bw_gm: torch.fx.GraphModule, num_tangents: int) -> list[int]:
    """Per saved value (the backward graph's leading placeholders), the tangents whose
    gradients read it: a backward that reaches none of them computes nothing from it that
    counts. Value k counts for the nodes that take a tangent and read k directly, or through
    nodes that take no tangent (recomputation); a node whose tangents were not reached adds
    zero (the gradient of outputs no loss used), so what it reads does not count. An output
    computed from saved values alone counts always."""
    placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    num_saved = len(placeholders) - num_tangents
    saved = {n: 1 << k for k, n in enumerate(placeholders[:num_saved])}
    tangents = {n: 1 << j for j, n in enumerate(placeholders[num_saved:])}
    reads: dict[torch.fx.Node, int] = dict(saved)  # saved values a tangent-free node reads
    needs = [0] * num_saved

    def add(mask_of_saved: int, wanting: int) -> None:
        for k in range(num_saved):
            if mask_of_saved >> k & 1:
                needs[k] |= wanting

    for node in bw_gm.graph.nodes:
        if node.op == "placeholder":
            continue
        inputs = node.all_input_nodes
        if node.op == "output":
            for out in inputs:
                if not tangents.get(out, 0):
                    add(reads.get(out, 0), ~0)
            continue
        mask = functools.reduce(operator.or_, (tangents.get(i, 0) for i in inputs), 0)
        if mask:
            tangents[node] = mask
            add(functools.reduce(operator.or_, (reads.get(i, 0) for i in inputs
                                                if not tangents.get(i, 0)), 0), mask)
        else:
            reads[node] = functools.reduce(operator.or_, (reads.get(i, 0) for i in inputs), 0)
    return needs


def _make_function(variant: TrainingVariant) -> type:
    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, views: list, *args: Any) -> Any:
            return variant.forward(ctx, views, args)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            return (None, *variant.backward(ctx, grads))

    return CompiledFunction


def _inputs_reaching_no_output(fw_gm: torch.fx.GraphModule, num_outputs: int) -> frozenset[int]:
    """The forward graph's inputs from which no path leads to its first `num_outputs` outputs
    (the mutated inputs' values and the user's outputs; the rest are saved for backward):
    no gradient can flow back to them, as none does in eager."""
    placeholders = [n for n in fw_gm.graph.nodes if n.op == "placeholder"]
    (outputs,) = next(n for n in fw_gm.graph.nodes if n.op == "output").args
    reaching: set[torch.fx.Node] = {o for o in outputs[:num_outputs] if isinstance(o, torch.fx.Node)}
    for node in reversed(list(fw_gm.graph.nodes)):
        if node in reaching:
            reaching.update(node.all_input_nodes)
    return frozenset(i for i, node in enumerate(placeholders) if node not in reaching)


def _detached(args: list, unreached: frozenset[int]) -> list:
    """`args` with the inputs no gradient reaches detached: the Function then holds no autograd
    edge to their history, as eager holds none where no output depends on them. With one, a
    backward asked for other leaves still ran the history's nodes, which read their saved
    tensors: `t = layer_norm(x); <break>; x.clamp_(-1, 1); return x` raised eager's "modified
    by an inplace operation" for layer_norm's saved `x` (fuzz seed 3501465 with --grad)."""
    if not unreached:
        return args
    return [a.detach() if i in unreached and isinstance(a, torch.Tensor) and a.requires_grad
            else a for i, a in enumerate(args)]


def _tangents_per_output(bw_gm: torch.fx.GraphModule, num_tangents: int) -> list[int]:
    """Per output of the backward graph, the tangents it depends on (bit j: tangents_j)."""
    placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    first = len(placeholders) - num_tangents
    needs: dict[torch.fx.Node, int] = {n: 1 << j for j, n in enumerate(placeholders[first:])}
    for node in bw_gm.graph.nodes:
        if node.op != "placeholder":
            needs[node] = functools.reduce(operator.or_, (needs.get(arg, 0)
                                                          for arg in node.all_input_nodes), 0)
    (outputs,) = next(n for n in bw_gm.graph.nodes if n.op == "output").args
    return [needs.get(out, 0) if isinstance(out, torch.fx.Node) else 0 for out in outputs]


@dataclasses.dataclass(frozen=True)
class _ViewOfIntermediate:
    """Returned output `slot` is a view of a tensor made inside the forward; the view is made
    again outside the Function from the output in `base_slot`. Either the slot returns the
    hidden base itself (`base_slot == slot`; the view's gradient is read back out of the base's
    gradient), or the base is another returned output (`base_slot != slot`; the slot returns
    None and the base's gradient already carries the view's part). `reshape`: the view is
    `base.view(size)` (both contiguous, same elements and start), whose backward is a reshape;
    otherwise it is `as_strided(size, stride, base offset + offset)`."""

    slot: int
    base_slot: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    reshape: bool
    base_size: tuple[int, ...]
    base_stride: tuple[int, ...]


def _bases_for_views(returned: list, first: int) -> list[_ViewOfIntermediate]:
    """The outputs (from index `first`, after the mutated inputs) that are views of a tensor made
    inside the forward and can be made again outside from their base. A hidden base several
    outputs view is returned in the slot of one that covers all of it (`t` beside
    `t.unsqueeze(1)`: the wrapper returns both as views of one buffer), the others rebuilt from
    it. Views that cannot be rebuilt exactly (overlapping, dtype-changing or conjugating views,
    a shared hidden base no output covers) are returned as they are: reads are right, and an
    in-place write on them raises, as it does in eager for overlapping views."""
    found: list[_ViewOfIntermediate] = []
    hidden_uses: dict[int, int] = {}
    for o in returned[first:]:
        if isinstance(o, torch.Tensor) and o._base is not None:
            hidden_uses[id(o._base)] = hidden_uses.get(id(o._base), 0) + 1
    slots = {id(o): k for k, o in enumerate(returned) if isinstance(o, torch.Tensor)}
    for k in range(first, len(returned)):  # a shared hidden base: returned where it is whole
        o = returned[k]
        if isinstance(o, torch.Tensor) and o._base is not None and \
                hidden_uses[id(o._base)] > 1 and id(o._base) not in slots and _whole_of(o):
            slots[id(o._base)] = k
    for k in range(first, len(returned)):
        o = returned[k]
        if not isinstance(o, torch.Tensor) or o._base is None or o.dtype != o._base.dtype \
                or o.is_conj() != o._base.is_conj() or o.is_neg() != o._base.is_neg():
            continue  # as_strided keeps the base's conjugate / negative bits, not the view's
        base = o._base
        offset = o.storage_offset() - base.storage_offset()
        reshape = (offset == 0 and o.is_contiguous() and base.is_contiguous()
                   and o.numel() == base.numel())
        geometry = (tuple(o.shape), tuple(o.stride()), offset, reshape,
                    tuple(base.shape), tuple(base.stride()))
        if slots.get(id(base)) == k:  # the output that stands for its shared hidden base
            found.append(_ViewOfIntermediate(k, k, *geometry))
        elif id(base) in slots:
            found.append(_ViewOfIntermediate(k, slots[id(base)], *geometry))
        elif hidden_uses[id(base)] == 1 and not _may_overlap(o):
            found.append(_ViewOfIntermediate(k, k, *geometry))
    return found


def _whole_of(view: torch.Tensor) -> bool:
    """Whether `view` is its base reshaped: every element once, in order, from its start."""
    base = view._base
    return (view.dtype == base.dtype and view.storage_offset() == base.storage_offset()
            and view.numel() == base.numel() and view.is_contiguous() and base.is_contiguous()
            and not (view.is_conj() or view.is_neg()))


def _may_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of `t` may share memory: dims sorted by stride, each must step past
    everything the smaller ones reach. (torch's `_debug_has_internal_overlap` answers "too hard"
    for a step slice such as `t[:, :, ::2]` of a (1, 2, 2) tensor, which then stayed a view made
    inside the Function: fuzz seed 704571.)"""
    reach = 0
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _view_again(outs: tuple, views: list[_ViewOfIntermediate]) -> tuple:
    """The Function's outputs with each view made again outside it (see _ViewOfIntermediate)."""
    if not views:
        return outs
    raw, outs = outs, list(outs)
    for view in views:
        base = raw[view.base_slot]  # the Function's output: a view made above is no base
        if view.reshape:
            outs[view.slot] = base.view(view.size)  # its backward is a reshape, not a scatter
        else:
            outs[view.slot] = base.as_strided(view.size, view.stride,
                                              base.storage_offset() + view.offset)
    return tuple(outs)


def _view_gradients(grads: tuple, views: tuple[_ViewOfIntermediate, ...]) -> tuple:
    """Incoming gradients in the slots the backward graph expects: where the Function returned a
    view's hidden base, the view's gradient is the base gradient read through the view."""
    if not views:
        return grads
    grads = list(grads)
    for view in views:
        grad = grads[view.slot]
        if grad is None or view.base_slot != view.slot:
            continue
        if view.reshape and grad.is_contiguous():
            grads[view.slot] = grad.view(view.size)
            continue
        if tuple(grad.stride()) != view.base_stride:
            grad = torch.empty_strided(view.base_size, view.base_stride, dtype=grad.dtype,
                                       device=grad.device).copy_(grad)
        grads[view.slot] = grad.as_strided(view.size, view.stride,
                                           grad.storage_offset() + view.offset)
    return tuple(grads)


def _coerce(grad: torch.Tensor | None, spec: TensorSpec) -> torch.Tensor:
    """The incoming gradient in the layout the backward graph was traced with (zeros for None,
    a dense copy of an expanded or differently strided gradient, or of one that starts inside
    its storage: compiled backwards may assume the traced storage offset)."""
    if grad is None:
        return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype,
                                   device=spec.device).zero_()
    if grad.dtype != spec.dtype:
        grad = grad.to(spec.dtype)
    if grad.storage_offset() != spec.storage_offset or any(
            size != 1 and have != want
            for size, have, want in zip(spec.shape, grad.stride(), spec.stride)):
        grad = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype,
                                   device=spec.device).copy_(grad)
    return grad


def _static_names(gm: torch.fx.GraphModule, indices: tuple[int, ...]) -> set[str]:
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return {placeholders[i] for i in indices if i < len(placeholders)}


def _mark_static_inputs(gm: torch.fx.GraphModule, names: set[str]) -> None:
    """`gm.meta["static_input_indices"]`: the positions of inputs that keep their address
    between calls (parameters, buffers, module attributes; in a backward graph, the saved ones
    among them), for a backend that may read them in place (CUDA graphs do not copy them)."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    gm.meta["static_input_indices"] = tuple(i for i, name in enumerate(placeholders)
                                            if name in names)


def _log_graph(kind: str, gm: torch.fx.GraphModule) -> None:
    if artifact_enabled("aot_graphs"):
        artifact_logger("aot_graphs").info("%s graph:\n%s", kind,
                                           gm.print_readable(print_output=False))
