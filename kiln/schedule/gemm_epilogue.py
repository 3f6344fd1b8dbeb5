"""gemm_epilogue: a matmul and the pointwise group reading its output, as one candidate kernel.

max-autotune only (`kiln.runtime.gemm_tuning` decides by benchmark; the default schedule never
calls this). `find_gemm_epilogues(schedule)` lists every `mm` / `addmm` / `bmm` library call
whose output feeds a pointwise `FusedGroup` that a Triton GEMM template can compute in its
store (`kiln.codegen.gemm_template`): bias, activations, residual adds, casts. Each candidate is
a `GemmGroup`: the epilogue group plus a `GemmNode` member standing for the matmul output,
which lives in registers (and is still written when anything else reads it).
`fuse_gemm_epilogues(schedule, candidates)` puts each in place of its two steps.

Legal when (else `GemmCandidate.refusal` says why, logged at DEBUG):

- the call is `aten.mm` / `aten.bmm` / `aten.addmm` with beta = alpha = 1, on static sizes,
  all operands in the output's floating dtype (fp32, bf16, fp16), each operand with a unit
  stride in one of its last two dims (as BLAS accepts);
- the first step reading the output is a pointwise group over the output's number of elements
  (whether it reads the output at the index it computes is codegen's check: a `CodegenError`
  there refuses the candidate too);
- no step between the call and that group reads the output.

Never changes the IR graph: `schedule.graph` still runs the library call (`run_ir` equals
eager); only the steps differ.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from kiln.lower.index import as_expr
from kiln.lower.ir import ComputedBuffer, ExternKernel, Origin, Pointwise, TensorArg
from kiln.lower.ops import current_handler, ops
from kiln.schedule.memory import plan_memory, step_reads
from kiln.schedule.plan import FusedGroup, Schedule

__all__ = ["GemmCandidate", "GemmGroup", "GemmNode", "GemmOperands", "epilogue_signature",
           "find_gemm_epilogues", "fuse_gemm_epilogue", "fuse_gemm_epilogues", "matmul_flops"]

log = logging.getLogger("kiln.schedule")

GEMM_OPS = {"mm": "aten.mm.default", "addmm": "aten.addmm.default", "bmm": "aten.bmm.default"}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class GemmOperands:
    """The matmul a template computes: `out[b, m, n] = sum_k a[b, m, k] * b[b, k, n] (+ bias)`.

    kind: "mm" | "addmm" | "bmm". a, b: the operand views (`[M, K]`, `[K, N]`; with a leading
    batch dim for bmm), bias: addmm's `self` (broadcast to `[M, N]`) or None. out: the output
    buffer's name. batch, m, n, k: the sizes (batch 1 for mm / addmm)."""

    kind: str
    a: TensorArg
    b: TensorArg
    bias: TensorArg | None
    out: str
    batch: int
    m: int
    n: int
    k: int

    def describe(self) -> str:
        sizes = f"{self.m}x{self.n}x{self.k}"
        return f"{self.kind} {self.batch}x{sizes}" if self.kind == "bmm" else f"{self.kind} {sizes}"


class GemmNode(ComputedBuffer):
    """The matmul output as a member of a `GemmGroup` (first member, never run as a loop body
    by codegen: the template computes it). Its body only describes its accesses — it loads the
    operands and stores the output — so dependency analysis (`plan_memory`) sees what the
    template kernel reads."""

    def __init__(self, out: ComputedBuffer | Any, gemm: GemmOperands,
                 origins: tuple[Origin, ...]) -> None:
        args = [a for a in (gemm.a, gemm.b, gemm.bias) if a is not None]

        def accesses(index):
            loads = [ops.load(a.name, _first_element(a)) for a in args]
            return ops.where(loads[0], loads[1], loads[-1])

        data = Pointwise(tuple(out.layout.size), accesses, out.dtype)
        super().__init__(out.name, out.layout, data, origins)
        self.gemm = gemm

    def body(self, index, rindex=()) -> None:
        """Under the template's printer, store the accumulator it computed (`gemm_result`:
        the epilogue's loads of this buffer then read it from registers); under any other
        handler, the accesses only."""
        result = getattr(current_handler(), "gemm_result", None)
        if result is None:
            super().body(index, rindex)
            return
        ops.store(self.name, self.layout.index(index), result(self))


