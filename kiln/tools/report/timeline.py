"""One variant's profile → kernel rows and time per category (the report's profile section).

On CUDA a row is a device kernel by name (memcpy and memset included): calls and microseconds
per call, summed over the profiled calls and divided by their count; the total is the sum of the
rows (device busy time per call). On the CPU there are no device kernels: a row is an outermost
CPU op (an ATen op, or a generated kernel's range where the compiler adds one, e.g. Inductor's
C++ kernels under `cpp.enable_kernel_profile`) with its CPU time; two categories exist only
there: allocation / views (ATen ops that move no data) and the time of each call not spent
inside any op (Python, interpreted Triton, dispatch), so the categories always sum to the
total (the call's wall time).

Categories come from a rule table on the name (`CATEGORY_RULES`, first match wins); a name in
`generated` (kiln's kernel names, from the debug dir's kernels.json) is generated outright.
"""
from __future__ import annotations

import collections
import re
from typing import Any

from kiln.tools.report.profile import Profiled, is_device_event, outermost

__all__ = ["CATEGORIES", "CATEGORY_RULES", "COPY", "CPU_ONLY", "GENERATED", "MATMUL", "NATIVE",
           "OUTSIDE", "VIEWS", "categorize", "read_profile"]

MATMUL = "matmul / library"
GENERATED = "generated pointwise / reduction"
NATIVE = "ATen pointwise / reduction"
COPY = "memory copies"
VIEWS = "allocation / views (CPU)"
OUTSIDE = "outside ops (Python, interpreter)"
CATEGORIES = (MATMUL, GENERATED, NATIVE, COPY, VIEWS, OUTSIDE)
CPU_ONLY = (VIEWS, OUTSIDE)  # no device kernel falls in these

_LIBRARY = (r"gemm|gemv|nvjet|xmma|cutlass|cublas|cudnn|wgmma|splitk|flash|fmha|attention"
            r"|implicit_convolve|conv(olution)?(_|\d|$)|fprop|dgrad|wgrad|scaled_dot_product"
            r"|^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|_addmm_activation)$")
CATEGORY_RULES: tuple[tuple[str, re.Pattern], ...] = (
    (MATMUL, re.compile(r"^(triton|kiln)_tem_")),  # generated matmul templates
    (GENERATED, re.compile(r"^(triton|kiln)_|cpp_fused|^graph_\d+_cpp")),
    (COPY, re.compile(r"^memcpy|^memset|copy|catarraybatched"
                      r"|^aten::(clone|contiguous|_to_copy|cat|stack)$", re.IGNORECASE)),
    (MATMUL, re.compile(_LIBRARY, re.IGNORECASE)),
    (VIEWS, re.compile(r"^aten::(empty|empty_strided|empty_like|new_empty|new_empty_strided"
                       r"|as_strided|set_|view|_unsafe_view|reshape|t|transpose|permute|expand"
                       r"|detach|alias|resize_|slice|select|unsqueeze|squeeze|lift_fresh"
                       r"|resolve_conj|resolve_neg|to|split|chunk|unbind|_reshape_alias)$")),
)
_GENERATED_RANGE = re.compile(r"^(triton|kiln)_|cpp_fused|^graph_\d+_cpp")


def categorize(name: str, generated: frozenset[str] | set[str] = frozenset()) -> str:
    """The category of a kernel or CPU op named `name`; ATen pointwise / reduction when no rule
    matches (eager's native kernels, ops kiln or torch.compile fell back to)."""
    if name in generated:
        return GENERATED
    for category, pattern in CATEGORY_RULES:
        if pattern.search(name):
            return category
    return NATIVE


def _aten_parent(event: Any) -> str | None:
    """The outermost ATen op enclosing a CPU event (the op a launched kernel belongs to)."""
    found = None
    while event is not None:
        if event.name.startswith("aten::"):
            found = event.name
        event = event.cpu_parent
    return found


def _kernel_ops(events: list) -> dict[str, str]:
    """Device kernel name -> the outermost ATen op that launched it (first seen)."""
    ops: dict[str, str] = {}
    for e in events:
        if is_device_event(e) or not getattr(e, "kernels", None):
            continue
        op = _aten_parent(e)
        for k in e.kernels:
            if op is not None:
                ops.setdefault(k.name, op)
    return ops


def _rows(totals: dict[str, list[float]], ops: dict[str, str], calls: int,
          generated: frozenset[str]) -> list[dict]:
    rows = [{"name": name, "calls": count / calls, "us": us / calls,
             "category": categorize(name, generated), "op": ops.get(name)}
            for name, (count, us) in totals.items()]
    return sorted(rows, key=lambda r: -r["us"])


def _device_rows(profiled: Profiled, generated: frozenset[str]) -> list[dict]:
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in profiled.events:
        if is_device_event(e):
            totals[e.name][0] += 1
            totals[e.name][1] += e.time_range.elapsed_us()
    return _rows(totals, _kernel_ops(profiled.events), profiled.calls, generated)


def _cpu_rows(profiled: Profiled, generated: frozenset[str]) -> list[dict]:
    def is_op(e: Any) -> bool:
        return (e.name.startswith("aten::") or e.name in generated
                or bool(_GENERATED_RANGE.search(e.name)))
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in outermost(profiled.events, is_op):
        totals[e.name][0] += 1
        totals[e.name][1] += e.cpu_time_total
    ops = {name: name for name in totals if name.startswith("aten::")}
    return _rows(totals, ops, profiled.calls, generated)


def read_profile(profiled: Profiled, generated: frozenset[str] = frozenset()) -> dict:
    """{"total_us", "wall_us", "kernels_per_call", "kernels": rows (name, calls, us, category,
    op), "categories": {category: us}} per call; the categories sum to total_us."""
    cuda = profiled.cuda
    rows = (_device_rows if cuda else _cpu_rows)(profiled, generated)
    in_rows = sum(r["us"] for r in rows)
    wall = profiled.wall_us
    total = in_rows if cuda else max(wall or 0.0, in_rows)
    categories = {c: 0.0 for c in CATEGORIES if c not in CPU_ONLY or not cuda}
    for r in rows:
        categories[r["category"]] = categories.get(r["category"], 0.0) + r["us"]
    if not cuda:
        categories[OUTSIDE] = total - in_rows
    return {"total_us": total, "wall_us": wall, "kernels_per_call": sum(r["calls"] for r in rows),
            "kernels": rows, "categories": categories}
