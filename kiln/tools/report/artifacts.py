"""Read a `KILN_DEBUG_DIR`: one `GraphArtifacts` per compiled-graph folder, whatever files it has.

The runtime writes, per graph folder, `kernels.json`, `fusion.json`, `timings.json`,
`schedule.txt`, `kernels/<name>.py` and `wrapper.py` (see docs/report.md for the fields read);
capture writes `graph.py`, `guards.txt`, `entry.py` and `bytecode.txt`. A folder with only some of
them (a backend that generates no kernels, an older run) still reads: missing parts are empty and
`GraphArtifacts.files` says what was there. `report.json` at the root (written by `kiln report`)
holds what only a live run knows: breaks, recompiles, capture times, kernel times, ceilings.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

__all__ = ["ARTIFACT_FILES", "GraphArtifacts", "read_debug_dir", "REPORT_JSON"]

log = logging.getLogger("kiln.tools.report")

ARTIFACT_FILES = ("kernels.json", "fusion.json", "timings.json", "schedule.txt", "wrapper.py",
                  "graph.py", "aten_graph.py", "ir.py", "guards.txt", "entry.py")
REPORT_JSON = "report.json"


@dataclasses.dataclass
class GraphArtifacts:
    """One graph folder. name: the folder name (`<n>_<graph name>`); kernels: kernels.json's
    entries (each gains "graph" and, when its source file exists, "source_text"); fusion:
    fusion.json ({"groups": [], "not_fused": []} when absent); timings: timings.json (seconds per
    stage); schedule: schedule.txt's text; files: the artifact files present."""
    name: str
    path: str
    kernels: list[dict] = dataclasses.field(default_factory=list)
    fusion: dict = dataclasses.field(default_factory=lambda: {"groups": [], "not_fused": []})
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    schedule: str = ""
    files: list[str] = dataclasses.field(default_factory=list)

    @property
    def has_kernel_data(self) -> bool:
        return "kernels.json" in self.files


def _read_json(path: str, default: Any) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        log.warning("kiln report: cannot read %s (%s); treating it as missing", path, exc)
        return default


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _is_graph_folder(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in ARTIFACT_FILES)


def _graph_folders(root: str) -> list[str]:
    """Folders holding artifacts: direct children of `root`, or their children one level down
    (a backend may nest forward/backward graphs under the capture folder)."""
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            continue
        if _is_graph_folder(path):
            found.append(path)
        found.extend(os.path.join(path, sub) for sub in sorted(os.listdir(path))
                     if sub != "kernels" and os.path.isdir(os.path.join(path, sub))
                     and _is_graph_folder(os.path.join(path, sub)))
    return found


def _read_graph(root: str, path: str) -> GraphArtifacts:
    name = os.path.relpath(path, root)
    files = [f for f in ARTIFACT_FILES if os.path.exists(os.path.join(path, f))]
    kernels = _read_json(os.path.join(path, "kernels.json"), [])
    for kernel in kernels:
        kernel["graph"] = name
        source = kernel.get("source")
        if source:
            kernel["source_text"] = _read_text(os.path.join(path, source))
    fusion = _read_json(os.path.join(path, "fusion.json"), {})
    fusion = {"groups": list(fusion.get("groups", [])),
              "not_fused": list(fusion.get("not_fused", []))}
    timings = {k: float(v) for k, v in _read_json(os.path.join(path, "timings.json"), {}).items()
               if isinstance(v, (int, float))}
    return GraphArtifacts(name, path, kernels, fusion, timings,
                          _read_text(os.path.join(path, "schedule.txt")), files)


def read_debug_dir(root: str) -> tuple[list[GraphArtifacts], dict]:
    """The graph folders under `root` in order, and report.json's contents ({} if absent)."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"kiln report: no debug dir {root!r} (hint: run with "
                                "KILN_DEBUG_DIR=<dir> or `python -m kiln report --debug-dir "
                                "<dir>`)")
    graphs = [_read_graph(root, p) for p in _graph_folders(root)]
    return graphs, _read_json(os.path.join(root, REPORT_JSON), {})
