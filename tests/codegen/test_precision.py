"""Generated kernels round as eager rounds (issue 11): explicit low-precision casts round inside
fused kernels, float32 division and square root are IEEE-rounded, no FMA contraction, and a load
at a constant index is a block. Compiled with the kiln backend against eager on fresh random
inputs on the test device (CPU: the kernels run in Triton's interpreter; CUDA: real binaries)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.codegen import emit_kernel  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower._compat import trace_aten  # noqa: E402


@pytest.fixture(autouse=True)
def generated_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config.cpu_codegen = "triton_interpret"
    config.suppress_errors = False  # a backend failure must fail the test, not run eagerly


def _same(fn, make_args, calls=2, **tol):
    compiled = kiln.compile(fn, backend="kiln")
    for _ in range(calls):
        args = make_args()
        got, want = compiled(*[a.clone() for a in args]), fn(*args)
        torch.testing.assert_close(got, want, equal_nan=True, **tol)


def _kernel_source(fn, *inputs) -> str:
    graph = lower_graph(trace_aten(fn, *inputs))
    (node,) = graph.computed
    return emit_kernel(node, graph).source


def test_constant_index_load_is_a_block(device):
    """Fuzz finding 5 (seed 5083): clamp of a one-element slice loaded a scalar, and the
    interpreter raised on `|` of a block and a scalar comparison."""
    def fn(x):
        v = x[1::3]
        x.clamp_(-1, 1)
        return v + v, x[1] * x

    _same(fn, lambda: [torch.randn(2, device=device, dtype=torch.float16) * 3])
    src = _kernel_source(lambda x: x[1:2].clamp(-1, 1), torch.randn(2))
    assert "tl.broadcast_to(tl.load(in_ptr0 + (1)), [1])" in src
