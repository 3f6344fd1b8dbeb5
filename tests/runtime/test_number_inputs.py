"""Generated kernels taking value-only Python numbers (issue 15): a float (or an int no size symbol
holds) that changes between calls reaches the kiln backend as a 0-dim CPU tensor input
(`capture/variables/number_tensors.py`); its kernels read it from the device (the wrapper moves
it there once per call) and are compiled for two values only: the first value's static graph,
then the graph taking the number. Inference and training, with eager's answers and gradients,
on the CPU interpreter and on CUDA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _scaled_block(x, w, temperature, shift):
    """A softmax with a temperature, a half-precision path and an int shift: numbers used
    beside tensors of three dtypes and in arithmetic among themselves."""
    logits = (x @ w) / temperature
    half = (x.half() * temperature).float()
    return F.softmax(logits, -1) * (1.0 - temperature / 4) + half.sum(-1, keepdim=True) + shift


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_a_changing_float_compiles_kernels_for_two_values_only(device, kernel_compiles,
                                                               recorder, train):
    compiled = kiln.compile(_scaled_block)
    w = torch.randn(16, 8, device=device, requires_grad=train)
    w_ref = w.detach().clone().requires_grad_(train)
    counts = []
    for temperature, shift in ((0.5, -3), (0.75, -5), (1.25, -2), (2.0, -9), (0.3, -4)):
        x = torch.randn(4, 16, device=device)
        with torch.set_grad_enabled(train):
            got = compiled(x, w, temperature, shift)
            want = _scaled_block(x, w_ref, temperature, shift)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
        if train:
            grad = torch.randn_like(want)
            got.backward(grad)
            want.backward(grad)
            torch.testing.assert_close(w.grad, w_ref.grad, rtol=2e-3, atol=2e-3)
        counts.append(len(kernel_compiles))
    assert len(recorder.autograd_traces) == 2, recorder.autograd_traces
    assert 0 < counts[1] == counts[-1], f"kernels compiled per value: {counts}"


def _item_scaled(x):
    peak = x.abs().amax().item()  # a graph break; the float reaches the code after it
    return torch.tanh(x / peak) * peak + peak / 2


def test_a_float_from_item_feeds_the_next_graphs_kernels(device, kernel_compiles):
    compiled = kiln.compile(_item_scaled)
    counts = []
    for _ in range(5):
        x = torch.randn(6, 5, device=device)
        torch.testing.assert_close(compiled(x), _item_scaled(x))
        counts.append(len(kernel_compiles))
    assert 0 < counts[1] == counts[-1], f"kernels compiled per value: {counts}"


def test_a_number_returned_from_the_graph_is_computed_on_the_host(device):
    """A number leaving the graph is Python arithmetic of the frame's numbers (no kernel, no
    device sync): eager's exact value and type."""
    def fn(x, s):
        return x * s, s * 3 - 1, s / 4

    compiled = kiln.compile(fn)
    for s in (0.5, 1.5, -2.5):
        x = torch.randn(5, device=device)
        got, want = compiled(x, s), fn(x, s)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] and type(got[1]) is float
