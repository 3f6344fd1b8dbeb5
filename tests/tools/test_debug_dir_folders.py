"""KILN_DEBUG_DIR on the CPU (README, "Logging and dumps"): one folder per compiled graph, the
four capture files in each; calls that hit a compiled graph write nothing."""
from __future__ import annotations

import os

import torch

import kiln
from kiln import records
from kiln.config import config


def two_breaks(x):
    y = x.sin()
    a = float(y.sum())  # a break: the value leaves the graph
    z = y * a
    b = float(z.sum())  # a second break
    return z + b


def test_six_calls_with_two_breaks_write_one_folder_per_compiled_graph(tmp_path):
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    try:
        with config.patch(debug_dir=str(tmp_path)):
            compiled = kiln.compile(two_breaks)
            for seed in range(6):
                torch.manual_seed(seed)
                compiled(torch.randn(8))
    finally:
        records.active_recorders().remove(recorder)
        kiln.reset()
    folders = sorted(os.listdir(tmp_path))
    # three graphs, then each resume recompiles once for its new float and goes dynamic
    assert len(folders) == len(recorder.graphs) == 5, folders
    for folder in folders:
        assert sorted(os.listdir(tmp_path / folder)) == ["bytecode.txt", "entry.py", "graph.py",
                                                         "guards.txt"]
