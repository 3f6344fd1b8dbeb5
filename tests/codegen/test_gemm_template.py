"""GEMM templates with fused epilogues (kiln.codegen.gemm_template, kiln.runtime.gemm_tuning),
forced with `config.gemm_templates = "always"` so the Triton interpreter runs them: compiled
graphs against eager and an fp64 reference (fp32, bf16, fp16; bias, erf/tanh GELU, residual,
cast; masked tiles, transposed operands, bmm), the legality refusals, training under
max-autotune, the choice by an injected timer, its disk cache and the budget, and the default
mode left alone."""
from __future__ import annotations

import math
import runpy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.errors import InvalidArgument  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.options import resolve_options  # noqa: E402
from kiln.runtime import compile_graph  # noqa: E402
from kiln.runtime import gemm_tuning  # noqa: E402
from kiln.runtime.gemm_tuning import LIBRARY, gemm_timer  # noqa: E402

pytestmark = pytest.mark.usefixtures("generated_kernels")

TUNED = "max-autotune-no-cudagraphs"


def _compile(fn, args, mode=TUNED, options=None):
    return compile_graph(trace_aten(fn, *args), args, options=resolve_options(mode, options))


def _templates(artifact) -> list:
    return [s for s in artifact.specs if s.kind == "gemm_template"]


def _check(fn, args, artifact, scale: float = 1.0):
    """Compiled vs an fp64 reference: within 2x eager's own error (+ a small floor)."""
    got = artifact(*args)
    eager = fn(*args)
    ref = fn(*[a.detach().double().cpu() for a in args])
    got = got if isinstance(got, tuple) else (got,)
    eager = eager if isinstance(eager, tuple) else (eager,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for g, e, r in zip(got, eager, ref):
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        err = (g.double().cpu() - r).abs().max().item()
        eager_err = (e.double().cpu() - r).abs().max().item()
        floor = (1e-5 if e.dtype == torch.float32 else 2e-2) * scale * max(1.0, r.abs().max())
        assert err <= 2 * eager_err + floor, (err, eager_err)


def _linear_args(dtype, m=18, k=20, n=24, batch=(2,)):
    x = torch.randn(*batch, m // math.prod(batch) if batch else m, k).to(dtype)
    w = (torch.randn(n, k) / k ** 0.5).to(dtype)
    b = torch.randn(n).to(dtype)
    r = torch.randn(*x.shape[:-1], n).to(dtype)
    return x, w, b, r


def gelu_erf(x, w, b, r):
    return F.gelu(F.linear(x, w, b))


def gelu_tanh(x, w, b, r):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def residual(x, w, b, r):
    return F.linear(x, w, b) + r


def gelu_residual_cast(x, w, b, r):
    return (F.gelu(F.linear(x, w, b)) + r).to(torch.bfloat16)


def bias_relu_no_bias_mm(x, w, b, r):
    return torch.relu(x @ w.t() + b)


EPILOGUES = [gelu_erf, gelu_tanh, residual, gelu_residual_cast, bias_relu_no_bias_mm]


@pytest.fixture(autouse=True)
def _forced():
    config.gemm_templates = "always"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("fn", EPILOGUES, ids=lambda f: f.__name__)
def test_epilogues_match_eager(fn, dtype):
    args = _linear_args(dtype)
    artifact = _compile(fn, args)
    (spec,) = _templates(artifact)
    assert "extern" not in artifact.wrapper_source and "aten.addmm" not in artifact.wrapper_source
    assert artifact.kernel_launches == 1  # one kernel: the library call and epilogue are gone
    _check(fn, args, artifact)


@pytest.mark.parametrize("sizes", [(16, 16, 16), (33, 17, 40), (7, 70, 5), (64, 48, 96)])
def test_sizes_that_are_not_block_multiples(sizes):
    m, k, n = sizes
    args = _linear_args(torch.float32, m=m, k=k, n=n, batch=())
    artifact = _compile(gelu_erf, args)
    (spec,) = _templates(artifact)
    masked = m % spec.meta_dict["BLOCK_M"] or n % spec.meta_dict["BLOCK_N"]
    assert ("xmask" in spec.source) == bool(masked)
    assert ("rk[None, :] <" in spec.source) == bool(k % spec.meta_dict["BLOCK_K"])
    # a partial last tile wraps its operand rows; exact tilings read them unwrapped
    assert (f"am = offs_m % {m}" in spec.source) == bool(m % spec.meta_dict["BLOCK_M"])
    assert (f"bn = offs_n % {n}" in spec.source) == bool(n % spec.meta_dict["BLOCK_N"])
    _check(gelu_erf, args, artifact)


def test_every_config_computes_the_same(tmp_path, monkeypatch):
    from kiln.codegen.gemm_template import emit_gemm, gemm_configs
    from kiln.lower import lower_graph
    from kiln.schedule import schedule
    from kiln.schedule.gemm_epilogue import find_gemm_epilogues

    args = _linear_args(torch.float32, m=40, k=72, n=80, batch=())
    graph = lower_graph(trace_aten(gelu_tanh, *args), list(args))
    plan = schedule(graph)
    (cand,) = find_gemm_epilogues(plan)
    configs = gemm_configs(cand.group.gemm, torch.float32)
    assert 2 <= len(configs) <= 6
    sources = {emit_gemm(cand.group, plan.graph, c).source for c in configs}
    assert len(sources) == len(configs)
    for i in range(len(configs)):
        timings = [9.0] * (len(configs) + 1)
        timings[i + 1] = 1.0
        kiln.reset()
        monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / str(i)))  # no cached choice
        with gemm_timer(lambda label, run, t=iter(timings): (run(), next(t))[1]):
            artifact = _compile(gelu_tanh, args, options={"gemm_autotune_budget_s": 60.0})
        (spec,) = _templates(artifact)
        assert spec.num_warps == configs[i].num_warps and spec.meta_dict["BLOCK_M"] == \
            configs[i].BLOCK_M and spec.num_stages == configs[i].num_stages
        _check(gelu_tanh, args, artifact)


