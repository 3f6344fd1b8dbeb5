"""`kiln report` on live code: a tiny function with two print() breaks of different cost under
each available backend (eager, and kiln once it is registered) on the test device, the CLI end to
end on the CPU (live, then `--from-debug-dir`), and the cached machine ceilings."""
from __future__ import annotations

import contextlib
import html
import html.parser
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from child_env import child_env
from kiln.backends import list_backends
from kiln.config import config
from kiln.tools.report import SECTION_IDS, collect_report, from_debug_dir, render_html
from kiln.tools.report.ceilings import machine_ceilings

SCRIPT = textwrap.dedent("""
    import torch

    def f(x, y):
        a = torch.sin(x) + y
        print("cheap break")
        b = a.relu() * 2
        for i in range(3):
            print("expensive break", i)
        return b * 3 + 1

    def make():
        return f, (torch.randn(4, 8), torch.randn(4, 8))
""")


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


def _load_script(tmp_path) -> tuple:
    script = tmp_path / "user_code.py"
    script.write_text(SCRIPT)
    namespace: dict = {}
    exec(compile(SCRIPT, str(script), "exec"), namespace)  # noqa: S102  (the test's own code)
    return script, namespace["f"]


class _Rows(html.parser.HTMLParser):
    """Table rows (cell texts) per section id."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.section, self.cell = None, None

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self.section = dict(attrs)["id"]
            self.rows[self.section] = []
        elif tag == "tr":
            self.rows[self.section].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[self.section][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def _rows(page: str) -> dict[str, list[list[str]]]:
    parser = _Rows()
    parser.feed(page)
    return parser.rows


def _backends() -> list[str]:
    return [b for b in ("eager", "kiln") if b in list_backends()]


@pytest.mark.parametrize("backend", _backends())
def test_live_report_ranks_print_breaks(tmp_path, backend, capsys, device):
    script, f = _load_script(tmp_path)
    x, y = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    # on CPU tensors the kiln backend runs its generated kernels only when asked to (in the
    # interpreter, which the CPU test device turns on); on CUDA they are compiled binaries
    interpret = backend == "kiln" and device.type == "cpu"
    codegen = (config.patch(cpu_codegen="triton_interpret") if interpret
               else contextlib.nullcontext())
    with codegen:
        data = collect_report(f, (x, y), target="user_code.py:make", backend=backend,
                              device=device.type, debug_dir=str(tmp_path / "debug"), calls=2)
    assert "expensive break" in capsys.readouterr().out  # the function really ran
    assert len(data.breaks) == 2 and data.graph_count >= 1
    page = render_html(data)
    rows = _rows(page)
    assert tuple(rows) == SECTION_IDS
    breaks = rows["graph-breaks"][1:]
    costs = [int(r[1]) for r in breaks]
    assert costs == sorted(costs, reverse=True) and costs[0] > costs[1]
    assert breaks[0][2] == "user_code.py:9" and breaks[0][3] == 'print("expensive break", i)'
    assert breaks[1][2] == "user_code.py:6" and breaks[1][3] == 'print("cheap break")'
    assert "print()" in breaks[0][4]
    # the saved report.json rebuilds the same breaks from the debug dir alone
    again = _rows(render_html(from_debug_dir(str(tmp_path / "debug"))))
    assert again["graph-breaks"] == rows["graph-breaks"]
    if backend == "eager":
        assert data.kernels == [] and "no kernel data: backend 'eager'" in html.unescape(page)
    else:  # the kiln backend writes kernels.json: every step is a row of the kernel table
        assert len(rows["kernels"]) - 1 == len(data.kernels) > 0
        names = [r[0] for r in rows["kernels"][1:]]
        assert all(any(n.startswith(k["name"]) for n in names) for k in data.kernels)


def _kiln(*args: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "report", *args], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=180,
                          check=False)


def test_cli_live_then_from_debug_dir(tmp_path):
    script, _ = _load_script(tmp_path)
    debug = tmp_path / "debug"
    done = _kiln(f"{script}:make", "-o", "live.html", "--debug-dir", str(debug),
                 "--device", "cpu", "--backend", "eager", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "2 break(s)" in done.stdout and "wrote " in done.stdout
    saved = json.loads((debug / "report.json").read_text())
    assert saved["backend"] == "eager" and len(saved["breaks"]) == 2
    assert saved["ceilings"]["bandwidth"] > 0 and saved["ceilings"]["flops"] > 0
    again = _kiln("--from-debug-dir", str(debug), "-o", "again.html", cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr
    live = _rows((tmp_path / "live.html").read_text())
    rebuilt = _rows((tmp_path / "again.html").read_text())
    assert live["graph-breaks"] == rebuilt["graph-breaks"] and len(live["graph-breaks"]) == 3


def test_ceilings_are_measured_once_per_device(tmp_path):
    first = machine_ceilings("cpu")
    assert first.bandwidth > 1e8 and first.flops > 1e8 and first.matmul_dtype == "float32"
    cache = json.loads((tmp_path / "cache" / "ceilings.json").read_text())
    assert cache[first.device]["flops"] == first.flops
    assert machine_ceilings("cpu") == first  # from the cache, not measured again


@pytest.mark.gpu
def test_cuda_kernel_times_cover_every_step(tmp_path):
    """On the GPU, every kernels.json step gets a profiler time (Triton kernels by name, extern
    calls by launch order or range), and GB/s and % of ceilings follow from them."""
    from kiln.tools.suite.model_registry import get
    model, batch = get("seed_block").build("small", "cuda")
    model.eval()
    with torch.no_grad():
        data = collect_report(model, tuple(batch.inputs), target="suite:seed_block",
                              backend="kiln", device="cuda", debug_dir=str(tmp_path / "d"))
    steps = {k["name"]: k["kind"] for k in data.kernels}
    missing = {n: kind for n, kind in steps.items() if n not in data.kernel_times}
    assert steps and not missing, (missing, data.timing_note)
    kernel_total = sum(data.kernel_times.values())
    assert 0 < kernel_total < 2 * data.steady_call_s, (kernel_total, data.steady_call_s)
    rows = _rows(render_html(data))["kernels"][1:]
    assert all(r[3] != "—" and r[5] != "—" for r in rows)
