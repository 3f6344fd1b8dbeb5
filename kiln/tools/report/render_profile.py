"""The profile section (`profile_section(data) -> HTML`) and its terminal summary
(`profile_lines(profile) -> lines`): eager, torch.compile and kiln side by side — time per call
by category, the biggest gaps, and each variant's top kernels (kiln's mapped back to its kernel
groups and user lines). Reads `ReportData.profile` (see `variants.profile_variants`)."""
from __future__ import annotations

from kiln.tools.report.markup import empty, escape, locations, num, section, table
from kiln.tools.report.timeline import OUTSIDE

__all__ = ["profile_lines", "profile_section", "what_was_measured"]

TOP_KERNELS = 12
_NAME_CHARS = 90


def what_was_measured(profile: dict) -> str:
    calls = profile.get("calls", "?")
    if profile.get("device") == "cuda":
        return (f"CUDA device kernels from torch.profiler, mean of {calls} steady calls after a "
                "warm-up; total = device busy time per call (the kernels' durations summed); "
                "wall = the call's CPU-side span with a synchronize, under the profiler")
    return (f"on the CPU there are no device kernels: rows are CPU-side ops (the outermost ATen "
            "ops, and generated-kernel ranges where the compiler adds them: Inductor's C++ "
            f"kernels) with their CPU time, mean of {calls} steady calls after a warm-up, under "
            f"the profiler (which adds its own overhead); \"{OUTSIDE}\" is the rest of each call "
            "(Python, dispatch, and kiln's Triton kernels when they run in the interpreter); "
            "total = wall time per call")


def _ok(profile: dict) -> list[dict]:
    return [v for v in profile.get("variants", ()) if v.get("categories") is not None]


def _per_call_table(variants: list[dict], cuda: bool) -> str:
    categories = list(dict.fromkeys(c for v in variants for c in v["categories"]))
    header = ["µs per call"] + [v["name"] for v in variants]
    rows = [["<b>total</b>"] + [num(v["total_us"], "{:,.1f}") for v in variants]]
    rows += [[escape(c)] + [num(v["categories"].get(c), "{:,.1f}") for v in variants]
             for c in categories]
    rows.append(["kernels per call" if cuda else "ops per call"]
                + [num(v["kernels_per_call"], "{:.0f}") for v in variants])
    rows.append(["wall per call (under the profiler)"]
                + [num(v.get("wall_us"), "{:,.1f}") for v in variants])
    return table(header, rows, range(1, len(header)))


def _gap_items(profile: dict) -> list[str]:
    gaps = profile.get("gaps") or {}
    against = gaps.get("against")
    worse = [g for g in gaps.get("rows", ()) if g["delta_us"] > 0]
    return [f"{g['category']}: kiln {g['kiln_us']:,.1f} µs vs {against} {g['other_us']:,.1f} µs "
            f"(+{g['delta_us']:,.1f} µs per call)" for g in worse[:4]]


def _gaps(profile: dict) -> str:
    gaps = profile.get("gaps") or {}
    against = gaps.get("against")
    if against is None:
        return empty("no gaps: kiln and at least one of torch.compile or eager need a profile")
    items = _gap_items(profile)
    total = gaps.get("total_delta_us", 0.0)
    head = (f'<p class="note">kiln − {escape(against)} in total: {total:+,.1f} µs per call'
            + ("" if against == "torch.compile" else " (torch.compile was not profiled)") + "</p>")
    if not items:
        return head + empty(f"kiln spends no more time than {against} in any category")
    return head + "<ol>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ol>"


def _kernel_name(name: str) -> str:
    short = name if len(name) <= _NAME_CHARS else name[:_NAME_CHARS - 1] + "…"
    return f'<code title="{escape(name)}">{escape(short)}</code>'


def _kiln_mapping(row: dict) -> str:
    steps = row.get("steps")
    if not steps:
        return "—"
    kinds = ", ".join(row.get("kinds") or ())
    if steps == [row["name"]]:  # a generated kernel: the step is the kernel itself
        named = ""
    else:
        named = steps[0] if len(steps) == 1 else f"{len(steps)} steps: {', '.join(steps[:3])}" + (
            ", …" if len(steps) > 3 else "")
    ops = ", ".join(o.removeprefix("aten.").removesuffix(".default") for o in row.get("ops") or ())
    user = sorted(row.get("user_locations") or (), key=lambda x: "site-packages" in x)[:3]
    return (f"{escape(named)} <span class='tag'>{escape(kinds)}</span><div class='note'>"
            f"{escape(ops)}</div><div class='note'>{locations(user)}</div>")