def test_transposed_operands_and_stored_output():
    x = torch.randn(20, 18)  # read as x.t(): rows of A are strided
    w = torch.randn(20, 24)

    def fn(x, w):
        y = x.t() @ w
        return y, torch.sigmoid(y) * 3

    artifact = _compile(fn, (x, w))
    (spec,) = _templates(artifact)
    assert len(spec.writes) == 2  # y is a graph output: the template writes it too
    _check(fn, (x, w), artifact)


def test_bmm_with_a_scale_epilogue():
    q, k = torch.randn(3, 10, 16), torch.randn(3, 24, 16)

    def fn(q, k):
        return torch.tanh(torch.bmm(q, k.transpose(1, 2)) * 0.25)

    artifact = _compile(fn, (q, k))
    (spec,) = _templates(artifact)
    assert spec.grid(spec.meta_dict)[1] == 3
    _check(fn, (q, k), artifact)


def test_epilogue_reading_the_output_transposed_keeps_the_library_call():
    x, w = torch.randn(16, 20), torch.randn(20, 24)

    def fn(x, w):
        return ((x @ w).t() + 1).contiguous()

    artifact = _compile(fn, (x, w))
    assert not _templates(artifact) and "aten.mm.default" in artifact.wrapper_source
    _check(fn, (x, w), artifact)


def test_reduction_reader_keeps_the_library_call():
    x, w = torch.randn(16, 20), torch.randn(20, 24)

    def fn(x, w):
        return F.softmax(x @ w, dim=-1)

    artifact = _compile(fn, (x, w))
    assert not _templates(artifact)
    _check(fn, (x, w), artifact)


