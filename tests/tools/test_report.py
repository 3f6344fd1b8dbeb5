"""`kiln.tools.report` from a fixture debug dir with every documented artifact: sections, the
kernel table's derived numbers, fusion and compile-time views; and the page in headless Chromium
(sections visible with content, a screenshot that is not blank)."""
from __future__ import annotations

import base64
import html.parser
import json
import os
import random
import shutil

import pytest

from kiln.tools.report import SECTION_IDS, from_debug_dir, render_html
from kiln.tools.report.cli import write_report
from kiln.tools.report.metrics import kernel_rows
from kiln.tools.report.timeline import COPY, GENERATED, MATMUL, NATIVE
from kiln.tools.report.variants import category_gaps, map_kiln_kernels

KERNEL_SOURCE = "@triton.jit\ndef {name}(in_ptr0, out_ptr0, XBLOCK: tl.constexpr):\n    pass\n"


def _steps(rng: random.Random) -> list[dict]:
    """Three steps as the runtime documents them: a fused pointwise kernel, an extern matmul and
    a persistent reduction, with random sizes."""
    n = rng.randrange(1 << 12, 1 << 20)
    m, k = rng.randrange(64, 1024), rng.randrange(64, 1024)
    return [
        {"name": "triton_poi_fused_add_relu_0", "kind": "pointwise", "numel": n, "rnumel": 1,
         "bytes": 12 * n, "flops": 2 * n, "nodes": ["add", "relu"],
         "ops": ["aten.add.Tensor", "aten.relu.default"],
         "user_locations": ["model.py:12", "model.py:13"],
         "source": "kernels/triton_poi_fused_add_relu_0.py"},
        {"name": "extern_addmm_1", "kind": "extern:addmm", "numel": m * k, "rnumel": 1,
         "bytes": 4 * (m * k * 3), "flops": 2 * m * k * k, "nodes": ["addmm"],
         "ops": ["aten.addmm.default"], "user_locations": ["model.py:14"], "source": None},
        {"name": "triton_per_fused_sum_2", "kind": "persistent_reduction", "numel": m,
         "rnumel": k, "bytes": 4 * (m * k + m), "flops": 0, "nodes": ["sum_1"],
         "ops": ["aten.sum.dim_IntList"], "user_locations": ["model.py:15"],
         "source": "kernels/triton_per_fused_sum_2.py"},
    ]


def _write(path: str, content: str | object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))


def make_debug_dir(root: str, seed: int = 0) -> dict:
    """A debug dir with one kernel graph (all documented files), one capture-only graph and a
    report.json; returns the values written, for the checks."""
    rng = random.Random(seed)
    steps = _steps(rng)
    graph = os.path.join(root, "0000_Model_forward")
    for step in steps:
        if step["source"]:
            _write(os.path.join(graph, step["source"]), KERNEL_SOURCE.format(name=step["name"]))
    _write(os.path.join(graph, "kernels.json"), steps)
    fusion = {"groups": [{"name": "buf1", "kernel": s["name"], "buffers": [f"buf{i}"],
                          "ops": s["ops"], "nodes": s["nodes"]} for i, s in enumerate(steps)],
              "not_fused": [{"a": "buf1", "b": "buf2",
                             "reason": "buf2 reduces over a different range (numel differs)"}]}
    _write(os.path.join(graph, "fusion.json"), fusion)
    timings = {s: rng.uniform(1e-3, 5e-2) for s in ("trace", "lower", "schedule", "codegen",
                                                     "compile_kernels", "autotune")}
    timings["total"] = sum(timings.values())
    _write(os.path.join(graph, "timings.json"), timings)
    _write(os.path.join(graph, "schedule.txt"), "group 0: buf0, buf1 (add, relu)\n")
    _write(os.path.join(graph, "wrapper.py"), "def call(args):\n    pass\n")
    _write(os.path.join(graph, "graph.py"), "class GraphModule: ...\n")
    _write(os.path.join(root, "0001_helper", "graph.py"), "class GraphModule: ...\n")
    times = {s["name"]: rng.uniform(1e-6, 1e-4) for s in steps}
    run = {"target": "fixture:model", "device": "cuda", "backend": "kiln", "mode": None,
           "breaks": [_break("model.py", 20, 3, "print(x)"),
                      _break("model.py", 31, 40, "x.item()")],
           "recompiles": [{"function": "forward", "entry_count": 2, "location": _loc(
               "model.py", 10, "def forward(self, x):"), "failures": [
               {"expr": "x.shape[0] == 8", "expected": "8", "actual": "16"}]}],
           "captures": [{"function": "forward", "capture": 0.02, "backend": 0.2},
                        {"function": "helper", "capture": 0.01, "backend": 0.0}],
           "kernel_times": times, "timing_note": "times from the fixture",
           "ceilings": {"device": "cuda:fixture", "bandwidth": 3.0e12, "flops": 7.0e14,
                        "matmul_dtype": "bfloat16"},
           "first_call_s": 1.5, "steady_call_s": 0.001, "notes": [],
           "profile": _profile(steps, times)}
    _write(os.path.join(root, "report.json"), run)
    return {"steps": steps, "times": times, "timings": timings, "run": run}


