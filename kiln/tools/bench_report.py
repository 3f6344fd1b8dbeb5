"""Rendering of `kiln.tools.bench` rows: the screen table, results.csv, results.json, the
speedup plot (speedups.png, when matplotlib is importable) and the summary line; and the
`python -m kiln bench` command itself (`add_arguments`, `bench_command`). With `--report` the
command also writes the HTML report (`kiln.tools.report`) of the first model, with the same
backend, mode, device and size, as `<out>/report.html`."""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import torch

from kiln.tools.bench import (COLUMNS, MODES, BenchConfig, names, parse_models, run_bench,
                              unknown_models)
from kiln.tools.compile_time import DEFINITION
from kiln.tools.suite.model_registry import SUITE
from kiln.version import __version__

__all__ = [
    "add_arguments",
    "bench_command",
    "format_table",
    "summary_line",
    "write_plot",
    "write_results",
]

# The screen table: (row key, header, widest cell). The widths keep a line within 100 columns
# (test_bench); CSV and JSON keep every column of COLUMNS in full.
TABLE = (("model", "model", 10), ("variant", "variant", 13), ("input", "input", 11),
         ("verdict", "verdict", 7), ("err_vs_eager", "vs eager", 8), ("err_vs_fp64", "vs fp64", 7),
         ("median_ms", "ms", 7), ("speedup", "speedup", 7), ("compile_s", "compile", 8),
         ("graphs", "graphs", 6))
# with memory measured, the peak and its ratio to eager's; the input shapes (whole in the JSON)
# narrow to keep the line within 100 columns
MEMORY_TABLE = (("peak_mem_mb", "peak", 5), ("mem_ratio", "mem", 6))
MEMORY_INPUT_WIDTH = 5


def legend(memory: bool) -> str:
    """What the table's columns mean, wrapped to 100 columns."""
    text = ("input: the input shapes; vs eager / vs fp64: max normalized error against eager "
            "and an fp64 reference; ms: median per step; speedup: eager ms / ms; compile: seconds, "
            f"{DEFINITION} (torch.compile: first call minus a steady call); graphs: kiln's "
            "graphs/breaks" +
            ("; peak: peak memory of a step (K/M/G bytes; MB in results.json); mem: peak / "
             "eager's" if memory else ""))
    return textwrap.fill(text, 100)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def execution_note(device: str, backend: Any) -> str:
    """What the kiln variant actually runs on `device` with `backend`, in one sentence: on the
    CPU kiln's backend runs the captured graph as torch ops unless told to interpret its
    kernels, and a speedup means something different in each case."""
    from kiln.config import config as kiln_config
    if backend != "kiln":
        name = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
        return {"eager": "kiln captures the graph and the eager backend runs it as torch ops "
                         "(no generated kernels)",
                "aot_eager": "kiln captures the graph and traces it to ATen graphs that torch "
                             "runs (no generated kernels)"}.get(
            name, f"kiln captures the graph and backend {name!r} runs it")
    if device != "cpu":
        return "kiln runs its generated Triton kernels"
    if kiln_config.cpu_codegen == "triton_interpret":
        return ("on CPU kiln runs its generated Triton kernels in Triton's interpreter "
                "(KILN_CPU_CODEGEN=triton_interpret): slow, for correctness, not speed")
    return ("on CPU kiln runs the captured graph as torch ops (no generated kernels), so its "
            "speedup measures capture and guard overhead only; KILN_CPU_CODEGEN="
            "triton_interpret runs the generated kernels in Triton's interpreter instead")


def _cell(col: str, row: dict) -> str:
    value = row.get(col)
    if col == "graphs" and value is not None:
        return f"{value}/{row.get('breaks')}"
    if col == "verdict" and value is not None:
        return value.split(" ")[0].rstrip(":")  # pass / fail / error: details under the table
    if col == "input" and value is not None:
        return ",".join("x".join(map(str, shape)) for shape in value)
    if value is None:
        return "—"
    if col.startswith("err_"):
        return f"{value:.1e}"
    if col == "speedup" or col == "mem_ratio":
        return f"{value:.2f}x"
    if col == "peak_mem_mb":
        return _bytes(value * 2**20)
    if isinstance(value, float):
        return f"{value:.3f}" if col.endswith("_s") else f"{value:.2f}"
    return str(value)