def test_kernel_names_its_user_lines_and_prints_as_python(capsys, tmp_path):
    from kiln import logs

    logs.set_logs("output_code")
    x, w, b, r = _linear_args(torch.float32)
    mlp = torch.nn.Sequential(torch.nn.Linear(20, 24), torch.nn.GELU())
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(mlp, backend="kiln", mode=TUNED)(x), mlp(x))
    err = capsys.readouterr().err
    source = err[err.index("# kiln gemm_template kernel"):]
    source = source[:source.index("\n[kiln:")] if "\n[kiln:" in source else source
    assert "from addmm (aten.addmm.default) at" in source
    assert "linear.py:" in source and "activation.py:" in source  # the user lines it came from
    name = source[source.index("def kiln_gemm") + 4:].split("(")[0]
    kernel_file = tmp_path / "kernel.py"  # triton.jit reads a kernel's source from its file
    kernel_file.write_text(source)
    assert name in runpy.run_path(str(kernel_file))  # runnable Python


def test_default_mode_is_unchanged():
    args = _linear_args(torch.float32)
    artifact = _compile(gelu_erf, args, mode=None)
    assert not _templates(artifact) and "aten.addmm.default" in artifact.wrapper_source
    calls = []
    with gemm_timer(lambda label, run: calls.append(label) or 1.0):
        artifact = _compile(gelu_erf, args, mode="reduce-overhead")
    assert not _templates(artifact) and not calls


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's rule")
def test_auto_keeps_the_library_call_where_nothing_can_be_timed(caplog):
    config.gemm_templates = "auto"
    args = _linear_args(torch.float32)
    with caplog.at_level("INFO", logger="kiln.runtime"):
        artifact = _compile(gelu_erf, args)
    assert not _templates(artifact) and "no GPU to time on" in caplog.text
    config.gemm_templates = "never"
    calls = []
    with gemm_timer(lambda label, run: calls.append(label) or 1.0):
        assert not _templates(_compile(gelu_erf, args)) and not calls


def test_training_under_max_autotune_matches_eager():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.GELU(),
                              torch.nn.Linear(48, 20))
    x = torch.randn(3, 6, 20, requires_grad=True)
    ref_model = mlp
    compiled = kiln.compile(mlp, backend="kiln", mode=TUNED)
    out = compiled(x)
    out.pow(2).mean().backward()
    grads = [p.grad.clone() for p in mlp.parameters()] + [x.grad.clone()]
    for p in mlp.parameters():
        p.grad = None
    x.grad = None
    ref = ref_model(x)
    ref.pow(2).mean().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads, [p.grad for p in mlp.parameters()] + [x.grad]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


# -- choice, disk cache and budget ------------------------------------------------------------

class FakeTimer:
    """Runs each candidate once (it must not fail) and reports `times[label]` (the library
    call: LIBRARY; templates by position)."""

    def __init__(self, library_ms: float, template_ms: list[float], clock=None):
        self.library_ms, self.template_ms, self.clock = library_ms, template_ms, clock
        self.timed: list[str] = []

    def __call__(self, label, run):
        run()
        self.timed.append(label)
        if self.clock is not None:
            self.clock.now += 1.0
        if label == LIBRARY:
            return self.library_ms
        return self.template_ms[len(self.timed) - 2]


def test_the_fastest_wins_and_the_choice_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "fresh"))
    config.gemm_templates = "auto"
    args = _linear_args(torch.float32)
    timer = FakeTimer(2.0, [3.0, 1.0, 4.0, 5.0, 6.0, 7.0])
    with gemm_timer(timer):
        first = _compile(gelu_erf, args)
    assert timer.timed[0] == LIBRARY and len(timer.timed) >= 3
    (spec,) = _templates(first)
    assert [p for p in (tmp_path / "fresh").rglob("*") if "gemm" in str(p) and p.is_file()]
    kiln.reset()
    again = FakeTimer(2.0, [3.0, 1.0])
    with gemm_timer(again):
        second = _compile(gelu_erf, args)
    assert again.timed == []  # read from disk: nothing benchmarked
    (spec2,) = _templates(second)
    assert spec2.source == spec.source
    _check(gelu_erf, args, second)


