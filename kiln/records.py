"""What capture did, as records: graphs compiled, breaks, recompiles. `kiln.explain` collects them;
logs render the same records as they happen."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch.fx

from kiln.diagnostics import GuardRecord, RecompileReason, Unsupported

__all__ = ["AutogradTraceRecord", "DDPPieceRecord", "DDPSplitRecord", "GraphRecord", "Recorder",
           "active_recorders", "emit"]


@dataclasses.dataclass(frozen=True)
class DDPPieceRecord:
    """One piece of a graph split at DDP bucket boundaries: the parameters whose gradients it
    produces (those first used in it), their bytes, and its graph's op targets."""

    params: tuple[str, ...]
    nbytes: int
    ops: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class DDPSplitRecord:
    """A graph captured under DDP and split so each bucket's all-reduce can start while the
    rest of the backward runs (kiln.capture.ddp_split); pieces in forward order, so the last
    piece's gradients are ready first and fill DDP's first bucket."""

    first_bucket_cap: int
    bucket_cap: int
    pieces: tuple[DDPPieceRecord, ...]

    def render(self, op_name: Callable[[Any], str] = str) -> str:
        lines = [f"{len(self.pieces)} pieces (bucket cap {self.bucket_cap} B, first bucket "
                 f"{self.first_bucket_cap} B; backward runs them last to first)"]
        for i, piece in enumerate(self.pieces):
            lines.append(f"  piece {i + 1}: {piece.nbytes} B of parameters, {len(piece.ops)} ops")
            lines.append(f"    params: {', '.join(piece.params) or '(none)'}")
            lines.append(f"    ops: {', '.join(op_name(op) for op in piece.ops)}")
        return "\n".join(lines)


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
    ddp_split: DDPSplitRecord | None = None  # set when the graph was split for DDP buckets


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
    # per graph with symbolic sizes that compiles per size after all: which stage gave up, why
    per_size: list[str] = dataclasses.field(default_factory=list)
    # per CUDA graph recorded (kiln.runtime.cudagraphs): graph, pool and static input bytes
    cudagraphs: list[dict] = dataclasses.field(default_factory=list)


_active: list[Recorder] = []


def active_recorders() -> list[Recorder]:
    return _active


def emit(kind: str, record: Any) -> None:
    for recorder in _active:
        getattr(recorder, kind).append(record)
