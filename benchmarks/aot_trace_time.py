"""Joint-graph trace + partition time of the seed TransformerBlock at full size (CPU).

d_model 1024, 16 heads, input [32, 512, 1024]. Tracing runs on fake tensors, so the size costs no
compute; the number measures kiln's autograd stage itself (stage 1 + stage 2 + min-cut partition).
Target: <= 0.5 s on a CPU machine. Prints seconds (median of the repeats, and the first call,
which includes one-time setup such as building the decomposition table).

    python benchmarks/aot_trace_time.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import kiln
from kiln.autograd import trace_joint
from kiln.autograd.partition import partition_joint
from kiln.tools.seed_model import TransformerBlock, seed_sizes


def captured_graph(block: torch.nn.Module, x: torch.Tensor):
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    kiln.compile(block, backend=keep, fullgraph=True)(x)
    return graphs[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    d_model, nhead, shape = seed_sizes("cuda")  # the seed's full size
    block = TransformerBlock(d_model, nhead)
    with torch.no_grad():
        x = torch.randn(*shape)
    x.requires_grad_(True)
    gm, inputs = captured_graph(block, x)
    times = []
    for _ in range(args.repeats + 1):
        start = time.perf_counter()
        joint = trace_joint(gm, inputs)
        traced = time.perf_counter()
        result = partition_joint(joint, policy="min_cut")
        done = time.perf_counter()
        times.append((traced - start, done - traced, done - start))
    first, rest = times[0], times[1:]
    trace_s = statistics.median(t[0] for t in rest)
    part_s = statistics.median(t[1] for t in rest)
    total_s = statistics.median(t[2] for t in rest)
    nodes = len(joint.gm.graph.nodes)
    print(f"seed block d_model={d_model} nhead={nhead} input={list(shape)} "
          f"torch {torch.__version__}")
    print(f"joint graph: {nodes} nodes; saved {result.num_saved} values, "
          f"{result.saved_bytes / 2**20:.1f} MiB")
    print(f"first call:            {first[2]:.3f} s")
    print(f"trace (median of {len(rest)}): {trace_s:.3f} s")
    print(f"partition (min_cut):   {part_s:.3f} s")
    print(f"trace + partition:     {total_s:.3f} s  (target <= 0.5 s)")


if __name__ == "__main__":
    main()