def _top_kernels(variant: dict) -> str:
    kiln = variant["name"] == "kiln"
    rows = []
    for r in variant["kernels"][:TOP_KERNELS]:
        share = r["us"] / variant["total_us"] if variant["total_us"] else None
        cells = [_kernel_name(r["name"]) + f"<div class='note'>{escape(r['category'])}</div>",
                 num(r["calls"], "{:.3g}"), num(r["us"], "{:,.1f}"), num(share, "{:.1f}%", 100)]
        rows.append(cells + ([_kiln_mapping(r)] if kiln else []))
    header = ["kernel", "calls", "µs", "% of step"] + (["kiln group / user lines"] if kiln else [])
    more = len(variant["kernels"]) - TOP_KERNELS
    tail = f'<p class="note">{more} more not shown (all in report.json)</p>' if more > 0 else ""
    body = table(header, rows, {1, 2, 3}) if rows else empty(
        "nothing recorded: the profiler saw no kernels or ops in these calls")
    wide = ' class="wide"' if kiln else ""
    return f"<div{wide}><h3>{escape(variant['name'])}</h3>{body}{tail}</div>"


def _notes(profile: dict) -> str:
    return "".join(f'<p class="note"><b>{escape(v["name"])}</b>: {escape(v["note"])}</p>'
                   for v in profile.get("variants", ()) if v.get("note"))


def profile_section(profile: dict | None, live: bool) -> str:
    title = "Profile: eager, torch.compile and kiln"
    if not profile:
        why = ("no profile: this debug dir's report.json has none (written before the profile "
               "section existed, or without `kiln report`)" if not live else
               "no profile was recorded")
        return section("profile", title, empty(why))
    if "skipped" in profile:
        return section("profile", title, empty(f"no profile: {profile['skipped']}"))
    ok = _ok(profile)
    head = f'<p class="note">{escape(what_was_measured(profile))}.</p>' + _notes(profile)
    if not ok:
        return section("profile", title, head + empty("no variant could be profiled"))
    per_call = _per_call_table(ok, profile.get("device") == "cuda")
    body = (head + "<h3>Time per call by category</h3>" + per_call + "<h3>Biggest gaps</h3>"
            + _gaps(profile) + "<h3>Top kernels</h3><div class=\"cols\">"
            + "".join(_top_kernels(v) for v in ok) + "</div>")
    return section("profile", title, body)


def profile_lines(profile: dict | None) -> list[str]:
    """The terminal summary: totals and categories per variant, gaps, kiln's top kernels."""
    if not profile or "skipped" in profile:
        return [] if not profile else [f"profile: skipped ({profile['skipped']})"]
    where = ("CUDA: device kernels" if profile.get("device") == "cuda" else
             "the CPU: CPU-side ops, not device kernels")
    lines = [f"profile on {where}; µs per call, mean of {profile.get('calls', '?')} calls:"]
    lines += [f"  {v['name']}: {v['note']}" for v in profile["variants"] if v.get("note")]
    ok = _ok(profile)
    if ok:
        lines += _category_lines(ok) + _gap_lines(profile, ok)
    return lines


def _category_lines(ok: list[dict]) -> list[str]:
    width = max(len(c) for v in ok for c in v["categories"]) + 2
    lines = ["  " + "".ljust(width) + "".join(v["name"].rjust(15) for v in ok)]
    for label in ["total"] + list(dict.fromkeys(c for v in ok for c in v["categories"])):
        values = [v["total_us"] if label == "total" else v["categories"].get(label) for v in ok]
        lines.append("  " + label.ljust(width) + "".join(
            ("—" if x is None else f"{x:,.1f}").rjust(15) for x in values))
    return lines


def _gap_lines(profile: dict, ok: list[dict]) -> list[str]:
    gaps = profile.get("gaps") or {}
    lines = []
    if gaps.get("against"):
        worse = [f"{g['category']} +{g['delta_us']:,.1f}" for g in gaps["rows"]
                 if g["delta_us"] > 0][:3]
        lines.append(f"  kiln − {gaps['against']}: {gaps['total_delta_us']:+,.1f} in total; "
                     + ("biggest gaps: " + ", ".join(worse) if worse else "no category slower"))
    kiln = next((v for v in ok if v["name"] == "kiln"), None)
    if kiln and kiln["kernels"]:
        lines.append("  kiln's top: " + ", ".join(
            f"{r['name'][:48]} {r['us']:,.1f}" for r in kiln["kernels"][:3]))
    return lines
