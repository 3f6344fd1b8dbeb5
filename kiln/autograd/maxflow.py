"""Maximum flow / minimum s-t cut by Dinic's algorithm, for the min-cut partitioner.

Input: a directed graph with non-negative capacities (ints, floats, or `math.inf`) between hashable
node keys. Output: the flow value and the source side of a minimum cut (the nodes still reachable
from the source in the residual graph, so the side closest to the source among all minimum cuts).

Both phases are iterative (BFS for levels, an explicit path stack for the blocking flow), so graphs
of any depth run without touching the recursion limit. Dinic's bound, O(V^2 E), does not depend on
the capacities, so the partitioner may use very large integers to order its costs lexicographically.
A path of infinite edges from source to sink gives an infinite flow value; the caller decides
whether that is an error. This module knows nothing about FX graphs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["FlowNetwork", "MaxFlowResult", "max_flow"]

Capacity = int | float


@dataclass(frozen=True)
class MaxFlowResult:
    """`value`: the maximum flow (= the minimum cut's capacity); `source_side`: node keys on the
    source side of a minimum cut; `cut_edges`: the (u, v) pairs from that side to the other."""

    value: Capacity
    source_side: frozenset[Hashable]
    cut_edges: tuple[tuple[Hashable, Hashable], ...]


class FlowNetwork:
    """A residual graph in flat arrays: edge `e` and its reverse `e ^ 1` are stored side by side."""

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._adj: list[list[int]] = []
        self._to: list[int] = []
        self._cap: list[Capacity] = []
        self._orig: list[Capacity] = []

    def add_node(self, key: Hashable) -> int:
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = len(self._keys)
            self._keys.append(key)
            self._adj.append([])
        return idx

    def add_edge(self, u: Hashable, v: Hashable, capacity: Capacity) -> None:
        if not capacity >= 0:
            raise ValueError(f"capacity of edge {u!r} -> {v!r} must be >= 0, got {capacity!r}")
        a, b = self.add_node(u), self.add_node(v)
        for src, dst, cap in ((a, b, capacity), (b, a, 0)):
            self._adj[src].append(len(self._to))
            self._to.append(dst)
            self._cap.append(cap)
            self._orig.append(cap)

    @property
    def num_nodes(self) -> int:
        return len(self._keys)

    @property
    def num_edges(self) -> int:
        return len(self._to) // 2

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self._keys)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if level[v] < 0 and self._cap[e] > 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level if level[t] >= 0 else None

    def _blocking_flow(self, s: int, t: int, level: list[int]) -> Capacity:
        adj, to, cap = self._adj, self._to, self._cap
        ptr = [0] * len(self._keys)
        path: list[int] = []
        total: Capacity = 0
        u = s
        while True:
            if u == t:
                f = min(cap[e] for e in path)
                if f == math.inf:
                    return math.inf
                for e in path:
                    cap[e] -= f
                    cap[e ^ 1] += f
                total += f
                k = next(i for i, e in enumerate(path) if cap[e] == 0)
                del path[k:]
                u = to[path[-1]] if path else s
                continue
            edges, i = adj[u], ptr[u]
            while i < len(edges):
                e = edges[i]
                if cap[e] > 0 and level[to[e]] == level[u] + 1:
                    break
                i += 1
            ptr[u] = i
            if i < len(edges):
                path.append(edges[i])
                u = to[edges[i]]
            elif u == s:
                return total
            else:  # dead end: retreat and skip the edge that led here
                e = path.pop()
                u = to[e ^ 1]
                ptr[u] += 1

    def _reachable(self, s: int) -> set[int]:
        seen = {s}
        stack = [s]
        while stack:
            u = stack.pop()
            for e in self._adj[u]:
                v = self._to[e]
                if v not in seen and self._cap[e] > 0:
                    seen.add(v)
                    stack.append(v)
        return seen

    def solve(self, source: Hashable, sink: Hashable) -> MaxFlowResult:
        s, t = self.add_node(source), self.add_node(sink)
        if s == t:
            raise ValueError("source and sink must differ")
        self._cap = list(self._orig)  # solving twice gives the same answer
        value: Capacity = 0
        while (level := self._levels(s, t)) is not None:
            value += self._blocking_flow(s, t, level)
            if value == math.inf:
                break
        side = self._reachable(s)
        cut = tuple((self._keys[u], self._keys[self._to[e]])
                    for u in sorted(side) for e in self._adj[u]
                    if e % 2 == 0 and self._to[e] not in side)
        return MaxFlowResult(value, frozenset(self._keys[i] for i in side), cut)


def max_flow(edges: list[tuple[Hashable, Hashable, Capacity]], source: Hashable,
             sink: Hashable) -> MaxFlowResult:
    """Maximum flow from `source` to `sink` over `(u, v, capacity)` edges; see `MaxFlowResult`."""
    net = FlowNetwork()
    for u, v, c in edges:
        net.add_edge(u, v, c)
    return net.solve(source, sink)
