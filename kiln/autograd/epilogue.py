"""epilogue: a compiled graph's raw outputs -> the captured graph's outputs.

A compiled forward or inference graph returns `(*new values of mutated inputs, *tensor
outputs)`. The epilogue writes the new values back into the inputs, then builds each flattened
output of the captured graph (computed, an input itself, a view of an input regenerated from
the real input, a repeat of an earlier output, or a Python constant) and restores the captured
graph's output structure. For a graph traced with symbolic sizes, the geometry of views of
inputs and returned sizes (`x.shape[0] * 3`) are evaluated for each call's sizes.

It is the only code that does this: `CompiledGraph`'s variants call it after their compiled
graph, and the kiln backend's warm start stores an `Epilogue` as plain data
(`output_structure`, `OutputRule` fields) and rebuilds the same object in a new process
(`Epilogue.from_structure`), without tracing.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import torch

from kiln.autograd import _compat
from kiln.autograd.joint import JointGraph, OutputInfo
from kiln.autograd.symbolic import SizeFunction, is_symbolic_value

__all__ = ["OUTPUT_KINDS", "Epilogue", "OutputRule", "WriteBack"]

OUTPUT_KINDS = ("tensor", "input", "input_view", "duplicate", "constant")


@dataclasses.dataclass(frozen=True)
class OutputRule:
    """How the epilogue makes one flattened output of the captured graph.

    kind: "tensor" (the compiled graph's next output), "input" (input `index` itself),
    "input_view" (a view of input `index`: `view` is its (shape, stride, storage offset), the
    offset counted from the input's first element),
    "duplicate" (the same object as output `index`), "constant" (the Python value `value`).
    `dtype`: an input view of another dtype than its input's (`view_as_complex`, `view(dtype)`),
    its geometry counted in elements of that dtype; None: the input's dtype."""

    kind: str
    index: int | None = None
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    value: Any = None
    dtype: torch.dtype | None = None

    @classmethod
    def of(cls, info: OutputInfo) -> OutputRule:
        view = info.view
        geometry = None if view is None else (view.shape, view.stride, view.storage_offset)
        return cls(info.kind, info.index, geometry, info.value, info.view_dtype)


@dataclasses.dataclass(frozen=True)
class WriteBack:
    """Mutated input `index` takes the compiled graph's next leading output; under autograd
    when the write carries a gradient (`requires_grad`), else under no_grad."""

    index: int
    requires_grad: bool


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """`epilogue(args, outs)`: the captured graph's outputs from the inputs of a call and the
    compiled graph's outputs `outs` (see the module docstring). `output_spec`: the pytree spec
    of the captured graph's outputs, one leaf per rule."""

    outputs: tuple[OutputRule, ...]
    output_spec: Any
    write_backs: tuple[WriteBack, ...] = ()
    # symbolic sizes: args -> per rule, (view, value) for the call's sizes (None: as traced)
    sized: Callable[[Sequence[Any]], tuple] | None = dataclasses.field(default=None,
                                                                      compare=False)

    @classmethod
    def of(cls, joint: JointGraph) -> Epilogue:
        write_backs = tuple(WriteBack(i, info.requires_grad)
                            for i, info in zip(joint.mutated_inputs, joint.input_mutations))
        rules = tuple(OutputRule.of(info) for info in joint.outputs)
        sized = None
        if joint.symbolic and any(is_symbolic_value(rule.value) or rule.kind == "input_view"
                                  for rule in rules):
            # views of inputs and returned sizes (`x.shape[0] * 3`) follow each call's sizes
            sized = SizeFunction(tuple((rule.view, rule.value) for rule in rules),
                                 joint.size_symbols)
        return cls(rules, joint.output_spec, write_backs, sized)

    @classmethod
    def from_structure(cls, outputs: Sequence[OutputRule], structure: Any) -> Epilogue:
        """The epilogue (without write-backs) whose `output_structure()` is `structure`."""
        leaves, spec = _compat.tree_flatten(structure)
        if leaves != list(range(len(outputs))):
            raise ValueError("the output structure does not hold each output once, in order")
        return cls(tuple(outputs), spec)

    def output_structure(self) -> Any:
        """The captured graph's output structure with output i's place holding the int i."""
        return _compat.tree_unflatten(list(range(len(self.outputs))), self.output_spec)

    @functools.cached_property
    def passes_outputs_through(self) -> bool:
        """The compiled graph's outputs are the captured graph's, as they are: a tuple of
        computed tensors and nothing to write back (the common case, kept cheap per call)."""
        flat = _compat.tree_flatten(tuple(range(len(self.outputs))))[1]
        return (not self.write_backs and all(o.kind == "tensor" for o in self.outputs)
                and self.output_spec == flat)

    def __call__(self, args: Sequence[Any], outs: tuple) -> Any:
        if self.passes_outputs_through:
            return outs
        self._write_back(args, outs)
        flat: list[Any] = []
        position = len(self.write_backs)
        sized = self.sized(args) if self.sized is not None else None
        for k, rule in enumerate(self.outputs):
            if sized is not None:
                rule = dataclasses.replace(rule, view=sized[k][0], value=sized[k][1])
            flat.append(_output_value(rule, args, outs, position, flat))
            if rule.kind != "constant":
                position += 1
        return _compat.tree_unflatten(flat, self.output_spec)

    def _write_back(self, args: Sequence[Any], outs: tuple) -> None:
        for write, value in zip(self.write_backs, outs):
            target = args[write.index]
            if target is value:
                continue
            with torch.set_grad_enabled(write.requires_grad and torch.is_grad_enabled()):
                target.copy_(value)  # under autograd when the write carries a gradient


def _output_value(rule: OutputRule, args: Sequence[Any], outs: tuple, position: int,
                  flat: list) -> Any:
    if rule.kind == "tensor":
        return outs[position]
    if rule.kind == "input":
        return args[rule.index]
    if rule.kind == "input_view":
        shape, stride, offset = rule.view  # the offset counts from the input's first element
        base = args[rule.index]
        start = base.storage_offset()
        if rule.dtype is not None and rule.dtype != base.dtype:
            start = start * base.element_size() // rule.dtype.itemsize
            base = _storage_as(base, rule.dtype)
        return base.as_strided(shape, stride, start + offset)
    if rule.kind == "duplicate":
        return flat[rule.index]
    return rule.value


def _storage_as(base: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole storage of `base` as a 1-D tensor of `dtype`, still a view of `base` (autograd
    follows it: view_as_real / view_as_complex where the element size changes between a real
    and its complex type)."""
    flat = base.as_strided((base.untyped_storage().nbytes() // base.element_size(),), (1,), 0)
    if flat.is_complex() and not dtype.is_complex:
        flat = torch.view_as_real(flat).flatten()
    elif dtype.is_complex and flat.dtype == dtype.to_real():
        return torch.view_as_complex(flat.view(-1, 2))
    return flat if flat.dtype == dtype else flat.view(dtype)
