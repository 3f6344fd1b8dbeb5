"""Inline SVG charts for the report: the roofline and the compile-time bars (no scripts, no
external resources; every label is escaped text)."""
from __future__ import annotations

import html
import math

from kiln.tools.report.ceilings import Ceilings
from kiln.tools.report.metrics import KernelRow

__all__ = ["compile_time_bars", "roofline"]

_W, _H, _PAD_L, _PAD_B, _PAD_T, _PAD_R = 760, 420, 100, 50, 20, 20
PALETTE = ("#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#b7791f",
           "#e53e3e", "#4a5568")


def _fmt_si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


class _LogAxes:
    """Maps (x, y) in data units to pixels on log10 axes spanning whole decades."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float]) -> None:
        self.x0, self.x1 = math.floor(math.log10(x_range[0])), math.ceil(math.log10(x_range[1]))
        self.y0, self.y1 = math.floor(math.log10(y_range[0])), math.ceil(math.log10(y_range[1]))
        self.x1, self.y1 = max(self.x1, self.x0 + 1), max(self.y1, self.y0 + 1)

    def px(self, x: float) -> float:
        frac = (math.log10(x) - self.x0) / (self.x1 - self.x0)
        return _PAD_L + frac * (_W - _PAD_L - _PAD_R)

    def py(self, y: float) -> float:
        frac = (math.log10(y) - self.y0) / (self.y1 - self.y0)
        return _H - _PAD_B - frac * (_H - _PAD_B - _PAD_T)

    def grid(self) -> list[str]:
        parts = []
        for e in range(self.x0, self.x1 + 1):
            x = self.px(10.0 ** e)
            parts.append(f'<line x1="{x:.1f}" y1="{_PAD_T}" x2="{x:.1f}" y2="{_H - _PAD_B}" '
                         'stroke="#e2e8f0"/>')
            parts.append(f'<text x="{x:.1f}" y="{_H - _PAD_B + 16}" text-anchor="middle" '
                         f'font-size="11">1e{e}</text>')
        for e in range(self.y0, self.y1 + 1):
            y = self.py(10.0 ** e)
            parts.append(f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_W - _PAD_R}" y2="{y:.1f}" '
                         'stroke="#e2e8f0"/>')
            parts.append(f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" '
                         f'font-size="11">{html.escape(_fmt_si(10.0 ** e, "FLOP/s"))}</text>')
        return parts


def _plottable(rows: list[KernelRow]) -> list[KernelRow]:
    return [r for r in rows if r.intensity and r.flop_rate]


def roofline(rows: list[KernelRow], ceilings: Ceilings | None) -> tuple[str, int]:
    """The roofline SVG (arithmetic intensity vs achieved FLOP/s, both ceilings as lines, one
    dot per kernel with FLOPs and a time) and the number of kernels plotted."""
    points = _plottable(rows)
    if ceilings is None and not points:
        return "", 0
    ridge = ceilings.flops / ceilings.bandwidth if ceilings else None
    xs = [r.intensity for r in points] or [ridge]
    ys = [r.flop_rate for r in points] or [ceilings.flops / 100]
    ridge = ridge or max(xs)
    axes = _LogAxes((min(min(xs), ridge / 100) / 2, max(max(xs), ridge * 10) * 2),
                    (min(min(ys), (ceilings.flops if ceilings else max(ys)) / 1e4) / 2,
                     max(max(ys), ceilings.flops if ceilings else 0.0) * 2))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
             f'viewBox="0 0 {_W} {_H}" role="img" aria-label="roofline">',
             f'<rect width="{_W}" height="{_H}" fill="#ffffff"/>', *axes.grid()]
    if ceilings:
        lo, hi = 10.0 ** axes.x0, 10.0 ** axes.x1
        x_start = max(lo, 10.0 ** axes.y0 / ceilings.bandwidth)
        parts.append(f'<polyline fill="none" stroke="#1a202c" stroke-width="2" points="'
                     f'{axes.px(x_start):.1f},{axes.py(x_start * ceilings.bandwidth):.1f} '
                     f'{axes.px(ridge):.1f},{axes.py(ceilings.flops):.1f}"/>')
        parts.append(f'<polyline fill="none" stroke="#c53030" stroke-width="2" points="'
                     f'{axes.px(ridge):.1f},{axes.py(ceilings.flops):.1f} '
                     f'{axes.px(hi):.1f},{axes.py(ceilings.flops):.1f}"/>')
        parts.append(f'<text x="{axes.px(ridge) + 6:.1f}" y="{axes.py(ceilings.flops) - 6:.1f}" '
                     f'font-size="12" fill="#c53030">matmul ceiling '
                     f'{html.escape(_fmt_si(ceilings.flops, "FLOP/s"))}</text>')
        # under the rising bandwidth line, starting at a point of it: the text runs right, where
        # the line is higher, so they never cross
        label_x = max(lo, x_start) * 1.5
        label_y = axes.py(label_x * ceilings.bandwidth) + 18
        bandwidth = html.escape(_fmt_si(ceilings.bandwidth, "B/s"))
        parts.append(f'<text class="bandwidth-label" x="{axes.px(label_x) + 4:.1f}" '
                     f'y="{label_y:.1f}" font-size="12">copy bandwidth {bandwidth}</text>')
    for i, r in enumerate(points):
        tip = (f"{r.name}: {r.intensity:.3g} FLOP/B, {_fmt_si(r.flop_rate, 'FLOP/s')}")
        parts.append(f'<circle class="kernel-dot" cx="{axes.px(r.intensity):.1f}" '
                     f'cy="{axes.py(r.flop_rate):.1f}" r="5" fill="{PALETTE[i % len(PALETTE)]}" '
                     f'fill-opacity="0.85"><title>{html.escape(tip)}</title></circle>')
    parts.append(f'<text x="{(_W + _PAD_L) / 2:.0f}" y="{_H - 10}" text-anchor="middle" '
                 'font-size="12">arithmetic intensity (FLOP per byte moved)</text>')
    parts.append("</svg>")
    return "".join(parts), len(points)


def compile_time_bars(stages: dict[str, float]) -> str:
    """Horizontal bars, one per stage, labelled with seconds; '' when there is nothing."""
    stages = {k: v for k, v in stages.items() if v > 0}
    if not stages:
        return ""
    longest = max(stages.values())
    row_h, label_w, width = 26, 140, 720
    height = row_h * len(stages) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="compile time by stage">']
    for i, (stage, seconds) in enumerate(stages.items()):
        y = 5 + i * row_h
        bar = max(2.0, (width - label_w - 110) * seconds / longest)
        parts.append(f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end" font-size="12">'
                     f'{html.escape(stage)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{bar:.1f}" height="{row_h - 8}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}"/>')
        parts.append(f'<text x="{label_w + bar + 6:.1f}" y="{y + 16}" font-size="12">'
                     f'{seconds * 1e3:.1f} ms</text>')
    parts.append("</svg>")
    return "".join(parts)
