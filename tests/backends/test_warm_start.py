"""The kiln backend's warm start finishes outputs with the autograd stage's own epilogue: a graph
rebuilt from the disk cache returns what the cold compile returns (inputs themselves, views of
inputs, repeats, constants, nested tuples), and the cold path stored it. (fx makes lists and
dicts immutable_list / immutable_dict, which are not stored.)
(Planted and damaged entries: tests/runtime/test_cache_safety.py; a new process:
tests/runtime/test_pipeline.py.)"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kiln.backends import warm_start  # noqa: E402
from kiln.backends.kiln_backend import kiln_backend  # noqa: E402
from kiln.codegen import triton_build  # noqa: E402
from kiln.config import config  # noqa: E402


def _graph(x, y):
    s = torch.sin(x) * y
    return (s, x), (x[1:], 3, s), (y.t(), None)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    config.cpu_codegen = "triton_interpret"
    config.suppress_errors = False


def _compile(x, y):
    triton_build._compiled.clear()  # as in a new process: kernels built again from their sources
    return kiln_backend(torch.fx.symbolic_trace(_graph), [x, y])


def test_a_warm_graph_returns_what_the_cold_one_returns(cache):
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    stores, hits = warm_start.STATS["stores"], warm_start.STATS["hits"]
    with torch.no_grad():
        cold = _compile(x, y)(x, y)
        assert warm_start.STATS["stores"] == stores + 1
        warm = _compile(x, y)(x, y)
    assert warm_start.STATS["hits"] == hits + 1
    for got in (cold, warm):
        (s, same), (view, three, again), (transposed, none) = got
        assert type(got) is tuple and all(type(part) is tuple for part in got)
        torch.testing.assert_close(s, _graph(x, y)[0][0])
        assert same is x and again is s and three == 3 and none is None
        assert view.data_ptr() == x[1:].data_ptr() and view.shape == (3, 6)
        assert transposed.data_ptr() == y.data_ptr() and transposed.stride() == (1, 6)


def test_a_warm_graph_compiles_the_full_pipeline_for_training(cache):
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    with torch.no_grad():
        _compile(x, y)
    compiled = _compile(x, y)
    assert isinstance(compiled, warm_start.WarmGraph)  # no offset guard around it
    w = y.clone().requires_grad_()
    out = compiled(x, w)
    out[0][0].sum().backward()
    torch.testing.assert_close(w.grad, torch.sin(x))
