"""schedule_text: the schedule as readable text (`KILN_LOGS=fusion`, the debug dir's `schedule.txt`)
and as the `fusion.json` record the report reads."""
from __future__ import annotations

from typing import Any

from kiln.lower.ir import ComputedBuffer, ExternKernel, Origin
from kiln.schedule.plan import FusedGroup, Schedule

__all__ = ["fusion_json", "render_schedule"]


def _ops(origins: tuple[Origin, ...]) -> list[str]:
    return list(dict.fromkeys(o.op for o in origins))


def _lines(origins: tuple[Origin, ...]) -> list[str]:
    return list(dict.fromkeys(o.user_location for o in origins if o.user_location))


def _node_label(node: ComputedBuffer, stores: tuple[str, ...]) -> str:
    kind = node.data.reduction_type if node.is_reduction else "pointwise"
    if getattr(node, "gemm", None) is not None:  # a GemmGroup's matmul output (gemm_epilogue)
        kind = node.gemm.kind
    mark = "" if node.name in stores else " (in registers)"
    return f"{node.name} {kind} {node.layout.render()}{mark}"


def _step_lines(i: int, step: FusedGroup | ExternKernel, schedule: Schedule) -> list[str]:
    if isinstance(step, FusedGroup):
        kind = "reduction" if step.is_reduction else "pointwise"
        if getattr(step, "gemm", None) is not None:  # max-autotune's GemmGroup
            kind = f"gemm template: {step.gemm.describe()} + epilogue"
        space = f"x={list(step.x_ranges)}" + (f" r={list(step.r_ranges)}" if step.r_ranges else "")
        head = f"step {i}: {step.name} ({kind} kernel, {space})"
        body = [f"    {_node_label(n, step.stores)}" for n in step.nodes]
    else:
        outs = ", ".join(o.name for o in step.output_buffers())
        head = f"step {i}: extern {step.kind} {getattr(step.op, '__name__', step.op)} -> {outs}"
        body = [f"    reads {a.render()}" for a in step.tensor_args()]
    freed = sorted(n for n, last in schedule.last_use.items() if last == i)
    body.append(f"    ops: {', '.join(_ops(step.origins)) or '-'}")
    body.append(f"    lines: {', '.join(_lines(step.origins)) or '-'}")
    if freed:
        body.append(f"    frees after: {', '.join(freed)}")
    return [head, *body]


def render_schedule(schedule: Schedule) -> str:
    """Each step with its buffers, ATen ops and user lines, then elided copies, storage reuse
    and every not-fused neighbour pair with its reason."""
    n_groups = len(schedule.groups)
    out = [f"schedule: {len(schedule.steps)} steps ({n_groups} kernels, "
           f"{len(schedule.steps) - n_groups} extern calls), {len(schedule.elided)} copies "
           f"elided, {len(schedule.split)} reductions split"]
    for i, step in enumerate(schedule.steps):
        out += _step_lines(i, step, schedule)
    if schedule.elided:
        out.append("elided copies (readers read a view instead):")
        out += [f"    {name} -> {view.render()}" for name, view in schedule.elided.items()]
    if schedule.split:
        out.append("split reductions:")
        out += [f"    {name}: {chunks} chunks" for name, chunks in schedule.split.items()]
    if schedule.reuse:
        out.append("storage reuse:")
        out += [f"    {new} takes {old}" for new, old in schedule.reuse.items()]
    not_fused = [d for d in schedule.decisions if not d.fused]
    out.append(f"not fused ({len(not_fused)} neighbour pairs):")
    out += [f"    {d.a} / {d.b}: {d.reason}" for d in not_fused]
    return "\n".join(out) + "\n"


def _kernel_name(step: FusedGroup | ExternKernel) -> str:
    if isinstance(step, FusedGroup):
        return step.name
    return f"extern:{step.kind}"


def fusion_json(schedule: Schedule) -> dict[str, Any]:
    """`{"groups": [{name, kernel, buffers, ops, nodes}], "not_fused": [{a, b, reason}]}`
    (interfaces.md's fusion.json; "kernel" is the group's name — codegen names kernels after
    their groups — or "extern:<kind>")."""
    groups = []
    for step in schedule.steps:
        if isinstance(step, FusedGroup):
            buffers = [n.name for n in step.nodes]
        else:
            buffers = [o.name for o in step.output_buffers()]
        groups.append({
            "name": step.name if isinstance(step, FusedGroup) else buffers[0] if buffers
            else step.kind,
            "kernel": _kernel_name(step),
            "buffers": buffers,
            "ops": _ops(step.origins),
            "nodes": list(dict.fromkeys(o.node for o in step.origins)),
        })
    not_fused = [{"a": d.a, "b": d.b, "reason": d.reason} for d in schedule.decisions
                 if not d.fused]
    return {"groups": groups, "not_fused": not_fused}
