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
