"""Per-kernel numbers from kernels.json, measured times and the machine's ceilings.

achieved bandwidth = bytes / time; achieved FLOP/s = flops / time; arithmetic intensity =
flops / bytes; each as a fraction of the matching ceiling. Missing inputs give None, never 0.
"""
from __future__ import annotations

import dataclasses

from kiln.tools.report.ceilings import Ceilings

__all__ = ["KernelRow", "kernel_rows"]


@dataclasses.dataclass(frozen=True)
class KernelRow:
    """One kernels.json step with its derived numbers (seconds, bytes/s, FLOP/s, fractions)."""
    graph: str
    name: str
    kind: str
    numel: int
    rnumel: int
    bytes: int
    flops: int
    ops: tuple[str, ...]
    user_locations: tuple[str, ...]
    source_text: str
    seconds: float | None
    bandwidth: float | None
    flop_rate: float | None
    intensity: float | None
    bandwidth_fraction: float | None
    flops_fraction: float | None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def kernel_rows(kernels: list[dict], times: dict[str, float],
                ceilings: Ceilings | None) -> list[KernelRow]:
    rows = []
    for k in kernels:
        seconds = times.get(k["name"])
        nbytes, flops = int(k.get("bytes") or 0), int(k.get("flops") or 0)
        bandwidth = _ratio(nbytes, seconds) if nbytes else None
        flop_rate = _ratio(flops, seconds) if flops else None
        rows.append(KernelRow(
            k.get("graph", ""), k["name"], k.get("kind", "?"), int(k.get("numel") or 0),
            int(k.get("rnumel") or 1), nbytes, flops, tuple(k.get("ops") or ()),
            tuple(k.get("user_locations") or ()), k.get("source_text", ""), seconds, bandwidth,
            flop_rate, _ratio(flops, nbytes) if flops and nbytes else None,
            _ratio(bandwidth, ceilings.bandwidth if ceilings else None),
            _ratio(flop_rate, ceilings.flops if ceilings else None)))
    return rows
