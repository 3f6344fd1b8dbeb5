"""kiln's float32 erf (`kiln.codegen.fast_math._erf_f32`) against float64 erf.

On the CPU the kernel runs in Triton's interpreter (numpy float32 arithmetic), with one program
over a dense grid, so the error bound checked here is the one the docstring states."""
from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

# DEVICE below is the GPU where there is one; oracles run on CPU copies
pytestmark = pytest.mark.explicit_device

from kiln.codegen import emit_kernel  # noqa: E402
from kiln.codegen.triton_build import launch  # noqa: E402
from kiln.codegen.fast_math import CLAMP, P, Q, fit_erf_coefficients  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_ABS_ERR = 5e-7


def _erf_spec(n: int, dtype: torch.dtype):
    graph = lower_graph(trace_aten(torch.erf, torch.randn(n, dtype=dtype)))
    (node,) = graph.computed
    return emit_kernel(node, graph)


def _run(spec, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    launch(spec, x, out)
    return out


def test_float32_erf_is_within_the_stated_bound_everywhere():
    n = 1 << 16
    spec = _erf_spec(n, torch.float32)
    assert "= _erf_f32(" in spec.source
    grid = torch.linspace(-4.5, 4.5, n, dtype=torch.float64)
    jitter = torch.rand(n, dtype=torch.float64) * (9.0 / n)  # fresh points between grid lines
    x = (grid + jitter).to(torch.float32).to(DEVICE)
    got = _run(spec, x).cpu().double()
    want = torch.special.erf(x.cpu().double())
    err = (got - want).abs().max().item()
    assert err < MAX_ABS_ERR, err
    tiny = torch.tensor([1e-30, -1e-30, 1e-8, 0.0] * (n // 4), dtype=torch.float32, device=DEVICE)
    got_tiny = _run(spec, tiny).cpu().double()
    rel = ((got_tiny - torch.special.erf(tiny.cpu().double())).abs()
           / (2 / math.sqrt(math.pi) * tiny.cpu().double().abs()).clamp_min(1e-45))
    assert rel.max().item() < 1e-6  # relative accuracy near 0 (erf(x) ~ 2x/sqrt(pi))


def test_special_values():
    specials = [float("nan"), float("inf"), float("-inf"), 1e30, -1e30, CLAMP, -CLAMP, 0.0]
    n = 1 << 16
    spec = _erf_spec(n, torch.float32)
    x = torch.tensor(specials * (n // len(specials)), dtype=torch.float32, device=DEVICE)
    got = _run(spec, x).cpu()[:len(specials)]
    want = torch.erf(torch.tensor(specials))
    torch.testing.assert_close(got, want, equal_nan=True, atol=MAX_ABS_ERR, rtol=0)


def test_16_bit_erf_goes_through_float32_and_float64_keeps_libdevice():
    assert "= _erf_f32(" in _erf_spec(64, torch.bfloat16).source
    assert "= _erf_f32(" not in _erf_spec(64, torch.float64).source


def test_coefficients_are_reproducible():
    """The refit lands on the shipped coefficients up to the least-squares solver's rounding
    (numpy builds differ in the last digits) and is as accurate."""
    p, q = fit_erf_coefficients()
    for got, want in zip(p + q, P + Q):
        assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-10), (got, want)
    x = torch.linspace(-CLAMP, CLAMP, 100_001, dtype=torch.float64)
    s = x * x
    ratio = sum(c * s**i for i, c in enumerate(p)) / sum(c * s**i for i, c in enumerate(q))
    assert (x * ratio - torch.special.erf(x)).abs().max().item() < MAX_ABS_ERR
