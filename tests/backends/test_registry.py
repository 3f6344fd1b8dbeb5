from __future__ import annotations

import pytest
import torch
import torch.fx

from kiln.backends import list_backends, lookup_backend, register_backend
from kiln.errors import InvalidArgument


def _fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ y).sin() + y.sum(0)


def test_eager_runs_captured_graph():
    gm = torch.fx.symbolic_trace(_fn)
    x, y = torch.randn(5, 7), torch.randn(7, 7)
    compiled = lookup_backend("eager")(gm, [x, y])
    for _ in range(2):
        x, y = torch.randn(5, 7), torch.randn(7, 7)
        torch.testing.assert_close(compiled(x, y), _fn(x, y))


def test_callable_passes_through():
    def my_backend(gm, example_inputs):
        return gm.forward

    assert lookup_backend(my_backend) is my_backend


def test_register_and_list():
    @register_backend("test_registry_double")
    def double(gm, example_inputs):
        return lambda *args: gm(*args) * 2

    assert "test_registry_double" in list_backends()
    gm = torch.fx.symbolic_trace(_fn)
    x, y = torch.randn(3, 4), torch.randn(4, 4)
    torch.testing.assert_close(lookup_backend("test_registry_double")(gm, [x, y])(x, y),
                               2 * _fn(x, y))
    with pytest.raises(InvalidArgument, match="'test_registry_double' is already registered"):
        register_backend("test_registry_double")(lambda gm, inputs: gm.forward)


def test_unknown_name_lists_registered():
    assert {"eager", "inductor"} <= set(list_backends())
    with pytest.raises(InvalidArgument) as info:
        lookup_backend("eagr")
    text = str(info.value)
    assert text.startswith("[kiln.api] unknown backend 'eagr'; registered backends: ")
    assert "eager" in text.split("registered backends:")[1]
    assert "hint:" in text
    assert isinstance(info.value, ValueError)
