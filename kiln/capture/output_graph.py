"""OutputGraph: the torch-level FX graph one trace builds, with fake-tensor propagation.

Every node is computed on FakeTensors as it is created, so shapes, dtypes and Python-level facts
(`x.dim()`, `x.requires_grad`) are known while tracing. Tensors read from the frame (arguments,
parameters, buffers, globals) become placeholders, one per distinct real tensor, each recording
its source. Nodes carry the user line (`meta["user_location"]`, `meta["stack_trace"]`).
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import torch
import torch.fx

from kiln.capture import _compat
from kiln.config import config
from kiln.capture.dynamic_dims import DynamicPolicy
from kiln.capture.guards import Constants, GuardSet
from kiln.capture.shape_guards import INT_ARGUMENT_MAX, SymbolicInputs
from kiln.capture.sources import NumberTensor, Source
from kiln.capture.unsupported import unsupported

if TYPE_CHECKING:
    from kiln.capture.variables.scalars import SymScalarVT
    from kiln.capture.variables.tensor import TensorVT

__all__ = ["OutputGraph", "GraphInput", "unbacked_guard_break"]


class GraphInput:
    """One placeholder: the real tensor seen at compile time and where to read it from."""

    def __init__(self, node: torch.fx.Node, source: Source, example: torch.Tensor) -> None:
        self.node = node
        self.source = source
        self.example = example


class OutputGraph:
    def __init__(self, consts: Constants | None = None,
                 dynamic_scalars: frozenset[str] = frozenset(), trace_numpy: bool = True,
                 dynamic: DynamicPolicy | None = None) -> None:
        self.graph = torch.fx.Graph()
        self.fake_mode = _compat.new_symbolic_fake_mode(
            config.capture_dynamic_output_shape_ops, config.capture_scalar_outputs)
        self.dynamic = dynamic if dynamic is not None else DynamicPolicy()
        self.symbolic = SymbolicInputs()  # the symbolic dims of the inputs, for their guards
        self.unbacked: dict[Any, str] = {}  # data-dependent symbol -> what made it (stage D)
        self._size_nodes: dict[tuple, SymScalarVT] = {}
        self.consts = consts if consts is not None else Constants()
        self.guards = GuardSet(self.consts)
        self.inputs: list[GraphInput] = []
        self._input_by_id: dict[int, TensorVT] = {}
        self._vt_by_fake: dict[int, TensorVT] = {}
        self.side_effects: list[Callable[[Any], None]] = []
        # (fake, its version, where) of tensors a replayed logging call reads (logging_calls)
        self.logged_tensors: list[tuple[torch.Tensor, int, Any]] = []
        self._names: dict[str, int] = {}
        self.open_contexts: list[Any] = []  # autocast modes entered by traced code, not yet left
        self.pending_globals: dict[tuple[int, str], Any] = {}
        self.current_tx: Any = None
        self.wrapped: dict[Source, Any] = {}  # one tracker per source read during the trace
        # plain objects by identity: (the object, its tracker), so one read through another path
        # (every layer's `self.config`) is that tracker, behind an `is` guard
        self.objects: dict[int, tuple[Any, Any]] = {}
        self.dynamic_scalars = dynamic_scalars  # source exprs of numbers kept symbolic
        self.scalar_examples: dict[Source, Any] = {}
        self.trace_numpy = trace_numpy  # tensor.numpy() gives traced arrays (variables/ndarray.py)
        self.numpy_traced = False  # this trace did (a failure then retries without it)

    # -- inputs --------------------------------------------------------------------------------
    def input_for(self, value: torch.Tensor, source: Source, python_type: type,
                  module_state: bool = False) -> TensorVT:
        """The tracker for a real tensor read from `source`; one placeholder per tensor object.
        Its dims chosen by the dynamic policy are symbolic (`module_state`: read from a
        module's attributes)."""
        from kiln.capture.variables.tensor import TensorVT
        known = self._input_by_id.get(id(value))
        if known is not None:
            return known
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            unsupported("tensor-subclass", f"{source.name()} is a tensor subclass "
                        f"({type(value).__qualname__}), which capture does not handle yet")
        dims = self.dynamic.dims_for(value, source.expr(), module_state)
        strides = self.dynamic.stride_dims_for(value, source.expr())
        if dims or strides:
            fake = _compat.symbolic_fake(self.fake_mode, value, set(dims), source.ident(),
                                         strides)
            self.symbolic.add(source, fake, module_state, dims)
        else:
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
        node = self._placeholder(source)
        node.meta["val"] = fake
        node.meta["source"] = source.name()
        node.meta["example_kind"] = python_type.__name__
        vt = TensorVT(node, fake, python_type, source)
        self.inputs.append(GraphInput(node, source, value))
        self._input_by_id[id(value)] = vt
        self._vt_by_fake[id(fake)] = vt
        return vt

    def scalar_input(self, value: Any, source: Source, why: str) -> Any:
        """A Python number read from `source` as a graph input (see variables/scalars.py): an
        int in `[2, INT_ARGUMENT_MAX]` is a symbol of the ShapeEnv, like a symbolic size; a
        float, a negative int or one past int32 (a seed, an id) stays value-only, a 0-dim
        tensor input (`variables/number_tensors.py`): arithmetic keeps it symbolic, any other
        use specializes it."""
        from kiln.capture.variables import number_tensors
        from kiln.capture.variables.scalars import SymScalarVT
        if type(value) is int and 2 <= value <= INT_ARGUMENT_MAX:
            node = self._placeholder(source)
            node.meta["source"] = source.name()
            self.inputs.append(GraphInput(node, source, value))
            symbol = _compat.symbolic_int(self.fake_mode, value, source.ident())
            self.symbolic.add_number(source, symbol, why)
            node.meta["val"] = symbol
            return SymScalarVT(node, symbol, (), self)
        wrap = number_tensors.float_tensor if type(value) is float else number_tensors.int_tensor
        example = wrap(value)
        wrapped = NumberTensor(source, self.consts.ref(wrap))
        node = self._placeholder(wrapped)
        node.meta["source"] = source.name()
        node.meta["val"] = fake = self.fake_mode.from_tensor(example, static_shapes=True)
        self.inputs.append(GraphInput(node, wrapped, example))
        self.scalar_examples[source] = value
        return number_tensors.TensorNumberVT(node, value, (source,), self, fake)

    def _placeholder(self, source: Source) -> torch.fx.Node:
        name = self._unique(source.ident())
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:
            return self.graph.placeholder(name)
        with self.graph.inserting_before(first):
            return self.graph.placeholder(name)

    def _unique(self, base: str) -> str:
        count = self._names.get(base, 0)
        self._names[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def symbolic_guards(self) -> None:
        """Add the guards on symbolic sizes (once the trace is done: see `shape_guards`)."""
        for guard in self.symbolic.guards(self.fake_mode):
            self.guards.add(guard)

    def describe_dims(self) -> tuple[str, ...]:
        """For explain: the symbolic input dims and why, then the data-dependent sizes the
        graph still computes (`u0 (data-dependent: Tensor.nonzero at f.py:4)`)."""
        live = {s for n in self.graph.nodes for s in n.meta.get("unbacked_bindings", ())}
        return self.symbolic.describe(self.fake_mode) + \
            tuple(text for symbol, text in self.unbacked.items() if symbol in live)

    def drop_dead_sizes(self, keep: list[torch.fx.Node]) -> None:
        """Erase the size arithmetic nothing uses but the `keep` outputs: a branch's
        `x.shape[0] > 4` was decided at capture and lives on as a guard, not as a node."""
        kept = set(keep)
        for node in reversed(list(self.graph.nodes)):
            if node.op == "call_function" and not node.users and node not in kept and \
                    isinstance(node.meta.get("val"), _compat.SYM_TYPES):
                self.graph.erase_node(node)
                self._size_nodes = {k: v for k, v in self._size_nodes.items() if v.node is not node}

    def size_node(self, tensor: TensorVT, op: Any, args: tuple, value: Any) -> SymScalarVT:
        """A symbolic size of `tensor` read in the graph (`op` is `sym_size.int`, ...): one node
        per (tensor, op, args), the ShapeEnv value as its example."""
        from kiln.capture.variables.scalars import SymScalarVT
        key = (tensor.node, op, args)
        known = self._size_nodes.get(key)
        if known is None:
            node = self.graph.create_node("call_function", op, (tensor.node, *args), {})
            node.meta["val"] = value
            self._attach_location(node)
            known = self._size_nodes[key] = SymScalarVT(node, value, (), self)
        return known

    # -- nodes ---------------------------------------------------------------------------------
    def create_node(self, op: str, target: Any, args: tuple, kwargs: dict,
                    fake_fn: Callable[[], Any]) -> tuple[torch.fx.Node, Any]:
        """Add a node and compute its fake value by calling `fake_fn` under the fake mode."""
        node = self.graph.create_node(op, target, args, kwargs)
        try:
            with self.fake_mode, _compat.symbolic_dispatch(self.has_symbols()):
                value = fake_fn()
        except _compat.DataDependentError as err:
            self.graph.erase_node(node)
            unsupported("data-dependent", f"the result depends on tensor values "
                        f"({type(err).__name__})", hint=_data_dependent_hint(err))
        except _compat.UnbackedGuardError as err:
            self.graph.erase_node(node)
            unbacked_guard_break(err)
        except Exception as err:
            self.graph.erase_node(node)
            unsupported("op-failed", f"{_target_name(target)} failed on the traced values: "
                        f"{type(err).__name__}: {err}", category="user-fixable",
                        hint="run the function eagerly with the same inputs to see the error")
        if self.logged_tensors:
            self._check_logged(node)
        node.meta["val"] = value
        self._attach_location(node)
        self._note_unbacked(node, target, value)
        return node, value

    def _check_logged(self, node: torch.fx.Node) -> None:
        from kiln.capture.variables.logging_calls import check_logged_tensors
        try:
            check_logged_tensors(self)
        except Exception:
            self.graph.erase_node(node)
            raise

    def has_symbols(self) -> bool:
        """Symbolic input sizes or data-dependent ones: fake computations then run under
        torch's Python dispatcher (`_compat.symbolic_dispatch`)."""
        return bool(self.symbolic) or bool(self.unbacked)

    def _note_unbacked(self, node: torch.fx.Node, target: Any, value: Any) -> None:
        """Record the data-dependent symbols an op's result introduced (`nonzero`'s `u0`):
        torch's passes find them through `meta["unbacked_bindings"]`, explain names them."""
        bindings = _compat.bind_unbacked(self.fake_mode, value)
        if not bindings:
            return
        node.meta["unbacked_bindings"] = bindings
        where = node.meta.get("user_location", "")
        for symbol in bindings:
            self.unbacked[symbol] = f"{symbol} (data-dependent: {_origin(target)}" \
                                    f"{' at ' + where if where else ''})"

    def _attach_location(self, node: torch.fx.Node) -> None:
        stack = self.current_tx.location_stack() if self.current_tx is not None else []
        if stack:
            inner = stack[-1]
            node.meta["user_location"] = f"{inner.filename}:{inner.lineno}"
            node.meta["stack_trace"] = "\n".join(loc.render() for loc in stack) + "\n"

    def remember(self, fake: Any, vt: TensorVT) -> None:
        self._vt_by_fake[id(fake)] = vt

    def known(self, fake: Any) -> TensorVT | None:
        return self._vt_by_fake.get(id(fake))

    def call_count(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in ("call_function", "call_method"))


def unbacked_guard_break(err: BaseException) -> NoReturn:
    """A break where the code decides on a data-dependent size or number (`if n > 0:` on a
    `nonzero` count, `x.view(n // 2, 2)`): its value is known only when the graph runs."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    unsupported("data-dependent", f"a decision on a data-dependent size or value ({first})",
                hint="keep the computation in tensors (torch.where, masks) instead of Python "
                     "branches or shapes on the value")


def _data_dependent_hint(err: BaseException) -> str:
    """The flag that captures what broke the graph (torch.compile's flag of the same name)."""
    if _compat.needs_scalar_outputs(err):
        flag, env = "capture_scalar_outputs", "KILN_CAPTURE_SCALAR_OUTPUTS"
    else:
        flag, env = "capture_dynamic_output_shape_ops", "KILN_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS"
    return f"set kiln.config.{flag} = True ({env}=1) to capture it with a data-dependent " \
           "size, or keep the value as a tensor"


def _origin(target: Any) -> str:
    """The op that made a data-dependent size, as the user wrote it (`torch.masked_select`,
    `Tensor.nonzero`, `indexing` for `x[mask]`)."""
    if target is operator.getitem:
        return "indexing"
    if not isinstance(target, str) and \
            (getattr(target, "__module__", "") or "").startswith("torch"):
        return f"torch.{target.__name__}"
    return _target_name(target)


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