def _first_element(arg: TensorArg) -> Any:
    return as_expr(arg.offset)


@dataclasses.dataclass(eq=False)
class GemmGroup(FusedGroup):
    """A GEMM template kernel: `nodes[0]` is the `GemmNode`, the rest the epilogue group's
    members in order. `gemm`: the operands; `extern`: the library call it replaces;
    `epilogue`: the pointwise group it absorbs."""

    gemm: GemmOperands | None = None
    extern: ExternKernel | None = None
    epilogue: FusedGroup | None = None

    @property
    def epilogue_nodes(self) -> list[ComputedBuffer]:
        return self.nodes[1:]


@dataclasses.dataclass
class GemmCandidate:
    """One matmul → epilogue pair: the steps' positions and the group that would replace them
    (None, with `refusal` saying why, when it is not legal)."""

    extern_step: int
    group_step: int | None
    group: GemmGroup | None
    refusal: str | None = None


def find_gemm_epilogues(schedule: Schedule) -> list[GemmCandidate]:
    """Every matmul call of the schedule, legal or refused (see the module docstring)."""
    found = []
    for i, step in enumerate(schedule.steps):
        if isinstance(step, ExternKernel) and step.kind in GEMM_OPS:
            found.append(_candidate(schedule, i, step))
    for cand in found:
        if cand.refusal:
            log.debug("gemm epilogue: %s stays a library call: %s",
                      schedule.steps[cand.extern_step].name, cand.refusal)
    return found


def _candidate(schedule: Schedule, i: int, node: ExternKernel) -> GemmCandidate:
    if schedule.graph.symbolic:
        return GemmCandidate(i, None, None, "symbolic sizes")
    gemm = _operands(node, schedule)
    if isinstance(gemm, str):
        return GemmCandidate(i, None, None, gemm)
    readers = [j for j, s in enumerate(schedule.steps) if j > i and gemm.out in step_reads(s)]
    if not readers:
        return GemmCandidate(i, None, None, "nothing reads the output")
    j = readers[0]
    group = schedule.steps[j]
    out = schedule.graph.buffers[gemm.out]
    if not isinstance(group, FusedGroup) or isinstance(group, GemmGroup):
        return GemmCandidate(i, j, None, f"its first reader (step {j}) is not a generated kernel")
    if group.is_reduction:
        return GemmCandidate(i, j, None, f"its first reader {group.name} is a reduction")
    if group.numel != out.layout.numel:
        return GemmCandidate(i, j, None, f"{group.name} iterates {list(group.x_ranges)}, not the "
                                         f"output's {list(out.layout.size)}")
    stored = len(readers) > 1 or gemm.out in _observed(schedule)
    stores = group.stores + ((gemm.out,) if stored else ())
    head = GemmNode(out, gemm, node.origins)
    merged = GemmGroup(group.name, [head, *group.nodes], group.x_ranges, (), stores,
                       gemm=gemm, extern=node, epilogue=group)
    return GemmCandidate(i, j, merged)


def _observed(schedule: Schedule) -> set[str]:
    graph = schedule.graph
    found = {o.name for o in graph.outputs if isinstance(o, TensorArg)}
    return found | {arg.name for _, arg in graph.mutations}


