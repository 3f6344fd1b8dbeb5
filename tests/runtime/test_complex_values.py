"""Complex tensors in compiled graphs: every op that reads or makes one runs as its ATen op
(`Interpreter.lower_complex`; Triton has no complex type), the real-valued work around it is
generated kernels. Before, a complex intermediate failed the lower stage and the whole function
ran eagerly, and a complex input (the `freqs_cis` buffer of Meta's Llama rotary embedding) made
its graph run as torch ops. On the CPU interpreter and on CUDA."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _freqs_cis(dim, end, device):
    freqs = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=device).float() / dim))
    angles = torch.outer(torch.arange(end, device=device).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def _rotary_attention(x, wq, wk, freqs_cis, heads=2):
    """Meta's Llama `apply_rotary_emb` (view_as_complex, a complex product, view_as_real)
    between projections and causal attention."""
    b, n, d = x.shape
    q = (x @ wq).view(b, n, heads, -1)
    k = (x @ wk).view(b, n, heads, -1)
    cis = freqs_cis[:n].view(1, n, 1, -1)
    q_c = torch.view_as_complex(q.float().reshape(b, n, heads, -1, 2))
    k_c = torch.view_as_complex(k.float().reshape(b, n, heads, -1, 2))
    q = torch.view_as_real(q_c * cis).flatten(3).type_as(x)
    k = torch.view_as_real(k_c * cis).flatten(3).type_as(x)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         k.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2).reshape(b, n, d).relu()


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_a_rotary_embedding_through_complex_numbers_compiles_with_its_graph(
        device, kernel_compiles, caplog, train):
    freqs_cis = _freqs_cis(8, 32, device)
    wq = torch.randn(16, 16, device=device, requires_grad=train)
    wk = torch.randn(16, 16, device=device, requires_grad=train)
    compiled = kiln.compile(_rotary_attention)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for n in (6, 9):
            x = torch.randn(2, n, 16, device=device, requires_grad=train)
            with torch.set_grad_enabled(train):
                got = compiled(x, wq, wk, freqs_cis)
                want = _rotary_attention(x, wq, wk, freqs_cis)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            if train:
                grad = torch.randn_like(want)
                got_grads = torch.autograd.grad(got, (x, wq, wk), grad)
                want_grads = torch.autograd.grad(want, (x, wq, wk), grad)
                for g, w in zip(got_grads, want_grads):
                    torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert kernel_compiles, "the real-valued ops around the complex ones were not compiled"


def _complex_in_and_out(z, x):
    rotated = z * torch.polar(torch.ones(z.shape[-1], device=z.device),
                              torch.arange(z.shape[-1], device=z.device) * 0.3)
    return rotated, rotated.real.relu() + x.sin(), rotated.abs().sum(-1)


def test_complex_inputs_and_outputs_equal_eager(device, caplog):
    compiled = kiln.compile(_complex_in_and_out)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(2):
            z = torch.randn(3, 5, dtype=torch.complex64, device=device)
            x = torch.randn(3, 5, device=device)
            for got, want in zip(compiled(z, x), _complex_in_and_out(z, x)):
                assert got.dtype == want.dtype
                torch.testing.assert_close(got, want)
    assert "code generator" not in caplog.text  # complex inputs no longer run as torch ops


def _scale_in_place(z, x):
    z.mul_(2j)
    return z.imag + x.cos()


def test_an_in_place_update_of_a_complex_input_is_seen_by_the_caller(device):
    compiled = kiln.compile(_scale_in_place)
    z = torch.randn(4, 3, dtype=torch.complex64, device=device)
    x = torch.randn(4, 3, device=device)
    z_ref = z.clone()
    torch.testing.assert_close(compiled(z, x), _scale_in_place(z_ref, x))
    torch.testing.assert_close(z, z_ref)


def _view_outlives_its_buffer(x):
    a = (x * 2).sin()
    c = torch.view_as_complex(a.view(4, 4, 2))  # a library op returning a view of `a`
    b = (x + 1).softmax(0) * 3  # written after `a`'s last read, as large as `a`
    return torch.view_as_real(c * torch.view_as_complex(b.view(4, 4, 2)))


def test_a_buffer_a_library_call_returned_a_view_of_keeps_its_storage(device):
    """The memory planner gave `a`'s storage to `b` after `view_as_complex(a)`, its last
    reader, while the complex view still read it: every element wrong."""
    x = torch.randn(4, 8, device=device)
    torch.testing.assert_close(kiln.compile(_view_outlives_its_buffer)(x),
                               _view_outlives_its_buffer(x))
