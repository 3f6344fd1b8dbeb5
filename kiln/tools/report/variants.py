"""The report's profile section: eager, torch.compile and kiln under torch.profiler, side by side.

`profile_variants(fn, args, kiln=<kiln's Profiled>, ...)` profiles eager (`fn` itself) and
torch.compile (Inductor unless `torch_backend` says otherwise) over the same steady calls kiln's
profile covered, reads each with `timeline.read_profile`, maps kiln's kernels back to its
kernel groups and user lines (by name for generated kernels; by ATen op for library calls, e.g.
aten::addmm -> the "extern:addmm" steps), and ranks the categories where kiln spends more time
than torch.compile (or eager when torch.compile did not run): the biggest gaps.

A variant that fails (torch.compile without a working compiler, an unsupported model) becomes a
note in its column; it never stops the report.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from kiln.tools.report.profile import Profiled, op_word, profile_calls
from kiln.tools.report.timeline import CATEGORIES, read_profile

__all__ = ["VARIANTS", "category_gaps", "map_kiln_kernels", "profile_variants"]

VARIANTS = ("eager", "torch.compile", "kiln")


def _call(fn: Callable, args: tuple, after: Callable[[Any], Any] | None) -> Callable[[], Any]:
    if after is None:
        return lambda: fn(*args)
    return lambda: after(fn(*args))


def _failure(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    message = message if len(message) <= 300 else message[:299] + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _inductor_kernel_ranges(device: str) -> contextlib.AbstractContextManager:
    """On the CPU, Inductor's C++ kernels get profiler ranges only with
    `cpp.enable_kernel_profile`; without it their time is invisible between ATen ops."""
    if device.startswith("cuda"):
        return contextlib.nullcontext()
    try:
        from torch._inductor import config as inductor_config
        return inductor_config.patch({"cpp.enable_kernel_profile": True})
    except (ImportError, AttributeError, KeyError):
        return contextlib.nullcontext()


def _torch_compiled(fn: Callable, mode: str | None, backend: Any) -> Callable:
    from kiln.tools.bench import TORCH_MODES  # one mode mapping for bench and report
    if backend == "inductor":
        return torch.compile(fn, backend=backend, mode=TORCH_MODES.get(mode, mode))
    return torch.compile(fn, backend=backend)


def _profile_other(name: str, fn: Callable, args: tuple, *, device: str, mode: str | None,
                   calls: int, after: Callable | None, torch_backend: Any) -> dict:
    """eager or torch.compile: its profile read into rows, or a note saying why there is none."""
    try:
        if name == "eager":
            profiled = profile_calls(_call(fn, args, after), device, calls)
        else:
            compiled = _torch_compiled(fn, mode, torch_backend)
            with _inductor_kernel_ranges(device):
                profiled = profile_calls(_call(compiled, args, after), device, calls)
    except Exception as exc:  # noqa: BLE001  (a failing comparison is reported, never fatal)
        what = "torch.compile" if name == "torch.compile" else name
        return {"name": name, "note": f"{what} failed: {_failure(exc)}"}
    return {"name": name, "note": "", **read_profile(profiled)}


def _steps_for(row: dict, by_name: dict[str, dict], externs: list[dict]) -> list[dict]:
    if row["name"] in by_name:
        return [by_name[row["name"]]]
    op = (row.get("op") or "").lower()
    return [s for s in externs if op and op_word(s.get("kind", "")) in op] if op else []


def map_kiln_kernels(rows: list[dict], steps: list[dict]) -> None:
    """Give each kiln row the kernels.json steps it ran ("steps": names, "kinds", "ops",
    "user_locations"): a generated kernel by its name, a library kernel by its ATen op."""
    by_name = {s["name"]: s for s in steps}
    externs = [s for s in steps if not s.get("source")]
    for row in rows:
        found = _steps_for(row, by_name, externs)
        if not found:
            continue
        row["steps"] = [s["name"] for s in found]
        row["kinds"] = _unique(s.get("kind") for s in found)
        row["ops"] = _unique(op for s in found for op in s.get("ops") or ())
        row["user_locations"] = _unique(loc for s in found
                                        for loc in s.get("user_locations") or ())


def _unique(values: Any) -> list:
    return list(dict.fromkeys(v for v in values if v))


def _no_kernels_note(backend: str, device: str) -> str:
    if backend != "kiln":
        why = f"backend {backend!r} generates none"
    elif not device.startswith("cuda"):
        why = ("on CPU tensors the kiln backend runs the captured graphs as torch ops unless "
               "KILN_CPU_CODEGEN=triton_interpret")
    else:
        why = "the backend wrote no kernels.json"
    return f"no kiln kernels ({why}), so these rows are the ATen ops its graphs ran"


def category_gaps(variants: list[dict]) -> dict:
    """kiln against torch.compile (or eager when torch.compile has no profile): per category
    the microseconds per call of each and kiln's excess, largest first."""
    by_name = {v["name"]: v for v in variants if v.get("categories") is not None}
    kiln = by_name.get("kiln")
    against = next((by_name[n] for n in ("torch.compile", "eager") if n in by_name), None)
    if kiln is None or against is None:
        return {"against": None, "rows": []}
    rows = [{"category": c, "kiln_us": kiln["categories"].get(c, 0.0),
             "other_us": against["categories"].get(c, 0.0)} for c in CATEGORIES
            if c in kiln["categories"] or c in against["categories"]]
    for r in rows:
        r["delta_us"] = r["kiln_us"] - r["other_us"]
    return {"against": against["name"], "total_delta_us": kiln["total_us"] - against["total_us"],
            "rows": sorted(rows, key=lambda r: -r["delta_us"])}


def profile_variants(fn: Callable, args: tuple, *, kiln: Profiled, steps: list[dict],
                     device: str, mode: str | None = None, calls: int = 3,
                     after: Callable | None = None, variants: Sequence[str] = VARIANTS,
                     torch_backend: Any = "inductor", backend: str = "kiln") -> dict:
    """The profile section's data: {"device", "what", "calls", "variants": [per variant: name,
    note, total_us, wall_us, kernels_per_call, kernels, categories], "gaps"}. `backend` is the
    kiln backend that made `kiln` (for the note when it generated no kernels)."""
    cuda = device.startswith("cuda")
    found = []
    for name in [v for v in VARIANTS if v in variants]:
        if name == "kiln":
            record = {"name": "kiln", "note": "",
                      **read_profile(kiln, frozenset(s["name"] for s in steps))}
            map_kiln_kernels(record["kernels"], steps)
            if not steps:
                record["note"] = _no_kernels_note(backend, device)
        else:
            record = _profile_other(name, fn, args, device=device, mode=mode, calls=calls,
                                    after=after, torch_backend=torch_backend)
        found.append(record)
    return {"device": "cuda" if cuda else "cpu", "what": "device kernels" if cuda else "CPU ops",
            "calls": calls, "variants": found, "gaps": category_gaps(found)}
