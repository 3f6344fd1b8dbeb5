"""report: one self-contained HTML page on what kiln did to a program and where the time goes.

Input: a target run live (`collect_report(fn, args, ...)`) or an existing `KILN_DEBUG_DIR`
(`from_debug_dir(path)`). Output: `render_html(data)` with the sections summary, bench (the
`kiln bench --report` table), profile (eager, torch.compile and kiln side by side under
torch.profiler: time by category, the biggest gaps, top kernels), graph-breaks (ranked by cost,
with source lines and hints), recompiles, fusion (ATen ops per kernel, and the neighbours not
fused with the reason), kernels (time, bytes, GB/s, FLOP/s, % of the measured copy-bandwidth and
matmul ceilings), roofline (inline SVG) and compile-time.

Files: `artifacts.py` reads a debug dir, `collect.py` runs a target, `profile.py` profiles calls
and times kernels, `variants.py` profiles eager and torch.compile beside kiln, `timeline.py`
reads a profile into kernel rows and categories, `ceilings.py` measures the machine,
`metrics.py` derives per-kernel numbers, `render.py`, `render_profile.py`, `markup.py` and
`svg.py` write the page, `cli.py` is `python -m kiln report`. Never: changes what it measures
(the backend writes the artifacts; the report only reads them), or loads anything from the
network (the page is offline).
"""
from __future__ import annotations

from kiln.tools.report.collect import collect_report
from kiln.tools.report.data import ReportData, from_debug_dir
from kiln.tools.report.render import SECTION_IDS, render_html

__all__ = ["ReportData", "SECTION_IDS", "collect_report", "from_debug_dir", "render_html"]
