"""kiln under torch.distributed on the GPU with NCCL, one rank (what the one-GPU machine allows
before a 2-GPU machine is lent; issue 20).

One spawned process (world size 1, NCCL, cuda:0) runs every case of `nccl_cases`: DDP with small
buckets over the seed stack and the suite's GPT-2, FSDP2 per layer over both, with the kiln
backend's generated Triton kernels. Each test checks one case: parameters, gradients and AdamW
state after 3 steps equal eager DDP's / FSDP2's within fp32 GPU tolerances, and it cannot pass
by running eagerly: kiln captured graphs and compiled them to kernels (a backend failure is an
error, not a fallback), and under DDP the graph was split into 2 pieces or more.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

from child_env import child_env  # noqa: E402

WORLD = 1
DEADLINE_S = 480  # the whole spawn, Triton compiles included; a hang fails, never stalls


def _nccl_missing() -> str | None:
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this torch build"
    if not torch.distributed.is_nccl_available():
        return "the NCCL backend of torch.distributed is not available"
    return None


pytestmark = pytest.mark.explicit_device
# the tests of the spawned run; the others check the cases' definitions on any machine
ON_GPU = [pytest.mark.gpu,
          pytest.mark.skipif(_nccl_missing() is not None, reason=_nccl_missing() or "")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    import gloo_cases
    import nccl_cases
    out_dir = tmp_path_factory.mktemp("nccl")
    # real Triton binaries (the CPU run's interpreter would be inherited), a fresh kernel cache
    env = child_env(KILN_TEST_DEVICE="cuda", KILN_CACHE_DIR=str(out_dir / "cache"))
    env.pop("TRITON_INTERPRET", None)
    return gloo_cases.spawn_cases(nccl_cases.run_rank, WORLD, out_dir, env, DEADLINE_S)


def _only_rank(results: list[dict], name: str) -> dict:
    import gloo_cases
    (found,) = gloo_cases.case_of(results, name)
    return found


def _check(r: dict, name: str) -> None:
    for what in ("param", "grad", "state"):
        assert r[f"{what}_tol"] <= 1, (
            f"{name}: {what} differs from eager by {r[what]} (over the tolerance: "
            f"{r[f'{what}_tol']})")
    assert r["graphs"], f"{name}: kiln captured nothing"
    assert r["pipeline_compiles"] >= 1, f"{name}: no graph was compiled to kernels"
    assert r["graph_runs"] >= 3, f"{name}: kiln ran {r['graph_runs']} graphs in 3 steps"


DDP_CASES = [f"ddp-split-{n}-{w}" for n, w in
             (("stack", "compile(DDP)"), ("stack", "DDP(compile)"), ("gpt2", "compile(DDP)"))]
FSDP_CASES = ["fsdp2-stack-layers", "fsdp2-gpt2-layers"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=ON_GPU) for n in DDP_CASES])
def test_ddp_split_on_nccl_matches_eager(results: list[dict], name: str) -> None:
    r = _only_rank(results, name)
    _check(r, name)
    assert r["splits"], f"{name}: the graph was not split at DDP's buckets"
    for pieces in r["splits"]:
        assert len(pieces) >= 2, f"{name}: {pieces}"
    # each piece compiled to kernels on its own
    assert r["pipeline_compiles"] >= len(r["splits"][0]), r["pipeline_compiles"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=ON_GPU) for n in FSDP_CASES])
def test_fsdp2_on_nccl_matches_eager(results: list[dict], name: str) -> None:
    r = _only_rank(results, name)
    _check(r, name)
    assert "distributed-module" not in r["breaks"], r["breaks"]  # the layers were compiled


def test_every_case_is_tested() -> None:
    """Runs without a GPU: the cases import and are the ones above."""
    import nccl_cases
    assert set(nccl_cases.CASES) == {*DDP_CASES, *FSDP_CASES}
    assert DDP_CASES == [f"ddp-split-{n}-{w}" for n, w in nccl_cases.DDP_MODELS]