def _operands(node: ExternKernel, schedule: Schedule) -> GemmOperands | str:
    """The call's operands, or why a template cannot compute it."""
    if str(node.op) != GEMM_OPS[node.kind]:
        return f"op {node.op} is not {GEMM_OPS[node.kind]}"
    outs = node.output_buffers()
    if len(outs) != 1:
        return "not one output"
    out = outs[0]
    kwargs = dict(node.kwargs)
    if node.kind == "addmm":
        if len(node.args) > 3 or kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            return "addmm with beta or alpha other than 1"
        bias, a, b = (_resolve(schedule, arg) for arg in node.args[:3])
    else:
        if len(node.args) != 2 or kwargs:
            return "unexpected arguments"
        bias, (a, b) = None, (_resolve(schedule, arg) for arg in node.args)
    args = [x for x in (a, b, bias) if x is not None]
    if not all(isinstance(x, TensorArg) for x in args):
        return "an operand is not a tensor view (or is an elided copy read through another view)"
    if out.dtype not in DTYPES or any(x.dtype != out.dtype for x in args):
        return f"dtypes {[str(x.dtype) for x in args]} -> {out.dtype} (one of fp32/bf16/fp16)"
    if not all(_unit_stride(x) for x in (a, b)):
        return "an operand has no unit stride in its last two dims"
    batch = a.size[0] if node.kind == "bmm" else 1
    (m, k), n = a.size[-2:], b.size[-1]
    if min(batch, m, n, k) < 1 or tuple(out.layout.size) != ((batch,) if node.kind == "bmm"
                                                              else ()) + (m, n):
        return f"sizes {a.size} x {b.size} -> {out.layout.size}"
    if bias is not None and not _broadcasts(bias, (m, n)):
        return f"bias {bias.size} does not broadcast to [{m}, {n}]"
    return GemmOperands(node.kind, a, b, bias, out.name, batch, m, n, k)


def _resolve(schedule: Schedule, arg: Any) -> Any:
    """The view an operand reads: an elided copy's readers read the recorded view instead
    (only when the operand is the copy's whole layout, as the wrapper requires)."""
    if not isinstance(arg, TensorArg) or arg.name not in schedule.elided:
        return arg
    lay = schedule.graph.buffers[arg.name].layout
    if (arg.size, arg.stride, arg.offset) != (lay.size, lay.stride, lay.offset):
        return None
    return schedule.elided[arg.name]


def _unit_stride(arg: TensorArg) -> bool:
    return any(st == 1 or size == 1 for size, st in zip(arg.size[-2:], arg.stride[-2:]))


def _broadcasts(bias: TensorArg, shape: tuple[int, int]) -> bool:
    if len(bias.size) > 2:
        return False
    return all(s in (1, want) for s, want in zip(reversed(bias.size), reversed(shape)))


def fuse_gemm_epilogue(schedule: Schedule, cand: GemmCandidate) -> Schedule:
    """`fuse_gemm_epilogues` of one candidate."""
    return fuse_gemm_epilogues(schedule, [cand])


def fuse_gemm_epilogues(schedule: Schedule, cands: list[GemmCandidate]) -> Schedule:
    """The schedule with each candidate's `GemmGroup` in place of its epilogue group and
    without its library call; buffer lifetimes planned again (a matmul output only the
    epilogue read is no longer allocated). Two candidates may not share an epilogue group."""
    steps = list(schedule.steps)
    drop: set[int] = set()
    for cand in cands:
        if cand.group is None or cand.group_step is None:
            raise ValueError(f"candidate is not legal: {cand.refusal}")
        if cand.group_step in drop or isinstance(steps[cand.group_step], GemmGroup):
            raise ValueError(f"{cand.group.name} already absorbs another matmul")
        steps[cand.group_step] = cand.group
        drop.add(cand.extern_step)
    steps = [s for i, s in enumerate(steps) if i not in drop]
    last_use, reuse = plan_memory(steps, schedule.graph)
    return dataclasses.replace(schedule, steps=steps, last_use=last_use, reuse=reuse)


def matmul_flops(gemm: GemmOperands) -> int:
    return 2 * gemm.batch * gemm.m * gemm.n * gemm.k


def epilogue_signature(group: GemmGroup) -> list[Any]:
    """What the epilogue does, for cache keys and progress lines: its ATen ops in order."""
    ops_: list[str] = []
    for node in group.epilogue_nodes:
        for origin in node.origins:
            op = origin.op.split("/")[-1].removeprefix("aten.").split(".")[0]
            if op not in ops_:
                ops_.append(op)
    return ops_

