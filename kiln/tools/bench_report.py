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
from collections.abc import Callable
from typing import Any

import torch

import kiln
from kiln.tools.bench import COLUMNS, MODES, BenchConfig, names, parse_models, run_bench

__all__ = [
    "add_arguments",
    "bench_command",
    "format_table",
    "summary_line",
    "write_plot",
    "write_results",
]

HEADERS = {"err_vs_eager": "err vs eager", "err_vs_fp64": "err vs fp64",
           "median_ms": "median ms", "speedup": "speedup", "cold_compile_s": "cold compile s",
           "recompile_warm_s": "recompile (warm process) s", "peak_mem_mb": "peak MB",
           "mem_ratio": "mem ratio"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _cell(col: str, value: Any) -> str:
    if value is None:
        return "—"
    if col.startswith("err_"):
        return f"{value:.2e}"
    if col == "speedup" or col == "mem_ratio":
        return f"{value:.2f}x"
    if isinstance(value, float):
        return f"{value:.3f}" if col.endswith("_s") else f"{value:.2f}"
    return str(value)


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table with one line per row and the columns of `COLUMNS`."""
    headers = [HEADERS.get(c, c) for c in COLUMNS]
    cells = [[_cell(c, row.get(c)) for c in COLUMNS] for row in rows]
    widths = [max([len(h)] + [min(len(r[i]), 60) for r in cells]) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v[:60].ljust(w) for v, w in zip(vals, widths))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


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
            "repeat": config.repeat, "device": config.device, "torch": torch.__version__,
            "kiln": kiln.__version__, "python": platform.python_version(),
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
    clean = [{c: _json_value(r.get(c)) for c in COLUMNS} for r in rows]
    with open(json_path, "w") as f:
        json.dump({"config": _config_dict(config), "columns": list(COLUMNS), "rows": clean,
                   "summary": summary(rows), "summary_line": summary_line(rows)}, f, indent=2)
    return [csv_path, json_path]


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_plot(rows: list[dict], out_dir: str) -> str | None:
    """speedups.png: speedup over eager per model and compiled variant; None when matplotlib is
    not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = names(rows)
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "eager"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(models)), 4))
    width = 0.8 / max(len(variants), 1)
    for k, variant in enumerate(variants):
        by_model = {r["model"]: r.get("speedup") or 0.0 for r in rows if r["variant"] == variant}
        ax.bar([i + k * width for i in range(len(models))],
               [by_model.get(m, 0.0) for m in models], width, label=variant)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([i + width * (len(variants) - 1) / 2 for i in range(len(models))])
    ax.set_xticklabels(models)
    ax.set_ylabel("speedup over eager")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out_dir, "speedups.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", help="comma-separated suite models (default: all)")
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
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    config = BenchConfig(models=parse_models(args.models),
                         backend=args.backend or kiln_config.default_backend, mode=args.mode,
                         dtype=_DTYPES[args.dtype], train=args.train,
                         size=args.size or ("full" if device == "cuda" else "small"),
                         compare=tuple(args.compare), repeat=args.repeat, device=device)
    echo(f"kiln {kiln.__version__} bench on {device} (torch {torch.__version__}): "
         f"{'training' if config.train else 'inference'}, {args.dtype}, size {config.size}, "
         f"backend {config.backend}" + (f", mode {config.mode}" if config.mode else ""))
    rows = run_bench(config, progress=sys.stderr)
    echo(format_table(rows))
    for path in write_results(rows, config, args.out):
        echo(f"wrote {path}")
    plot = write_plot(rows, args.out)
    echo(f"wrote {plot}" if plot else "plot skipped: matplotlib is missing")
    echo(summary_line(rows))
    if getattr(args, "report", False):
        echo(f"wrote {write_bench_report(config, args.out)}")
    return 0


def write_bench_report(config: BenchConfig, out_dir: str) -> str:
    """The HTML report of the run's first model (`python -m kiln report suite:<model>`, same
    backend, mode, device and size; training configs are reported in inference) as
    `<out_dir>/report.html`, with its debug dir beside it; returns the path."""
    import shutil

    from kiln.tools.report.cli import report_for_target, write_report
    backend = config.backend if isinstance(config.backend, str) else "eager"
    debug_dir = os.path.join(out_dir, "report_debug")
    shutil.rmtree(debug_dir, ignore_errors=True)  # ours: only this run's graphs
    data = report_for_target(f"suite:{config.models[0]}", backend=backend, mode=config.mode,
                             device=config.device, size=config.size, debug_dir=debug_dir)
    return write_report(data, os.path.join(out_dir, "report.html"))
