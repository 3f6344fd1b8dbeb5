"""Memory planning: executing the steps in order with storages actually shared as `reuse`
says, and freed storages poisoned right after `last_use`, still gives eager's results (so no
buffer is reused or freed before its last read); the plan never frees outputs or inputs and
lowers the peak of live bytes."""
from __future__ import annotations

import math

import pytest
import torch
from schedule_graphs import lower_fn, real_inputs, seed_block_graphs

from kiln.lower import lower_graph
from kiln.lower.evaluate import PrintedRun, _materialize, _run_node
from kiln.lower.ir import ExternKernel, TensorArg
from kiln.schedule import FusedGroup, Schedule, schedule
from kiln.schedule.memory import live_bytes, step_reads, step_writes


def run_with_reuse(sched: Schedule, inputs: list) -> list:
    """An independent executor: steps in schedule order, `reuse` as real storage sharing,
    storages poisoned (NaN / -1) after their last use."""
    graph = sched.graph
    rt = PrintedRun(graph.constants)
    for buf, value in zip(graph.inputs, inputs):
        if buf is not None:
            lay = buf.layout
            rt.bind(buf.name, value, lay.dtype, lay.size, lay.stride, lay.offset)
    for name in graph.constants:
        rt.constant(name)
    for i, step in enumerate(sched.steps):
        for node in (step.nodes if isinstance(step, FusedGroup) else [step]):
            _run_node(rt, node)
        for name in step_writes(step):
            if name in sched.reuse:
                target = rt.storages[sched.reuse[name]]
                assert target.shape == rt.storages[name].shape
                target.copy_(rt.storages[name])
                rt.storages[name] = target
        for name, last in sched.last_use.items():
            if last == i:
                storage = rt.storages[name]
                storage.fill_(math.nan if storage.is_floating_point() else -1)
    by_name = {b.name: v for b, v in zip(graph.inputs, inputs) if b is not None}
    for name, arg in graph.mutations:
        by_name[name].copy_(_materialize(arg, rt))
    return [_materialize(o, rt) for o in graph.outputs]


def _graphs():
    cases = []
    for training in (False, True):
        for gm, example in seed_block_graphs(training):
            cases.append((gm, example))
    return cases


@pytest.fixture(scope="module")
def seed_graphs():
    return [(gm, ex, lower_graph(gm, ex)) for gm, ex in _graphs()]


@pytest.mark.explicit_device  # module-scoped CPU seed-block graphs
def test_reuse_and_frees_keep_results(seed_graphs) -> None:
    for gm, example, graph in seed_graphs:
        sched = schedule(graph)
        inputs = real_inputs(example)
        eager = gm(*inputs)
        eager = list(eager) if isinstance(eager, (tuple, list)) else [eager]
        got = run_with_reuse(sched, inputs)
        for g, e in zip(got, eager):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-4)
        assert sched.reuse, "the seed graphs have same-sized temporaries to share"


def test_plan_never_frees_observed_buffers(seed_graphs) -> None:
    for _, _, graph in seed_graphs:
        sched = schedule(graph)
        observed = {o.name for o in graph.outputs if isinstance(o, TensorArg)}
        inputs = {b.name for b in graph.inputs if b is not None}
        assert not (observed | inputs) & set(sched.last_use)
        assert not (observed | inputs) & set(sched.reuse.values())
        assert not inputs & set(sched.reuse)
        for i, step in enumerate(sched.steps):
            for name in step_reads(step):
                if name in sched.last_use:
                    assert sched.last_use[name] >= i
        for new, old in sched.reuse.items():
            a, b = graph.buffers[new].layout, graph.buffers[old].layout
            assert (a.dtype, a.device, a.storage_size()) == (b.dtype, b.device, b.storage_size())


def test_plan_lowers_the_peak(seed_graphs) -> None:
    for _, _, graph in seed_graphs:
        sched = schedule(graph)
        planned = live_bytes(sched.steps, sched.graph, sched.last_use)
        assert planned < live_bytes(sched.steps, sched.graph)


def test_unread_extern_output_dies_where_it_is_written() -> None:
    def fn(x, w):
        return torch.nn.functional.layer_norm(x @ w, (8,))

    graph, eager = lower_fn(fn, torch.randn(4, 8), torch.randn(8, 8))
    sched = schedule(graph)
    mm = next(i for i, s in enumerate(sched.steps) if isinstance(s, ExternKernel))
    assert sched.last_use[sched.steps[mm].name] == mm + 1
    torch.testing.assert_close(run_with_reuse(sched, [torch.randn(4, 8), torch.randn(8, 8)])[0]
                               .shape, eager[0].shape)


def test_fusion_never_grows_the_peak(seed_graphs) -> None:
    for _, _, graph in seed_graphs:
        fused, unfused = schedule(graph), schedule(graph, fuse=False)
        assert live_bytes(fused.steps, fused.graph, fused.last_use) <= \
            live_bytes(unfused.steps, unfused.graph, unfused.last_use)


def _fresh_between(sched: Schedule, start: int, stop: int) -> list[str]:
    """Buffers allocated fresh (not taking a dead one's storage) by steps start..stop-1."""
    return [name for step in sched.steps[start:stop] for name in step_writes(step)
            if name not in sched.reuse]


def _assert_donors_never_held_past_an_allocation(sched: Schedule) -> None:
    index = {name: i for i, step in enumerate(sched.steps) for name in step_writes(step)}
    for new, old in sched.reuse.items():
        died, taken = sched.last_use[old], index[new]
        assert died < taken
        assert not _fresh_between(sched, died + 1, taken), \
            f"{old} (dead after step {died}) is held across allocations until {new} takes it"


def _chain(x, w1, w2, w3):
    a = x @ w1                           # [64, 64]
    b = torch.relu(a)                    # a dies here
    d = torch.sin(b @ w2)                # fresh [64, 32] buffers
    return torch.cos(d @ w3) * 2         # [64, 64]: could take a's storage, held since b


def test_reuse_never_raises_the_peak(seed_graphs) -> None:
    """A donor is held from its death to the taker's allocation: only worth it when no other
    allocation happens between (the first planner held ResNet activations across stages)."""
    graph, _ = lower_fn(_chain, torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 32),
                        torch.randn(32, 64))
    scheds = [schedule(graph, fuse=False)]
    scheds += [schedule(g) for _, _, g in seed_graphs]
    for sched in scheds:
        _assert_donors_never_held_past_an_allocation(sched)
        freed = live_bytes(sched.steps, sched.graph, sched.last_use)
        assert live_bytes(sched.steps, sched.graph, sched.last_use, sched.reuse) <= freed
    assert not scheds[0].reuse  # the chain's same-sized donors died allocations ago
