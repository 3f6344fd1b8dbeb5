"""joint: the records of the joint trace, which the partitioner and the runtime read.

`JointGraph` is the autograd stage's functional ATen graph with what the runtime needs to call it
(`OutputInfo` per output, `TensorSpec` per tangent); `RawTrace` is stage 1's mutating graph as
stage 2 receives it (`trace.py` makes it, `functionalize.py` turns it into a `JointGraph`);
`AutogradUnsupported` is how the stage refuses a graph. Below the tracer and both stages, so
they share these records without importing each other.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln.errors import KilnError

if TYPE_CHECKING:
    from kiln.autograd.mutation import SyntheticBase

__all__ = ["AutogradUnsupported", "JointGraph", "OutputInfo", "RawTrace", "TensorSpec"]


class AutogradUnsupported(KilnError):
    """A graph the autograd stage refuses (the backend then runs it eagerly, never wrongly)."""

    stage = "autograd"


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
    view_dtype: torch.dtype | None = None  # an input view of another dtype (view_as_complex)


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
    call's members) after the other inputs.
    size_symbols: for a graph traced with symbolic sizes (`symbolic.py`), where each symbol of
    its `meta["val"]`s, tensor specs and views lives in a call's primals; None when static."""

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
    size_symbols: Any = None  # a symbolic.SizeSymbols (symbolic imports this module)

    @property
    def symbolic(self) -> bool:
        return self.size_symbols is not None

    @property
    def num_user_outputs(self) -> int:
        return self.num_fw_outputs - len(self.mutated_inputs)


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
    symbolic: bool = False  # traced with symbolic sizes (see JointGraph.size_symbols)