def test_the_library_call_wins_when_faster(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "fresh"))
    config.gemm_templates = "auto"
    args = _linear_args(torch.float32)
    with gemm_timer(FakeTimer(0.5, [1.0] * 6)):
        artifact = _compile(gelu_erf, args)
    assert not _templates(artifact) and "aten.addmm.default" in artifact.wrapper_source
    _check(gelu_erf, args, artifact)
    config.gemm_templates = "always"  # forced: a template even though the library won
    kiln.reset()
    again = FakeTimer(0.5, [1.0] * 6)
    with gemm_timer(again):
        artifact = _compile(gelu_erf, args)
    assert again.timed == [] and len(_templates(artifact)) == 1


class _Clock:
    now = 0.0

    def perf_counter(self):
        return self.now


def _two_gemms(x, w1, w2):
    h = F.gelu(x @ w1)
    return torch.relu(h @ w2)


def test_budget_stops_benchmarking_and_later_gemms_keep_the_library(monkeypatch, caplog):
    config.gemm_templates = "auto"
    clock = _Clock()
    monkeypatch.setattr(gemm_tuning.time, "perf_counter", clock.perf_counter)
    args = (torch.randn(40, 20), torch.randn(20, 72), torch.randn(72, 24))
    timer = FakeTimer(5.0, [4.0, 1.0, 0.5, 0.1, 0.1, 0.1], clock)
    with gemm_timer(timer), caplog.at_level("INFO", logger="kiln.runtime"):
        artifact = _compile(_two_gemms, args, options={"gemm_autotune_budget_s": 2.5})
    # clock: 0 library, 1 template 0, 2 template 1; at 3 > 2.5 the first gemm stops
    assert len(timer.timed) == 3 and "budget spent" in caplog.text
    (spec,) = _templates(artifact)  # the best measured (template 1); the second gemm: library
    assert "gelu" in spec.name and "aten.mm.default" in artifact.wrapper_source
    _check(_two_gemms, args, artifact)


def test_a_template_that_fails_is_skipped():
    config.gemm_templates = "auto"
    timed = []

    def timer(label, run):
        timed.append(label)
        if len(timed) == 2:  # the first template
            raise RuntimeError("out of resources: shared memory")
        return 5.0 if label == LIBRARY else float(len(timed))

    args = _linear_args(torch.float32, m=40, k=72, n=80, batch=())
    with gemm_timer(timer):
        artifact = _compile(gelu_erf, args)
    (spec,) = _templates(artifact)
    assert len(timed) >= 3 and f"{spec.meta_dict['BLOCK_M']}x{spec.meta_dict['BLOCK_N']}x" \
        f"{spec.meta_dict['BLOCK_K']} GROUP_M=8 num_warps={spec.num_warps} " \
        f"num_stages={spec.num_stages}" == timed[2]  # the next one, the fastest that ran
    _check(gelu_erf, args, artifact)


def test_gemm_budget_option_is_validated():
    assert resolve_options(TUNED, {"gemm_autotune_budget_s": 3}).gemm_autotune_budget_s == 3.0
    for bad in (0, -1.0, "5"):
        with pytest.raises(InvalidArgument, match="gemm_autotune_budget_s"):
            resolve_options(TUNED, {"gemm_autotune_budget_s": bad})


def test_stored_artifact_and_kernel_records_keep_the_template():
    """The warm-start cache stores a compiled graph as data (`artifact_json`): the template
    comes back as a kernel with a fixed grid; kernels.json counts its flops; the schedule's
    text names the template step."""
    from kiln.runtime.artifact_json import artifact_from_json, artifact_json, check_artifact_json
    from kiln.runtime.debug import kernel_records

    args = _linear_args(torch.float32)
    artifact = _compile(gelu_residual_cast, args)
    (record,) = [r for r in kernel_records(artifact) if r["kind"] == "gemm_template"]
    assert record["flops"] == 2 * 18 * 24 * 20 and record["user_locations"] == []
    from kiln.schedule import render_schedule

    text = render_schedule(artifact.schedule)
    assert "gemm template: addmm 18x24x20 + epilogue" in text and "buf0 addmm float32" in text
    data = artifact_json(artifact)
    check_artifact_json(data)
    again = artifact_from_json(data)
    assert [s.kind for s in again.specs] == ["gemm_template"]
    torch.testing.assert_close(again(*args), artifact(*args), atol=0, rtol=0)


