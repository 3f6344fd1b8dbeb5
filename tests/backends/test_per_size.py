"""Graphs captured with symbolic sizes in the kiln and aot_eager backends: one capture, one
compile per set of input sizes behind it (`kiln/backends/per_size.py`), outputs equal to eager,
and eager's answer with a warning when a size cannot be compiled."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
import kiln.runtime
from kiln.backends import per_size as per_size_module
from kiln.backends.kiln_backend import kiln_backend
from kiln.backends.per_size import SizeCache, per_size, symbolic_inputs

pytestmark = pytest.mark.usefixtures("generated_kernels")


class _Recording:
    """The kiln backend, keeping what it returned (captures = len(returned))."""

    def __init__(self) -> None:
        self.returned: list = []

    def __call__(self, gm, example_inputs):
        compiled = kiln_backend(gm, example_inputs)
        self.returned.append(compiled)
        return compiled


def _mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2 + x.shape[0]


def test_kiln_backend_generates_kernels_per_size_behind_one_capture(monkeypatch, device):
    pytest.importorskip("triton")
    compiles = []
    real = kiln.runtime.compile_graph

    def counting(*args, **kwargs):
        compiles.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(kiln.runtime, "compile_graph", counting)
    # the per-size path (what the symbolic one falls back to): stage C compiles this MLP once
    monkeypatch.setattr(kiln.config.config, "symbolic_kernels", False)
    backend = _Recording()
    compiled = kiln.compile(_mlp, backend=backend)
    w1, w2 = torch.randn(8, 16, device=device), torch.randn(16, 4, device=device)
    for batch in (2, 5, 3, 5):
        x = torch.randn(batch, 8, device=device)
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, w1, w2), _mlp(x, w1, w2), rtol=1e-4, atol=1e-4)
    (graph,) = backend.returned
    assert isinstance(graph, SizeCache)
    assert sorted(graph.compiled) == [(((b, 8), (8, 1)),) for b in (2, 3, 5)]  # shape, stride
    assert len(compiles) == 3  # generated code per size, the repeated size from the cache


def test_a_size_that_fails_to_compile_runs_eagerly_with_a_warning(monkeypatch, caplog, device):
    pytest.importorskip("triton")
    monkeypatch.setattr(kiln.config.config, "symbolic_kernels", False)  # per size: 2 compiles
    compiled = kiln.compile(_mlp, backend="kiln", dynamic=True)
    w1, w2 = torch.randn(8, 16, device=device), torch.randn(16, 4, device=device)
    x = torch.randn(2, 8, device=device)
    torch.testing.assert_close(compiled(x, w1, w2), _mlp(x, w1, w2), rtol=1e-4, atol=1e-4)

    def failing(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(kiln.runtime, "compile_graph", failing)
    x = torch.randn(6, 8, device=device)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out = compiled(x, w1, w2)
    torch.testing.assert_close(out, _mlp(x, w1, w2), rtol=1e-4, atol=1e-4)
    assert "failed (RuntimeError: injected)" in caplog.text


def test_static_graph_compiles_directly():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert symbolic_inputs(gm) == []
    made = []
    result = per_size(lambda g, ex: made.append(ex) or g, gm, [torch.randn(2)])
    assert result is gm and len(made) == 1


def test_size_cache_is_bounded(monkeypatch, caplog):
    monkeypatch.setattr(per_size_module, "MAX_SIZES", 2)
    calls = []
    gm = torch.fx.symbolic_trace(lambda x: x * 2)

    def compile_static(g, inputs):
        calls.append(tuple(inputs[0].shape))
        return lambda x: x * 2

    cache = SizeCache(compile_static, gm, [0], [torch.randn(2)])
    for n in (3, 4, 5):
        x = torch.randn(n)
        with caplog.at_level(logging.WARNING, logger="kiln"):
            out = cache(x)  # compiled for 2 and 3; the graph itself (eager) for 4 and 5
        torch.testing.assert_close(out, x * 2)
    assert calls == [(2,), (3,)]
    assert "compiled for 2 sizes" in caplog.text
