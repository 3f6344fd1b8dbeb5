"""What capture did, as records: graphs compiled, breaks, recompiles. `kiln.explain` collects them;
logs render the same records as they happen."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch.fx

from kiln.diagnostics import GuardRecord, RecompileReason, Unsupported

__all__ = ["AutogradTraceRecord", "GraphRecord", "Recorder", "active_recorders", "emit"]


@dataclasses.dataclass
class GraphRecord:
    function: str
    graph: torch.fx.GraphModule | None
    ops: list[Any]
    guards: list[GuardRecord]
    compile_seconds: dict[str, float]
    # the graph's symbolic input dims, each with why: "x.shape[0] (dynamic=True)"; then its
    # data-dependent sizes: "u0 (data-dependent: Tensor.nonzero at f.py:4)"
    dynamic_dims: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class AutogradTraceRecord:
    """One trace of the autograd stage: training or inference, whether it traced symbolic sizes
    (once for every size) or the sizes of `input_shapes` (None for a non-tensor input)."""

    training: bool
    symbolic: bool
    input_shapes: tuple[tuple[int, ...] | None, ...]


@dataclasses.dataclass
class Recorder:
    graphs: list[GraphRecord] = dataclasses.field(default_factory=list)
    breaks: list[Unsupported] = dataclasses.field(default_factory=list)
    recompiles: list[RecompileReason] = dataclasses.field(default_factory=list)
    saved: list[str] = dataclasses.field(default_factory=list)  # autograd saved-bytes reports
    # per compiled ATen graph: the pipeline's seconds per stage (kiln.tools.compile_time)
    pipeline_timings: list[dict[str, float]] = dataclasses.field(default_factory=list)
    # per pass of a stage's pass list: a kiln.passes.PassRecord (name, status, seconds)
    passes: list[Any] = dataclasses.field(default_factory=list)
    # per trace of the autograd stage: an AutogradTraceRecord
    autograd_traces: list[AutogradTraceRecord] = dataclasses.field(default_factory=list)


_active: list[Recorder] = []


def active_recorders() -> list[Recorder]:
    return _active


def emit(kind: str, record: Any) -> None:
    for recorder in _active:
        getattr(recorder, kind).append(record)
