"""Frames with no graph (issue 13 item 4): a frame capture gave up on runs its route-only copy
while that reaches compiled graphs, and its original code once `skip.QUIET_PROBES` runs reached
none (`kiln/capture/skip.py`), so a model kiln cannot capture costs eager's time plus one check.

Each test compares with eager on fresh random inputs and counts what kiln did: capture attempts
(a counting wrapper around `convert._capture_with_break`), routed calls (counting wrappers around
`breaks.Router.call` and `call_ex`) and graph runs (a backend whose graphs count their calls).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from helpers import assert_same_structure_and_values
from kiln.capture import breaks, convert, skip
from kiln.config import config


class GraphRunCounter:
    """A backend whose graphs run unchanged and count their calls (`runs`); `count` = graphs."""

    def __init__(self) -> None:
        self.count = 0
        self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        self.count += 1

        def run(*args):
            self.runs += 1
            return gm.forward(*args)
        return run


@pytest.fixture
def counts(monkeypatch):
    """`counts["captures"]`: capture attempts; `counts["routes"]`: calls route-only code sent
    through the router (calls of user code and Python library code)."""
    found = {"captures": 0, "routes": 0}
    capture = convert._capture_with_break

    def counting_capture(*args, **kwargs):
        found["captures"] += 1
        return capture(*args, **kwargs)

    def counting(method):
        def count(*args, **kwargs):
            found["routes"] += 1
            return method(*args, **kwargs)
        return count

    monkeypatch.setattr(convert, "_capture_with_break", counting_capture)
    monkeypatch.setattr(breaks.Router, "call", counting(breaks.Router.call))
    monkeypatch.setattr(breaks.Router, "call_ex", counting(breaks.Router.call_ex))
    return found


def looped_scale(x):
    for _ in range(2):
        kiln.graph_break()  # a break inside a loop: this frame has no graph of its own
        x = x * 1.5
    return x


class NoGraph(nn.Module):
    """Capture gives up on forward (a break inside a loop); it calls C functions and a function
    capture gives up on too (a module like nn.Linear would be routed and compiled)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 6) / 3)

    def forward(self, x):
        for _ in range(2):
            kiln.graph_break()
            x = torch.tanh(x @ self.weight)
        return looped_scale(x)


class Capturable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return torch.relu(self.lin(x)) + 1


