"""kiln.autograd.maxflow: Dinic's max-flow / min-cut against hand-solved graphs and, on random
graphs, against networkx (a test oracle only; kiln does not depend on it)."""

from __future__ import annotations

import math
import random

import pytest

from kiln.autograd.maxflow import FlowNetwork, max_flow


def _cut_capacity(edges, side):
    return sum(c for u, v, c in edges if u in side and v not in side)


def _check_cut(edges, source, sink, result):
    """The returned side is an s-t cut whose capacity equals the flow value."""
    assert source in result.source_side and sink not in result.source_side
    assert _cut_capacity(edges, result.source_side) == pytest.approx(result.value)
    want = {(u, v) for u, v, c in edges if u in result.source_side
            and v not in result.source_side}
    assert set(result.cut_edges) == want


def test_textbook_network():
    # CLRS figure 26.1: maximum flow 23, minimum cut {s, v1, v2, v4}.
    edges = [("s", "v1", 16), ("s", "v2", 13), ("v2", "v1", 4), ("v1", "v3", 12),
             ("v3", "v2", 9), ("v2", "v4", 14), ("v4", "v3", 7), ("v3", "t", 20),
             ("v4", "t", 4)]
    result = max_flow(edges, "s", "t")
    assert result.value == 23
    assert result.source_side == {"s", "v1", "v2", "v4"}
    _check_cut(edges, "s", "t", result)


def test_source_side_is_the_one_nearest_the_source():
    # Two minimum cuts of value 5: after s->a or after a->t; the nearest is {s}.
    result = max_flow([("s", "a", 5), ("a", "t", 5)], "s", "t")
    assert result.value == 5 and result.source_side == {"s"}


def test_disconnected_sink_and_zero_capacities():
    result = max_flow([("s", "a", 3), ("a", "b", 0), ("b", "t", 7), ("c", "t", 1)], "s", "t")
    assert result.value == 0
    assert result.source_side == {"s", "a"}
    assert result.cut_edges == (("a", "b"),)


def test_infinite_edges_and_infinite_flow():
    finite = max_flow([("s", "a", math.inf), ("a", "b", 4), ("b", "t", math.inf),
                       ("s", "b", 1.5)], "s", "t")
    assert finite.value == 5.5 and finite.source_side == {"s", "a"}
    infinite = max_flow([("s", "a", math.inf), ("a", "t", math.inf), ("s", "t", 1)], "s", "t")
    assert infinite.value == math.inf
    assert "t" in infinite.source_side


def test_parallel_edges_and_cycles():
    edges = [("s", "a", 2), ("s", "a", 3), ("a", "b", 10), ("b", "a", 10), ("b", "s", 4),
             ("b", "t", 4), ("a", "t", 0.5)]
    result = max_flow(edges, "s", "t")
    assert result.value == 4.5
    _check_cut(edges, "s", "t", result)


def test_deep_chain_needs_no_recursion():
    n = 50_000
    edges = [(i, i + 1, 10 + (i % 7)) for i in range(n)] + [(0, n, 1)]
    result = max_flow(edges, 0, n)
    assert result.value == 11
    assert result.source_side == {0}


def test_big_integer_capacities_are_exact():
    big = 10**30
    edges = [("s", "a", 3 * big + 1), ("a", "t", 3 * big + 2), ("s", "t", big)]
    assert max_flow(edges, "s", "t").value == 4 * big + 1


def test_solving_twice_gives_the_same_answer():
    net = FlowNetwork()
    for u, v, c in [("s", "a", 2), ("a", "t", 1), ("s", "t", 1)]:
        net.add_edge(u, v, c)
    first, second = net.solve("s", "t"), net.solve("s", "t")
    assert first == second and first.value == 2
    assert net.num_nodes == 3 and net.num_edges == 3


def test_bad_arguments():
    net = FlowNetwork()
    with pytest.raises(ValueError, match="capacity of edge 'a' -> 'b' must be >= 0"):
        net.add_edge("a", "b", -1)
    with pytest.raises(ValueError, match="source and sink must differ"):
        max_flow([("a", "b", 1)], "a", "a")


def _random_graph(rng: random.Random, n: int, m: int, floats: bool):
    edges = []
    for _ in range(m):
        u, v = rng.randrange(n), rng.randrange(n)
        if u == v:
            continue
        cap = round(rng.uniform(0, 10), 3) if floats else rng.randint(0, 20)
        edges.append((u, v, cap))
    return edges


def _networkx_min_source_side(nx, edges, s, t):
    """networkx's flow value and the source side nearest s (reachable in the residual)."""
    g = nx.DiGraph()
    g.add_nodes_from([s, t])
    for u, v, c in edges:  # networkx has no parallel edges in a DiGraph: merge them
        old = g.get_edge_data(u, v, {"capacity": 0})["capacity"]
        g.add_edge(u, v, capacity=old + c)
    residual = nx.algorithms.flow.edmonds_karp(g, s, t)
    value = residual.graph["flow_value"]
    seen, stack = {s}, [s]
    while stack:
        u = stack.pop()
        for v, attr in residual[u].items():
            if v not in seen and attr["capacity"] - attr["flow"] > 1e-9:
                seen.add(v)
                stack.append(v)
    return value, seen


@pytest.mark.parametrize("floats", [False, True], ids=["int", "float"])
def test_random_graphs_match_networkx(floats):
    nx = pytest.importorskip("networkx")
    rng = random.Random(1234 + floats)
    for trial in range(150):
        n = rng.randint(2, 40)
        edges = _random_graph(rng, n, rng.randint(0, 6 * n), floats)
        s, t = 0, n - 1
        result = max_flow(edges, s, t) if edges else None
        if result is None:
            continue
        value, side = _networkx_min_source_side(nx, edges, s, t)
        assert result.value == pytest.approx(value, abs=1e-6), f"trial {trial}"
        _check_cut(edges, s, t, result)
        if not floats:  # float round-off may leave a near-zero residual; ints are exact
            assert result.source_side == side, f"trial {trial}"


def test_layered_dag_like_a_partition_graph_matches_networkx():
    # The partitioner's shape: split nodes with big weights, infinite data edges.
    nx = pytest.importorskip("networkx")
    rng = random.Random(7)
    n = 300
    edges = []
    for i in range(n):
        edges.append((("n", i, "in"), ("n", i, "out"), rng.randint(1, 10**12)))
        for _ in range(2):
            j = rng.randrange(i + 1, n + 1)
            target = "sink" if j == n else ("n", j, "in")
            edges.append((("n", i, "out"), target, math.inf))
        if rng.random() < 0.1:
            edges.append(("source", ("n", i, "in"), math.inf))
    result = max_flow(edges, "source", "sink")
    finite = [(u, v, 10**15 if c == math.inf else c) for u, v, c in edges]
    value, side = _networkx_min_source_side(nx, finite, "source", "sink")
    assert result.value == value > 0
    assert result.source_side == side
