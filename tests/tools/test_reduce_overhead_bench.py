"""benchmarks/reduce_overhead.py without a GPU: each row answers like eager and, for kiln's
CUDA graph mode on CPU tensors, says why no graph was recorded (the numbers are the GPU's)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_check_rows(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "reduce_overhead.py"), "--device", "cpu",
         "--size", "tiny", "--cases", "seed_block", "--modes", "eager,kiln,kiln_reduce_overhead",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["eager", "kiln", "kiln_reduce_overhead"]
    for row in rows:
        assert "error" not in row, row
        assert row["ms"] > 0 and row["rel_err"] < 1e-5
    assert "runs as torch ops without CUDA graphs" in done.stderr