class Outer(nn.Module):
    """A route-only forward calling `inner` (any module) and a NoGraph."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.tail = NoGraph()

    def forward(self, x):
        for _ in range(2):
            kiln.graph_break()
            x = self.inner(x)
        return self.tail(x)


def _check_calls(model, compiled, calls):
    with torch.no_grad():  # one graph per layer class (a leaf input would differ in grad)
        for _ in range(calls):
            x = torch.randn(3, 6)
            assert_same_structure_and_values(model(x.clone()), compiled(x))


def test_frames_reaching_no_graph_run_their_original_code(counts):
    torch.manual_seed(0)
    model = Outer(NoGraph())
    backend = GraphRunCounter()
    compiled = kiln.compile(model, backend=backend)
    _check_calls(model, compiled, skip.QUIET_PROBES)
    assert backend.count == 0
    captures, routes = counts["captures"], counts["routes"]
    assert captures >= 3  # Outer, NoGraph and looped_scale were each tried once
    assert routes > 0  # the probes ran the route-only copies
    _check_calls(model, compiled, 5)
    # skipped: no capture, no routing, no graph on later calls (the original code runs)
    assert (counts["captures"], counts["routes"], backend.runs) == (captures, routes, 0)


def test_frames_reaching_graphs_keep_routing(counts):
    torch.manual_seed(0)
    model = Outer(Capturable())
    backend = GraphRunCounter()
    compiled = kiln.compile(model, backend=backend)
    _check_calls(model, compiled, 6)
    # Outer's route-only copy reaches Capturable's graph (2 calls per forward) on every call,
    # so it keeps routing; NoGraph (the tail) reaches none and is skipped after its probes
    assert backend.count == 1
    assert backend.runs == 2 * 6
    captures = counts["captures"]
    _check_calls(model, compiled, 3)
    assert backend.runs == 2 * 9 and counts["captures"] == captures


def test_training_outputs_and_gradients_equal_eager():
    torch.manual_seed(0)
    model = Outer(Capturable())
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="aot_eager")
    for _ in range(skip.QUIET_PROBES + 3):
        x = torch.randn(3, 6)
        expected, actual = reference(x), compiled(x)
        assert_same_structure_and_values(expected, actual)
        expected.sum().backward()
        actual.sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


class Block(nn.Module):
    """One class, two instances that call different code: decisions are per instance."""

    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.child = child

    def forward(self, x):
        for _ in range(2):
            kiln.graph_break()
            x = self.child(x)
        return x


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Block(NoGraph())  # called first: nothing compiled beneath it
        self.second = Block(Capturable())

    def forward(self, x):
        return self.second(self.first(x))


def test_skip_decisions_are_per_module_instance():
    torch.manual_seed(0)
    model = TwoBlocks()
    backend = GraphRunCounter()
    compiled = kiln.compile(model, backend=backend)
    _check_calls(model, compiled, skip.QUIET_PROBES + 4)
    # the first Block instance is skipped; the second (same code) still routes its child,
    # whose graph runs twice per call on every call
    assert backend.count == 1
    assert backend.runs == 2 * (skip.QUIET_PROBES + 4)


def test_a_module_change_probes_again(counts):
    torch.manual_seed(0)
    model = Outer(NoGraph())
    backend = GraphRunCounter()
    compiled = kiln.compile(model, backend=backend)
    _check_calls(model, compiled, skip.QUIET_PROBES + 1)
    assert backend.count == 0
    model.inner = Capturable()  # moves the module version: the skipped frames probe again
    _check_calls(model, compiled, 3)
    assert backend.count == 1
    assert backend.runs == 2 * 3


def test_a_frame_that_keeps_changing_modules_stops_probing(counts, monkeypatch):
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            for _ in range(2):
                kiln.graph_break()
                x = x.sin()
            self.calls += 1  # nn.Module.__setattr__: moves the module version on every call
            return x

    model = Counting()
    compiled = kiln.compile(model, backend=GraphRunCounter())
    calls = skip.QUIET_PROBES + config.recompile_limit + 1
    _check_calls(model, compiled, calls)
    routes = counts["routes"]
    slow = []
    run = skip.SkipDecisions.run
    monkeypatch.setattr(skip.SkipDecisions, "run", lambda *a: slow.append(1) or run(*a))
    _check_calls(model, compiled, 4)
    # settled: no routing, and the dispatcher no longer takes the slow path on a version change
    assert counts["routes"] == routes and not slow
    assert model.calls == 2 * (calls + 4)


def branchy(x):
    if x.dim() == 3:  # only 3-d inputs reach the loop with a break: capture gives up on them
        for _ in range(2):
            kiln.graph_break()
            x = x.cos()
    return x * 2


def test_a_frame_with_entries_whose_recompile_failed(counts):
    backend = GraphRunCounter()
    compiled = kiln.compile(branchy, backend=backend)
    for call in range(skip.QUIET_PROBES + 4):
        for shape in ((4, 5), (2, 4, 5)):
            x = torch.randn(shape)
            assert_same_structure_and_values(branchy(x), compiled(x))
    assert backend.count == 1  # the 2-d entry, hit on every call
    assert backend.runs == skip.QUIET_PROBES + 4
    captures = counts["captures"]
    x = torch.randn(3, 4, 5)  # a new 3-d shape: not captured again
    assert_same_structure_and_values(branchy(x), compiled(x))
    assert counts["captures"] == captures


def test_hf_t5_forced_uncapturable_runs_eager_code(monkeypatch, counts):
    pytest.importorskip("transformers")
    from kiln.capture.unsupported import Unsupported
    from kiln.tools.suite import hf

    def fail(*args, **kwargs):
        counts["captures"] += 1
        raise Unsupported("forced", "capture forced to fail (test)")

    monkeypatch.setattr(convert, "_capture_with_break", fail)
    arch = hf.get("t5")
    model = hf.build(arch)
    compiled = kiln.compile(model, backend=GraphRunCounter())
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for call in range(skip.QUIET_PROBES + 3):
            inputs = hf.make_inputs(arch, gen=gen)
            expected, actual = model(**inputs), compiled(**inputs)
            for key, value in expected.items():
                if isinstance(value, torch.Tensor):
                    torch.testing.assert_close(actual[key], value, rtol=0, atol=0)
            if call == skip.QUIET_PROBES - 1:
                captures, routes = counts["captures"], counts["routes"]
    assert captures > 5 and routes > 50
    assert (counts["captures"], counts["routes"]) == (captures, routes)


def doubled(xs):
    for x in xs:
        kiln.graph_break()  # a break inside a loop: capture gives up on this generator
        yield scale_up(x)


def scale_up(x):
    return x * 2 + 1


def sum_doubled(xs):
    total = 0
    for y in doubled(xs):  # the call of doubled is routed: kiln compiles the generator
        kiln.graph_break()
        total = total + y
    return total


def test_a_generator_keeps_routing_while_iterated():
    """Calling a generator function runs none of its body, so probing around the call would see
    no graph: generators keep their route-only copy, and what they call is compiled."""
    backend = GraphRunCounter()
    compiled = kiln.compile(sum_doubled, backend=backend)
    calls = skip.QUIET_PROBES + 3
    for _ in range(calls):
        xs = [torch.randn(4) for _ in range(2)]
        assert_same_structure_and_values(sum_doubled(xs), compiled(xs))
    assert backend.count == 1  # scale_up
    assert backend.runs == 2 * calls
