"""Route-only copies (`breaks.route_only`): a frame capture gave up on still sends the user
functions and modules it calls through kiln; C callables are called natively after an inline
type check. Each test compares with eager on fresh random inputs (outputs, printed text, raised
exceptions) and counts the calls that went through the router."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln
from helpers import CountingBackend, assert_same_structure_and_values
from kiln.capture import breaks, skip


@pytest.fixture
def routed(monkeypatch):
    """The callables route-only code handed to the router, in call order."""
    seen = []
    call = breaks.Router.call

    def counting(router, fn, args, kwnames):
        seen.append(fn)
        return call(router, fn, args, kwnames)

    monkeypatch.setattr(breaks.Router, "call", counting)
    return seen


def scale(x, *, factor=2.0, shift=0.0):
    return x * factor + shift


def raises_value_error(x):
    raise ValueError(f"bad {x.shape[0]}")


class Holder:
    def method(self, x, bias=0.0):
        return x - bias


def many_calls(x, holder):
    for _ in range(2):
        kiln.graph_break()  # a break inside a loop: the frame runs route-only
    y = torch.add(x, 1, alpha=2.0)  # C function with a keyword
    y = y.clamp(min=-1.0, max=1.0)  # tensor method with keywords
    y = scale(y, factor=3.0, shift=torch.cos(x).sum().item())  # routed, keywords, nested calls
    y = holder.method(y, bias=0.5)  # a bound method of a plain object
    try:
        raises_value_error(y)  # routed; raises inside a try of the route-only frame
    except ValueError as err:
        y = y + len(str(err))
    try:
        torch.cat([y], dim=5)  # a C function raising inside a try
    except (IndexError, RuntimeError):
        y = y * 2
    parts = [p.sum() for p in y.split(1)]  # a comprehension: stays a native call
    return max(parts), sorted(v.item() for v in parts), y


def test_route_only_calls_equal_eager_and_route_only_user_code(routed):
    backend = CountingBackend()
    compiled = kiln.compile(many_calls, backend=backend)
    for _ in range(skip.QUIET_PROBES + 2):
        x = torch.randn(3, 4)
        assert_same_structure_and_values(many_calls(x, Holder()), compiled(x, Holder()))
    names = {getattr(fn, "__name__", type(fn).__name__) for fn in routed}
    # C callables (torch.add, clamp, cos, sum, item, cat, max, sorted, len, str, range) never
    # reach the router; user code does (and Python library code such as Tensor.split)
    assert {"graph_break", "scale", "method", "raises_value_error"} <= names, names
    assert not names & {"add", "clamp", "cos", "sum", "item", "cat", "max", "sorted", "len",
                        "str", "range"}, names
    assert backend.count >= 1  # scale was compiled (a graph), so the frame keeps routing


def test_route_only_exception_escapes_like_eager():
    def outer(x):
        for _ in range(2):
            kiln.graph_break()
        return raises_value_error(torch.sin(x))

    compiled = kiln.compile(outer, backend=CountingBackend())
    for _ in range(skip.QUIET_PROBES + 2):
        with pytest.raises(ValueError, match="bad 3"):
            compiled(torch.randn(3))


class Gate(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gates = nn.ModuleList([Gate() for _ in range(3)])

    def forward(self, x, *, scale_by=1.0):
        for gate in self.gates:
            kiln.graph_break()  # route-only: every gate call is routed, each compiled
            x = gate(x) * scale_by
        return x


def test_route_only_module_calls_are_compiled(routed):
    backend = CountingBackend()
    model = Stack()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 5)
            assert_same_structure_and_values(model(x, scale_by=0.5), compiled(x, scale_by=0.5))
    assert backend.count == 1  # one graph shared by the three gates
    assert sum(isinstance(fn, Gate) for fn in routed) == 3 * 4
