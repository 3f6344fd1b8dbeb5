"""backward: the backward half of stage 1 — tangents, and autograd.grad traced inside the trace.

`BackwardTrace` makes one tangent per output that needs a gradient (the captured graph's
outputs, then the inputs whose in-place write carries autograd history) and calls
`torch.autograd.grad` under the tracer, so the backward's ATen ops land in the raw joint.

When autograd saved a tensor that the program then wrote in place, eager's forward runs and
eager's backward raises. The first trace then raises `SavedTensorModified`; stage 1 traces again
with `probe`, trying each output's backward alone on fakes, unrecorded (`backward_errors`): the
outputs whose backward would raise keep eager's message instead of a tangent, the runtime
raises it when a gradient reaches them, and the other outputs train as usual.

Never: differentiates through a value eager overwrote.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from kiln.autograd import _compat

if TYPE_CHECKING:
    from kiln.autograd.joint import OutputInfo
    from kiln.autograd.mutation import StandIns

__all__ = ["BackwardTrace", "SavedTensorModified", "backward_errors", "is_saved_tensor_modified",
           "make_tangents", "tangent_strides"]


class SavedTensorModified(Exception):
    """The traced backward read a tensor written in place after autograd saved it."""


class BackwardTrace:
    """The backward half of stage 1: tangents for the outputs and the tracked input mutations
    that need gradients (outputs first, then mutations by input index), and the input grads
    autograd.grad traces. With `probe`, the ones whose eager backward raises get the error."""

    def __init__(self, tracer: Any, primals: list, requires_grad: list[bool],
                 probe: bool) -> None:
        self.tracer = tracer
        self.primals = primals
        self.requires_grad = requires_grad
        self.probe = probe
        self.tangents: list[torch.Tensor] = []
        self.grads: list[Any] = [None] * len(primals)
        self.needed = False

    def run(self, flat: list, outputs: list[OutputInfo], mutations: dict[int, OutputInfo],
            stand_ins: StandIns) -> list[OutputInfo]:
        """Trace the backward; returns `outputs` with tangents (or errors) filled in, and fills
        them into `mutations` in place."""
        keys = [k for k, info in enumerate(outputs) if info.kind == "tensor" and info.requires_grad]
        values = [flat[k] for k in keys] + [stand_ins.tensors[i] for i in mutations]
        self.needed = bool(values)
        wrt = [p for p, rg in zip(self.primals, self.requires_grad) if rg]
        errors = backward_errors(values, wrt, self.tracer) if self.probe else [None] * len(values)
        healthy = [v for v, error in zip(values, errors) if error is None]
        self.tangents = make_tangents(self.tracer, healthy)
        if healthy and wrt:
            try:
                self.grads = _grads(healthy, self.tangents, self.primals, self.requires_grad)
            except RuntimeError as err:
                if self.probe or not is_saved_tensor_modified(err):
                    raise
                raise SavedTensorModified() from err
        numbered = iter(range(len(healthy)))
        updates = [{"backward_error": e} if e else {"tangent": next(numbered)} for e in errors]
        outputs = list(outputs)
        for k, update in zip(keys, updates):
            outputs[k] = dataclasses.replace(outputs[k], **update)
        for i, update in zip(list(mutations), updates[len(keys):]):
            mutations[i] = dataclasses.replace(mutations[i], **update)
        return outputs


def make_tangents(tracer: Any, diff: list[torch.Tensor]) -> list[torch.Tensor]:
    """One `tangents_<j>` placeholder per output in `diff`, laid out by tangent_strides."""
    tracer.paused = True
    try:
        tangents = [torch.empty_strided(o.shape, tangent_strides(o), dtype=o.dtype,
                                        device=o.device) for o in diff]
    finally:
        tracer.paused = False
    for j, t in enumerate(tangents):
        tracer.placeholder(f"tangents_{j}", t)
    return tangents


def tangent_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The output's strides when it is dense (a permutation of a contiguous layout), else
    contiguous strides: gradients of expanded or overlapping outputs are made dense. Symbolic
    sizes: the order of the dims comes from the example's sizes, and the layout counts as dense
    only when it is for every size (no guard is recorded)."""
    shape, stride = tuple(t.shape), tuple(t.stride())
    expected: Any = 1
    for d in sorted(range(t.dim()), key=lambda d: _compat.size_hint(stride[d])):
        if _compat.known_equal(shape[d], 1):
            continue
        if not _compat.known_equal(stride[d], expected):
            return _contiguous_strides(shape)
        expected *= shape[d]
    return stride


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= size if isinstance(size, torch.SymInt) else max(size, 1)  # symbolic: >= 2
    return tuple(reversed(strides))


def _grads(diff: list, tangents: list, primals: list, requires_grad: list[bool]) -> list[Any]:
    wrt = [p for p, rg in zip(primals, requires_grad) if rg]
    got = iter(torch.autograd.grad(diff, wrt, tangents, allow_unused=True) if wrt else ())
    return [next(got) if rg else None for rg in requires_grad]


def is_saved_tensor_modified(err: BaseException) -> bool:
    """Autograd's error for a saved tensor written in place after it was saved."""
    return isinstance(err, RuntimeError) and \
        "modified by an inplace operation" in str(err)


def backward_errors(outputs: list[torch.Tensor], wrt: list[torch.Tensor],
                    tracer: Any) -> list[str | None]:
    """For each output alone: eager's error if its backward reads a saved tensor that was
    written in place afterwards, else None. Runs on fakes with the tracer paused (nothing is
    recorded) and keeps the autograd graph for the real backward trace."""
    found: list[str | None] = []
    tracer.paused = True
    try:
        for out in outputs:
            seed = torch.empty_strided(out.shape, tangent_strides(out), dtype=out.dtype,
                                       device=out.device)
            try:
                if wrt:
                    torch.autograd.grad([out], wrt, [seed], retain_graph=True, allow_unused=True)
                found.append(None)
            except RuntimeError as err:
                if not is_saved_tensor_modified(err):
                    raise
                found.append(str(err).strip())
    finally:
        tracer.paused = False
    return found
