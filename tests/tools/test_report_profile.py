"""The report's profile section: eager, torch.compile and kiln side by side under torch.profiler.

Live on the test device (a small model: both columns, categories that sum to the total, kiln's
rows mapped back to its kernels.json steps, the same section rebuilt from the debug dir), a
torch.compile that fails (a note, not a crash), the CUDA reading on synthetic device events
(golden numbers), the category rule table on real kernel names, the empty states, and the
terminal summary of `python -m kiln report`."""
from __future__ import annotations

import argparse
import contextlib
import html.parser
import os
import subprocess
import sys
import types

import pytest
import torch

from child_env import child_env
from kiln.config import config
from kiln.tools.report import collect_report, from_debug_dir, render_html
from kiln.tools.report.data import ReportData
from kiln.tools.report.profile import Profiled, kernel_times
from kiln.tools.report.render_profile import profile_lines
from kiln.tools.report.timeline import (COPY, GENERATED, MATMUL, NATIVE, OUTSIDE, VIEWS,
                                        categorize, read_profile)
from kiln.tools.report.variants import map_kiln_kernels


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


class _Profile(html.parser.HTMLParser):
    """The profile section's text, its tables' rows and its <h3> headings."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self.tables, self.headings = "", [], []
        self._inside, self._cell, self._tag = False, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self._inside = dict(attrs)["id"] == "profile"
        elif self._inside and tag == "table":
            self.tables.append([])
        elif self._inside and tag == "tr":
            self.tables[-1].append([])
        elif self._inside and tag in ("td", "th"):
            self._cell = []
        self._tag = tag

    def handle_endtag(self, tag):
        if tag == "section":
            self._inside = False
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if not self._inside:
            return
        self.text += data
        if self._cell is not None:
            self._cell.append(data)
        if self._tag == "h3":
            self.headings.append(data)


def _profile_html(data: ReportData) -> _Profile:
    parser = _Profile()
    parser.feed(render_html(data))
    return parser


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = (torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                         torch.nn.Linear(32, 8))

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.norm(self.up(x))))


def _collect(tmp_path, device, **kwargs) -> ReportData:
    model = _Small().to(device).eval()
    x = torch.randn(4, 16, device=device)
    interpret = device.type == "cpu"  # kiln's kernels run interpreted on CPU tensors
    codegen = (config.patch(cpu_codegen="triton_interpret") if interpret
               else contextlib.nullcontext())
    with codegen, torch.no_grad():
        return collect_report(model, (x,), target="test:small", backend="kiln",
                              device=device.type, debug_dir=str(tmp_path / "debug"), calls=2,
                              ceilings=False, **kwargs)


def test_profile_section_sets_eager_and_kiln_side_by_side(tmp_path, device):
    data = _collect(tmp_path, device, variants=("eager", "kiln"))
    variants = {v["name"]: v for v in data.profile["variants"]}
    assert list(variants) == ["eager", "kiln"]
    for v in variants.values():
        assert v["total_us"] > 0 and v["kernels"], v["name"]
        assert v["categories"][MATMUL] > 0, v["name"]  # two Linear layers in each
    page = _profile_html(data)
    per_call = page.tables[0]
    assert per_call[0] == ["µs per call", "eager", "kiln"]
    rows = {r[0]: r[1:] for r in per_call[1:]}
    categories = [c for c in rows if c in (MATMUL, GENERATED, NATIVE, COPY, VIEWS, OUTSIDE)]
    for column in range(2):  # the categories sum to the total, within the table's rounding
        total = _number(rows["total"][column])
        assert abs(sum(_number(rows[c][column]) for c in categories) - total) <= \
            0.05 * len(categories) + 0.05
    # kiln's library calls point back at its extern steps and their user lines
    kiln_rows = variants["kiln"]["kernels"]
    mapped = [r for r in kiln_rows if r.get("steps")]
    assert mapped and all(set(r["steps"]) <= {k["name"] for k in data.kernels} for r in mapped)
    assert any(k.startswith("extern:") for r in mapped for k in r.get("kinds") or ()), kiln_rows
    if device.type == "cuda":  # compiled Triton kernels keep kiln's names: mapped by name
        assert any(r["category"] == GENERATED and r.get("steps") == [r["name"]]
                   and r.get("user_locations") for r in kiln_rows), kiln_rows
    assert "kiln group / user lines" in page.tables[-1][0]
    # report.json carries the section: --from-debug-dir rebuilds the same numbers
    again = _profile_html(from_debug_dir(str(tmp_path / "debug")))
    assert again.tables == page.tables


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="kiln's kernels on CPU tensors need Triton's interpreter, and this "
                           "process compiles real kernels (one Triton mode per process)")
def test_cpu_profile_says_it_shows_cpu_ops(tmp_path):
    data = _collect(tmp_path, torch.device("cpu"), variants=("eager", "kiln"))
    text = " ".join(_profile_html(data).text.split())
    assert "on the CPU there are no device kernels: rows are CPU-side ops" in text
    assert OUTSIDE in text and "kiln's Triton kernels when they run in the interpreter" in text
    kiln = next(v for v in data.profile["variants"] if v["name"] == "kiln")
    assert kiln["categories"][OUTSIDE] > 0  # the interpreted kernels run outside any op
    assert profile_lines(data.profile)[0].startswith("profile on the CPU: CPU-side ops")


def _no_compiler(gm, example_inputs):
    raise RuntimeError("no C++ compiler on this machine (test)")


def test_failing_torch_compile_is_a_note_not_a_crash(tmp_path, device):
    data = _collect(tmp_path, device, torch_backend=_no_compiler)
    variants = {v["name"]: v for v in data.profile["variants"]}
    assert list(variants) == ["eager", "torch.compile", "kiln"]
    note = variants["torch.compile"]["note"]
    assert note.startswith("torch.compile failed: ") and "no C++ compiler" in note
    assert "categories" not in variants["torch.compile"]
    page = _profile_html(data)
    assert "torch.compile: torch.compile failed" in " ".join(page.text.split())
    assert page.tables[0][0] == ["µs per call", "eager", "kiln"]
    assert data.profile["gaps"]["against"] == "eager"  # kiln is compared with what ran
    assert "(torch.compile was not profiled)" in page.text
    assert any("torch.compile failed" in line for line in profile_lines(data.profile))


# --- the CUDA reading, on synthetic events ---------------------------------------------------

class _Range:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def elapsed_us(self) -> float:
        return self.end - self.start


class _Event:
    """The fields of torch's FunctionEvent that the report reads."""

    def __init__(self, name, start, end, *, device=False, parent=None, kernels=(), dev_us=0.0,
                 annotation=False):
        self.name, self.time_range, self.cpu_parent = name, _Range(start, end), parent
        self.is_user_annotation = annotation
        self.device_type = (torch.autograd.DeviceType.CUDA if device
                            else torch.autograd.DeviceType.CPU)
        self.kernels = [types.SimpleNamespace(name=k) for k in kernels]
        self.cpu_time_total, self.device_time_total = end - start, dev_us


GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
STEPS = [{"name": "buf0", "kind": "extern:addmm", "ops": ["aten.addmm.default"],
          "user_locations": ["model.py:3"], "source": None},
         {"name": "kiln_poi_add_relu_group1", "kind": "pointwise",
          "ops": ["aten.add.Tensor", "aten.relu.default"], "user_locations": ["model.py:4"],
          "source": "kernels/kiln_poi_add_relu_group1.py"}]


def _cuda_calls(calls: int) -> list[_Event]:
    """Per call: a step range (on the CPU and, as torch records it, on the GPU timeline too),
    aten::addmm launching a GEMM (10 µs), kiln's Triton kernel (4 µs), a device-to-device copy
    (1 µs) and a fill (2 µs)."""
    events = []
    for i in range(calls):
        t = 100.0 * i
        step = _Event(f"ProfilerStep#{i}", t, t + 50)
        addmm = _Event("aten::addmm", t + 1, t + 5, parent=step, dev_us=10.0)
        launch = _Event("cudaLaunchKernel", t + 2, t + 3, parent=addmm, kernels=[GEMM])
        events += [step, _Event(f"ProfilerStep#{i}", t + 5, t + 22, device=True,
                                annotation=True),
                   addmm, launch, _Event(GEMM, t + 5, t + 15, device=True),
                   _Event("kiln_poi_add_relu_group1", t + 15, t + 19, device=True),
                   _Event("Memcpy DtoD (Device -> Device)", t + 19, t + 20, device=True),
                   _Event(FILL, t + 20, t + 22, device=True)]
    return events


