"""The saved-bytes report of a forward/backward partition: what the forward keeps alive for the
backward, how big it is, and why each value was saved rather than recomputed.

Input: `SavedValue` records built by the partitioner (never parsed back out of logs). Output: plain
text for `PartitionResult.report()`, `kiln.explain` and the `aot_graphs` log artifact. This module
only formats; it never inspects graphs.

Reasons, in the order the partitioner decides them:
    parameter / input   a graph input (free to save: it is alive anyway)
    random              a random op: recomputing it would draw different numbers
    compute-heavy       a matmul/convolution/attention: too expensive to run twice
    reduction           a reduction that shrinks its input more than 4x: recomputing it needs the
                        bigger input saved instead
    not-recomputable    an op outside the recompute allowlist (custom ops, batch norm, ...)
    min-cut             chosen by the minimum cut as the cheapest set to save
    default             the eager-like partition saves every forward value the backward reads
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "REASONS",
    "SavedValue",
    "format_bytes",
    "format_comparison",
    "format_saved_report",
]

REASONS: tuple[str, ...] = (
    "parameter", "input", "random", "compute-heavy", "reduction", "not-recomputable",
    "min-cut", "default",
)


@dataclass(frozen=True)
class SavedValue:
    """One value the forward graph returns for the backward.

    name:   the node's name in the joint, forward and backward graphs
    op:     the ATen op that produced it ("placeholder" for graph inputs)
    shape:  its shape, or None for a non-tensor value (a Python scalar)
    dtype:  its dtype without the "torch." prefix, or the Python type name
    nbytes: numel * element size (8 for a scalar)
    reason: one of REASONS
    """

    name: str
    op: str
    shape: tuple[int, ...] | None
    dtype: str
    nbytes: int
    reason: str


def format_bytes(n: int) -> str:
    """`n` bytes in the largest binary unit that keeps it >= 1: '512 B', '1.50 KiB', '3.00 MiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return "scalar" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def format_saved_report(saved: Sequence[SavedValue], *, policy: str,
                        recomputed: Sequence[str] = (), title: str = "saved for backward") -> str:
    """A table with one line per saved value, then totals by reason and the recomputed nodes."""
    total = sum(v.nbytes for v in saved)
    lines = [f"{title} ({policy} partition): {len(saved)} values, {format_bytes(total)}"]
    rows = [(v.name, v.op, _shape_text(v.shape), v.dtype, format_bytes(v.nbytes), v.reason)
            for v in saved]
    header = ("name", "op", "shape", "dtype", "bytes", "why saved")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    by_reason: dict[str, int] = {}
    for v in saved:
        by_reason[v.reason] = by_reason.get(v.reason, 0) + v.nbytes
    if by_reason:
        parts = [f"{r} {format_bytes(by_reason[r])}" for r in REASONS if r in by_reason]
        lines.append("  by reason: " + ", ".join(parts))
    activations = sum(v.nbytes for v in saved if v.reason not in ("parameter", "input"))
    lines.append(f"  activations (excluding graph inputs): {format_bytes(activations)}")
    if recomputed:
        lines.append(f"  recomputed in backward ({len(recomputed)}): " + ", ".join(recomputed))
    return "\n".join(lines)


def format_comparison(reports: dict[str, Sequence[SavedValue]]) -> str:
    """One line per policy: values and bytes saved, and the ratio to the first policy given."""
    base = None
    lines = []
    for policy, saved in reports.items():
        total = sum(v.nbytes for v in saved)
        base = total if base is None else base
        ratio = f"{total / base:.3f}x" if base else "n/a"
        lines.append(f"{policy}: {len(saved)} values, {format_bytes(total)} ({ratio})")
    return "\n".join(lines)
