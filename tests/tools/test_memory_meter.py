"""The CPU peak-memory meter on eager code with known allocation patterns: exact bytes for
fresh outputs, views and in-place ops not counted, frees seen when they happen, a backward's
gradients, and cycles told apart from reference-counted frees."""
from __future__ import annotations

import torch

from kiln.tools.memory_meter import MemoryMeter, measure_peak

MIB = 2**20
N = MIB // 4  # float32 elements in 1 MiB


def test_counts_fresh_storages_and_frees_at_last_reference():
    x = torch.randn(N)

    def fn():
        a = x * 2                 # 1 MiB
        b = a + 1                 # 2
        del a                     # 1
        b.view(-1).mul_(3)        # a view and an in-place op: nothing new
        d = torch.empty(2 * N)    # 3
        d.copy_(torch.cat([b, b]))  # cat's 2 MiB on top: 5, then freed
        del d
        return b

    peak = measure_peak(fn)
    assert peak.peak_bytes == 5 * MIB
    assert peak.end_bytes == MIB and peak.allocations == 4
    assert peak.result.shape == (N,) and peak.cycle_bytes == 0
    assert [n for _, n in peak.at_peak] == [MIB, 2 * MIB, 2 * MIB]
    assert measure_peak(fn, keep_result=False).end_bytes == 0


def test_backward_gradients_and_saved_activations():
    lin = torch.nn.Linear(512, 256)
    x = torch.randn(128, 512, requires_grad=True)

    def step():
        lin(x).relu().sum().backward()

    peak = measure_peak(step, keep_result=False)
    # kept: weight grad 512 KiB, bias grad 1 KiB, x.grad 256 KiB
    assert peak.end_bytes == (512 * 256 + 256 + 128 * 512) * 4
    # at least the kept grads plus the linear's output (saved by relu) were alive at once
    assert peak.peak_bytes >= peak.end_bytes + 128 * 256 * 4
    assert peak.peak_bytes < 2 * peak.end_bytes


def test_inputs_are_not_counted_nor_their_storage_views():
    x = torch.randn(N)
    peak = measure_peak(lambda: (x[1:], x.t(), torch.as_strided(x, (4,), (2,))))
    assert peak.peak_bytes == 0 and peak.allocations == 0


class _Cycle:
    def __init__(self, t):
        self.t, self.me = t, self


def test_cycles_are_collected_only_when_asked():
    def fn():
        _Cycle(torch.randn(N))    # garbage held by a reference cycle
        return torch.randn(N)

    import gc
    gc.collect()
    plain = measure_peak(fn, keep_result=False)
    assert plain.peak_bytes == 2 * MIB and plain.cycle_bytes == 0
    gc.collect()
    collected = measure_peak(fn, keep_result=False, collect_cycles=True)
    assert collected.peak_bytes == MIB and collected.cycle_bytes == MIB


def test_meter_counts_frees_after_exit():
    meter = MemoryMeter()
    with meter:
        t = torch.ones(N)
    assert meter.live == MIB
    del t
    assert meter.live == 0 and meter.peak == MIB
