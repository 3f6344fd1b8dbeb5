"""Checks of `CudaGraphRunner` shared by the CPU tests (fake mechanism, test_cudagraphs.py) and
the GPU tests (torch.cuda.CUDAGraph, test_cudagraphs_gpu.py). `make_runner(fn, **kwargs)`
returns a runner over `fn` with the mechanism under test; inputs are drawn on `device`."""
from __future__ import annotations

import logging

import torch

LOGGER = "kiln.runtime.cudagraphs"


def scale_by(args):
    """A wrapper-like call: fresh output buffers, a view among the outputs."""
    x, w = args
    out = torch.empty_strided(tuple(x.shape), x.stride(), device=x.device)
    torch.mul(x, w.detach(), out=out)
    return (out, torch.as_strided(out, (x.shape[0] - 1,), (1,), 1))


def check_held_outputs_stay_correct(make_runner, device):
    """Outputs of every step, all held by the caller, stay right after later replays (one
    record per generation of live outputs); once released, the first record serves again."""
    run = make_runner(scale_by)
    w = torch.nn.Parameter(torch.randn(4, device=device))
    xs = [torch.randn(4, device=device) for _ in range(5)]
    held = [run([x, w]) for x in xs]  # step 1 warms up; every later step's outputs are alive
    for x, (out, view) in zip(xs, held):
        torch.testing.assert_close(out, x * w.detach())
        torch.testing.assert_close(view, (x * w.detach())[1:])
    assert run.num_recordings() == 4 and run.stats["replayed"] == 4
    held.clear()
    for x in xs:  # nothing held any more: the first generation serves every call
        out, _ = run([x, w])
        torch.testing.assert_close(out, x * w.detach())
        del out, _
    assert run.num_recordings() == 4
    return run


def check_written_inputs_are_copied_back(make_runner, device):
    def add_into(args):
        x, y = args
        x.add_(y)
        return (x * 2,)

    run = make_runner(add_into, written_inputs=[0])
    for _ in range(3):
        x, y = torch.randn(4, device=device), torch.randn(4, device=device)
        want_x = x + y
        out = run([x, y])[0]
        torch.testing.assert_close(x, want_x)
        torch.testing.assert_close(out, want_x * 2)
    assert run.stats["replayed"] == 2


def check_random_numbers_like_eager(make_runner, device, n):
    """Each replay draws new numbers, the same as eager's after the same manual_seed."""
    def noisy(args):
        (x,) = args
        return (x + torch.rand_like(x),)

    x = torch.randn(n, device=device)
    torch.manual_seed(7)
    eager = [noisy([x])[0] for _ in range(4)]
    run = make_runner(noisy)
    torch.manual_seed(7)
    graphed = [run([x])[0].clone() for _ in range(4)]
    assert run.stats["replayed"] == 3
    for want, got in zip(eager, graphed):
        torch.testing.assert_close(got, want)
    assert not torch.equal(graphed[1], graphed[2])


def check_a_host_sync_falls_back(make_runner, device, caplog) -> str:
    """A capture that syncs with the host raises; the runner falls back for good and answers
    like eager. Returns what was logged, for the mechanism's own message."""
    def syncs(args):
        (x,) = args
        return (x * x.sum().item(),)

    run = make_runner(syncs)
    with caplog.at_level(logging.WARNING, LOGGER):
        for _ in range(3):
            x = torch.randn(4, device=device)
            torch.testing.assert_close(run([x])[0], x * x.sum().item())
    assert run.blocked is not None
    return caplog.text


def record_artifacts(monkeypatch) -> list:
    """The CompiledArtifacts the kiln backend builds from now on (their `cudagraphs` runners)."""
    import kiln.runtime.pipeline as pipeline

    built: list = []
    original = pipeline.compile_graph

    def recording(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr("kiln.runtime.compile_graph", recording)
    return built