def _bytes(n: float) -> str:
    """At most 5 characters: 80K, 12.3M, 640M, 6.26G."""
    for unit, scale in (("K", 2**10), ("M", 2**20), ("G", 2**30)):
        if n / scale < 999.5 or unit == "G":
            value = n / scale
            return f"{value:.3g}{unit}" if value >= 1 or n == 0 else f"{value:.2f}{unit}"
    return ""


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def format_table(rows: list[dict]) -> str:
    """The screen table (≤ 100 columns): one line per row. The peak-memory columns appear when
    some row has a ratio to eager's, else one line says why they are absent. Verdicts other
    than pass are spelled out in full under the table."""
    measured_memory = any(r.get("mem_ratio") is not None for r in rows)
    spec = TABLE
    if measured_memory:
        spec = tuple((k, h, MEMORY_INPUT_WIDTH if k == "input" else w) for k, h, w in TABLE)
        spec += MEMORY_TABLE
    cells = [[_fit(_cell(key, row), cap) for key, _, cap in spec] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, (_, h, _) in enumerate(spec)]
    line = lambda vals: " ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    lines = [line([h for _, h, _ in spec]), line(["-" * w for w in widths])]
    lines += [line(r) for r in cells]
    if not measured_memory:
        lines.append("peak memory: not measured (no eager row to compare with)")
    lines += [textwrap.fill(f"{r['model']} / {r['variant']}: {r['verdict']}", 100,
                            subsequent_indent="  ")
              for r in rows if r.get("verdict") and r["verdict"] != "pass"]
    return "\n".join(lines)


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per compiled variant: passed, total, pass_rate and geomean speedup over eager."""
    out: dict[str, dict] = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        if variant == "eager":
            continue
        mine = [r for r in rows if r["variant"] == variant]
        passed = sum(r["verdict"] == "pass" for r in mine)
        out[variant] = {"passed": passed, "total": len(mine),
                        "pass_rate": passed / len(mine) if mine else 0.0,
                        "geomean_speedup": _geomean([r.get("speedup") for r in mine
                                                     if r["verdict"] == "pass"])}
    return out


def summary_line(rows: list[dict]) -> str:
    """'summary: kiln pass rate 2/2 (100%), geomean speedup 1.03x over eager; ...' (the geomean
    is over the models that passed)."""
    parts = []
    for variant, s in summary(rows).items():
        geo = "n/a" if s["geomean_speedup"] is None else f"{s['geomean_speedup']:.2f}x"
        parts.append(f"{variant} pass rate {s['passed']}/{s['total']} "
                     f"({100 * s['pass_rate']:.0f}%), geomean speedup {geo} over eager")
    return "summary: " + "; ".join(parts)


def _config_dict(config: BenchConfig) -> dict:
    backend = config.backend if isinstance(config.backend, str) else getattr(
        config.backend, "__name__", type(config.backend).__name__)
    return {"models": list(config.models), "backend": backend, "mode": config.mode,
            "dtype": str(config.dtype),
            "train": config.train, "size": config.size, "compare": list(config.compare),
            "repeat": config.repeat, "device": config.device,
            "kiln_runs": execution_note(config.device, config.backend),
            "compile_time": DEFINITION, "torch": torch.__version__,
            "kiln": __version__, "python": platform.python_version(),
            "machine": platform.machine()}


def write_results(rows: list[dict], config: BenchConfig, out_dir: str) -> list[str]:
    """results.csv (one line per row, COLUMNS, empty for missing) and results.json (config,
    rows, summary) in `out_dir`; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path, json_path = (os.path.join(out_dir, f) for f in ("results.csv", "results.json"))
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: "" if r.get(c) is None else r[c] for c in COLUMNS} for r in rows)
    clean = [{**{c: _json_value(r.get(c)) for c in COLUMNS},
              "compile_stages": r.get("compile_stages")} for r in rows]
    with open(json_path, "w") as f:
        json.dump({"config": _config_dict(config), "columns": list(COLUMNS), "rows": clean,
                   "summary": summary(rows), "summary_line": summary_line(rows)}, f, indent=2)
    return [csv_path, json_path]


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _plot_title(config: BenchConfig | None) -> str:
    if config is None:
        return "speedup over eager"
    step = "training step" if config.train else "inference"
    return (f"kiln bench: speedup over eager ({step}, {str(config.dtype).removeprefix('torch.')}"
            f", {config.device}, size {config.size})\n"
            f"{execution_note(config.device, config.backend).split(', so ')[0]}")