class _Terminal:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_progress_is_one_updating_line_on_a_terminal(monkeypatch, tmp_path):
    terminal = _Terminal()
    monkeypatch.setattr(gemm_tuning.sys, "stderr", terminal)
    args = _linear_args(torch.float32)
    with gemm_timer(FakeTimer(2.0, [1.0] * 6)):
        _compile(gelu_erf, args)
    # on a GPU the pointwise kernels' autotuner writes its own progress lines beside it
    gemm = terminal.text[terminal.text.index("\r\033[K[kiln gemm]"):]
    assert "\n" in gemm  # ended
    updates = gemm[:gemm.index("\n")].split("\r")[1:]  # one line: every update before its end
    assert len(updates) == terminal.text.count("[kiln gemm]") >= 2
    assert all(u.startswith("\033[K[kiln gemm] 1/1 addmm 18x24x20 -> ") for u in updates)
    assert "library 2000.0 us, best template 1000.0 us" in updates[-1]


def test_without_a_terminal_one_info_line_per_gemm(monkeypatch, caplog):
    monkeypatch.setattr(gemm_tuning.sys, "stderr", __import__("io").StringIO())
    args = (torch.randn(40, 20), torch.randn(20, 72), torch.randn(72, 24))
    with gemm_timer(FakeTimer(2.0, [1.0] * 12)), caplog.at_level("INFO", logger="kiln.runtime"):
        _compile(_two_gemms, args)
    chose = [r.getMessage() for r in caplog.records if " chose " in r.getMessage()
             and not r.getMessage().startswith("autotune ")]  # pointwise kernels' (GPU)
    assert len(chose) == 2 and "mm 40x72x20 -> gelu" in chose[0] and "library: 2000.0 us" in \
        chose[0]
    assert gemm_tuning.sys.stderr.getvalue() == ""


_SECOND_PROCESS = """
import os, sys
sys.path[:0] = [{tests!r}]
import torch
from kiln.config import config
from kiln.runtime import gemm_tuning
import test_gemm_template as t

config.cpu_codegen, config.suppress_errors, config.gemm_templates = "triton_interpret", False, "auto"

def refuse(label, run):
    raise AssertionError("benchmarked again: " + label)

torch.manual_seed(0)
args = t._linear_args(torch.float32)
with gemm_tuning.gemm_timer(refuse):
    artifact = t._compile(t.gelu_erf, args)
(spec,) = t._templates(artifact)
print(spec.meta_dict["BLOCK_M"], spec.num_stages)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the child runs on the CPU interpreter")
def test_another_process_reads_the_choice_and_benchmarks_nothing(tmp_path, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    from child_env import ROOT, child_env

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "shared"))
    config.gemm_templates = "auto"
    torch.manual_seed(0)
    args = _linear_args(torch.float32)
    with gemm_timer(FakeTimer(2.0, [3.0, 1.0, 4.0, 5.0, 6.0, 7.0])):
        (spec,) = _templates(_compile(gelu_erf, args))
    script = _SECOND_PROCESS.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=child_env(TRITON_INTERPRET="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(spec.meta_dict["BLOCK_M"]), str(spec.num_stages)]


def test_seed_block_inference_and_training(monkeypatch):
    from kiln.tools.seed_model import TransformerBlock

    fused = []
    real = gemm_tuning.fuse_gemm_epilogues
    monkeypatch.setattr(gemm_tuning, "fuse_gemm_epilogues",
                        lambda s, cands: fused.extend(cands) or real(s, cands))
    torch.manual_seed(0)
    block = TransformerBlock(32, 4)
    x = torch.randn(2, 8, 32, requires_grad=True)
    out = kiln.compile(block, backend="kiln", mode=TUNED)(x)
    ref = block(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    grad = torch.randn_like(out)
    inputs = [x, *block.parameters()]
    for got, want in zip(torch.autograd.grad(out, inputs, grad),
                         torch.autograd.grad(ref, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # fc1 + GELU in the forward, its recomputation + GELU's backward in the backward
    assert [c.group.gemm.kind for c in fused] == ["addmm", "mm"]
