"""The "kiln" backend's registration and its CPU switches (the pipeline itself is tested in
tests/runtime/test_pipeline.py)."""
from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import torch

from kiln.backends import list_backends, lookup_backend
from kiln.backends.kiln_backend import kiln_backend
from kiln.config import config
from kiln.errors import KilnConfigError


def test_registered_as_kiln():
    assert "kiln" in list_backends()
    assert lookup_backend("kiln") is kiln_backend


def _installed_entry_points() -> list[importlib.metadata.EntryPoint]:
    points = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return [p for p in points if p.name == "kiln"]


def test_pyproject_declares_the_torch_dynamo_entry_point():
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"]
    assert declared["torch_dynamo_backends"] == {"kiln": "kiln.backends.kiln_backend:kiln_backend"}
    module, _, name = declared["torch_dynamo_backends"]["kiln"].partition(":")
    assert getattr(importlib.import_module(module), name) is kiln_backend


@pytest.mark.skipif(not _installed_entry_points(), reason="kiln is not pip-installed here, so "
                    "no distribution metadata carries its torch_dynamo_backends entry point "
                    "(the declaration in pyproject.toml is checked above)")
def test_installed_torch_dynamo_entry_point():
    (point,) = _installed_entry_points()
    assert point.load() is kiln_backend


def test_unknown_cpu_codegen_is_a_config_error():
    config.cpu_codegen = "interpreter"
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(KilnConfigError, match="cpu_codegen='interpreter'.*triton_interpret"):
        kiln_backend(gm, [torch.randn(2, device="cpu")])


def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch):
    config.cpu_codegen = "triton_interpret"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(KilnConfigError, match="TRITON_INTERPRET"):
        kiln_backend(gm, [torch.randn(2, device="cpu")])


def test_cpu_default_returns_the_captured_graph():
    config.cpu_codegen = "eager"
    gm = torch.fx.symbolic_trace(lambda x, y: torch.tanh(x) @ y)
    x, y = torch.randn(3, 4, device="cpu"), torch.randn(4, 2, device="cpu")
    compiled = kiln_backend(gm, [x, y])
    assert compiled is gm
    x, y = torch.randn(3, 4, device="cpu"), torch.randn(4, 2, device="cpu")
    torch.testing.assert_close(compiled(x, y), torch.tanh(x) @ y)


def _captured(fn, *args) -> torch.fx.GraphModule:
    import kiln
    graphs = []
    kiln.compile(fn, backend=lambda gm, inputs: graphs.append(gm) or gm)(*args)
    return graphs[0]


@pytest.mark.explicit_device  # CPU tensors in both runs (arange makes them on the test device)
def test_work_on_cpu_tensors_is_found_and_moves_are_not():
    from kiln.backends.kiln_backend import _computes_on_cpu
    x = torch.randn(4, 3)
    assert _computes_on_cpu(_captured(lambda t: t.cpu() * 2, x))
    assert _computes_on_cpu(_captured(lambda t: t + torch.arange(3), x))
    assert not _computes_on_cpu(_captured(lambda t: (t.cpu(), t.to("cpu", torch.float64)), x))


@pytest.mark.gpu
@pytest.mark.parametrize("cpu_codegen", ["eager", "triton_interpret"])
def test_a_graph_with_cpu_work_beside_cuda_inputs_runs_as_torch_ops(cpu_codegen, caplog):
    """`torch.histogramdd(x.cpu())` in a CUDA function: compiled Triton cannot run the CPU part
    (it read CPU pointers as device memory), so the graph runs as torch ops and says so."""
    import kiln
    config.cpu_codegen, config.suppress_errors = cpu_codegen, False

    def fn(x):
        hist, edges = torch.histogramdd(x.cpu(), (2, 3), density=False)
        return hist * 2, [e + 1 for e in edges], x.sin()

    x = torch.randn(6, 2, device="cuda")
    with caplog.at_level("INFO", logger="kiln.backends"):
        got = kiln.compile(fn, backend="kiln")(x)
    torch.testing.assert_close(got, fn(x))
    assert "computes on CPU tensors" in caplog.text


