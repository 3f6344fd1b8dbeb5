"""Fixtures of the runtime tests."""
from __future__ import annotations

import pytest

import kiln.runtime.launcher as launcher_module


@pytest.fixture
def kernel_compiles(monkeypatch):
    """The kernel specs compiled into kernel objects (one entry per compile_kernel call)."""
    pytest.importorskip("triton")
    compiled: list = []
    real = launcher_module.compile_kernel

    def counting(spec):
        compiled.append(spec)
        return real(spec)

    monkeypatch.setattr(launcher_module, "compile_kernel", counting)
    return compiled
