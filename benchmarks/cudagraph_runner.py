"""Host cost of one `CudaGraphRunner` replay, on the CPU (issue 17).

  python benchmarks/cudagraph_runner.py

The runner's own per-call work (input key, address checks, static-input copy, fresh output
aliases) around a replay, with the CPU fake mechanism of tests/runtime/fake_cudagraph.py: one
activation and 12 parameters (the seed block's inference graph has 13 inputs). The fake's
"replay" reruns a one-op wrapper, so the number is an upper bound of the runner's share.
"""
from __future__ import annotations

import os
import sys
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "runtime")]

import torch  # noqa: E402

from fake_cudagraph import FakeGraphMechanism  # noqa: E402
from kiln.runtime.cudagraphs import CudaGraphRunner  # noqa: E402


def main() -> None:
    params = [torch.nn.Parameter(torch.randn(16, 16)) for _ in range(12)]
    runner = CudaGraphRunner(lambda args: (args[0] + 1,), name="bench",
                             mechanism=FakeGraphMechanism(), static_inputs=range(1, 13))
    x = torch.randn(4, 16)
    for _ in range(5):  # warm-up, record
        runner([x, *params])
    calls = 20000
    runs = [timeit.timeit(lambda: runner([x, *params]), number=calls) / calls * 1e6
            for _ in range(5)]
    print(f"runner per call {sorted(runs)[2]:.1f} us (median of 5 x {calls}), {runner.stats}")


if __name__ == "__main__":
    main()