def test_cuda_rows_categories_and_mapping_from_device_events():
    profiled = Profiled(_cuda_calls(3), "cuda:0", 3)
    read = read_profile(profiled, frozenset(s["name"] for s in STEPS))
    assert read["total_us"] == pytest.approx(17.0) and read["wall_us"] == pytest.approx(50.0)
    assert read["kernels_per_call"] == pytest.approx(4.0)
    assert read["categories"] == pytest.approx({MATMUL: 10.0, GENERATED: 4.0, NATIVE: 2.0,
                                                COPY: 1.0})
    assert [r["name"] for r in read["kernels"]] == [GEMM, "kiln_poi_add_relu_group1",
                                                    FILL, "Memcpy DtoD (Device -> Device)"]
    map_kiln_kernels(read["kernels"], STEPS)
    gemm, kiln_kernel = read["kernels"][:2]
    assert gemm["op"] == "aten::addmm" and gemm["steps"] == ["buf0"]
    assert gemm["kinds"] == ["extern:addmm"] and gemm["user_locations"] == ["model.py:3"]
    assert kiln_kernel["steps"] == ["kiln_poi_add_relu_group1"]
    assert kiln_kernel["ops"] == ["aten.add.Tensor", "aten.relu.default"]
    assert "steps" not in read["kernels"][2]  # a fill kiln's steps do not name
    times, note = kernel_times(profiled, STEPS)  # the kernels section reads the same profile
    assert times == pytest.approx({"buf0": 10e-6, "kiln_poi_add_relu_group1": 4e-6})
    assert "launch order" in note


@pytest.mark.parametrize("name, category", [
    (GEMM, MATMUL), ("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NNT", MATMUL),
    ("ampere_sgemm_32x128_tn", MATMUL), ("void pytorch_flash::flash_fwd_kernel<...>", MATMUL),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", MATMUL), ("aten::linear", MATMUL),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", MATMUL), ("aten::conv2d", MATMUL),
    ("triton_tem_fused_mm_0", MATMUL), ("triton_poi_fused_add_0", GENERATED),
    ("triton_red_fused_sum_1", GENERATED), ("kiln_per_add_native_layer_norm_group3", GENERATED),
    ("graph_0_cpp_fused_gelu_view_3", GENERATED), ("Memcpy HtoD (Pageable -> Device)", COPY),
    ("Memset (Device)", COPY), ("aten::copy_", COPY), ("aten::clone", COPY),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", COPY),
    (FILL, NATIVE), ("aten::layer_norm", NATIVE), ("aten::gelu", NATIVE),
    ("void at::native::vectorized_elementwise_kernel<4, convert_to_float>", NATIVE),
    ("aten::empty_strided", VIEWS), ("aten::as_strided", VIEWS),
])
def test_category_rules_on_real_names(name, category):
    assert categorize(name) == category


def test_a_kiln_kernel_name_is_generated_whatever_it_looks_like():
    assert categorize("buf7_copy", frozenset({"buf7_copy"})) == GENERATED


# --- empty states and the terminal -------------------------------------------------------------

def test_empty_profile_states_say_why():
    old = _profile_html(ReportData(target="t", device="cpu", backend="kiln", live=False)).text
    assert "no profile: this debug dir's report.json has none" in old
    skipped = ReportData(target="t", device="cpu", backend="kiln",
                         profile={"skipped": "the side-by-side profile was turned off"})
    assert "no profile: the side-by-side profile was turned off" in _profile_html(skipped).text
    assert profile_lines(skipped.profile) == [
        "profile: skipped (the side-by-side profile was turned off)"]
    failed = ReportData(target="t", device="cpu", backend="kiln", profile={
        "device": "cpu", "calls": 2, "gaps": {"against": None, "rows": []},
        "variants": [{"name": "eager", "note": "eager failed: RuntimeError: boom"}]})
    text = _profile_html(failed).text
    assert "no variant could be profiled" in text and "eager failed: RuntimeError: boom" in text


def test_cli_prints_the_profile_summary(tmp_path):
    script = tmp_path / "user_code.py"
    script.write_text("import torch\n\ndef f(x):\n    return torch.relu(x @ x.T) + 1\n\n"
                      "def make():\n    return f, (torch.randn(8, 8),)\n")
    done = subprocess.run(
        [sys.executable, "-m", "kiln", "report", f"{script}:make", "-o", "r.html", "--device",
         "cpu", "--backend", "eager", "--no-torch-compile", "--debug-dir", str(tmp_path / "d")],
        cwd=str(tmp_path), env=child_env(), capture_output=True, text=True, timeout=180,
        check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("profile on the CPU"))
    assert "kiln: no kiln kernels (backend 'eager' generates none)" in lines[start + 1]
    assert lines[start + 2].split() == ["eager", "kiln"]
    assert lines[start + 3].split()[0] == "total" and "kiln − eager" in done.stdout
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr  # quiet


def test_no_profile_flag_and_no_report_import_at_kiln_import():
    from kiln.tools.report.cli import _variants
    assert _variants(argparse.Namespace(no_profile=True, no_torch_compile=False)) == ()
    assert _variants(argparse.Namespace(no_profile=False, no_torch_compile=True)) == (
        "eager", "kiln")
    done = subprocess.run(
        [sys.executable, "-c", "import sys, kiln; print(sorted(m for m in sys.modules "
         "if m.startswith('kiln.tools.report')))"],
        env=child_env(), capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
