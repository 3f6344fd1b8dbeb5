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

Steps of `schedule(graph)`, in order: `PASSES`, one named pass per step module (`kiln.passes`:
each timed, dumped under `KILN_DEBUG_DIR`, and switchable off by name with
`KILN_DISABLE_PASSES`):
1. `gemm_merge` (`gemm_merge.py`): matmuls that share their input and read neighbouring
   blocks of one weight become one matmul;
2. `attention_layout` (`attention_layout.py`): attention operands regrouped to `[B, H, L, D]`
   where that lets more q/k/v copies become views;
3. `elide` (`elide.py`): pure copies read only by library calls replaced by strided views,
   attention outputs given the layout the op returns (repeated while it helps);
4. `split` (`split.py`): long reductions with few outputs split into a partial and a final
   reduction;
5. `fusion` (`fusion.py`): greedy, score-ordered fusion with legality checks and a reason for
   every not-fused neighbour pair (off: one kernel per computed buffer);
6. `memory` (`memory.py`, required): last uses and storage reuse;
`schedule_text.py` prints the result (`KILN_LOGS=fusion`, `schedule.txt`) and builds `fusion.json`;
`plan.py` holds the output types (`FusedGroup`, `FusionDecision`, `Schedule`, `group_index`).

Graph rewrites (1-4) stay in IR form on a copy of the graph (the caller's is never changed),
so `kiln.lower.evaluate.run_ir(schedule.graph, inputs)` still equals eager. Never: emits code,
picks kernel configurations, or reorders work across a dependency.
"""
from __future__ import annotations

from kiln.logs import artifact_enabled, artifact_logger
from kiln.lower.ir import ComputedBuffer, ExternKernel, IRGraph
from kiln.passes import Pass, PassList
from kiln.schedule.attention_layout import refresh_attention_layouts, regroup_attention
from kiln.schedule.elide import elide_copies
from kiln.schedule.fusion import fuse_nodes, reduction_passes
from kiln.schedule.gemm_merge import merge_gemms
from kiln.schedule.graph_edit import copy_graph
from kiln.schedule.memory import plan_memory
from kiln.schedule.plan import FusedGroup, FusionDecision, Schedule, group_index
from kiln.schedule.schedule_text import fusion_json, render_schedule
from kiln.schedule.split import split_reductions

__all__ = [
    "FusedGroup",
    "FusionDecision",
    "PASSES",
    "Schedule",
    "fusion_json",
    "group_index",
    "reduction_passes",
    "render_schedule",
    "schedule",
    "trivial_schedule",
]


def trivial_schedule(graph: IRGraph) -> Schedule:
    """One kernel per computed buffer, every buffer stored: the unfused baseline tests and
    benchmarks compare fusion against (`schedule()` with fusion disabled still plans storage
    and layouts; this does nothing but list the steps)."""
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
    """Plan `graph` with `PASSES` on a copy of it: merge GEMMs, plan extern layouts (attention
    regrouping, copy elision), split long reductions, fuse, and plan memory. `fuse=False`
    keeps one kernel per computed buffer; `elide=False` skips the layout planning and
    `split=False` the splits (as do `KILN_DISABLE_PASSES=fusion,...` and friends)."""
    plan = Schedule(copy_graph(graph), [])
    result = PASSES.run(plan, flags={"fuse": fuse, "elide": elide, "split": split})
    if artifact_enabled("fusion"):
        artifact_logger("fusion").info("%s", render_schedule(result))
    return result


# -- the passes: each takes the plan so far and fills in its part ---------------------------------

def _merge_gemms(plan: Schedule) -> Schedule:
    merge_gemms(plan.graph)
    return plan


def _regroup_attention(plan: Schedule) -> Schedule:
    if plan.graph.symbolic:  # the regrouping searches divisors of the batch: a static size
        return plan
    regroup_attention(plan.graph)
    return plan


def _elide_copies(plan: Schedule) -> Schedule:
    for _ in range(3):  # an output in its op's own layout may let a later copy go too
        elide_copies(plan.graph, plan.elided)
        if not refresh_attention_layouts(plan.graph):
            break
    return plan


def _split_reductions(plan: Schedule) -> Schedule:
    if plan.graph.symbolic:  # chunk counts must divide rnumel: sizes only known at run time
        return plan
    plan.split = split_reductions(plan.graph)
    return plan


def _fuse(plan: Schedule) -> Schedule:
    plan.steps, plan.decisions = fuse_nodes(plan.graph, True)
    return plan


def _one_kernel_per_node(plan: Schedule) -> Schedule:
    plan.steps, plan.decisions = fuse_nodes(plan.graph, False)
    return plan


def _plan_memory(plan: Schedule) -> Schedule:
    plan.last_use, plan.reuse = plan_memory(plan.steps, plan.graph)
    return plan


def _print_plan(plan: Schedule) -> str:
    """The IR as runnable Python, then the steps once fusion planned them (as comments)."""
    text = str(plan.graph)
    if plan.steps:
        steps = render_schedule(plan)
        text += "\n\n# schedule\n" + "\n".join(f"# {line}".rstrip() for line in steps.splitlines())
    return text + "\n"


PASSES = PassList("schedule", [
    Pass("gemm_merge", _merge_gemms, "matmuls reading neighbouring weight blocks of one input "
         "become one matmul"),
    Pass("attention_layout", _regroup_attention, "attention operands regrouped to [B, H, L, D] "
         "where more copies can become views", flag="elide"),
    Pass("elide", _elide_copies, "copies read only by library calls become strided views; "
         "attention outputs take the op's layout", flag="elide"),
    Pass("split", _split_reductions, "long reductions with few outputs split into partial + "
         "final", flag="split"),
    Pass("fusion", _fuse, "greedy fusion of computed buffers into kernels (off: one kernel per "
         "buffer)", flag="fuse", off=_one_kernel_per_node),
    Pass("memory", _plan_memory, "last uses and storage reuse: the wrapper frees and reuses "
         "buffers by them", required=True),
], _print_plan)