def _variant(name: str, kernels: list[tuple[str, str, float]]) -> dict:
    """A profiled variant as report.json stores it: rows (name, category, µs per call)."""
    rows = [{"name": n, "calls": 1.0, "us": us, "category": c, "op": None}
            for n, c, us in sorted(kernels, key=lambda k: -k[2])]
    categories = {MATMUL: 0.0, GENERATED: 0.0, NATIVE: 0.0, COPY: 0.0}
    for r in rows:
        categories[r["category"]] += r["us"]
    total = sum(categories.values())
    return {"name": name, "note": "", "total_us": total, "wall_us": 1.3 * total,
            "kernels_per_call": float(len(rows)), "kernels": rows, "categories": categories}


def _profile(steps: list[dict], times: dict[str, float]) -> dict:
    """eager, torch.compile and kiln on CUDA: kiln's rows are its fixture steps, mapped."""
    kiln = _variant("kiln", [(s["name"], MATMUL if s["source"] is None else GENERATED,
                              times[s["name"]] * 1e6) for s in steps])
    map_kiln_kernels(kiln["kernels"], steps)
    eager = _variant("eager", [("ampere_sgemm_64x64_nn", MATMUL, 30.0),
                               ("void at::native::vectorized_elementwise_kernel<4>", NATIVE, 9.0),
                               ("void at::native::reduce_kernel<512, 1>", NATIVE, 7.0)])
    compiled = _variant("torch.compile", [("ampere_sgemm_64x64_nn", MATMUL, 30.0),
                                          ("triton_poi_fused_add_relu_0", GENERATED, 3.0),
                                          ("triton_per_fused_sum_1", GENERATED, 2.0),
                                          ("Memcpy DtoD (Device -> Device)", COPY, 1.0)])
    variants = [eager, compiled, kiln]
    return {"device": "cuda", "what": "device kernels", "calls": 3, "variants": variants,
            "gaps": category_gaps(variants)}


def _loc(filename: str, lineno: int, source: str) -> dict:
    return {"filename": f"/src/{filename}", "lineno": lineno, "function": "forward",
            "source": source}


def _break(filename: str, lineno: int, cost: int, source: str) -> dict:
    return {"code": "unsupported-call", "category": "user-fixable",
            "message": f"cannot capture {source}", "location": _loc(filename, lineno, source),
            "stack": [], "hints": [f"move {source} out of the compiled function"], "cost": cost}


