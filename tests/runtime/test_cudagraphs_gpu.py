"""CUDA graph replay on a real GPU (torch.cuda.CUDAGraph): the checks of test_cudagraphs.py with
the real mechanism, and the seed block under mode="reduce-overhead" against eager.

Written on a CPU-only day: not run yet. On the GPU machine: `pytest -m gpu
tests/runtime/test_cudagraphs*.py`.
"""
from __future__ import annotations

import logging

import pytest
import torch

from cudagraph_checks import (LOGGER, check_a_host_sync_falls_back,
                              check_held_outputs_stay_correct, check_random_numbers_like_eager,
                              check_written_inputs_are_copied_back, record_artifacts,
                              scale_by)
from kiln.runtime.cudagraphs import CudaGraphMechanism, CudaGraphRunner

pytestmark = [pytest.mark.gpu, pytest.mark.explicit_device]

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def real_cudagraphs(monkeypatch):
    """Real capture is off by default until these tests pass on the H200 (config.py)."""
    from kiln.config import config
    monkeypatch.setattr(config, "cudagraphs_on_gpu", True)


def runner(fn=scale_by, **kwargs):
    return CudaGraphRunner(fn, name="test", mechanism=CudaGraphMechanism(), **kwargs)


def test_inputs_at_new_addresses_and_held_outputs_stay_correct():
    check_held_outputs_stay_correct(runner, CUDA)


def test_written_inputs_are_copied_back():
    check_written_inputs_are_copied_back(runner, CUDA)


def test_random_numbers_differ_per_replay_and_follow_manual_seed_like_eager():
    check_random_numbers_like_eager(runner, CUDA, 1024)


def test_a_host_sync_falls_back_with_the_reason(caplog):
    assert "capturing it raised" in check_a_host_sync_falls_back(runner, CUDA, caplog)
    # the failed capture left nothing behind: torch.cuda.graph kept its side stream current
    # and the generator in capture mode ("Offset increment outside graph capture" from then on)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    torch.testing.assert_close(torch.rand(64, device=CUDA).mean().item(), 0.5, atol=0.2, rtol=0)


def test_cpu_inputs_fall_back(caplog):
    run = runner()
    with caplog.at_level(logging.WARNING, LOGGER):
        run([torch.randn(4), torch.nn.Parameter(torch.randn(4))])
    assert "input 0 is a cpu tensor" in caplog.text


# -- the seed block through the kiln backend -------------------------------------------------------

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.tools.seed_model import TransformerBlock  # noqa: E402


@pytest.fixture
def artifacts(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    return record_artifacts(monkeypatch)


def test_seed_block_inference_equals_eager_and_reports_pool_memory(artifacts, caplog):
    block = TransformerBlock(256, 4).to(CUDA).eval()
    compiled = kiln.compile(block, backend="kiln", mode="reduce-overhead")
    held = []
    with torch.no_grad(), caplog.at_level(logging.INFO, LOGGER):
        for _ in range(4):
            x = torch.randn(4, 64, 256, device=CUDA)
            held.append((compiled(x), block(x)))
    for got, want in held:
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    runner = artifacts[0].cudagraphs
    assert runner.stats["replayed"] == 3 and runner.pool_bytes > 0
    assert "private pool" in caplog.text


def _training_step(model, compiled, x):
    out = compiled(x)
    out.pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def test_seed_block_training_equals_eager(artifacts):
    """Each step holds the last step's output while the next forward runs, so the forward
    alternates between two recordings, and the backward, which reads the forward's saved
    tensors in place, needs one per forward recording. Its first call on a recording's
    tensors is a new key (attention's philox seed and offset, host values, come from a
    recording instead of eager), hence a second warm-up. From the fifth step on both replay
    what they recorded, nothing new."""
    block = TransformerBlock(256, 4).to(CUDA)
    compiled = kiln.compile(block, backend="kiln", mode="reduce-overhead")
    before_steady = None
    for step in range(6):
        if step == 4:
            before_steady = {a.name: dict(a.cudagraphs.stats) for a in artifacts}
        x = torch.randn(4, 64, 256, device=CUDA)
        got_out, got = _training_step(block, compiled, x)
        want_out, want = _training_step(block, block, x)
        torch.testing.assert_close(got_out, want_out, atol=2e-3, rtol=2e-3)
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=5e-3, rtol=5e-3,
                                       msg=f"grad of {name}")
    for a in artifacts:
        stats, earlier = a.cudagraphs.stats, before_steady[a.name]
        assert stats["recorded"] == earlier["recorded"] == 2, (a.name, earlier, stats)
        assert stats["replayed"] == earlier["replayed"] + 2 and stats["eager"] == 0, \
            (a.name, earlier, stats)


def test_dropout_draws_new_numbers_every_replay():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    compiled = kiln.compile(f, backend="kiln", mode="reduce-overhead")
    x = torch.ones(4096, device=CUDA)
    outs = [compiled(x).clone() for _ in range(4)]
    assert all(not torch.equal(a, b) for a, b in zip(outs, outs[1:]))
