"""`render_html(data) -> str`: the report as one self-contained HTML page.

No external resources: inline CSS, inline SVG, no scripts. Sections have stable ids — summary,
bench, profile (`render_profile.py`), graph-breaks, recompiles, fusion, kernels, roofline,
compile-time — and each says in words why it is empty when it is.
"""
from __future__ import annotations

import os

from kiln.diagnostics import user_terms
from kiln.tools.compile_time import DEFINITION, stage_seconds
from kiln.tools.report.data import ReportData
from kiln.tools.report.markup import empty, locations, num, section, table
from kiln.tools.report.markup import escape as _e
from kiln.tools.report.metrics import KernelRow, kernel_rows
from kiln.tools.report.render_profile import profile_section
from kiln.tools.report.svg import compile_time_bars, roofline

__all__ = ["SECTION_IDS", "render_html"]

SECTION_IDS = ("summary", "bench", "profile", "graph-breaks", "recompiles", "fusion", "kernels",
               "roofline", "compile-time")

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1a202c;
background:#f7fafc;line-height:1.45}
header{background:#1a365d;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#bee3f8;font-size:13px}
nav{padding:8px 32px;background:#2c5282}
nav a{color:#fff;margin-right:18px;font-size:13px;text-decoration:none}
main{padding:8px 32px 40px}
section{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:16px 20px;
margin:16px 0}
h2{margin:0 0 10px;font-size:18px;color:#2a4365}
h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #edf2f7;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#ebf8ff;color:#2a4365}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th.num{text-align:right}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
pre{background:#f7fafc;border:1px solid #e2e8f0;padding:8px;overflow:auto;max-height:360px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#ebf8ff;border-radius:6px;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:20px;color:#1a365d}
.card span{font-size:12px;color:#4a5568}
.empty{color:#718096;font-style:italic}
.note{color:#4a5568;font-size:13px}
.tag{display:inline-block;background:#fefcbf;border-radius:4px;padding:0 6px;font-size:12px}
.hint{color:#276749}
.bar{display:inline-block;height:10px;background:#3182ce;vertical-align:middle}
.scroll{overflow-x:auto}
td{overflow-wrap:anywhere}
.cols{display:flex;flex-wrap:wrap;gap:12px}
.cols>div{flex:1 1 340px;min-width:0}
.cols>div.wide{flex:1.6 1 460px}
"""


def _pct(fraction: float | None) -> str:
    if fraction is None:
        return "—"
    width = max(1, min(60, int(60 * fraction)))
    return f'{100 * fraction:.1f}% <span class="bar" style="width:{width}px"></span>'


# --- summary --------------------------------------------------------------------------------

def _summary(data: ReportData, rows: list[KernelRow]) -> str:
    compile_s = sum(_stage_totals(data).values())
    kernel_s = sum(r.seconds for r in rows if r.seconds is not None)
    cards = [("model", data.target), ("device", data.device),
             ("backend", data.backend + (f" ({data.mode})" if data.mode else "")),
             ("graphs", data.graph_count), ("graph breaks", len(data.breaks)),
             ("recompiles", len(data.recompiles)), ("kernels", len(rows)),
             ("first call (compile + run)", _fmt_s(data.first_call_s)),
             ("steady call", _fmt_s(data.steady_call_s)),
             ("compile (all stages)", _fmt_s(compile_s if data.captures else None)),
             ("kernel time per call", _fmt_s(kernel_s if data.kernel_times else None))]
    html_cards = "".join(f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>'
                         for k, v in cards)
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in [DEFINITION + "."] + data.notes)
    where = f'<p class="note">debug dir: <code>{_e(data.debug_dir)}</code>; torch ' \
            f'{_e(data.torch_version)}, kiln {_e(data.kiln_version)}</p>'
    return section("summary", "Summary", f'<div class="cards">{html_cards}</div>{where}{notes}')


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _bench(data: ReportData) -> str:
    if not data.bench_table:
        return section("bench", "Bench", empty(
            "no bench results: this report was made by `python -m kiln report`; "
            "`python -m kiln bench --report` puts its eager / kiln / torch.compile table here"))
    return section("bench", "Bench", f"<pre>{_e(data.bench_table)}</pre>")


def _no_kernels(data: ReportData) -> str:
    """Why there are no kernels, and how to get them."""
    if data.device.startswith("cpu") and data.backend == "kiln":
        return ("on CPU the kiln backend runs the captured graph as torch ops, so it generates "
                "no kernels; run on a GPU, or set KILN_CPU_CODEGEN=triton_interpret and "
                "TRITON_INTERPRET=1 to generate them and run them in Triton's interpreter (slow)")
    return (f"backend {data.backend!r} generated no kernels for these graphs (no kernels.json "
            "in the debug dir); the \"kiln\" backend generates them")


# --- graph breaks and recompiles ------------------------------------------------------------

def _location(loc: dict | None) -> str:
    if not loc:
        return "—"
    return f"<code>{_e(os.path.basename(loc['filename']))}:{_e(loc['lineno'])}</code>"


def _breaks(data: ReportData) -> str:
    if not data.breaks:
        why = "no graph breaks: every captured function compiled as whole graphs" if (
            data.captures or data.live) else "graph breaks not recorded (see the summary note)"
        return section("graph-breaks", "Graph breaks", empty(why))
    rows = []
    ranked = sorted(data.breaks, key=lambda b: -int(b.get("cost") or 0))
    for rank, b in enumerate(ranked, 1):
        loc = b.get("location")
        source = f"<code>{_e(loc['source'])}</code>" if loc and loc.get("source") else "—"
        stack = "".join(f"<br>from <code>{_e(os.path.basename(f['filename']))}:{_e(f['lineno'])}"
                        f"</code> in {_e(f['function'])}" for f in b.get("stack") or ())
        hints = "".join(f'<div class="hint">hint: {_e(h)}</div>' for h in b.get("hints") or ())
        rows.append([str(rank), _e(b.get("cost", 0)), _location(loc) + stack, source,
                     f'<span class="tag">{_e(b["category"])}</span> <code>{_e(b["code"])}</code>'
                     f"<div>{_e(b['message'])}</div>{hints}"])
    body = ('<p class="note">Ranked by cost: the estimated instructions that ran outside graphs '
            "because of the break.</p>" +
            table(["#", "cost", "where", "source", "why / what to do"], rows, {0, 1}))
    return section("graph-breaks", "Graph breaks", body)


def _recompiles(data: ReportData) -> str:
    if not data.recompiles:
        return section("recompiles", "Recompiles", empty(
            "no recompiles: every call after the first hit a compiled entry"))
    rows = []
    for r in data.recompiles:
        why = "<br>".join(f"<code>{_e(user_terms(f['expr']))}</code>: expected "
                          f"{_e(f['expected'])}, got "
                          f"{_e(f['actual'])}" for f in r.get("failures") or ()) or \
            "no cache entry matched"
        rows.append([f"<code>{_e(user_terms(r['function']))}</code>", _location(r.get("location")),
                     _e(r.get("entry_count", "")), why])
    return section("recompiles", "Recompiles",
                   table(["function", "where", "entry", "failed guards"], rows, {2}))


# --- fusion --------------------------------------------------------------------------------

def _fusion_graph(graph, kernels_by_name: dict[str, dict]) -> str:
    groups, not_fused = graph.fusion["groups"], graph.fusion["not_fused"]
    parts = [f"<h3>{_e(graph.name)}</h3>"]
    if groups:
        rows = []
        for g in groups:
            k = kernels_by_name.get(g.get("kernel", ""), {})
            rows.append([f"<code>{_e(g.get('kernel', g.get('name', '?')))}</code>",
                         _e(", ".join(g.get("ops") or ())), _e(", ".join(g.get("buffers") or ())),
                         locations(k.get("user_locations"))])
        parts.append(table(["kernel", "ATen ops fused", "buffers", "user lines"], rows))
    if not_fused:
        rows = [[f"<code>{_e(p['a'])}</code>", f"<code>{_e(p['b'])}</code>", _e(p["reason"])]
                for p in not_fused]
        parts.append("<p>Neighbours not fused:</p>" + table(["a", "b", "reason"], rows))
    if not groups and not not_fused and graph.schedule:
        parts.append(f"<pre>{_e(graph.schedule)}</pre>")
    if len(parts) == 1:
        parts.append(empty("no fusion.json or schedule.txt in this graph's folder"))
    return "".join(parts)


def _fusion(data: ReportData) -> str:
    with_fusion = [g for g in data.graphs if g.fusion["groups"] or g.fusion["not_fused"]
                   or g.schedule]
    if not with_fusion:
        return section("fusion", "Fusion", empty(f"no fusion data: {_no_kernels(data)}"))
    by_name = {k["name"]: k for k in data.kernels}
    return section("fusion", "Fusion", "".join(_fusion_graph(g, by_name) for g in with_fusion))


# --- kernels and roofline ------------------------------------------------------------------

def _kernel_table(rows: list[KernelRow]) -> str:
    table_rows = []
    for r in rows:
        source = (f"<details><summary>source</summary><pre>{_e(r.source_text)}</pre></details>"
                  if r.source_text else "")
        table_rows.append([
            f"<code>{_e(r.name)}</code><div class='note'>{_e(r.graph)}</div>", _e(r.kind),
            _e(f"{r.numel}×{r.rnumel}" if r.rnumel > 1 else r.numel),
            num(r.seconds, "{:.2f}", 1e6), num(r.bytes or None, "{:,.0f}"),
            num(r.bandwidth, "{:.2f}", 1e-9), num(r.flops or None, "{:,.0f}"),
            num(r.flop_rate, "{:.3g}", 1e-9), _pct(r.bandwidth_fraction),
            _pct(r.flops_fraction), _e(", ".join(r.ops)) + source,
            locations(r.user_locations)])
    return table(["kernel", "kind", "size", "time µs", "bytes", "GB/s", "FLOPs", "GFLOP/s",
                  "% copy BW", "% matmul FLOP/s", "ATen ops", "user lines"], table_rows,
                 {2, 3, 4, 5, 6, 7, 8, 9})


def _ceiling_note(data: ReportData) -> str:
    c = data.ceilings_obj
    if c is None:
        return '<p class="note">machine ceilings not measured</p>'
    return (f'<p class="note">ceilings measured on {_e(c.device)}: copy bandwidth '
            f"{c.bandwidth / 1e9:.1f} GB/s, {_e(c.matmul_dtype)} matmul "
            f"{c.flops / 1e9:.1f} GFLOP/s</p>")


def _kernels(data: ReportData, rows: list[KernelRow]) -> str:
    if not rows:
        return section("kernels", "Kernels", empty(f"no kernel data: {_no_kernels(data)}")
                       + _ceiling_note(data))
    note = data.timing_note or "no kernel times recorded"
    if not data.device.startswith("cuda"):
        note += ("; on the CPU, times are CPU-side times of the profiler ranges (Triton runs "
                 "interpreted), so GB/s and FLOP/s are not hardware numbers")
    body = (f'<p class="note">{_e(note)}. GB/s = bytes / time; FLOP/s = FLOPs / time.</p>'
            + _ceiling_note(data) + _kernel_table(rows))
    return section("kernels", "Kernels", body)


def _roofline(data: ReportData, rows: list[KernelRow]) -> str:
    svg, plotted = roofline(rows, data.ceilings_obj)
    if not svg:
        return section("roofline", "Roofline", empty(
            "no roofline: the machine's ceilings were not measured and no kernel has FLOPs and "
            f"a time ({_no_kernels(data)})"))
    missing = len(rows) - plotted
    note = (f'<p class="note">{plotted} kernel(s) plotted; {missing} without a FLOP count or a '
            "time are not (pointwise kernels often count 0 FLOPs).</p>") if rows else \
        empty(f"no kernels to plot: {_no_kernels(data)}; the ceilings alone are drawn")
    return section("roofline", "Roofline", note + svg)


# --- compile time --------------------------------------------------------------------------

def _stage_totals(data: ReportData) -> dict[str, float]:
    return stage_seconds(data.captures, [g.timings for g in data.graphs])


def _compile_time(data: ReportData) -> str:
    totals = _stage_totals(data)
    if not totals:
        return section("compile-time", "Compile time", empty(
            "no compile times: neither capture records nor timings.json"))
    stages = list(dict.fromkeys(s for g in data.graphs for s in g.timings if s != "total"))
    rows = [[_e(g.name)] + [num(g.timings.get(s), "{:.1f}", 1e3) for s in stages]
            for g in data.graphs if g.timings]
    per_graph = table(["graph"] + [f"{s} ms" for s in stages], rows,
                      set(range(1, len(stages) + 1))) if rows else empty(
        f"no timings.json: backend {data.backend!r} does not time its stages; capture and the "
        "whole backend call are shown")
    total = sum(totals.values())
    body = (f'<p class="note">compile {total * 1e3:.1f} ms over all graphs. {_e(DEFINITION)}. '
            "Capture from capture records, the rest from each graph's timings.json.</p>" +
            compile_time_bars(totals) + per_graph)
    return section("compile-time", "Compile time", body)


def render_html(data: ReportData) -> str:
    rows = kernel_rows(data.kernels, data.kernel_times, data.ceilings_obj)
    nav = "".join(f'<a href="#{sid}">{sid.replace("-", " ")}</a>' for sid in SECTION_IDS)
    sections = [_summary(data, rows), _bench(data), profile_section(data.profile, data.live),
                _breaks(data), _recompiles(data), _fusion(data), _kernels(data, rows),
                _roofline(data, rows), _compile_time(data)]
    title = f"kiln report: {data.target}"
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{_e(title)}</h1><p>{_e(data.device)} · backend {_e(data.backend)}"
            f"</p></header><nav>{nav}</nav><main>{''.join(sections)}</main></body></html>\n")
