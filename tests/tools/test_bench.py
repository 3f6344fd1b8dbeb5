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
from kiln.tools.suite.model_registry import SUITE

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
        assert tuple(row) == COLUMNS + ("compile_stages",)
        assert row["verdict"] == "pass", row
        assert row["input"] == bench.input_shapes(SUITE[row["model"]].build("small")[1].inputs)
        assert row["median_ms"] > 0 and row["peak_mem_mb"] > 0  # the CPU meter
        assert 0 < row["err_vs_fp64"] < 1e-4
    kiln_row = rows[1]
    assert kiln_row["graphs"] == 1 and kiln_row["breaks"] == 0
    # compile = kiln's recorded stages; the first call also runs the compiled code once
    assert kiln_row["compile_s"] == pytest.approx(sum(kiln_row["compile_stages"].values()))
    assert "capture" in kiln_row["compile_stages"]
    assert 0 < kiln_row["compile_s"] < kiln_row["first_call_s"]
    assert kiln_row["recompile_warm_s"] >= 0
    assert kiln_row["speedup"] == rows[0]["median_ms"] / kiln_row["median_ms"]
    assert rows[0]["mem_ratio"] == 1.0
    assert kiln_row["mem_ratio"] == kiln_row["peak_mem_mb"] / rows[0]["peak_mem_mb"]
    table = format_table(rows)
    assert table.splitlines()[0].split() == ["model", "variant", "input", "verdict", "vs",
                                             "eager", "vs", "fp64", "ms", "speedup", "compile",
                                             "graphs", "peak", "mem"]
    assert re.search(r"^mlp +kiln +16x32 +pass ", table, re.M), table
    assert re.search(r" 1/0 +[0-9.]+[KMG] +[0-9.]+x$", table.splitlines()[3]), table
    assert "not measured" not in table
    csv_path, json_path = write_results(rows, _config(), str(tmp_path))
    with open(csv_path) as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        assert [r["verdict"] for r in reader] == ["pass"] * 4
    with open(json_path) as f:
        data = json.load(f)
    assert data["columns"] == list(COLUMNS) and len(data["rows"]) == 4
    assert data["rows"][0]["input"] == [[16, 32]]
    assert data["rows"][1]["peak_mem_mb"] > 0 and data["rows"][1]["mem_ratio"] > 0
    assert data["config"]["kiln_runs"].startswith("kiln captures the graph and the eager backend "
                                                  "runs it as torch ops")
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
    assert modes and set(modes) == {"max-autotune-no-cudagraphs"}  # CUDA graphs off in both
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compiled.append(kw) or model)
    model = torch.nn.Linear(4, 4)
    for mode in (None, "default", "max-autotune"):
        config = _config(mode=mode)
        assert bench._compile("torch.compile", model, config) is model
    # max-autotune brings CUDA graphs: both compilers are compared without them
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
    bench_section = page.split('id="bench"')[1].split("</section>")[0]
    assert re.search(r"mlp +kiln +16x32 +pass", bench_section), bench_section
    assert "summary: kiln pass rate 1/1" in bench_section


def _fake_row(model: str, variant: str, **kw) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(model=model, variant=variant, input=[[32, 512, 1024], [32, 512]], verdict="pass",
               err_vs_eager=1.234e-7, err_vs_fp64=float("inf"), median_ms=12345.678,
               speedup=123.456, compile_s=1234.5678, graphs=12, breaks=11, **kw)
    return row


@pytest.mark.parametrize("memory", [False, True])
def test_table_fits_100_columns_even_with_long_names_and_errors(memory):
    extra = {"peak_mem_mb": 12345.6, "mem_ratio": 12.34} if memory else {}
    rows = [_fake_row("hf:a_very_long_architecture_name", variant, **extra)
            for variant in ("eager", "kiln", "torch.compile")]
    rows[1]["verdict"] = "error: RuntimeError: " + "something went wrong " * 20
    table = format_table(rows)
    assert max(len(line) for line in table.splitlines()) <= 100, table
    assert ("mem" in table.splitlines()[0]) is memory
    cut = "32x5…" if memory else "32x512x102…"  # the input shapes, cut (JSON has all)
    assert f"{cut} error" in table.splitlines()[3]
    if memory:
        assert table.splitlines()[2].endswith(" 12.1G 12.34x")
    else:
        assert "peak memory: not measured" in table
    assert "hf:a_very_long_architecture_name / kiln: error: RuntimeError: something" in table
    assert max(len(line) for line in bench_report.legend(memory).splitlines()) <= 100


def test_unknown_model_exits_non_zero_and_lists_the_choices(tmp_path, capsys):
    args = _parse("--models", "mlp,nosuch", "--cpu", "--out", str(tmp_path))
    assert bench_report.bench_command(args, echo=lambda line: None) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln bench: unknown model(s) nosuch; choose from seed_block, gpt2")
    assert not os.listdir(tmp_path)  # nothing written


def test_bench_help_lists_the_models_and_describes_the_command(capsys):
    from kiln.__main__ import main
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "Benchmark models of kiln's suite under eager PyTorch" in out
    assert "Rendering of" not in out and "`kiln.tools" not in out  # no developer docstring
    for name in SUITE:
        assert f"\n  {name} " in out


def test_cpu_note_says_what_kiln_ran(monkeypatch):
    from kiln.config import config
    assert "runs the captured graph as torch ops" in bench_report.execution_note("cpu", "kiln")
    with config.patch(cpu_codegen="triton_interpret"):
        note = bench_report.execution_note("cpu", "kiln")
    assert note.startswith("on CPU kiln runs its generated Triton kernels in Triton's interpreter")
    assert bench_report.execution_note("cuda", "kiln") == "kiln runs its generated Triton kernels"


def test_model_families_are_found_by_name_and_unknown_ones_listed():
    pytest.importorskip("transformers")
    assert bench.unknown_models(["mlp", "hf:gpt2", "hf:no_such_arch", "no_such_model"]) == [
        "hf:no_such_arch", "no_such_model"]


def test_a_transformers_family_model_runs_in_the_bench():
    pytest.importorskip("transformers")
    rows = run_bench(_config(models=("hf:gpt2",), repeat=1), progress=None)
    assert [(r["model"], r["variant"], r["verdict"]) for r in rows] == [
        ("hf:gpt2", "eager", "pass"), ("hf:gpt2", "kiln", "pass")]
    assert rows[1]["graphs"] >= 1


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_kiln_kernels_peak_at_most_eager(generated_kernels, train):
    """With kiln's generated kernels (interpreted on the CPU), the bench's peak-memory ratio
    for the seed block is at most 1: the meter collects the interpreter's cycles."""
    config = _config(models=("seed_block",), backend="kiln", train=train, repeat=1)
    eager, kiln_row = run_bench(config, progress=None)
    assert kiln_row["verdict"] == "pass", kiln_row
    assert 0 < kiln_row["mem_ratio"] <= 1.0, (kiln_row["peak_mem_mb"], eager["peak_mem_mb"])
