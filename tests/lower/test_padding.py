"""kiln.lower.padding: large matmuls with rows that are not 16-byte aligned run on zero-padded
operands (on CUDA; exercised on the test device, CPU included, with a low threshold), results
equal to eager and to an fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kiln.lower import padding
from kiln.lower.decomposition_tables import trace_aten
from kiln.lower.driver import copy_graph_module

aten = torch.ops.aten


def _padded(fn, *inputs):
    gm = copy_graph_module(trace_aten(fn, *inputs))
    return gm, padding.pad_matmuls(gm)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.fixture(autouse=True)
def low_threshold_on_the_test_device(monkeypatch, device):
    monkeypatch.setattr(padding, "MIN_FLOPS", 1)
    monkeypatch.setattr(padding, "DEVICES", (device.type,))


def _lm_head(h, w):
    return h @ w.t()


def _linear(x, w, b):
    return torch.nn.functional.linear(x, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_head_pads_n_and_slices(dtype):
    h, w = torch.randn(6, 16, dtype=dtype), torch.randn(37, 16, dtype=dtype)
    gm, count = _padded(_lm_head, h, w)
    assert count == 1
    targets = _targets(gm)
    assert aten.constant_pad_nd.default in targets and aten.slice.Tensor in targets
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert mm.meta["val"].shape[1] % (16 // dtype.itemsize) == 0
    out = gm(h, w)
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref = _lm_head(h.double(), w.double())
    torch.testing.assert_close(out, _lm_head(h, w))
    assert (out.double() - ref).abs().max() <= 2 * (_lm_head(h, w).double() - ref).abs().max() + 1e-6


def test_addmm_pads_bias_and_k():
    x, w, b = torch.randn(5, 13), torch.randn(11, 13), torch.randn(11)
    gm, count = _padded(_linear, x, w, b)
    assert count == 1
    addmm = next(n for n in gm.graph.nodes if n.target is aten.addmm.default)
    assert addmm.meta["val"].shape == (5, 12)  # N 11 -> 12
    assert addmm.args[1].meta["val"].shape == (5, 16)  # K 13 -> 16 on both operands
    out = gm(x, w, b)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, _linear(x, w, b))


def test_aligned_or_small_matmuls_are_left_alone(monkeypatch):
    assert _padded(_lm_head, torch.randn(6, 16), torch.randn(32, 16))[1] == 0  # aligned
    monkeypatch.setattr(padding, "MIN_FLOPS", 2 ** 30)
    assert _padded(_lm_head, torch.randn(6, 16), torch.randn(37, 16))[1] == 0  # small
    monkeypatch.setattr(padding, "MIN_FLOPS", 1)
    monkeypatch.setattr(padding, "DEVICES", ("cuda",))  # the default: CPU graphs untouched
    assert _padded(_lm_head, torch.randn(6, 16, device="cpu"),
                   torch.randn(37, 16, device="cpu"))[1] == 0


def test_lowered_padded_graph_returns_eager_strides():
    from kiln.lower import lower_graph
    from kiln.lower.evaluate import run_ir

    h, w = torch.randn(6, 16), torch.randn(37, 16)
    graph = lower_graph(trace_aten(_lm_head, h, w))  # pads inside the lower stage
    assert any(getattr(b, "layout", None) is not None and b.layout.size == (6, 40)
               for b in graph.buffers.values())
    (out,) = run_ir(graph, [h, w])
    assert out.stride() == (37, 1)
    torch.testing.assert_close(out, _lm_head(h, w))


def test_compiled_padded_graph_equals_eager_on_fresh_inputs(device):
    """Generated kernels on the test device (issue 11: on the GPU machine this test handed CPU
    tensors to compiled Triton kernels: garbage, then an illegal memory access)."""
    pytest.importorskip("triton")
    from kiln.runtime import compile_graph

    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)
    artifact = compile_graph(trace_aten(_lm_head, h, w), [h, w], name="lm_head")
    assert "(16, 40)" in artifact.wrapper.source  # the mm reads a padded weight
    h, w = torch.randn(6, 16, device=device), torch.randn(37, 16, device=device)
    (out,) = artifact(h, w)
    assert out.stride() == (37, 1)
    torch.testing.assert_close(out, _lm_head(h, w))
    ref = _lm_head(h.double(), w.double())
    assert (out.double() - ref).abs().max() <= 2 * (_lm_head(h, w).double() - ref).abs().max() + 1e-5


def test_compiled_kernels_refuse_cpu_tensors_outside_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET a compiled kernel would dereference host pointers on the GPU;
    compile_graph raises instead."""
    pytest.importorskip("triton")
    from kiln.errors import KilnError
    from kiln.runtime import compile_graph

    def pointwise(h, w):  # a generated kernel whatever the padding policy of the device
        return (h @ w.t()).sin()

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    h, w = torch.randn(6, 16, device="cpu"), torch.randn(37, 16, device="cpu")
    with pytest.raises(KilnError, match="TRITON_INTERPRET=1"):
        compile_graph(trace_aten(pointwise, h, w), [h, w], name="pointwise")
