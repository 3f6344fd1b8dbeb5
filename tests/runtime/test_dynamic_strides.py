"""Automatic dynamic for strides: a slice of buffers of growing width (`torch.randn(3, n)[:, :4]`)
keeps its shape while its stride changes at every call. Capture makes that stride a symbol of
its own at the recompile (`x.stride(0)`, as torch.compile does) instead of recompiling per call
into the recompile limit; the kiln backend binds it from the input at each call (a kernel size
argument), and the per-size fallback keys its variants by strides too (a variant's kernels index
by the strides it was compiled for: keyed by shape alone, a later stride read wrong elements)."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln import records

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _f(x, w):
    return torch.sin(x @ w) * 2 + x.sum(0)


def _run(backend, device, train, kernel_compiles=(), calls=7):
    """Calls over 7 widths, each checked against eager (and its gradient when `train`); the
    recorder, and how many kernels had compiled after each call."""
    w = torch.randn(4, 4, device=device, requires_grad=train)
    compiled = kiln.compile(_f, backend=backend)
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    counts = []
    try:
        for n in range(5, 5 + calls):
            x = torch.randn(3, n, device=device)[:, :4]
            got, want = compiled(x, w), _f(x, w)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            if train:
                g1, = torch.autograd.grad(got.sum(), w)
                g2, = torch.autograd.grad(want.sum(), w)
                torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-4)
            counts.append(len(kernel_compiles))
    finally:
        records.active_recorders().remove(recorder)
    return recorder, counts


@pytest.mark.parametrize("train", [False, True])
def test_a_changing_stride_becomes_symbolic_aot_eager(device, train, caplog):
    with caplog.at_level(logging.WARNING, logger="kiln"):
        recorder, _ = _run("aot_eager", device, train)
    assert sum(g.graph is not None for g in recorder.graphs) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    why = " ".join(" ".join(r.became_dynamic) for r in recorder.recompiles)
    assert "x.stride(0) changed from 5 to 6" in why, why


@pytest.mark.parametrize("train", [False, True])
def test_kiln_kernels_take_the_stride_as_an_argument(device, train, kernel_compiles, caplog):
    with caplog.at_level(logging.WARNING, logger="kiln"):
        _, counts = _run("kiln", device, train, kernel_compiles)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # the first stride static, the second symbolic: no kernel compiled after that
    assert counts[1] >= counts[0] > 0 and counts[-1] == counts[1], counts


def test_per_size_variants_are_keyed_by_strides():
    from kiln.autograd.size_variants import PerSizeVariants
    made = []
    variants = PerSizeVariants(lambda args: made.append(args[0].stride()) or (lambda a: None),
                               [0], lambda args: None)
    base = torch.randn(3, 8)
    variants([base[:, :4]])
    variants([torch.randn(3, 9)[:, :4]])
    variants([torch.randn(3, 8)[:, :4]])
    assert made == [(8, 1), (9, 1)]
