"""Python int arguments as symbolic sizes (issue 15): an int that changed between calls (or any
int argument under `dynamic=True`) is a symbol of the capture's ShapeEnv, as torch.compile's
unspecialized ints, so `torch.arange(n)`, `x[:, :n]`, `x * n` and a decode step's position keep
one graph for every value; the autograd stage traces it once (a SymInt placeholder);
`dynamic=False` specializes every value; a branch on it is a guard in the user's terms. Floats
and ints outside a symbol's range are 0-dim tensor inputs (tests/capture/test_number_tensors.py).

Every test compares with eager on fresh random inputs per call and counts captures."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kiln
from helpers import CountingAot

# aot_eager graphs (no generated kernels): CPU tensors also in the CUDA suite
pytestmark = pytest.mark.explicit_device


def _close(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def _int_idioms(x: torch.Tensor, n: int) -> torch.Tensor:
    ramp = torch.arange(n, dtype=x.dtype)  # a size from the int
    head = x[:, :n] * n  # a slice bound and a scalar
    return head.sum(-1) + ramp.sum() + x.new_ones(n).sum() + F.pad(x, (0, n)).sum(-1)


def test_a_changing_int_argument_is_traced_once(recorder):
    backend = CountingAot()
    compiled = kiln.compile(_int_idioms, backend=backend)
    for n in (3, 5, 2, 7, 11, 4):
        x = torch.randn(4, 12)
        _close(compiled(x, n), _int_idioms(x, n))
    assert len(backend.gms) == 2, f"{len(backend.gms)} captures for 6 values"
    assert any(isinstance(p.meta.get("val"), torch.SymInt) for p in backend.gms[-1].graph.nodes
               if p.op == "placeholder")
    traces = recorder.autograd_traces
    assert len(traces) == 2 and traces[-1].symbolic, traces


def test_dynamic_true_makes_an_int_argument_symbolic_from_the_first_call():
    backend = CountingAot()
    compiled = kiln.compile(_int_idioms, backend=backend, dynamic=True)
    for n in (3, 5, 2, 7):
        x = torch.randn(4, 12)
        _close(compiled(x, n), _int_idioms(x, n))
    assert len(backend.gms) == 1, f"{len(backend.gms)} captures with dynamic=True"


def test_dynamic_false_specializes_every_value():
    backend = CountingAot()
    compiled = kiln.compile(_int_idioms, backend=backend, dynamic=False)
    values = (3, 5, 2, 7)
    for n in values:
        x = torch.randn(4, 12)
        _close(compiled(x, n), _int_idioms(x, n))
    assert len(backend.gms) == len(values)
    assert all(all(not isinstance(p.meta.get("val"), torch.SymInt) for p in gm.graph.nodes)
               for gm in backend.gms)


def _branchy(x: torch.Tensor, n: int) -> torch.Tensor:
    if n > 4:
        return x[:n].cos()
    return x[:n].sin() * n


def test_a_branch_on_an_int_argument_is_a_guard_in_user_terms():
    backend = CountingAot()
    compiled = kiln.compile(_branchy, backend=backend, dynamic=True)
    for n in (2, 3, 6, 8, 4):
        x = torch.randn(10, 3)
        _close(compiled(x, n), _branchy(x, n))
    assert len(backend.gms) == 2, f"{len(backend.gms)} captures: one per side of the branch"
    out = kiln.explain(_branchy, dynamic=True)(torch.randn(10, 3), 3)
    guards = out.render(verbose=True)
    assert "n <= 4" in guards and "type(n) is int" in guards, guards
    assert "n (dynamic=True)" in out.render(), out.render()


def test_an_int_attribute_of_a_module_stays_specialized_under_dynamic_true():
    """Layer sizes and head counts are ints of the module: torch.compile keeps them constant."""

    class Heads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = 4

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], self.heads, -1).softmax(-1)

    backend = CountingAot()
    model = Heads()
    compiled = kiln.compile(model, backend=backend, dynamic=True)
    x = torch.randn(3, 8)
    _close(compiled(x), model(x))
    (gm,) = backend.gms
    view = next(n for n in gm.graph.nodes if n.target == "view")
    assert 4 in view.args, view.args


class _DecodeStep(torch.nn.Module):
    """A decode step: the new token's keys written into a cache at `start`, attention over the
    first `start + 1` positions, a position embedding looked up at `start`."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.pos = torch.nn.Embedding(32, 16)
        self.register_buffer("cache", torch.randn(2, 32, 16))

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        n = x.shape[1]
        self.cache[:, start:start + n] = self.proj(x)
        keys = self.cache[:, :start + n]
        q = x + self.pos(torch.arange(start, start + n, device=x.device))
        return F.softmax(q @ keys.transpose(1, 2) / 4.0, -1) @ keys


