"""fusion: greedy, score-ordered grouping of computed buffers into kernels.

Every `ComputedBuffer` starts as its own group; externs are fixed steps. Candidate pairs are
groups that touch a common buffer (a producer and its consumer, or two readers of one buffer),
scored by the bytes fusing them saves (a load, plus a store when nothing else reads the
producer; or one read of a shared buffer). Pairs are tried best first, in rounds until nothing
changes; a pair fuses when `check` finds it legal:

- iteration spaces agree: equal `numel` (pointwise), equal `(numel, rnumel)` (reductions), or a
  pointwise over `numel × rnumel` joining a reduction as prologue/epilogue (residual add +
  LayerNorm's mean, var and normalize; softmax's max, sum and normalize), or a pointwise over
  `numel` joining one (a value per reduced row: the mean and rstd a training LayerNorm saves);
- every read of one member by another, mapped through `group_index`, equals the producer's
  write (a reduction result read broadcast along r qualifies), or reads a pointwise producer at
  its row's first element (the shifted-mean pivot; codegen recomputes the producer there);
- no dependency path between them runs through another step (that would be a cycle, and when
  the step is an extern, a fusion across a library call);
- the peak of live memory does not grow (steps are ordered by a stable topological sort);
- at most `MAX_GROUP_NODES` members.

Every pair of neighbouring buffers (consecutive in the graph, or producer and consumer) gets a
`FusionDecision` saying why it was fused or not.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable

from kiln.lower.index import size_hint
from kiln.lower.deps import DepsCollector, ReadWrites
from kiln.lower.ir import ComputedBuffer, ExternKernel, IRGraph, TensorArg, loop_vars
from kiln.lower.ops import use_handler
from kiln.schedule.plan import FusedGroup, FusionDecision, group_index, row_start, spans_x_only
from kiln.schedule.graph_edit import node_deps

__all__ = ["MAX_GROUP_NODES", "fuse_nodes", "reduction_passes"]

MAX_GROUP_NODES = 64
MAX_SHARED_READERS = 16   # readers of one buffer considered pairwise for horizontal fusion
MAX_ROUNDS = 10


class _Unit:
    """A group under construction (`members`) or an extern step (`extern`)."""

    def __init__(self, key: int, members: list[ComputedBuffer] | None = None,
                 extern: ExternKernel | None = None) -> None:
        self.key = key
        self.members = members or []
        self.extern = extern
        if extern is not None:
            self.reads = {a.name for a in extern.tensor_args()}
            self.writes = {o.name for o in extern.output_buffers()}
        else:
            node = self.members[0]
            self.reads = set(node_deps(node).read_names) - {node.name}
            self.writes = {node.name}

    @property
    def is_group(self) -> bool:
        return self.extern is None

    def space(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(x_ranges, r_ranges) of the group: the first reduction member's, else the first
        member's."""
        for node in self.members:
            if node.is_reduction:
                return tuple(node.data.ranges), tuple(node.data.reduction_ranges)
        return tuple(self.members[0].data.ranges), ()

    def label(self) -> str:
        if self.extern is not None:
            return f"an extern ({self.extern.kind} {self.extern.name})"
        return self.members[0].name


