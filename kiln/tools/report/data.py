"""`ReportData`: everything one report shows, as plain JSON-able values.

A live run (`collect.collect_report`) fills all of it and saves the run-only part as the debug
dir's report.json; `from_debug_dir` rebuilds it from a debug dir alone (without report.json the
run-only parts — breaks, recompiles, capture times, kernel times — are simply absent).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import torch

from kiln.tools.report.artifacts import REPORT_JSON, GraphArtifacts, read_debug_dir
from kiln.tools.report.ceilings import Ceilings
from kiln.version import __version__

__all__ = ["ReportData", "from_debug_dir", "save_run_json"]

_RUN_FIELDS = ("target", "device", "backend", "mode", "breaks", "recompiles", "captures",
               "kernel_times", "timing_note", "ceilings", "first_call_s", "steady_call_s",
               "notes", "torch_version", "kiln_version", "profile")


@dataclasses.dataclass
class ReportData:
    """target/device/backend/mode: what ran. breaks: `Unsupported` records as dicts, most
    expensive first; recompiles: `RecompileReason` dicts; captures: per captured graph
    {"function", "capture", "backend"} seconds; graphs: the debug dir's graph folders;
    kernel_times: seconds per call by kernel name; timing_note: how they were attributed;
    ceilings: `Ceilings` as a dict (None when not measured); first/steady call seconds; notes:
    anything the reader should know about missing data; bench_table: `kiln bench`'s screen table
    when the report comes from `kiln bench --report` ("" otherwise); profile: eager,
    torch.compile and kiln side by side under torch.profiler (`variants.profile_variants`), or
    {"skipped": why}; None when not recorded."""
    target: str = "?"
    device: str = "?"
    backend: str = "?"
    mode: str | None = None
    breaks: list[dict] = dataclasses.field(default_factory=list)
    recompiles: list[dict] = dataclasses.field(default_factory=list)
    captures: list[dict] = dataclasses.field(default_factory=list)
    graphs: list[GraphArtifacts] = dataclasses.field(default_factory=list)
    kernel_times: dict[str, float] = dataclasses.field(default_factory=dict)
    timing_note: str = ""
    ceilings: dict | None = None
    first_call_s: float | None = None
    steady_call_s: float | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    torch_version: str = torch.__version__
    kiln_version: str = __version__
    debug_dir: str = ""
    live: bool = True
    bench_table: str = ""
    profile: dict | None = None

    @property
    def ceilings_obj(self) -> Ceilings | None:
        return Ceilings(**self.ceilings) if self.ceilings else None

    @property
    def kernels(self) -> list[dict]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def graph_count(self) -> int:
        return len(self.captures) if self.captures else len(self.graphs)

    def run_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _RUN_FIELDS}


def save_run_json(data: ReportData, debug_dir: str) -> str:
    """Write the run-only fields as `<debug_dir>/report.json`; returns the path."""
    os.makedirs(debug_dir, exist_ok=True)
    path = os.path.join(debug_dir, REPORT_JSON)
    with open(path, "w") as f:
        json.dump(data.run_dict(), f, indent=2, default=str)
    return path


def from_debug_dir(debug_dir: str) -> ReportData:
    """A report's data from a debug dir alone (report.json adds what only the run knew)."""
    graphs, run = read_debug_dir(debug_dir)
    known = {k: v for k, v in run.items() if k in _RUN_FIELDS}
    data = ReportData(**known, graphs=graphs, debug_dir=debug_dir, live=False)
    if not run:
        data.notes.append(f"{debug_dir} has no {REPORT_JSON} (it was not written by `kiln "
                          "report`): graph breaks, recompiles, capture times and kernel times "
                          "are not known; run `python -m kiln report TARGET --debug-dir DIR` to "
                          "record them")
    return data
