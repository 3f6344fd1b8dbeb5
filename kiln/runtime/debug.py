"""debug: what a compiled graph shows the user — log artifacts and the `KILN_DEBUG_DIR` folder.

- `KILN_LOGS=output_code`: each kernel's source, then the wrapper.
- `KILN_LOGS=fusion`: the schedule (`kiln.schedule.render_schedule` when the schedule stage has
  it, else one line per step).
- `KILN_DEBUG_DIR=<dir>`: one folder per compiled graph with `aten_graph.py`, `ir.py`,
  `schedule.txt`, `kernels/<name>.py`, `wrapper.py`, `kernels.json`, `fusion.json`,
  `timings.json` (fields in docs/runtime.md). Everything is built from the records the stages
  keep (IR nodes, origins, specs), never parsed back out of text.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch

from kiln.lower.index import size_hint
from kiln.lower.ir import ExternKernel, Fallback, TensorArg
from kiln.logs import artifact_enabled, artifact_logger
from kiln.schedule import FusedGroup

__all__ = ["fusion_record", "kernel_records", "render_schedule", "report_artifact"]


def report_artifact(artifact: Any, gm: torch.fx.GraphModule | None) -> str | None:
    """Log the enabled artifacts and write the debug folder (returns it, or None when off)."""
    if artifact_enabled("output_code"):
        logger = artifact_logger("output_code")
        for spec in artifact.specs:
            logger.info("kernel %s (%s):\n%s", spec.name, artifact.name, spec.source)
        logger.info("wrapper (%s):\n%s", artifact.name, artifact.wrapper.source)
    if artifact_enabled("fusion") and artifact.schedule is not None:
        artifact_logger("fusion").info("schedule (%s):\n%s", artifact.name,
                                       render_schedule(artifact.schedule))
    return dump_artifact(artifact, gm)


def dump_artifact(artifact: Any, gm: torch.fx.GraphModule | None) -> str | None:
    from kiln.dump import new_dump_folder, write_dump

    folder = new_dump_folder(artifact.name)
    if folder is None:
        return None
    schedule = artifact.schedule
    files = {
        "aten_graph.py": gm.print_readable(print_output=False) if gm is not None else "",
        "ir.py": str(schedule.graph),
        "schedule.txt": render_schedule(schedule) + "\n",
        "wrapper.py": artifact.wrapper.source,
        "kernels.json": _json(kernel_records(artifact)),
        "fusion.json": _json(fusion_record(artifact)),
        "timings.json": _json(artifact.timings),
    }
    for spec in artifact.specs:
        files[f"kernels/{spec.name}.py"] = spec.source
    write_dump(folder, files)
    return folder


def _json(value: Any) -> str:
    # a symbolic size (an index `Expr`) is written as its source text: `s0*64`
    return json.dumps(value, indent=1, default=str) + "\n"


def render_schedule(schedule: Any) -> str:
    """The schedule stage's rendering, or one line per step when it has none yet."""
    import kiln.schedule as stage

    render = getattr(stage, "render_schedule", None)
    if callable(render):
        return render(schedule)
    lines = []
    for step in schedule.steps:
        if isinstance(step, FusedGroup):
            lines.append(f"{step.name}: [{', '.join(n.name for n in step.nodes)}] "
                         f"x={list(step.x_ranges)} r={list(step.r_ranges)} "
                         f"stores={list(step.stores)}")
        else:
            lines.append(f"{step.name}: {_step_kind(step)}")
    for d in schedule.decisions:
        if not d.fused:
            lines.append(f"not fused {d.a} -> {d.b}: {d.reason}")
    return "\n".join(lines)


# -- kernels.json ----------------------------------------------------------------------------------

def kernel_records(artifact: Any) -> list[dict]:
    """One record per step in execution order (fields in docs/runtime.md)."""
    schedule = artifact.schedule
    specs = {g.name: s for g, s in zip(schedule.groups, artifact.specs)}
    graph = schedule.graph
    out = []
    for step in schedule.steps:
        if isinstance(step, FusedGroup):
            out.append(_group_record(step, specs[step.name], graph))
        else:
            out.append(_extern_record(step, graph))
    return out


