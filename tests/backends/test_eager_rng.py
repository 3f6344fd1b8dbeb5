"""KILN_EAGER_RNG=1 through the kiln backend: random ops are library calls of the ops themselves,
so dropout masks and `torch.rand` draws are bit-identical to eager under `torch.manual_seed`
and the generator ends where eager's does (decomposed, `native_dropout` drew `rand_like`
where eager draws `bernoulli_`: other masks)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.usefixtures("generated_kernels")


@pytest.fixture
def eager_rng(monkeypatch):
    monkeypatch.setattr(kiln.config.config, "eager_rng", True)


def _random_block(x, w):
    h = F.dropout(torch.tanh(x @ w), 0.4, training=True)
    return h * 3 + torch.rand(h.shape[-1], device=x.device), F.dropout(x, 0.25)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_random_ops_draw_like_eager(device, eager_rng, recorder, train):
    x = torch.randn(16, 12, device=device)
    w = torch.randn(12, 8, device=device, requires_grad=train)
    compiled = kiln.compile(_random_block, backend="kiln")
    for seed in (1, 2):
        torch.manual_seed(seed)
        got = compiled(x, w)
        after_got = torch.rand(3, device=device)
        torch.manual_seed(seed)
        want = _random_block(x, w)
        after_want = torch.rand(3, device=device)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            assert torch.equal(a == 0, b == 0)  # the same elements dropped
        assert torch.equal(after_got, after_want)  # the generator advanced as eager's
        if train:
            (g,) = torch.autograd.grad(got[0].sum(), w)
            (e,) = torch.autograd.grad(want[0].sum(), w)
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert recorder.autograd_traces  # compiled by kiln, not run eagerly
