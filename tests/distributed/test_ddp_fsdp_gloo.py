"""kiln under torch.distributed on the CPU: DDP and FSDP2 over gloo, 2 processes.

One spawn runs every case of `gloo_cases` on both ranks (start-up is most of the cost); each
test below then checks one case on both ranks: parameters, gradients and optimizer state after 3
optimizer steps equal eager DDP's / FSDP2's, kiln ran graphs, the breaks it reported are the
documented ones (docs/distributed.md), and under FSDP2 layers of one shape share one capture.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

from child_env import child_env  # noqa: E402

WORLD = 2
DEADLINE_S = 240  # the whole spawn; a hang is a failure, never a stuck test run
TOL = 1e-5  # aot_eager's backward adds in another order than eager's: last bits only
# bf16 compute (FSDP2's mixed precision): aot_eager's decompositions round in other places than
# eager's ops (measured: 2.4e-4 at most, on the gradients)
MP_TOL = 2e-3


def _gloo_missing() -> str | None:
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this torch build"
    if not torch.distributed.is_gloo_available():
        return "the gloo backend of torch.distributed is not available"
    return None


pytestmark = [pytest.mark.explicit_device,
              pytest.mark.skipif(_gloo_missing() is not None, reason=_gloo_missing() or "")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    import gloo_cases
    # children import kiln from here, and see no GPU: these are CPU (gloo) runs
    env = child_env(KILN_TEST_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    return gloo_cases.spawn_cases(gloo_cases.run_rank, WORLD, tmp_path_factory.mktemp("gloo"),
                                  env, DEADLINE_S)


def _case(results: list[dict], name: str) -> list[dict]:
    import gloo_cases
    return gloo_cases.case_of(results, name)


def _check_training(per_rank: list[dict], name: str, tol: float = TOL) -> None:
    for rank, r in enumerate(per_rank):
        for what in ("param", "grad", "state"):  # state: the optimizer's (momentum, AdamW's)
            assert r[what] <= tol, f"{name} rank {rank}: {what} differs from eager by {r[what]}"
        assert r["graph_runs"] >= 3, f"{name} rank {rank}: kiln ran {r['graph_runs']} graphs"


def _captures(r: dict, function: str) -> int:
    return sum(g["function"] == function for g in r["graphs"])


DDP_CASES = [f"ddp-{m}-{w}-{b}" for b in ("aot_eager", "kiln") for m in ("mlp", "block")
             for w in ("compile(DDP)", "DDP(compile)")]
GPT2_DDP_CASES = ["ddp-gpt2-compile(DDP)-kiln"]  # the suite's GPT-2 (tied lm_head / wte)
SPLIT_CASES = [name.replace("ddp-", "ddp-split-", 1) for name in DDP_CASES]


@pytest.mark.parametrize("name", DDP_CASES + GPT2_DDP_CASES)
def test_ddp_matches_eager(results: list[dict], name: str) -> None:
    per_rank = _case(results, name)
    _check_training(per_rank, name)
    # a break is reported when the frame is captured: once per process, by the first case
    allowed = {"distributed-wrapper"} if "compile(DDP)" in name else set()
    for r in per_rank:
        assert set(r["breaks"]) <= allowed, r["breaks"]
    if name == DDP_CASES[0]:
        assert per_rank[0]["breaks"] == ["distributed-wrapper"], per_rank[0]["breaks"]
    for r in per_rank:  # the default buckets (25 MiB, first 1 MiB) hold these models whole
        assert r["splits"] == [], r["splits"]


@pytest.mark.parametrize("name", SPLIT_CASES)
def test_ddp_split_at_buckets_matches_eager(results: list[dict], name: str) -> None:
    """With a small bucket_cap_mb the graph is split into 3 pieces or more, each compiled on its
    own (one backward node each, so DDP can reduce a bucket while the backward goes on), and
    training still equals eager DDP's on both ranks."""
    import gloo_cases
    per_rank = _case(results, name)
    _check_training(per_rank, name)
    cap = int(gloo_cases.SPLIT_BUCKET_MB[name.split("-")[2]] * 2**20)
    for rank, r in enumerate(per_rank):
        assert len(r["splits"]) == 1, f"rank {rank}: {r['splits']}"  # one capture, split once
        pieces = r["splits"][0]
        assert len(pieces) >= 3, f"rank {rank}: {pieces}"
        # each piece but the first (which takes what is left) reached the cap
        assert all(nbytes >= cap for nbytes in pieces[1:]), (cap, pieces)
    assert per_rank[0]["splits"] == per_rank[1]["splits"]


FSDP_CASES = [f"fsdp2-{h}-{b}" for b in ("aot_eager", "kiln") for h in ("layers", "whole")]
FSDP_CASES.append("fsdp2-layers-root-kiln")  # layers compiled before the root is sharded
GPT2_FSDP_CASES = ["fsdp2-gpt2-layers-aot_eager", "fsdp2-gpt2-layers-kiln",
                   "fsdp2-gpt2-whole-kiln"]