def _provenance(origins: Any) -> dict:
    ops, nodes, lines = [], [], []
    for o in origins:
        for values, item in ((nodes, o.node), (ops, o.op.split("/")[0]), (lines, o.user_location)):
            if item and item not in values:
                values.append(item)
    return {"nodes": nodes, "ops": ops, "user_locations": lines}


def _buffer_bytes(graph: Any, name: str) -> int:
    buf = graph.buffers.get(name)
    return 0 if buf is None else size_hint(buf.layout.numel) * buf.dtype.itemsize


def _group_record(group: FusedGroup, spec: Any, graph: Any) -> dict:
    from kiln.schedule.gemm_epilogue import GemmGroup, matmul_flops

    moved = sum(_buffer_bytes(graph, n) for n in dict.fromkeys(spec.args))
    flops = matmul_flops(group.gemm) if isinstance(group, GemmGroup) else 0
    # a kernel with symbolic sizes is recorded at the example's sizes
    return {"name": spec.name, "kind": spec.kind, "numel": size_hint(spec.numel),
            "rnumel": size_hint(spec.rnumel), "bytes": moved, "flops": flops,
            **_provenance(group.origins), "source": f"kernels/{spec.name}.py"}


def _step_kind(node: ExternKernel) -> str:
    if isinstance(node, Fallback):
        return f"fallback:{str(node.op).removeprefix('aten.')}"
    return f"extern:{node.kind}"


def _extern_record(node: ExternKernel, graph: Any) -> dict:
    views = {(a.name, a.size, a.stride, a.offset): a for a in node.tensor_args()}
    moved = sum(math.prod(size_hint(n) for n in a.size) * a.dtype.itemsize for a in views.values())
    moved += sum(_buffer_bytes(graph, o.name) for o in node.output_buffers())
    outs = node.output_buffers()
    numel = outs[0].layout.numel if outs else 0
    return {"name": node.name, "kind": _step_kind(node), "numel": size_hint(numel),
            "rnumel": _reduction_size(node), "bytes": int(moved), "flops": _flops(node),
            **_provenance(node.origins), "source": None}


def _matmul_dims(node: ExternKernel) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of an mm / addmm / bmm call (symbolic sizes at the example's)."""
    args = [_at_hints(a) for a in node.args if isinstance(a, TensorArg)]
    if node.kind == "mm" and len(args) >= 2:
        (m, k), (_, n) = args[0].size, args[1].size
        return 1, m, n, k
    if node.kind == "addmm" and len(args) >= 3:
        (m, k), (_, n) = args[1].size, args[2].size
        return 1, m, n, k
    if node.kind == "bmm" and len(args) >= 2:
        (b, m, k), (_, _, n) = args[0].size, args[1].size
        return b, m, n, k
    return None


def _at_hints(arg: TensorArg) -> Any:
    """`arg` with its sizes as ints (a symbolic one at the example's size)."""
    return dataclasses.replace(arg, size=tuple(size_hint(n) for n in arg.size))


def _reduction_size(node: ExternKernel) -> int:
    dims = _matmul_dims(node)
    return dims[3] if dims else 1


def _flops(node: ExternKernel) -> int:
    """2·M·N·K per matmul; attention forward = two matmuls (4·B·H·Lq·Lk·D); others 0."""
    dims = _matmul_dims(node)
    if dims:
        b, m, n, k = dims
        return 2 * b * m * n * k
    args = [_at_hints(a) for a in node.args if isinstance(a, TensorArg)]
    if node.kind == "attention" and len(args) >= 3 and len(args[0].size) == 4:
        b, h, lq, d = args[0].size
        return 4 * b * h * lq * args[1].size[2] * d
    return 0


# -- fusion.json -----------------------------------------------------------------------------------

def fusion_record(artifact: Any) -> dict:
    schedule = artifact.schedule
    groups = []
    for group, spec in zip(schedule.groups, artifact.specs):
        prov = _provenance(group.origins)
        groups.append({"name": group.name, "kernel": spec.name,
                       "buffers": [n.name for n in group.nodes], "ops": prov["ops"],
                       "nodes": prov["nodes"]})
    not_fused = [{"a": d.a, "b": d.b, "reason": d.reason} for d in schedule.decisions
                 if not d.fused]
    return {"groups": groups, "not_fused": not_fused}
