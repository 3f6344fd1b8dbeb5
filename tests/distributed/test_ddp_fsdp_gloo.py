"""kiln under torch.distributed on the CPU: DDP and FSDP2 over gloo, 2 processes.

One spawn runs every case of `gloo_cases` on both ranks (start-up is most of the cost); each
test below then checks one case on both ranks: parameters and gradients after 3 optimizer steps
equal eager DDP's / FSDP2's, kiln ran graphs, and the breaks it reported are the documented
ones (docs/distributed.md).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

from child_env import child_env  # noqa: E402

WORLD = 2
DEADLINE_S = 240  # the whole spawn; a hang is a failure, never a stuck test run
TOL = 1e-5  # aot_eager's backward adds in another order than eager's: last bits only


def _gloo_missing() -> str | None:
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this torch build"
    if not torch.distributed.is_gloo_available():
        return "the gloo backend of torch.distributed is not available"
    return None


pytestmark = [pytest.mark.explicit_device,
              pytest.mark.skipif(_gloo_missing() is not None, reason=_gloo_missing() or "")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out_dir: Path) -> None:
    import torch.multiprocessing as mp

    import gloo_cases
    saved = dict(os.environ)
    # children import kiln from here, and see no GPU: these are CPU (gloo) runs
    os.environ.update(child_env(KILN_TEST_DEVICE="cpu", CUDA_VISIBLE_DEVICES=""))
    try:
        ctx = mp.start_processes(gloo_cases.run_rank, nprocs=WORLD, join=False,
                                 start_method="spawn",
                                 args=(WORLD, f"tcp://127.0.0.1:{_free_port()}", str(out_dir)))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {WORLD} gloo ranks ran past {DEADLINE_S} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("gloo")
    _spawn(out_dir)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _case(results: list[dict], name: str) -> list[dict]:
    per_rank = []
    for rank, found in enumerate(results):
        assert name in found, f"rank {rank} did not reach case {name} (an earlier case failed)"
        assert "error" not in found[name], f"rank {rank}, {name}:\n{found[name]['error']}"
        per_rank.append(found[name])
    return per_rank


def _check_training(per_rank: list[dict], name: str) -> None:
    for rank, r in enumerate(per_rank):
        assert r["param"] <= TOL, f"{name} rank {rank}: parameters differ from eager by {r['param']}"
        assert r["grad"] <= TOL, f"{name} rank {rank}: gradients differ from eager by {r['grad']}"
        assert r["graph_runs"] >= 3, f"{name} rank {rank}: kiln ran {r['graph_runs']} graphs"


DDP_CASES = [f"ddp-{m}-{w}-{b}" for b in ("aot_eager", "kiln") for m in ("mlp", "block")
             for w in ("compile(DDP)", "DDP(compile)")]
SPLIT_CASES = [name.replace("ddp-", "ddp-split-", 1) for name in DDP_CASES]


@pytest.mark.parametrize("name", DDP_CASES)
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


@pytest.mark.parametrize("name", [f"fsdp2-{h}-{b}" for b in ("aot_eager", "kiln")
                                  for h in ("layers", "whole")])
def test_fsdp2_matches_eager(results: list[dict], name: str) -> None:
    per_rank = _case(results, name)
    _check_training(per_rank, name)
    for r in per_rank:
        if "whole" in name:  # each sharded layer's call breaks; the layers compile on their own
            assert r["graph_runs"] >= 3 * 3  # two layers and the root's head, per step
            if name.endswith("aot_eager"):  # reported once per process, when first captured
                assert "distributed-module" in r["breaks"], r["breaks"]
        else:
            assert "distributed-module" not in r["breaks"], r["breaks"]


def test_collectives_run_natively_not_dropped(results: list[dict]) -> None:
    """all_reduce and all_gather work in place: as graph nodes they would be dropped."""
    for r in _case(results, "collectives"):
        assert r["param"] <= TOL
        assert r["breaks"] == ["distributed-call"], r["breaks"]


def test_every_case_is_tested(results: list[dict]) -> None:
    import gloo_cases
    tested = set(DDP_CASES) | set(SPLIT_CASES) | {f"fsdp2-{h}-{b}" for b in ("aot_eager", "kiln")
                               for h in ("layers", "whole")} | {"collectives"}
    assert set(gloo_cases.CASES) == tested
