"""The cases of test_nccl_single_rank.py: one rank, NCCL, cuda:0, the kiln backend compiling to
Triton kernels. The gloo run's models, training loop and comparison (`gloo_common`,
`gloo_cases.ddp_case`, `fsdp_cases.fsdp_case`) on the GPU:

- DDP with a small `bucket_cap_mb` (`gloo_cases.SPLIT_BUCKET_MB`), so the graph is split at
  bucket boundaries, over the 2-block seed stack (both wrappings) and the suite's GPT-2;
- FSDP2 `fully_shard` per layer on a 1-rank CUDA mesh, each layer `kiln.compile`d.

Each case starts from an empty kiln cache, so the graphs, splits and kernel compiles it reports
are its own. A spawned process imports this module by name (on the parent's sys.path).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from fsdp_cases import fsdp_case
from gloo_cases import ddp_case, run_cases
from gloo_common import Tol, Trained, diffs

DEVICE = "cuda"
# fp32 training compared on the GPU as tests/autograd and tests/suite do (generated kernels
# reduce in other orders than ATen's)
TOL = Tol(rtol=1e-4, atol=1e-5)
DDP_MODELS = (("stack", "compile(DDP)"), ("stack", "DDP(compile)"), ("gpt2", "compile(DDP)"))
FSDP_MODELS = ("stack", "gpt2")


def _compared(case: Callable[[int], Trained]) -> Callable[[int], dict[str, Any]]:
    """The case from an empty kiln cache; its largest differences from eager, plain and over
    TOL (`*_tol`: at most 1 when allclose)."""
    def run(rank: int) -> dict[str, Any]:
        import kiln
        kiln.reset()
        trained = case(rank)
        return {**diffs(trained), **{f"{k}_tol": v for k, v in diffs(trained, TOL).items()}}
    return run


def _cases() -> dict[str, Callable[[int], Any]]:
    cases = {}
    for name, wrap in DDP_MODELS:
        cases[f"ddp-split-{name}-{wrap}"] = _compared(
            lambda rank, n=name, w=wrap: ddp_case(n, w, "kiln", rank, True, DEVICE))
    for name in FSDP_MODELS:
        cases[f"fsdp2-{name}-layers"] = _compared(
            lambda rank, n=name: fsdp_case(n, "layers", "kiln", rank, device=DEVICE))
    return cases


CASES = tuple(_cases())


def run_rank(rank: int, world: int, init: str, out_dir: str) -> None:
    """One NCCL rank on cuda:`rank`, every case in order."""
    from kiln.config import config
    torch.cuda.set_device(rank)
    config.suppress_errors = False  # a backend failure fails the case, never runs eagerly
    run_cases(_cases(), "nccl", rank, world, init, out_dir)