def _render_space(space: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    x, r = space
    text = f"[{math.prod(x)}]"
    return text + f"×[{math.prod(r)}]" if r else text


def _merged_space(a: _Unit, b: _Unit) -> tuple | None:
    (ax, ar), (bx, br) = a.space(), b.space()
    an, bn = math.prod(ax), math.prod(bx)
    if not ar and not br:
        return (ax, ()) if an == bn else None
    if ar and br:
        return (ax, ar) if (an, math.prod(ar)) == (bn, math.prod(br)) else None
    (rx, rr), pn = ((ax, ar), bn) if ar else ((bx, br), an)
    # a pointwise over x × r (prologue/epilogue), or over x only (`spans_x_only`: one value per
    # reduced row, e.g. a LayerNorm's mean or rstd output)
    return (rx, rr) if pn in (math.prod(rx) * math.prod(rr), math.prod(rx)) else None


def group_deps(node: ComputedBuffer, x_ranges: tuple, r_ranges: tuple,
               cache: dict | None = None) -> ReadWrites:
    """`read_writes` of `node` with its loop variables expressed in the group's."""
    data = node.data
    own = (tuple(data.ranges), tuple(data.reduction_ranges) if node.is_reduction else ())
    if own == (x_ranges, r_ranges):
        return node_deps(node)   # the group's variables are the node's own
    _deps_cache = {} if cache is None else cache
    key = (node.name, x_ranges, r_ranges)
    if key not in _deps_cache:
        xv, rv = loop_vars(x_ranges, "x"), loop_vars(r_ranges, "r")
        index, rindex = group_index(node, xv, rv, x_ranges, r_ranges)
        collector = DepsCollector()
        with use_handler(collector):
            node.body(index, rindex)
        _deps_cache[key] = ReadWrites(tuple(dict.fromkeys(collector.reads)),
                                      tuple(dict.fromkeys(collector.writes)),
                                      collector.ops, collector.indirect > 0)
    return _deps_cache[key]


def _index_mismatch(members: list[ComputedBuffer], space: tuple, cache: dict) -> str | None:
    """Why some member cannot read another member's value in registers, or None."""
    writes = {}
    by_name = {n.name: n for n in members}
    for node in members:
        deps = group_deps(node, *space, cache)
        writes[node.name] = deps.writes[0].index
    for node in members:
        for dep in group_deps(node, *space, cache).reads:
            if dep.name in writes and dep.name != node.name and dep.index != writes[dep.name]:
                if _reads_row_start(by_name[dep.name], dep.index, writes[dep.name], space):
                    continue
                how = "transposed" if _is_transposed(node, by_name[dep.name]) else \
                    f"at a different index ({dep.index} vs written {writes[dep.name]})"
                return f"{node.name} reads {dep.name} {how}"
    return None


def _reads_row_start(producer: ComputedBuffer, index, written, space: tuple) -> bool:
    """A read of a pointwise x × r member at its row's first element (a LayerNorm's or
    variance's shifted-mean pivot): codegen recomputes the producer there from its inputs
    (`group._Emitter.resolve_load`), so the residual add + LayerNorm of a pre-norm block stays
    one kernel even where the residual is realized."""
    if producer.is_reduction or spans_x_only(producer, *space):
        return False
    return bool(space[1]) and index != written and index == row_start(written)


def _is_transposed(consumer: ComputedBuffer, producer: ComputedBuffer) -> bool:
    """True when the consumer reads the producer's elements through a permutation of its own
    loop variables (other than the identity)."""
    from kiln.schedule.graph_edit import invert_layout

    own = consumer.loop_vars()[0]
    for dep in node_deps(consumer).reads:
        if dep.name != producer.name:
            continue
        logical = invert_layout(producer.layout, dep.index)
        if logical is None:
            return False
        used = [e for e, size in zip(logical, producer.layout.size) if size != 1]
        wanted = [v for v in own if not v.is_constant]
        if sorted(map(str, used)) == sorted(map(str, wanted)) and \
                [str(e) for e in used] != [str(v) for v in wanted]:
            return True
    return False


class Fuser:
    """The greedy fusion state over one graph."""

    def __init__(self, graph: IRGraph, observed: set[str]) -> None:
        self.graph = graph
        self.observed = observed
        self._deps: dict = {}
        self._positions = {n.name: i for i, n in enumerate(graph.nodes)
                           if isinstance(n, ComputedBuffer)}
        self.units: list[_Unit] = []
        for i, node in enumerate(graph.nodes):
            unit = _Unit(i, [node]) if isinstance(node, ComputedBuffer) else _Unit(i, extern=node)
            self.units.append(unit)
        self.owner = {w: u for u in self.units for w in u.writes}
        self.readers: dict[str, set[_Unit]] = {}
        for unit in self.units:
            for name in unit.reads:
                self.readers.setdefault(name, set()).add(unit)

    # -- structure ---------------------------------------------------------------------------

    def successors(self, unit: _Unit) -> set[_Unit]:
        out: set[_Unit] = set()
        for name in unit.writes:
            out |= self.readers.get(name, set())
        out.discard(unit)
        return out

    def predecessors(self, unit: _Unit) -> set[_Unit]:
        return {self.owner[n] for n in unit.reads if n in self.owner} - {unit}

    def order(self) -> list[_Unit]:
        """Stable topological order (Kahn's algorithm, earliest original position first)."""
        indeg = {u: len(self.predecessors(u)) for u in self.units}
        heap = [(u.key, id(u), u) for u in self.units if indeg[u] == 0]
        heapq.heapify(heap)
        out: list[_Unit] = []
        while heap:
            _, _, unit = heapq.heappop(heap)
            out.append(unit)
            for succ in self.successors(unit):
                indeg[succ] -= 1
                if indeg[succ] == 0:
                    heapq.heappush(heap, (succ.key, id(succ), succ))
        if len(out) != len(self.units):
            raise RuntimeError("schedule: fusion produced a dependency cycle")
        return out

    def stores(self, unit: _Unit) -> list[str]:
        """Member buffers that must reach memory: read by another step, or observed."""
        return [n.name for n in unit.members
                if n.name in self.observed or self.readers.get(n.name, set()) - {unit}]

    def peak(self) -> int:
        order = self.order()
        last: dict[str, int] = {}
        for step, unit in enumerate(order):
            for name in unit.reads:
                last[name] = step
        live = peak = 0
        frees: dict[int, int] = {}
        for step, unit in enumerate(order):
            outs = unit.writes if not unit.is_group else self.stores(unit)
            for name in outs:
                size = _bytes(self.graph, name)
                live += size
                if name not in self.observed:
                    frees[last.get(name, step)] = frees.get(last.get(name, step), 0) + size
            peak = max(peak, live)
            live -= frees.pop(step, 0)
        return peak

    # -- legality ----------------------------------------------------------------------------

    def path_through(self, start: _Unit, goal: _Unit) -> _Unit | None:
        """A step other than both on some dependency path start → goal, or None."""
        stack = [(s, s) for s in self._ordered_successors(start) if s is not goal]
        seen = {start}
        best: _Unit | None = None
        while stack:
            unit, first = stack.pop()
            if unit in seen:
                continue
            seen.add(unit)
            if goal in self.successors(unit):
                if first.extern is not None or unit.extern is not None:
                    return first if first.extern is not None else unit
                best = best or first
            stack += [(s, first) for s in self._ordered_successors(unit) if s is not goal]
        return best

    def _ordered_successors(self, unit: _Unit) -> list[_Unit]:
        # by position, not set order (ids): the step a reason names is the same in every run
        return sorted(self.successors(unit), key=lambda u: u.key)

    def check(self, a: _Unit, b: _Unit) -> str | None:
        """None when a and b may fuse, else the reason they may not."""
        if len(a.members) + len(b.members) > MAX_GROUP_NODES:
            return f"the group would exceed {MAX_GROUP_NODES} nodes"
        space = _merged_space(a, b)
        if space is None:
            return (f"different iteration space: {_render_space(a.space())} vs "
                    f"{_render_space(b.space())}")
        for first, second in ((a, b), (b, a)):
            via = self.path_through(first, second)
            if via is not None:
                if via.extern is not None:
                    shared = sorted(first.writes & via.reads) or sorted(first.writes)
                    return f"{via.label()} depends on {shared[0]}"
                return f"would create a cycle through {via.label()}"
        members = sorted(a.members + b.members, key=self.position)
        mismatch = _index_mismatch(members, space, self._deps)
        if mismatch is not None:
            return mismatch
        return self._memory_reason(a, b)

    def _memory_reason(self, a: _Unit, b: _Unit) -> str | None:
        order = self.order()
        if abs(order.index(a) - order.index(b)) == 1:
            return None
        before = self.peak()
        undo = self.merge(a, b)
        after = self.peak()
        undo()
        if after > before:
            return f"would grow peak memory ({before} -> {after} bytes)"
        return None

    def position(self, node: ComputedBuffer) -> int:
        return self._positions[node.name]

    # -- merging -----------------------------------------------------------------------------

    def merge(self, a: _Unit, b: _Unit) -> Callable[[], None]:
        """Fold b into a; returns a function that undoes it."""
        saved = (list(a.members), set(a.reads), set(a.writes), a.key, list(self.units))
        touched = {n: set(self.readers.get(n, set())) for n in a.reads | b.reads}
        a.members = sorted(a.members + b.members, key=self.position)
        a.writes = a.writes | b.writes
        a.reads = (a.reads | b.reads) - a.writes
        a.key = min(a.key, b.key)
        self.units.remove(b)
        for name in b.writes:
            self.owner[name] = a
        for name in b.reads:
            self.readers[name].discard(b)
            if name not in a.writes:
                self.readers[name].add(a)
        for name in a.writes & touched.keys():
            self.readers[name].discard(a)

        def undo() -> None:
            a.members, a.reads, a.writes, a.key, self.units = saved
            for name in b.writes:
                self.owner[name] = b
            for name, users in touched.items():
                self.readers[name] = users

        return undo

    # -- the greedy loop ---------------------------------------------------------------------

    def candidates(self) -> list[tuple[int, _Unit, _Unit]]:
        scored: dict[tuple[int, int], list] = {}
        for name, users in self.readers.items():
            groups = sorted((u for u in users if u.is_group), key=lambda u: u.key)
            writer = self.owner.get(name)
            size = _bytes(self.graph, name)
            pairs: list[tuple[_Unit, _Unit, int]] = []
            if writer is not None and writer.is_group:
                alone = name not in self.observed and len(users) == 1
                pairs += [(writer, g, size * (2 if alone else 1)) for g in groups]
            shared = groups[:MAX_SHARED_READERS]
            pairs += [(g, h, size) for i, g in enumerate(shared) for h in shared[i + 1:]]
            for g, h, gain in pairs:
                key = (id(g), id(h)) if g.key <= h.key else (id(h), id(g))
                entry = scored.setdefault(key, [0, g, h])
                entry[0] += gain
        return sorted(((s, g, h) for s, g, h in scored.values()),
                      key=lambda t: (-t[0], min(t[1].key, t[2].key)))

    def run(self) -> None:
        for _ in range(MAX_ROUNDS):
            fused = False
            for _, g, h in self.candidates():
                g, h = self.owner[next(iter(g.writes))], self.owner[next(iter(h.writes))]
                if g is h:
                    continue
                a, b = (g, h) if g.key <= h.key else (h, g)
                if self.check(a, b) is None:
                    self.merge(a, b)
                    fused = True
            if not fused:
                return


def _bytes(graph: IRGraph, name: str) -> int:
    buf = graph.buffers.get(name)
    if buf is None:
        return 0
    # a heuristic (peak memory): symbolic sizes count at the example's sizes
    return size_hint(buf.layout.storage_size()) * buf.layout.dtype.itemsize


def observed_buffers(graph: IRGraph) -> set[str]:
    """Buffers whose storage outlives the graph: outputs' and mutations' bases."""
    found = {o.name for o in graph.outputs if isinstance(o, TensorArg)}
    found |= {arg.name for _, arg in graph.mutations}
    return found


def fuse_nodes(graph: IRGraph, fuse: bool = True) -> tuple[list, list[FusionDecision]]:
    """(steps, decisions): `FusedGroup`s and externs in execution order, and a decision for
    every neighbouring pair of computed buffers."""
    fuser = Fuser(graph, observed_buffers(graph))
    if fuse:
        fuser.run()
    steps: list = []
    for unit in fuser.order():
        if unit.extern is not None:
            steps.append(unit.extern)
            continue
        x_ranges, r_ranges = unit.space()
        steps.append(FusedGroup(f"group{len(steps)}", list(unit.members), x_ranges, r_ranges,
                                tuple(fuser.stores(unit))))
    return steps, _decisions(graph, fuser, fuse)


def _neighbour_pairs(graph: IRGraph) -> Iterable[tuple[ComputedBuffer, ComputedBuffer]]:
    computed = [n for n in graph.nodes if isinstance(n, ComputedBuffer)]
    seen: set[tuple[str, str]] = set()
    position = {n.name: i for i, n in enumerate(computed)}
    pairs = list(zip(computed, computed[1:]))
    for node in computed:
        for name in node_deps(node).read_names:
            if name in position and name != node.name:
                pairs.append((computed[position[name]], node))
    for a, b in pairs:
        if (a.name, b.name) not in seen:
            seen.add((a.name, b.name))
            yield a, b


def _decisions(graph: IRGraph, fuser: Fuser, fuse: bool) -> list[FusionDecision]:
    out = []
    for a, b in _neighbour_pairs(graph):
        ga, gb = fuser.owner[a.name], fuser.owner[b.name]
        if ga is gb:
            how = "vertical" if a.name in node_deps(b).read_names else "horizontal"
            out.append(FusionDecision(a.name, b.name, True, f"fused ({how})"))
            continue
        first, second = (ga, gb) if ga.key <= gb.key else (gb, ga)
        reason = "fusion disabled" if not fuse else fuser.check(first, second)
        if reason is None:
            reason = "nothing shared to save (no common buffer)"
        out.append(FusionDecision(a.name, b.name, False, reason))
    return out


def reduction_passes(group: FusedGroup) -> list[list[ComputedBuffer]]:
    """The members of a reduction group split into passes over r: a member that reads a
    reduction finished in this group (directly or through another member) runs in a later
    pass. One pass: a plain (looped or persistent) reduction; more: the kernel must keep the
    row in registers (persistent) or loop over r once per pass."""
    level: dict[str, int] = {}
    names = {n.name for n in group.nodes}
    passes: list[list[ComputedBuffer]] = []
    for node in group.nodes:
        deps = [d for d in node_deps(node).read_names if d in names and d != node.name]
        lvl = 0
        for d in deps:
            src = next(n for n in group.nodes if n.name == d)
            lvl = max(lvl, level[d] + (1 if src.is_reduction else 0))
        level[node.name] = lvl
        while len(passes) <= lvl:
            passes.append([])
        passes[lvl].append(node)
    return passes