def test_a_decode_step_over_positions_is_one_graph():
    backend = CountingAot()
    model = _DecodeStep()
    twin = _DecodeStep()
    twin.load_state_dict(model.state_dict())
    compiled = kiln.compile(twin, backend=backend)
    with torch.no_grad():
        for start in range(3, 15):
            x = torch.randn(2, 1, 16)
            _close(compiled(x, start), model(x, start))
            _close(twin.cache, model.cache)
    assert len(backend.gms) == 2, f"{len(backend.gms)} captures for 12 positions"


def _scaled(x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    return (x[:, :n] @ w[:n]).tanh() * n


def test_training_with_an_int_argument_matches_eager_grads(recorder):
    backend = CountingAot()
    compiled = kiln.compile(_scaled, backend=backend)
    for n in (3, 5, 8, 6):
        x = torch.randn(4, 8, requires_grad=True)
        w = torch.randn(8, 5, requires_grad=True)
        x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
        got, want = compiled(x, w, n), _scaled(x2, w2, n)
        _close(got, want)
        grad = torch.randn_like(want)
        got.backward(grad)
        want.backward(grad)
        _close(x.grad, x2.grad)
        _close(w.grad, w2.grad)
    assert len(backend.gms) == 2
    assert recorder.autograd_traces[-1].symbolic and recorder.autograd_traces[-1].training


def test_values_below_two_get_graphs_of_their_own():
    """The symbol of an int argument is a size's (kernels assume sizes >= 2): after the
    symbolic capture, 1 and 0 each get a specialized graph and a negative value one of its own
    (a slice bound needs its value), all with eager's answers; a later value >= 2 reuses the
    symbolic one."""
    backend = CountingAot()

    def fn(x, n):
        return x[:, n:] * n + torch.arange(n + 2, dtype=x.dtype).sum()

    compiled = kiln.compile(fn, backend=backend)
    for n in (3, 5, 1, 0, -2, 7):
        x = torch.randn(4, 9)
        _close(compiled(x, n), fn(x, n))
    assert len(backend.gms) == 5, f"{len(backend.gms)} captures"
    symbolic = [any(isinstance(p.meta.get("val"), torch.SymInt) for p in gm.graph.nodes)
                for gm in backend.gms]
    assert symbolic == [False, True, False, False, False], symbolic


def test_an_int_past_int32_gets_a_graph_of_its_own():
    """The kernels' sizes are int32: an int argument's symbol is bounded by a guard, and a value
    past it (a seed, a checksum) is a 0-dim int64 tensor input in a capture of its own (one for
    all such values: no recompile per value), with eager's answers."""
    backend = CountingAot()

    def fn(x, n):
        return x * (n % 1000) + x[:2].sum() * (n % 3 + 1)

    compiled = kiln.compile(fn, backend=backend)
    for n in (5, 7, 2**40 + 3, 9, 2**40 + 8):
        x = torch.randn(4, 3, dtype=torch.float64)
        _close(compiled(x, n), fn(x, n))
    assert len(backend.gms) == 3, f"{len(backend.gms)} captures"
    out = kiln.explain(fn, dynamic=True)(torch.randn(4, 3), 5).render(verbose=True)
    assert "n <= 2147483647" in out, out
