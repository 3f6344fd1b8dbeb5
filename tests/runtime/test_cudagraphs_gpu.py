"""CUDA graph replay on a real GPU (torch.cuda.CUDAGraph): the checks of test_cudagraphs.py with
the real mechanism, and the seed block under mode="reduce-overhead" against eager.

Written on a CPU-only day: not run yet. On the GPU machine: `pytest -m gpu
tests/runtime/test_cudagraphs*.py`.
"""
from __future__ import annotations

import logging

import pytest
import torch

from kiln.runtime.cudagraphs import CudaGraphMechanism, CudaGraphRunner

pytestmark = [pytest.mark.gpu, pytest.mark.explicit_device]

LOGGER = "kiln.runtime.cudagraphs"
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def real_cudagraphs(monkeypatch):
    """Real capture is off by default until these tests pass on the H200 (config.py)."""
    from kiln.config import config
    monkeypatch.setattr(config, "cudagraphs_on_gpu", True)


def scale_by(args):
    x, w = args
    out = torch.empty_strided(tuple(x.shape), x.stride(), device=x.device)
    torch.mul(x, w.detach(), out=out)
    return (out, torch.as_strided(out, (x.shape[0] - 1,), (1,), 1))


def runner(fn=scale_by, **kwargs):
    return CudaGraphRunner(fn, name="test", mechanism=CudaGraphMechanism(), **kwargs)


def test_inputs_at_new_addresses_and_held_outputs_stay_correct():
    run = runner()
    w = torch.nn.Parameter(torch.randn(4, device=CUDA))
    xs = [torch.full((4,), float(i), device=CUDA) for i in range(5)]
    held = [run([x, w]) for x in xs]
    for x, (out, view) in zip(xs, held):
        torch.testing.assert_close(out, x * w.detach())
        torch.testing.assert_close(view, (x * w.detach())[1:])
    assert run.num_recordings() == 4 and run.stats["replayed"] == 4
    held.clear()
    for x in xs:
        out, _ = run([x, w])
        torch.testing.assert_close(out, x * w.detach())
        del out, _
    assert run.num_recordings() == 4


def test_written_inputs_are_copied_back():
    def add_into(args):
        x, y = args
        x.add_(y)
        return (x * 2,)

    run = runner(add_into, written_inputs=[0])
    for _ in range(3):
        x, y = torch.randn(4, device=CUDA), torch.randn(4, device=CUDA)
        want = x + y
        out = run([x, y])[0]
        torch.testing.assert_close(x, want)
        torch.testing.assert_close(out, want * 2)
    assert run.stats["replayed"] == 2


def test_random_numbers_differ_per_replay_and_follow_manual_seed_like_eager():
    def noisy(args):
        (x,) = args
        return (x + torch.rand_like(x),)

    x = torch.zeros(1024, device=CUDA)
    torch.manual_seed(7)
    eager = [noisy([x])[0] for _ in range(4)]
    run = runner(noisy)
    torch.manual_seed(7)
    graphed = [run([x])[0].clone() for _ in range(4)]
    assert run.stats["replayed"] == 3
    for want, got in zip(eager, graphed):
        torch.testing.assert_close(got, want)
    assert not torch.equal(graphed[1], graphed[2])


def test_a_host_sync_falls_back_with_the_reason(caplog):
    def syncs(args):
        (x,) = args
        return (x * x.sum().item(),)

    run = runner(syncs)
    with caplog.at_level(logging.WARNING, LOGGER):
        for _ in range(3):
            x = torch.randn(4, device=CUDA)
            torch.testing.assert_close(run([x])[0], x * x.sum().item())
    assert run.blocked is not None and "capturing it raised" in caplog.text


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
    import kiln.runtime.pipeline as pipeline

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    built = []
    original = pipeline.compile_graph

    def recording(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr("kiln.runtime.compile_graph", recording)
    return built


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
    block = TransformerBlock(256, 4).to(CUDA)
    compiled = kiln.compile(block, backend="kiln", mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(4, 64, 256, device=CUDA)
        got_out, got = _training_step(block, compiled, x)
        want_out, want = _training_step(block, block, x)
        torch.testing.assert_close(got_out, want_out, atol=2e-3, rtol=2e-3)
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=5e-3, rtol=5e-3,
                                       msg=f"grad of {name}")
    runners = {a.name: a.cudagraphs for a in artifacts}
    assert runners["forward"].stats["replayed"] == 3
    assert runners["backward"].stats["replayed"] == 3


def test_dropout_draws_new_numbers_every_replay():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    compiled = kiln.compile(f, backend="kiln", mode="reduce-overhead")
    x = torch.ones(4096, device=CUDA)
    outs = [compiled(x).clone() for _ in range(4)]
    assert all(not torch.equal(a, b) for a, b in zip(outs, outs[1:]))