MP_CASES = ["fsdp2-mp-aot_eager", "fsdp2-mp-kiln"]
# the whole model compiled, then sharded: fully_shard(kiln.compile(model)) with the layers
# sharded after compile or before it (issue 20)
WHOLE_THEN_SHARD_CASES = [f"fsdp2-gpt2-{h}-{b}" for b in ("aot_eager", "kiln")
                          for h in ("compile-shard", "shard-compile-shard")]
MP_WHOLE_THEN_SHARD_CASES = ["fsdp2-mp-shard-compile-shard-aot_eager",
                             "fsdp2-mp-compile-shard-kiln"]


def _check_breaks(per_rank: list[dict], name: str) -> None:
    whole = "whole" in name or "compile-shard" in name
    for r in per_rank:  # the whole model: each sharded layer's call breaks, and compiles alone
        assert ("distributed-module" in r["breaks"]) == whole, r["breaks"]


@pytest.mark.parametrize("name", FSDP_CASES)
def test_fsdp2_matches_eager(results: list[dict], name: str) -> None:
    per_rank = _case(results, name)
    _check_training(per_rank, name)
    _check_breaks(per_rank, name)
    for r in per_rank:
        if "whole" in name:
            assert r["graph_runs"] >= 3 * 3  # two layers and the root's head, per step


@pytest.mark.parametrize("name", GPT2_FSDP_CASES)
def test_fsdp2_layers_of_one_shape_share_one_capture(results: list[dict], name: str) -> None:
    """Regional compilation: the suite's GPT-2 with 4 blocks, each sharded by FSDP2 and compiled
    on its own (per layer, or as the calls the whole model's trace breaks at): one capture and
    one backend compile of GPT2Block.forward, run 4 times a step."""
    import gloo_common
    per_rank = _case(results, name)
    _check_training(per_rank, name)
    _check_breaks(per_rank, name)
    for r in per_rank:
        assert _captures(r, "GPT2Block.forward") == 1, r["graphs"]
        assert r["graph_runs"] >= gloo_common.GPT2_LAYERS * 3


@pytest.mark.parametrize("name", WHOLE_THEN_SHARD_CASES)
def test_fsdp2_sharding_the_compiled_model_matches_eager(results: list[dict], name: str) -> None:
    """fully_shard(kiln.compile(gpt2)), its blocks sharded after the compile or before it: the
    wrapper becomes the FSDP root (checked in the case), FSDP2's hooks run eagerly around the
    compiled forward, the block calls break and compile on their own, and training equals eager
    FSDP2's. The graphs read the parameters FSDP2 swaps in at each forward without recompiling:
    the 4 blocks share one capture, nothing is captured again after the first step."""
    import gloo_common
    per_rank = _case(results, name)
    _check_training(per_rank, name)
    _check_breaks(per_rank, name)
    for r in per_rank:
        assert _captures(r, "GPT2Block.forward") == 1, r["graphs"]
        # wte / wpe / ln_f / lm_head and 4 blocks a step: 8 runs per step, from <= 5 captures
        # (the two embeddings share Embedding.forward: one automatic-dynamic recompile)
        assert r["graph_runs"] == (gloo_common.GPT2_LAYERS + 4) * gloo_common.STEPS, r
        assert len(r["graphs"]) <= 5 and len(r["recompiles"]) <= 1, (r["graphs"],
                                                                      r["recompiles"])


@pytest.mark.parametrize("name", MP_CASES + MP_WHOLE_THEN_SHARD_CASES)
def test_fsdp2_mixed_precision_matches_eager(results: list[dict], name: str) -> None:
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): training equals eager FSDP2's
    under the same policy, and the compiled layers read bf16 parameters (FSDP2's cast copies);
    sharding the compiled whole model, its head's graph reads the root's bf16 copies too."""
    per_rank = _case(results, name)
    _check_training(per_rank, name, MP_TOL)
    _check_breaks(per_rank, name)
    for r in per_rank:
        if name in MP_WHOLE_THEN_SHARD_CASES:  # the head: the root's own parameters
            assert _captures(r, "Linear.forward") == 1, r["graphs"]
        # 2 layers, 2 captures: the first layer's input needs no gradient, the second's does
        # (requires_grad is guarded, as in torch.compile); the case starts with no graphs
        assert _captures(r, "TransformerBlock.forward") == 2, r["graphs"]
        assert all(g["module_dtypes"] == ["torch.bfloat16"] for g in r["graphs"]), r["graphs"]


def test_collectives_run_natively_not_dropped(results: list[dict]) -> None:
    """all_reduce and all_gather work in place: as graph nodes they would be dropped."""
    for r in _case(results, "collectives"):
        assert r["param"] <= TOL
        assert r["breaks"] == ["distributed-call"], r["breaks"]


def test_every_case_is_tested(results: list[dict]) -> None:
    import gloo_cases
    tested = {*DDP_CASES, *GPT2_DDP_CASES, *SPLIT_CASES, *FSDP_CASES, *GPT2_FSDP_CASES,
              *MP_CASES, *WHOLE_THEN_SHARD_CASES, *MP_WHOLE_THEN_SHARD_CASES, "collectives"}
    assert set(gloo_cases.CASES) == tested
