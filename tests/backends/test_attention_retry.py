"""The kiln backend retries a failed compile without the joint-graph attention rewrite only when
the rewrite can be the cause, and says truthfully what failed.

Issue 11's H200 campaign logged "compiling with the joint-graph attention rewrite failed" for 17
kernel compile errors in graphs with no attention at all: every `KilnError` was retried (and
blamed on the rewrite), even when the rewrite had changed nothing."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln.runtime
from kiln.backends.kiln_backend import kiln_backend
from kiln.config import config
from kiln.errors import CodegenError, InternalError, KilnError


class _FailFirst:
    """`compile_graph` that raises `error` on its first `failures` calls."""

    def __init__(self, error: Exception, failures: int = 1) -> None:
        self.real, self.error, self.failures, self.calls = kiln.runtime.compile_graph, error, \
            failures, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.real(*args, **kwargs)


@pytest.fixture(autouse=True)
def _generated_kernels():
    pytest.importorskip("triton")
    config.cpu_codegen = "triton_interpret"


def test_codegen_error_is_a_kiln_error_and_still_a_not_implemented_error():
    err = CodegenError("group0: empty loop nest")
    assert isinstance(err, KilnError) and isinstance(err, NotImplementedError)
    assert str(err) == "[kiln.codegen] group0: empty loop nest"


def test_no_retry_when_the_graph_had_no_attention(monkeypatch, caplog, device):
    failing = _FailFirst(CodegenError("group0: injected"))
    monkeypatch.setattr(kiln.runtime, "compile_graph", failing)
    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    with caplog.at_level(logging.WARNING, logger="kiln.backends"):
        with pytest.raises(CodegenError, match="injected"):
            kiln_backend(gm, [torch.randn(4, device=device)])
    assert failing.calls == 1
    assert "attention" not in caplog.text


def test_a_failure_after_an_applied_rewrite_is_retried_and_named(monkeypatch, caplog, device):
    import kiln
    from kiln.tools.seed_model import TransformerBlock

    failing = _FailFirst(CodegenError("group3: injected"))
    monkeypatch.setattr(kiln.runtime, "compile_graph", failing)
    torch.manual_seed(0)
    block, x = TransformerBlock(32, 2).to(device), torch.randn(2, 8, 32, device=device)
    with caplog.at_level(logging.WARNING, logger="kiln.backends"):
        out = kiln.compile(block, backend="kiln")(x)
    torch.testing.assert_close(out, block(x))
    assert failing.calls > 1
    assert "rewritten to SDPA failed (CodegenError: [kiln.codegen] group3: injected)" \
        in caplog.text
    assert "compiling without it" in caplog.text


def test_a_second_failure_is_raised_as_itself(monkeypatch, device):
    import kiln.backends.kiln_backend as backend

    def broken(joint):
        raise InternalError("injected rewrite failure")

    failing = _FailFirst(CodegenError("group0: the real failure"), failures=10)
    monkeypatch.setattr(backend, "rewrite_joint_attention", broken)
    monkeypatch.setattr(kiln.runtime, "compile_graph", failing)
    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    with pytest.raises(CodegenError, match="the real failure"):
        kiln_backend(gm, [torch.randn(4, device=device)])