def write_plot(rows: list[dict], out_dir: str, config: BenchConfig | None = None) -> str | None:
    """speedups.png: speedup over eager per model (labelled with its input shape) and compiled
    variant, each bar labelled with its value, the title saying what ran where; None when
    matplotlib is not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = names(rows)
    inputs = {r["model"]: _cell("input", r) for r in rows}
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "eager"]
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(models)), 4.8))
    width = 0.8 / max(len(variants), 1)
    for k, variant in enumerate(variants):
        by_model = {r["model"]: r.get("speedup") or 0.0 for r in rows if r["variant"] == variant}
        bars = ax.bar([i + k * width for i in range(len(models))],
                      [by_model.get(m, 0.0) for m in models], width, label=variant)
        ax.bar_label(bars, fmt="%.2fx", fontsize=8, padding=2)
    ax.axhline(1.0, color="grey", linewidth=0.8, label="eager (1.00x)")
    ax.set_xticks([i + width * (len(variants) - 1) / 2 for i in range(len(models))])
    ax.set_xticklabels([f"{m}\n{inputs.get(m, '')}" for m in models], fontsize=8)
    ax.set_ylabel("speedup over eager (higher is faster)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # room for the value labels
    ax.set_title(textwrap.fill(_plot_title(config), 90), fontsize=9)
    # below the axes, so it never covers a bar
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(variants) + 1,
              fontsize=8, frameon=False)
    fig.tight_layout()
    path = os.path.join(out_dir, "speedups.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


DESCRIPTION = """\
Benchmark models of kiln's suite under eager PyTorch, kiln and (with --compare torch)
torch.compile, side by side. Per model and variant: accuracy against eager and against an fp64
reference, the median time of one step, the speedup over eager, the compile time and kiln's
graph and break counts. Prints a table and writes results.csv, results.json and speedups.png."""


def models_help() -> str:
    """The suite's models, one per line with its description: `bench --help`'s epilog."""
    width = max(map(len, SUITE))
    return "models (--models a,b; default all):\n" + "\n".join(
        f"  {name:<{width}}  {textwrap.shorten(spec.description.removeprefix(name + ':'), 70)}"
        for name, spec in SUITE.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", help="comma-separated suite models (default: all; the "
                        "list is below)")
    parser.add_argument("--backend", default=None,
                        help="kiln backend: eager, aot_eager or another registered name "
                        "(default: kiln.config.default_backend)")
    parser.add_argument("--mode", choices=MODES, default=None,
                        help="compile mode for kiln's backend and for torch.compile "
                        "(default: none given, i.e. each one's default)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    parser.add_argument("--train", action="store_true",
                        help="time the training step (forward, loss, backward) instead of "
                        "inference")
    parser.add_argument("--size", choices=("small", "full"), default=None,
                        help="model sizes (default: full on CUDA, small on the CPU)")
    parser.add_argument("--compare", choices=("torch",), action="append", default=[],
                        help="also run torch.compile (default mode)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "out", "bench"),
                        help="folder for results.csv, results.json and speedups.png")
    parser.add_argument("--repeat", type=int, default=5, help="timing runs per median (CPU)")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    parser.add_argument("--report", action="store_true",
                        help="also write the HTML report of the first model (report.html in "
                        "--out; see `python -m kiln report`)")


def bench_command(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    from kiln.config import config as kiln_config
    try:
        unknown = unknown_models(parse_models(args.models))
    except RuntimeError as err:  # a model family whose package cannot be imported
        print(f"kiln bench: {err}", file=sys.stderr)
        return 2
    if unknown:
        print(f"kiln bench: unknown model(s) {', '.join(unknown)}; choose from "
              f"{', '.join(SUITE)}, hf:<arch> (kiln.tools.suite.hf.ARCHS) or timm:<name>",
              file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    config = BenchConfig(models=parse_models(args.models),
                         backend=args.backend or kiln_config.default_backend, mode=args.mode,
                         dtype=_DTYPES[args.dtype], train=args.train,
                         size=args.size or ("full" if device == "cuda" else "small"),
                         compare=tuple(args.compare), repeat=args.repeat, device=device)
    echo(f"kiln {__version__} bench on {device} (torch {torch.__version__}): "
         f"{'training' if config.train else 'inference'}, {args.dtype}, size {config.size}, "
         f"backend {config.backend}" + (f", mode {config.mode}" if config.mode else ""))
    note = execution_note(device, config.backend)
    echo(f"what runs: {note}")
    rows = run_bench(config, progress=sys.stderr)
    echo(format_table(rows))
    echo(legend(any(r.get("mem_ratio") is not None for r in rows)))
    for path in write_results(rows, config, args.out):
        echo(f"wrote {path}")
    plot = write_plot(rows, args.out, config)
    echo(f"wrote {plot}" if plot else "plot skipped: matplotlib is missing")
    echo(summary_line(rows) + ("" if device != "cpu" else f" ({note.split(' (')[0]})"))
    if getattr(args, "report", False):
        echo(f"wrote {write_bench_report(config, args.out, rows)}")
    return 0


def write_bench_report(config: BenchConfig, out_dir: str, rows: list[dict] | None = None) -> str:
    """The HTML report of the run's first model (`python -m kiln report suite:<model>`, same
    backend, mode, device and size; training configs are reported in inference) as
    `<out_dir>/report.html`, with its debug dir beside it; returns the path. Its profile
    section has torch.compile when the bench compared against it (`--compare torch`)."""
    import shutil

    from kiln.tools.report.cli import report_for_target, write_report
    from kiln.tools.report.variants import VARIANTS
    backend = config.backend if isinstance(config.backend, str) else "eager"
    debug_dir = os.path.join(out_dir, "report_debug")
    shutil.rmtree(debug_dir, ignore_errors=True)  # ours: only this run's graphs
    data = report_for_target(f"suite:{config.models[0]}", backend=backend, mode=config.mode,
                             device=config.device, size=config.size, debug_dir=debug_dir,
                             variants=tuple(v for v in VARIANTS if v in config.variants))
    if rows:
        data.bench_table = format_table(rows) + "\n" + legend(
            any(r.get("mem_ratio") is not None for r in rows)) + "\n" + summary_line(rows)
    return write_report(data, os.path.join(out_dir, "report.html"))
