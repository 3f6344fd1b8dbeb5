"""OutputGraph: the torch-level FX graph one trace builds, with fake-tensor propagation.

Every node is computed on FakeTensors as it is created, so shapes, dtypes and Python-level facts
(`x.dim()`, `x.requires_grad`) are known while tracing. Tensors read from the frame (arguments,
parameters, buffers, globals) become placeholders, one per distinct real tensor, each recording
its source. Nodes carry the user line (`meta["user_location"]`, `meta["stack_trace"]`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx

from kiln.capture import _compat
from kiln.capture.dynamic_dims import DynamicPolicy
from kiln.capture.guards import Constants, GuardSet
from kiln.capture.shape_guards import SymbolicInputs
from kiln.capture.sources import Source
from kiln.capture.unsupported import unsupported

if TYPE_CHECKING:
    from kiln.capture.variables.scalars import SymScalarVT
    from kiln.capture.variables.tensor import TensorVT

__all__ = ["OutputGraph", "GraphInput"]


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
        self.fake_mode = _compat.new_symbolic_fake_mode()
        self.dynamic = dynamic if dynamic is not None else DynamicPolicy()
        self.symbolic = SymbolicInputs()  # the symbolic dims of the inputs, for their guards
        self._size_nodes: dict[tuple, SymScalarVT] = {}
        self.consts = consts if consts is not None else Constants()
        self.guards = GuardSet(self.consts)
        self.inputs: list[GraphInput] = []
        self._input_by_id: dict[int, TensorVT] = {}
        self._vt_by_fake: dict[int, TensorVT] = {}
        self.side_effects: list[Callable[[Any], None]] = []
        self._names: dict[str, int] = {}
        self.open_contexts: list[Any] = []  # autocast modes entered by traced code, not yet left
        self.pending_globals: dict[tuple[int, str], Any] = {}
        self.current_tx: Any = None
        self.wrapped: dict[Source, Any] = {}  # one tracker per source read during the trace
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
        if dims:
            fake = _compat.symbolic_fake(self.fake_mode, value, set(dims), source.ident())
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

    def scalar_input(self, value: Any, source: Source) -> Any:
        """A Python number read from `source` as a graph input (see variables/scalars.py)."""
        from kiln.capture.variables.scalars import SymScalarVT
        node = self._placeholder(source)
        node.meta["val"] = value
        node.meta["source"] = source.name()
        self.inputs.append(GraphInput(node, source, value))
        self.scalar_examples[source] = value
        return SymScalarVT(node, value, (source,), self)

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
            with self.fake_mode, _compat.symbolic_dispatch(bool(self.symbolic)):
                value = fake_fn()
        except _compat.DataDependentError as err:
            self.graph.erase_node(node)
            unsupported("data-dependent", f"the result depends on tensor values "
                        f"({type(err).__name__})", hint="keep the value as a tensor, or move this "
                        "code out of the compiled function")
        except Exception as err:
            self.graph.erase_node(node)
            unsupported("op-failed", f"{_target_name(target)} failed on the traced values: "
                        f"{type(err).__name__}: {err}", category="user-fixable",
                        hint="run the function eagerly with the same inputs to see the error")
        node.meta["val"] = value
        self._attach_location(node)
        return node, value

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


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
