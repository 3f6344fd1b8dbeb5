"""KILN_DEBUG_DIR: one folder per compiled graph with the capture stage's artifacts."""
from __future__ import annotations

import os

import torch

import kiln
from kiln.config import config


def test_debug_dir_dumps_one_folder_per_graph(tmp_path):
    def f(x):
        y = x.sin() * 2
        print("break")  # two graphs: before and after the break
        return y.cos()

    with config.patch(debug_dir=str(tmp_path)):
        x = torch.randn(3)
        torch.testing.assert_close(kiln.compile(f)(x), f(x), rtol=0, atol=0)
    folders = sorted(os.listdir(tmp_path))
    assert len(folders) == 2 and folders[0].endswith("_f")
    files = sorted(os.listdir(tmp_path / folders[0]))
    assert files == ["bytecode.txt", "entry.py", "graph.py", "guards.txt"]
    graph = (tmp_path / folders[0] / "graph.py").read_text()
    assert "sin" in graph and "test_debug_dir.py" in graph  # provenance of each node
    assert "x.shape == (3,)" in (tmp_path / folders[0] / "guards.txt").read_text()
    assert "__graph(" in (tmp_path / folders[0] / "entry.py").read_text()
    assert "__resume_at_" in folders[1]