class _Sections(html.parser.HTMLParser):
    """The text inside each <section id=...>, and the cells of every table row in it."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self._section: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        if tag == "section":
            self._section = attrs["id"]
            self.text[self._section], self.rows[self._section] = "", []
        elif tag == "tr" and self._section:
            self.rows[self._section].append([])
        elif tag in ("td", "th") and self._section:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        elif tag in ("td", "th") and self._cell is not None:
            self.rows[self._section][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._section:
            self.text[self._section] += data
        if self._cell is not None:
            self._cell.append(data)


def _parse(page: str) -> _Sections:
    parser = _Sections()
    parser.feed(page)
    return parser


def test_report_from_fixture_debug_dir_has_every_section(tmp_path):
    make_debug_dir(str(tmp_path))
    page = render_html(from_debug_dir(str(tmp_path)))
    sections = _parse(page)
    assert tuple(sections.text) == SECTION_IDS
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<script" not in page and "<link" not in page
    summary = sections.text["summary"]
    for value in ("fixture:model", "cuda", "kiln"):
        assert value in summary
    compact = summary.replace(" ", "")
    assert "2graphbreaks" in compact and "3kernels" in compact and "1recompiles" in compact
    # breaks ranked by cost: the x.item() break (cost 40) comes first
    break_rows = sections.rows["graph-breaks"][1:]
    assert [r[1] for r in break_rows] == ["40", "3"]
    assert break_rows[0][2] == "model.py:31" and break_rows[0][3] == "x.item()"
    assert "hint: move x.item() out" in break_rows[0][4]
    assert "x.shape[0] == 8: expected 8, got 16" in sections.text["recompiles"]
    fusion = sections.text["fusion"]
    assert "aten.add.Tensor, aten.relu.default" in fusion and "model.py:12, model.py:13" in fusion
    assert "buf2 reduces over a different range" in fusion
    for stage in ("capture", "trace", "lower", "schedule", "codegen", "compile_kernels",
                  "autotune"):
        assert stage in sections.text["compile-time"]
    assert page.count('class="kernel-dot"') == 2  # the reduction counts 0 FLOPs: not plotted
    profile = sections.text["profile"]
    assert "CUDA device kernels from torch.profiler" in profile and "Biggest gaps" in profile
    assert sections.rows["profile"][0] == ["µs per call", "eager", "torch.compile", "kiln"]
    kiln_rows = {r[0].split("matmul")[0].split("generated")[0]: r
                 for r in sections.rows["profile"] if len(r) == 5}
    assert "model.py:14" in kiln_rows["extern_addmm_1"][4]  # mapped to its step's user line


def test_kernel_table_numbers_are_bytes_and_flops_over_time(tmp_path):
    written = make_debug_dir(str(tmp_path), seed=7)
    data = from_debug_dir(str(tmp_path))
    rows = {r[0].split("0000_")[0]: r for r in _parse(render_html(data)).rows["kernels"][1:]}
    ceil = written["run"]["ceilings"]
    for step in written["steps"]:
        seconds = written["times"][step["name"]]
        row = rows[step["name"]]
        assert row[3] == f"{seconds * 1e6:.2f}"
        assert row[4] == f"{step['bytes']:,}"
        assert row[5] == f"{step['bytes'] / seconds / 1e9:.2f}"
        assert row[8].startswith(f"{100 * step['bytes'] / seconds / ceil['bandwidth']:.1f}%")
        if step["flops"]:
            assert row[7] == f"{step['flops'] / seconds / 1e9:.3g}"
            assert row[9].startswith(f"{100 * step['flops'] / seconds / ceil['flops']:.1f}%")
        else:
            assert row[7] == row[9] == "—"
    derived = kernel_rows(data.kernels, data.kernel_times, data.ceilings_obj)
    for r, step in zip(derived, written["steps"]):
        assert r.bandwidth == step["bytes"] / written["times"][step["name"]]
        assert r.intensity == (step["flops"] / step["bytes"] if step["flops"] else None)


def test_debug_dir_without_kernels_says_why(tmp_path):
    os.makedirs(tmp_path / "0000_f")
    (tmp_path / "0000_f" / "graph.py").write_text("class GraphModule: ...\n")
    data = from_debug_dir(str(tmp_path))
    data.backend = "eager"
    sections = _parse(render_html(data)).text
    assert "no kernel data: backend 'eager' generated no kernels" in sections["kernels"]
    assert "no fusion data: backend 'eager'" in sections["fusion"]
    assert "has no report.json" in sections["summary"]


# --- in headless Chromium ------------------------------------------------------------------

def _chromium() -> str:
    """The Chromium that scripts/setup_browser.sh found or installed (or KILN_CHROMIUM). A missing
    browser fails the test in CI (CI=true, where .ci/run installs one); elsewhere the test is
    skipped with the command that installs one, since that install is system-wide and opt-in."""
    if os.environ.get("KILN_SKIP_BROWSER_TESTS") == "1":
        pytest.skip("KILN_SKIP_BROWSER_TESTS=1")
    path = os.environ.get("KILN_CHROMIUM") or next(
        (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "google-chrome")
         if shutil.which(n)), None)
    if not path:
        why = ("no headless Chromium: run `KILN_INSTALL_BROWSER=1 bash scripts/test.sh` "
               "(installs Debian's chromium-headless-shell system-wide) or set KILN_CHROMIUM")
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(why)
        pytest.skip(why)
    return path


_PIXEL_STATS = """async (png) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + png;
  await img.decode();
  const canvas = document.createElement('canvas');
  canvas.width = img.width; canvas.height = img.height;
  const ctx = canvas.getContext('2d');
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, img.width, img.height).data;
  const colours = new Set(); let nonWhite = 0;
  for (let i = 0; i < d.length; i += 4) {
    colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) nonWhite++;
  }
  return {width: img.width, height: img.height, colours: colours.size,
          nonWhite: nonWhite / (d.length / 4)};
}"""


def test_report_in_headless_chromium(tmp_path):
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run "
                    "`bash scripts/setup_browser.sh <venv python>`")
    make_debug_dir(str(tmp_path / "debug"), seed=3)
    path = write_report(from_debug_dir(str(tmp_path / "debug")), str(tmp_path / "report.html"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto("file://" + path)
            for sid in SECTION_IDS:
                section = page.locator(f"#{sid}")
                assert section.is_visible(), sid
                box = section.bounding_box()
                assert box["width"] > 600 and box["height"] > 40, (sid, box)
                assert len(section.inner_text().strip()) > 40, sid
            dots = page.locator("#roofline circle.kernel-dot")
            assert dots.count() == 2 and dots.first.is_visible()
            shot = page.screenshot(full_page=True)
            (tmp_path / "report.png").write_bytes(shot)
            stats = page.evaluate(_PIXEL_STATS, base64.b64encode(shot).decode())
        finally:
            browser.close()
    assert stats["width"] == 1280 and stats["height"] > 900
    assert stats["colours"] > 50, stats
    assert 0.05 < stats["nonWhite"] < 0.98, stats


def test_cpu_report_says_why_kernel_sections_are_empty_and_how_to_fill_them():
    from kiln.tools.report.data import ReportData
    page = _parse(render_html(ReportData(target="suite:mlp", device="cpu", backend="kiln",
                                         captures=[{"function": "f", "capture": 0.01,
                                                    "backend": 0.002}])))
    for sid in ("fusion", "kernels", "roofline"):
        text = page.text[sid]
        assert "on CPU the kiln backend runs the captured graph as torch ops" in text, sid
        assert "KILN_CPU_CODEGEN=triton_interpret" in text, sid
    assert "python -m kiln bench --report" in page.text["bench"]
    # one definition of compile time: capture + backend, the same words as bench and explain
    assert "12.00 ms" in page.text["summary"] and "compile (all stages)" in page.text["summary"]
    assert "first call = compile + first run" in page.text["summary"]


def test_bench_table_appears_in_the_report():
    from kiln.tools.report.data import ReportData
    data = ReportData(target="suite:mlp", device="cpu", backend="kiln",
                      bench_table="model variant ...\nmlp   kiln    16x32 pass")
    assert "mlp   kiln    16x32 pass" in _parse(render_html(data)).text["bench"]


def test_copy_bandwidth_label_sits_under_its_line():
    import re

    from kiln.tools.report.ceilings import Ceilings
    from kiln.tools.report.render import roofline
    svg, _ = roofline([], Ceilings("cpu", bandwidth=20e9, flops=500e9, matmul_dtype="float32"))
    label = re.search(r'<text class="bandwidth-label" x="([\d.]+)" y="([\d.]+)"', svg)
    first = re.search(r'<polyline[^>]*points="([\d.]+),([\d.]+) ([\d.]+),([\d.]+)"', svg)
    x0, y0, x1, y1 = map(float, first.groups())
    lx, ly = float(label.group(1)), float(label.group(2))
    line_y_at = lambda x: y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    text_top = ly - 12  # font-size 12; the line rises to the right (y decreases)
    assert y1 < y0 and x0 <= lx
    assert text_top > line_y_at(lx), "the label's left end touches the bandwidth line"


def test_report_help_describes_the_command_not_the_module(capsys):
    from kiln.__main__ import main
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    assert "Write one self-contained HTML file" in out
    assert "`add_arguments`" not in out and "report_command" not in out
