"""schedule: loop IR (`IRGraph`) → an ordered list of kernels to launch (`Schedule`).

Input: an `IRGraph` from `kiln.lower`. Output: a `Schedule`: `steps` in execution order, each a
`FusedGroup` (one generated kernel computing several `ComputedBuffer`s over one iteration
space) or an `ExternKernel` (library call / fallback), plus the fusion decisions (fused or not,
with a reason for every pair of neighbours), buffer lifetimes and storage reuse for the wrapper.

The contract with codegen (`kiln.codegen.emit_group`) and the wrapper (`kiln.runtime`):

- A `FusedGroup` iterates `x_ranges` (output loop, `numel = prod(x_ranges)`) and `r_ranges`
  (reduction loop, `rnumel = prod(r_ranges)`, `()` for a pointwise group); both are at least 1,
  and a reduction group's `r_ranges` is never `()` (the lower stage allocates a buffer with no
  elements with an `empty` extern and gives every reduction a non-empty r loop). Every member's own
  loop variables are expressions of the group's variables: `group_index(member, xvars, rvars)`
  gives the `(index, rindex)` to call `member.body(index, rindex)` with. A pointwise member of a
  reduction group spans x and r (a LayerNorm's normalize step over [rows, cols]: x = rows,
  r = cols); a reduction member's x must cover the group's x and its r the group's r.
- Members run in order; a load of a member buffer by a later member reads the value computed in
  registers (no memory round trip); `stores` are the member buffers that must still be written
  to memory (read by a later step, a graph output, or a mutation).
- Buffers in `Schedule.elided` are never computed: every reader reads the `TensorArg` view of
  another buffer instead (a copy that an extern could read as a strided view).

Steps of `schedule(graph)`, in order (each a small module):
1. `attention_layout.py` + `elide.py`: extern layout planning — attention operands regrouped
   to `[B, H, L, D]` where that helps, pure copies read only by library calls replaced by
   strided views, attention outputs in the layout the op returns (repeated while it helps);
2. `split.py`: long reductions with few outputs split into a partial and a final reduction;
3. `fusion.py`: greedy, score-ordered fusion with legality checks and a reason for every
   not-fused neighbour pair;
4. `memory.py`: last uses and storage reuse;
`render.py` prints the result (`KILN_LOGS=fusion`, `schedule.txt`) and builds `fusion.json`;
`plan.py` holds the output types (`FusedGroup`, `FusionDecision`, `Schedule`, `group_index`).

Graph rewrites (1, 2) stay in IR form on a copy of the graph (the caller's is never changed),
so `kiln.lower.evaluate.run_ir(schedule.graph, inputs)` still equals eager. Never: emits code,
picks kernel configurations, or reorders work across a dependency.
"""
from __future__ import annotations

from kiln.lower.ir import ComputedBuffer, ExternKernel, IRGraph, TensorArg
from kiln.schedule.plan import FusedGroup, FusionDecision, Schedule, group_index

__all__ = [
    "FusedGroup",
    "FusionDecision",
    "Schedule",
    "fusion_json",
    "group_index",
    "reduction_passes",
    "render_schedule",
    "schedule",
    "trivial_schedule",
]


def trivial_schedule(graph: IRGraph) -> Schedule:
    """One kernel per computed buffer, every buffer stored: the unfused baseline (and the
    fallback when fusion is disabled)."""
    steps: list[FusedGroup | ExternKernel] = []
    for i, node in enumerate(graph.nodes):
        if isinstance(node, ComputedBuffer):
            rr = node.data.reduction_ranges if node.is_reduction else ()
            steps.append(FusedGroup(f"group{i}", [node], tuple(node.data.ranges), tuple(rr),
                                    (node.name,)))
        else:
            steps.append(node)
    return Schedule(graph, steps)


def schedule(graph: IRGraph, *, fuse: bool = True, elide: bool = True,
             split: bool = True) -> Schedule:
    """Plan `graph`: elide copies into extern views, split long reductions, fuse, and plan
    memory. `fuse=False` keeps one kernel per computed buffer (the rewrites still apply)."""
    from kiln.logs import artifact_enabled, artifact_logger
    from kiln.schedule.attention_layout import refresh_attention_layouts, regroup_attention
    from kiln.schedule.elide import elide_copies
    from kiln.schedule.fusion import fuse_nodes
    from kiln.schedule.gemm_merge import merge_gemms
    from kiln.schedule.graph_edit import copy_graph
    from kiln.schedule.memory import plan_memory
    from kiln.schedule.render import render_schedule
    from kiln.schedule.split import split_reductions

    work = copy_graph(graph)
    merge_gemms(work)
    elided: dict[str, TensorArg] = {}
    if elide:
        regroup_attention(work)
        for _ in range(3):  # an output in its op's own layout may let a later copy go too
            elide_copies(work, elided)
            if not refresh_attention_layouts(work):
                break
    chunks = split_reductions(work) if split else {}
    steps, decisions = fuse_nodes(work, fuse)
    last_use, reuse = plan_memory(steps, work)
    result = Schedule(work, steps, decisions, last_use, reuse, elided, chunks)
    if artifact_enabled("fusion"):
        artifact_logger("fusion").info("%s", render_schedule(result))
    return result


def __getattr__(name: str):
    if name in ("render_schedule", "fusion_json"):
        from kiln.schedule import render

        return getattr(render, name)
    if name == "reduction_passes":
        from kiln.schedule.fusion import reduction_passes

        return reduction_passes
    raise AttributeError(f"module 'kiln.schedule' has no attribute {name!r}")
