"""benchmarks/distributed_train.py without a GPU: its arguments, its refusal to start without
CUDA or enough GPUs, the NCCL overlap it computes from a trace's kernel events, its table."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.explicit_device

ROOT = Path(__file__).parents[2]


def _load():
    name = "kiln_distributed_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "benchmarks" / "distributed_train.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


bench = _load()


def test_arguments():
    args = bench.parse_args([])
    assert (args.nproc, args.models, args.modes, args.wrap) == (
        2, ["seed_stack", "gpt2"], ["eager", "inductor", "kiln"], ["ddp", "fsdp2"])
    args = bench.parse_args(["--nproc", "1", "--models", "gpt2", "--modes", "kiln,eager",
                             "--wrap", "fsdp2", "--steps", "7", "--profile", "traces"])
    assert (args.nproc, args.models, args.modes, args.wrap, args.steps, args.profile) == (
        1, ["gpt2"], ["kiln", "eager"], ["fsdp2"], 7, "traces")
    for bad in (["--modes", "kiln,tvm"], ["--wrap", ""], ["--nproc", "0"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2


def test_refuses_to_start_without_cuda(monkeypatch):
    def spawned(*args):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(bench, "spawn_ranks", spawned)
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs CUDA GPUs"):
        bench.main(["--nproc", "1"])


def test_refuses_more_ranks_than_gpus(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(bench.torch.distributed, "is_nccl_available", lambda: True)
    with pytest.raises(SystemExit, match="--nproc 2 needs 2 GPUs; 1 visible"):
        bench.check_devices(2)
    bench.check_devices(1)


def _kernel(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0,
            "tid": stream}


def test_nccl_overlap_of_kernel_events():
    events = [
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 10, 20),
        _kernel("triton_poi_fused_add_0", 5, 15, 7),  # compute kernels overlapping each other
        _kernel("ampere_sgemm_128x64_nn", 8, 4, 7),
        _kernel("ncclDevKernel_ReduceScatter_Sum_f32", 30, 10, 20),  # nothing beside it
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 32, 4, 21),  # inside the last one
        {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 30, "dur": 10},
        {"ph": "i", "cat": "kernel", "name": "ncclDevKernel_marker", "ts": 50},  # no duration
    ]
    # NCCL busy [0, 10] and [30, 40]: 20 µs; compute [5, 20]: 5 µs of it overlapped
    assert bench.nccl_overlap(events) == {"nccl_us": 20.0, "overlapped_us": 5.0,
                                          "overlap": 0.25}
    assert bench.nccl_overlap(events[1:3])["overlap"] is None  # no NCCL kernel


def test_merge_and_intersection():
    assert bench.merge([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert bench.intersection([(0, 4), (5, 6)], [(3, 5.5), (10, 11)]) == 1.5


def test_rows_gathered_and_tabled():
    ranks = [{"first_step_s": 30.0, "compile_s": 29.9, "step_ms": 100.0, "peak_gib": 1.5,
              "tokens": 1000, "overlap": 0.5, "graphs": 1},
             {"first_step_s": 31.0, "compile_s": 30.9, "step_ms": 101.0, "peak_gib": 1.25,
              "tokens": 1000, "overlap": None, "graphs": 1}]
    kiln_row = bench._gathered("gpt2", "ddp", "kiln", ranks)
    assert kiln_row["peak_gib"] == [1.5, 1.25] and kiln_row["overlap"] == [0.5, None]
    assert kiln_row["tokens_per_s"] == 20000 and kiln_row["world"] == 2
    eager_row = bench._gathered("gpt2", "ddp", "eager", [{**r, "step_ms": 150.0} for r in ranks])
    failed = bench._gathered("gpt2", "fsdp2", "kiln", [ranks[0], {"error": "RuntimeError: x"}])
    assert failed["error"] == "RuntimeError: x"
    lines = bench.table([eager_row, kiln_row, failed]).splitlines()
    assert len(lines) == 5 and lines[0].startswith("| model | wrap | mode | step ms")
    assert "| gpt2 | ddp | kiln | 100.0 | 20,000 | 1.50 | 30.0 | 1.5 | 50%, - |" == lines[3]
    assert "error: RuntimeError: x" in lines[4]


def test_runs_end_to_end_on_gloo(tmp_path):
    """`--device cpu`: one gloo rank through every step of a row (spawn, DDP, kiln, the
    profile and its overlap, the gathered row, the table and --json); the numbers mean
    nothing on the CPU."""
    sys.path.insert(0, str(ROOT / "tests"))
    from child_env import child_env
    rows_path = tmp_path / "rows.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "distributed_train.py"), "--device",
               "cpu", "--nproc", "1", "--models", "seed_stack", "--layers", "1", "--batch",
               "1", "--seq", "8", "--steps", "1", "--warmup", "0", "--modes", "eager,kiln",
               "--wrap", "ddp", "--profile", str(tmp_path / "traces"), "--json",
               str(rows_path), "--timeout", "240"]
    done = subprocess.run(command, env=child_env(CUDA_VISIBLE_DEVICES=""), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(rows_path.read_text())
    assert [(r["model"], r["wrap"], r["mode"]) for r in rows] == [
        ("seed_stack", "ddp", "eager"), ("seed_stack", "ddp", "kiln")]
    assert all("error" not in r and r["step_ms"] > 0 for r in rows), rows
    # one block's 50 MB in DDP's default buckets (first 1 MiB, then 25 MiB): split
    assert rows[1]["graphs"] >= 1 and rows[1]["ddp_pieces"][0] >= 2, rows[1]
    assert (tmp_path / "traces" / "seed_stack-ddp-kiln-rank0.json").is_file()
    assert rows[1]["overlap"] == [None]  # gloo's all-reduce runs no GPU kernel
    assert "| seed_stack | ddp | kiln |" in done.stdout
