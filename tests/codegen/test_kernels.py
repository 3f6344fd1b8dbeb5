"""Generated Triton kernels (kiln.codegen) against eager, on tiny shapes.

Without a GPU these run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
which costs ~1 ms per program instance: every shape here is <= 256 elements and a few programs.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

# DEVICE below is the GPU where there is one; oracles run on CPU copies
pytestmark = pytest.mark.explicit_device

from kiln.codegen import KernelSpec, emit_kernel  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.codegen.triton_build import launch, run_graph  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.lower.evaluate import run_ir  # noqa: E402

if torch.cuda.is_available():
    DEVICE = "cuda"
else:
    DEVICE = "cpu"


def _check(fn, *inputs, atol=1e-5, rtol=1e-5, kinds=None):
    graph = lower_graph(trace_aten(fn, *inputs))
    specs = [emit_kernel(node, graph) for node in graph.computed]
    if kinds is not None:
        assert sorted(s.kind for s in specs) == sorted(kinds)
    got = run_graph(graph, [t.to(DEVICE) for t in inputs] if DEVICE != "cpu" else list(inputs))
    want = fn(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    oracle = run_ir(graph, list(inputs))
    for g, w, o in zip(got, want, oracle):
        g = g.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, o, equal_nan=True)  # the IR evaluator's numerics (dtype tolerances)
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
    return graph, specs


def test_pointwise_chain():
    def fn(x, y):
        z = torch.where(x > 0, x * y + 1.0, torch.exp(y))
        return F.gelu(z) - x

    x, y = torch.randn(8, 16), torch.randn(8, 16)
    _, specs = _check(fn, x, y, kinds=["pointwise"])
    assert "= _erf_f32(" in specs[0].source and "tl.where" in specs[0].source


def test_pointwise_broadcast_and_transpose():
    def fn(x, b):
        return (x.t() + b).sigmoid() * 2

    x, b = torch.randn(16, 8), torch.randn(16)
    _check(fn, x, b)


@pytest.mark.parametrize("emulate, roundings", [(True, 3), (False, 1)])
def test_bf16_computes_in_fp32_and_rounds_as_eager(monkeypatch, emulate, roundings):
    """Loads convert to float32 once; with config.emulate_precision_casts every op's result
    is rounded to bfloat16 as eager stores it (x * y, + x, tanh); without, only the store."""
    monkeypatch.setattr(config, "emulate_precision_casts", emulate)

    def fn(x, y):
        return (x * y + x).tanh().to(torch.bfloat16)

    x = torch.randn(4, 32, dtype=torch.bfloat16)
    y = torch.randn(4, 32, dtype=torch.bfloat16)
    _, specs = _check(fn, x, y, atol=1e-2, rtol=1e-2)
    body = specs[0].source.split("@triton.jit")[-1]
    assert body.count("_to_bf16(") == roundings


def test_row_sum():
    x = torch.randn(4, 24)
    _, specs = _check(lambda x: x.sum(-1), x, kinds=["persistent_reduction"])
    assert specs[0].meta_dict == {"XBLOCK": 4, "RBLOCK": 32}  # short rows: several per program
    assert specs[0].grid(specs[0].meta_dict) == (1,)


def test_row_max_min_and_nan():
    x = torch.randn(4, 16)
    x[1, 3] = float("nan")
    _check(lambda x: (x.amax(-1), x.amin(-1)), x, kinds=["persistent_reduction"] * 2)


def test_column_sum_strided_reads():
    x = torch.randn(6, 8)
    _check(lambda x: x.sum(0), x, kinds=["persistent_reduction"])


def test_bf16_row_sum():
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    _check(lambda x: (x * 2).sum(-1), x, atol=2e-2, rtol=2e-2)


def test_softmax_pieces():
    x = torch.randn(4, 16)
    _check(lambda x: torch.softmax(x, -1), x,
           kinds=["persistent_reduction", "persistent_reduction", "pointwise"])


def test_masked_padding_negative_indices():
    x = torch.randn(3, 5)
    _check(lambda x: F.pad(x, (2, 1)) * 3, x)


def test_integer_ops():
    def fn(a, b):
        return torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), a.argmax(-1)

    a = torch.randint(-20, 20, (4, 8))
    b = torch.randint(1, 5, (4, 8)) * torch.where(torch.rand(4, 8) > 0.5, 1, -1)
    _check(fn, a, b)


def test_spec_provenance_and_launch():
    def fn(x):
        return x.exp() + 1

    x = torch.randn(10)
    graph = lower_graph(trace_aten(fn, x))
    (node,) = graph.computed
    spec = emit_kernel(node, graph)
    assert isinstance(spec, KernelSpec)
    assert spec.args == ("x_1", node.name) and spec.reads == ("x_1",)
    assert f"for {node.name}" in spec.source.splitlines()[0]
    assert all(f"from {o.node}" in spec.source for o in node.origins)
    assert spec.name in spec.source and spec.kind == "pointwise"
    assert spec.grid(spec.meta_dict) == (1,)
    x = x.to(DEVICE)
    out = torch.empty(10, device=DEVICE)
    launch(spec, x, out)
    torch.testing.assert_close(out, x.exp() + 1)


def test_libdevice_ops():
    def fn(x, y):
        return (torch.expm1(x) + torch.log1p(y) + torch.pow(y, x) + torch.atan2(x, y)
                + torch.fmod(x, y) + torch.trunc(x * 3) + torch.round(x * 3) + torch.tan(x))

    x, y = torch.randn(64), torch.rand(64) + 0.5
    _check(fn, x, y, atol=1e-4, rtol=1e-4)