def test_a_failing_joint_attention_rewrite_falls_back_to_compiling_without_it(monkeypatch,
                                                                             caplog, device):
    """The joint-graph attention rewrite must never cost the graph: if compiling with it fails,
    the backend compiles without it (and says so) and training still equals eager."""
    import logging

    import kiln
    import kiln.backends.kiln_backend as backend
    from kiln.errors import InternalError
    from kiln.tools.seed_model import TransformerBlock

    def broken(joint):
        raise InternalError("injected failure")

    monkeypatch.setattr(backend, "rewrite_joint_attention", broken)
    config.cpu_codegen = "triton_interpret"
    torch.manual_seed(0)
    block, x = TransformerBlock(32, 2).to(device), torch.randn(2, 8, 32, device=device)
    with caplog.at_level(logging.WARNING, logger="kiln.backends"):
        out = kiln.compile(block, backend="kiln")(x)
    assert "compiling without it" in caplog.text
    torch.testing.assert_close(out, block(x))


@pytest.mark.parametrize("suppress", [True, False])
def test_a_backward_graph_that_fails_to_compile_runs_its_aten_ops(monkeypatch, caplog, device,
                                                                  suppress, tmp_path):
    """The backward graph compiles on the first backward call, after the forward ran: a failure
    there (OpInfo's kthvalue of a 0-dim tensor did) raised out of `loss.backward()`. Now the
    traced backward graph runs on torch's kernels, with a warning; KILN_SUPPRESS_ERRORS=0 raises."""
    import logging

    import kiln
    import kiln.runtime as runtime

    real = runtime.compile_graph

    def failing_backward(graph, inputs, *, name, **kw):
        if name == "backward":
            raise RuntimeError("injected backward failure")
        return real(graph, inputs, name=name, **kw)

    monkeypatch.setattr(runtime, "compile_graph", failing_backward)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config.cpu_codegen = "triton_interpret"
    config.suppress_errors = suppress

    def fn(x, w):
        return (torch.tanh(x @ w) * x.sum(-1, keepdim=True)).softmax(-1)

    x = torch.randn(4, 6, device=device, requires_grad=True)
    w = torch.randn(6, 6, device=device, requires_grad=True)
    x2, w2 = (t.detach().clone().requires_grad_(True) for t in (x, w))
    weights = torch.randn(4, 6, device=device)
    out = kiln.compile(fn, backend="kiln")(x, w)
    torch.testing.assert_close(out, fn(x2, w2))
    (fn(x2, w2) * weights).sum().backward()
    if not suppress:
        with pytest.raises(RuntimeError, match="injected backward failure"):
            (out * weights).sum().backward()
        return
    with caplog.at_level(logging.WARNING, logger="kiln.autograd"):
        (out * weights).sum().backward()
    assert "compiling a backward graph failed" in caplog.text
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_complex_values_are_never_given_to_a_generated_kernel(tmp_path, monkeypatch, caplog):
    """OpInfo's fft.ifft in training: the backward graph cloned a complex64 tangent in a
    generated copy kernel, which Triton cannot take (KeyError 'complex64' at launch, out of
    `loss.backward()`). Complex groups are now refused at code generation: the graph runs its
    ATen ops instead (with a warning), and gradients equal eager's."""
    import logging

    import kiln

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config.cpu_codegen = "triton_interpret"

    def fn(a):
        return torch.fft.ifft(a)

    x = torch.randn(6, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out = kiln.compile(fn, backend="kiln")(x)
        want = fn(x2)
        torch.testing.assert_close(out, want)
        weights = torch.randn(6)
        (out * weights).real.sum().backward()
        (want * weights).real.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_a_symbolic_backward_that_cannot_compile_goes_per_size_without_a_warning(
        tmp_path, monkeypatch, caplog):
    """HuberLoss's backward reads `sym_float` of a size, which the symbolic lowering refuses:
    that failure must send the graph per size (silently, as before), not through the eager
    fallback of a backward that fails at `loss.backward()` time."""
    import logging

    import kiln

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config.cpu_codegen = "triton_interpret"
    loss_fn = torch.nn.HuberLoss(delta=0.5)
    compiled = kiln.compile(loss_fn, backend="kiln")
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for rows in (3, 4, 5):  # the second size recompiles with symbolic sizes
            x, y = (torch.randn(rows, 4, requires_grad=True) for _ in range(2))
            x2, y2 = (t.detach().clone().requires_grad_(True) for t in (x, y))
            out, want = compiled(x, y), loss_fn(x2, y2)
            out.backward()
            want.backward()
            torch.testing.assert_close(out, want)
            torch.testing.assert_close(x.grad, x2.grad)
            torch.testing.assert_close(y.grad, y2.grad)
    assert "compiling a backward graph failed" not in caplog.text
