"""`kiln.tools.bench`: rows, files and summary on two small suite models, on the CPU."""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import re

import pytest
import torch

from kiln.tools import bench, bench_report
from kiln.tools.bench import COLUMNS, BenchConfig, max_error, run_bench
from kiln.tools.bench_report import format_table, summary_line, write_results
from kiln.tools.suite.registry import SUITE

MODELS = ("mlp", "gpt2")


def _config(**kw) -> BenchConfig:
    return BenchConfig(**{"models": MODELS, "size": "small", "repeat": 2, "device": "cpu", **kw})


def off_by_one(gm: torch.fx.GraphModule, example_inputs):
    """A wrong backend: every tensor output is shifted by 1.0."""
    def run(*args):
        out = gm.forward(*args)
        if isinstance(out, torch.Tensor):
            return out + 1.0
        return type(out)(o + 1.0 if isinstance(o, torch.Tensor) else o for o in out)
    return run


def test_rows_table_and_files_have_the_documented_columns(tmp_path):
    rows = run_bench(_config(), progress=None)
    assert [(r["model"], r["variant"]) for r in rows] == [
        ("mlp", "eager"), ("mlp", "kiln"), ("gpt2", "eager"), ("gpt2", "kiln")]
    for row in rows:
        assert tuple(row) == COLUMNS
        assert row["verdict"] == "pass", row
        assert row["median_ms"] > 0 and row["peak_mem_mb"] is None
        assert 0 < row["err_vs_fp64"] < 1e-4
    kiln_row = rows[1]
    assert kiln_row["graphs"] == 1 and kiln_row["breaks"] == 0
    assert kiln_row["cold_compile_s"] > 0 and kiln_row["recompile_warm_s"] >= 0
    assert kiln_row["speedup"] == rows[0]["median_ms"] / kiln_row["median_ms"]
    table = format_table(rows)
    for header in ("model", "variant", "verdict", "err vs eager", "err vs fp64", "median ms",
                   "speedup", "cold compile s", "recompile (warm process) s", "peak MB",
                   "mem ratio", "graphs", "breaks"):
        assert header in table.splitlines()[0]
    assert "—" in table  # no peak memory on the CPU
    csv_path, json_path = write_results(rows, _config(), str(tmp_path))
    with open(csv_path) as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        assert [r["verdict"] for r in reader] == ["pass"] * 4
    with open(json_path) as f:
        data = json.load(f)
    assert data["columns"] == list(COLUMNS) and len(data["rows"]) == 4
    assert data["summary"]["kiln"]["passed"] == 2


def test_wrong_backend_fails_accuracy():
    rows = run_bench(_config(models=("mlp",), backend=off_by_one), progress=None)
    eager, kiln_row = rows
    assert eager["verdict"] == "pass"
    assert kiln_row["verdict"].startswith("fail"), kiln_row
    assert kiln_row["err_vs_eager"] > 1e-2 and kiln_row["err_vs_fp64"] > 1e-2
    assert "kiln pass rate 0/1 (0%)" in summary_line(rows)


def doubled(gm: torch.fx.GraphModule, example_inputs):
    """A wrong backend for training: +1.0 would leave a cross-entropy loss unchanged."""
    def run(*args):
        out = gm.forward(*args)
        if isinstance(out, torch.Tensor):
            return out * 2.0
        return type(out)(o * 2.0 if isinstance(o, torch.Tensor) else o for o in out)
    return run


def test_training_step_compares_loss_and_gradients():
    rows = run_bench(_config(models=("mlp",), train=True), progress=None)
    assert [r["verdict"] for r in rows] == ["pass", "pass"]
    wrong = run_bench(_config(models=("mlp",), train=True, backend=doubled), progress=None)
    assert wrong[1]["verdict"].startswith("fail"), wrong[1]


def test_a_crashing_model_is_an_error_row_and_the_run_goes_on():
    def broken(size: str) -> torch.nn.Module:
        raise RuntimeError("factory exploded")
    specs = dict(SUITE, broken=dataclasses.replace(SUITE["mlp"], name="broken",
                                                   make_model=broken))
    rows = run_bench(_config(models=("broken", "mlp")), specs=specs, progress=None)
    assert [r["verdict"] for r in rows[:2]] == ["error: RuntimeError: factory exploded"] * 2
    assert [r["verdict"] for r in rows[2:]] == ["pass", "pass"]
    line = summary_line(rows)
    assert re.search(r"kiln pass rate 1/2 \(50%\), geomean speedup \d+\.\d\dx over eager", line)
    assert "error: RuntimeError" in format_table(rows)


def test_max_error_is_normalized_and_catches_nan_and_shape():
    ref = [torch.tensor([2.0, -4.0])]
    assert max_error([torch.tensor([2.0, -3.0])], ref) == 0.25
    assert max_error([torch.tensor([float("nan"), 0.0])], ref) == float("inf")
    assert max_error([torch.zeros(3)], ref) == float("inf")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_report.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_mode_flag_is_parsed_into_the_config(monkeypatch, tmp_path):
    assert _parse().mode is None
    with pytest.raises(SystemExit):
        _parse("--mode", "fastest")
    seen = []
    monkeypatch.setattr(bench_report, "run_bench",
                        lambda config, progress=None: seen.append(config) or [])
    args = _parse("--mode", "max-autotune", "--backend", "aot_eager", "--models", "mlp",
                  "--cpu", "--out", str(tmp_path))
    assert bench_report.bench_command(args, echo=lambda line: None) == 0
    assert seen[0].mode == "max-autotune" and seen[0].backend == "aot_eager"
    assert json.loads((tmp_path / "results.json").read_text())["config"]["mode"] == "max-autotune"


def test_mode_reaches_the_kiln_backend_and_torch_compile(monkeypatch):
    modes = []

    def recording(gm: torch.fx.GraphModule, example_inputs, *, mode=None):
        """A correct backend that records the mode kiln.compile hands it."""
        modes.append(mode)
        return gm.forward

    rows = run_bench(_config(models=("mlp",), backend=recording, mode="max-autotune"),
                     progress=None)
    assert [r["verdict"] for r in rows] == ["pass", "pass"]
    assert modes and set(modes) == {"max-autotune"}
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compiled.append(kw) or model)
    model = torch.nn.Linear(4, 4)
    for mode in (None, "default", "max-autotune"):
        config = _config(mode=mode)
        assert bench._compile("torch.compile", model, config) is model
    # torch's max-autotune brings CUDA graphs, which kiln lacks: compared without them
    assert [kw["mode"] for kw in compiled] == [None, "default", "max-autotune-no-cudagraphs"]


def test_bench_report_flag_writes_the_html_report(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    lines = []
    args = _parse("--models", "mlp", "--backend", "eager", "--cpu", "--repeat", "1",
                  "--out", str(tmp_path), "--report")
    assert bench_report.bench_command(args, echo=lines.append) == 0
    assert any(line.startswith("summary: kiln pass rate 1/1") for line in lines)
    report = os.path.join(str(tmp_path), "report.html")
    assert lines[-1] == f"wrote {report}"
    page = open(report).read()
    assert "kiln report: suite:mlp" in page and 'id="kernels"' in page
