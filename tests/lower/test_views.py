"""Property test: random chains of view ops lower to index maps that read exactly eager's elements.

Each case applies a random chain (permute, transpose, slice with steps, select, unsqueeze,
squeeze, expand, reshape, as_strided) to a random tensor. The lowered graph must return eager's
values, and whenever eager's result is a view of the input, the IR's output must be that same
strided view: `torch.as_strided(x, size, stride, offset)` with eager's geometry (so the index
algebra left no div/mod behind).
"""
from __future__ import annotations

import math
import random

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower import lower_graph
from kiln.lower.evaluate import run_ir
from kiln.lower.ir import TensorArg


def _factorizations(n: int, rng: random.Random) -> list[int]:
    dims, rest = [], n
    while rest > 1 and len(dims) < 3:
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        d = rng.choice(divisors)
        dims.append(d)
        rest //= d
    if rest > 1:
        dims.append(rest)
    rng.shuffle(dims)
    return dims or [1]


def _random_step(y: torch.Tensor, rng: random.Random) -> tuple[str, tuple]:
    nd = y.dim()
    choices = ["unsqueeze", "reshape", "as_strided"]
    if nd:
        choices += ["permute", "transpose", "slice", "select", "expand"]
    if any(s == 1 for s in y.shape):
        choices.append("squeeze")
    op = rng.choice(choices)
    if op == "permute":
        dims = list(range(nd))
        rng.shuffle(dims)
        return op, (dims,)
    if op == "transpose":
        return op, (rng.randrange(nd), rng.randrange(nd))
    if op == "slice":
        d = rng.randrange(nd)
        n = y.shape[d]
        start = rng.randrange(n)
        return op, (d, start, rng.randint(start + 1, n), rng.choice([1, 1, 2, 3]))
    if op == "select":
        d = rng.randrange(nd)
        return op, (d, rng.randrange(-y.shape[d], y.shape[d]))
    if op == "unsqueeze":
        return op, (rng.randint(-nd - 1, nd),)
    if op == "squeeze":
        return op, (rng.choice([d for d in range(nd) if y.shape[d] == 1]),)
    if op == "expand":
        if rng.random() < 0.5 or all(s != 1 for s in y.shape):
            return op, ([rng.randint(2, 3), *y.shape],)
        return op, ([rng.randint(2, 3) if s == 1 else s for s in y.shape],)
    if op == "reshape":
        return op, (_factorizations(y.numel(), rng),)
    storage = y.untyped_storage().nbytes() // y.element_size()
    while True:
        size = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
        stride = [rng.choice([0, 1, 2, 3, 5]) for _ in size]
        span = sum((s - 1) * st for s, st in zip(size, stride)) + 1
        if span <= storage:
            return op, (size, stride, rng.randint(0, storage - span))


def _apply(y: torch.Tensor, op: str, args: tuple) -> torch.Tensor:
    if op == "slice":
        d, start, end, step = args
        return y[(slice(None),) * d + (slice(start, end, step),)]
    if op == "select":
        return y.select(*args)
    if op == "expand":
        return y.expand(*args)
    return getattr(y, op)(*args)


def _chain(seed: int) -> tuple[torch.Tensor, list[tuple[str, tuple]]]:
    rng = random.Random(seed)
    x = torch.randn([rng.randint(1, 5) for _ in range(rng.randint(1, 4))])
    steps, y = [], x
    for _ in range(rng.randint(1, 6)):
        step = _random_step(y, rng)
        y = _apply(y, *step)
        steps.append(step)
    return x, steps


@pytest.mark.parametrize("seed", range(120))
def test_view_chain_reads_eagers_elements(seed):
    x, steps = _chain(seed)

    def fn(t):
        for step in steps:
            t = _apply(t, *step)
        return t

    expected = fn(x)
    graph = lower_graph(make_fx(fn)(x))
    (got,) = run_ir(graph, [x])
    assert torch.equal(got, expected), steps
    arg = graph.outputs[0]
    if expected.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        assert isinstance(arg, TensorArg) and arg.name == graph.inputs[0].name, steps
        assert not graph.nodes, f"a view was copied: {steps}"
        strided = torch.as_strided(x, arg.size, arg.stride, arg.offset)
        assert torch.equal(strided, expected)
        assert arg.offset == expected.storage_offset()
        assert all(a == b for s, a, b in zip(arg.size, arg.stride, expected.stride()) if s > 1)


def test_reshape_of_a_transpose_reads_through_div_mod():
    x = torch.randn(4, 6)

    def fn(t):
        return t.t().reshape(3, 8)

    graph = lower_graph(make_fx(fn)(x))
    assert torch.equal(run_ir(graph, [x])[0], fn(x))
    assert "//" in str(graph) and "%" in str(graph)
    assert math.prod(graph.outputs[0].size) == 24
