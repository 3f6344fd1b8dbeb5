"""mutation: in-place writes on graph inputs, traced the way eager runs them.

Stage 1 (`trace.py`) uses three pieces from here:

- `StandIns`: the tensors the replayed program sees for its inputs. An input that requires grad
  and is not a leaf (a tensor computed before a graph break) is replaced by a clone made inside
  the trace, so the program may write into it as eager allows on a non-leaf, while
  autograd.grad still differentiates with respect to the value the input had before the write
  (AOTAutograd's clone of mutated inputs that require grad). Clones of inputs nothing writes are
  taken out of the raw graph again. A leaf that requires grad is traced as the leaf: a write
  into it under grad mode raises eager's own error (`is_leaf_write`), and the graph runs
  eagerly, where eager raises it.
- `MutationWatch`: called by the tracer for every op that writes to an argument; notes which
  inputs change and collects the reasons to refuse (custom ops, shape or stride changes).
- `SyntheticBase`: inputs that share one storage (a tensor and its view, both passed to the
  graph after a graph break), one of them written. Functionalization would see unrelated
  tensors, so the group is traced again through one extra input, a 1-D view of the storage they
  share; inside the graph each member is an as_strided view of it, so a write through one is
  read through the others, and the new value of the base is what the runtime writes back
  (AOTAutograd's synthetic base). Members must not require grad and must share a dtype.

The runtime writes each new value back into its input after the call, under autograd when the
write carried autograd history (`StandIns.tracked`), so the input's grad_fn is what eager's is.

Never: refuses a write that eager allows.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx

from kiln.autograd import _compat

__all__ = ["MutationWatch", "StandIns", "SyntheticBase", "alias_groups", "is_leaf_write",
           "layout_keeping_clone", "mutated_arg_positions"]

_write_args_cache: dict[Any, tuple[int, ...]] = {}


def mutated_arg_positions(op: _compat.OpOverload) -> tuple[int, ...]:
    """Positions of the schema arguments `op` writes to (`Tensor(a!)`)."""
    found = _write_args_cache.get(op)
    if found is None:
        found = tuple(i for i, arg in enumerate(_compat.schema(op).arguments)
                      if arg.alias_info is not None and arg.alias_info.is_write)
        _write_args_cache[op] = found
    return found


@dataclasses.dataclass(frozen=True)
class SyntheticBase:
    """Primal `index` is the memory the inputs `members` share: their storage as a 1-D tensor of
    `size` elements from storage offset `offset`. `layouts[k]`: (shape, stride, storage offset)
    of member k when traced; the runtime checks the call's members against them."""

    index: int
    members: tuple[int, ...]
    offset: int
    size: int
    layouts: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]

    @classmethod
    def of(cls, index: int, members: tuple[int, ...], reals: list) -> SyntheticBase:
        layouts = tuple((tuple(reals[m].shape), tuple(reals[m].stride()),
                         reals[m].storage_offset()) for m in members)
        low = min(offset for _, _, offset in layouts)
        high = max(_end(*layout) for layout in layouts)
        return cls(index, members, low, max(high - low, 0), layouts)

    def build(self, args: list) -> torch.Tensor | None:
        """The base for this call's members, or None when they do not alias as traced."""
        first = args[self.members[0]]
        key = _compat.storage_key(first)
        for m, layout in zip(self.members, self.layouts):
            t = args[m]
            if _compat.storage_key(t) != key or t.dtype != first.dtype or \
                    (tuple(t.shape), tuple(t.stride()), t.storage_offset()) != layout:
                return None
        return first.as_strided((self.size,), (1,), self.offset)

    def member_view(self, base: torch.Tensor, k: int) -> torch.Tensor:
        """Member k as a view of the (traced) base."""
        shape, stride, offset = self.layouts[k]
        return base.as_strided(shape, stride, offset - self.offset + base.storage_offset())


def _end(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> int:
    if any(size == 0 for size in shape):
        return offset
    return offset + sum((size - 1) * step for size, step in zip(shape, stride)) + 1


def alias_groups(reals: list, written: set[int]) -> tuple[list[tuple[int, ...]], str | None]:
    """The groups of inputs that share a storage and of which one is written; or a reason to
    refuse (a member requires grad, or the members differ in dtype)."""
    by_storage: dict[Any, list[int]] = {}
    for i, real in enumerate(reals):
        if isinstance(real, torch.Tensor):  # not an int argument
            by_storage.setdefault(_compat.storage_key(real), []).append(i)
    groups = [tuple(g) for g in by_storage.values() if len(g) > 1 and written & set(g)]
    for group in groups:
        first = next(i for i in group if i in written)
        other = next(i for i in group if i != first)
        if any(reals[i].requires_grad for i in group) or \
                len({reals[i].dtype for i in group}) > 1:
            return [], (f"input primals_{first} is mutated in place and shares memory with "
                        f"input primals_{other}")
    return groups, None


class StandIns:
    """What the replayed program receives for each primal (see the module docstring).

    tensors[i]: the primal itself, or its clone (`cloned[i]` is the clone's node in the raw
    graph); `tracked(i)`: after the forward, whether the input's new value carries autograd
    history the program wrote (then it gets a tangent and the runtime writes it back under
    autograd)."""

    def __init__(self, primals: list[torch.Tensor], reals: list[Any],
                 bases: tuple[SyntheticBase, ...] = ()) -> None:
        self.primals = primals
        self.tensors = list(primals)
        self.cloned: dict[int, torch.fx.Node] = {}
        self.bases = bases
        self.members = {m for base in bases for m in base.members}
        self._first_grad_fn: dict[int, Any] = {}
        self._reals_leaf = [not isinstance(r, torch.Tensor) or r.is_leaf for r in reals]

    def make(self, tracer: Any, training: bool) -> None:
        """Members of synthetic bases become views of their base; for training, non-leaf inputs
        that require grad are cloned. Call inside the trace (recorded)."""
        for base in self.bases:
            for k, m in enumerate(base.members):
                self.tensors[m] = base.member_view(self.primals[base.index], k)
        for i, primal in enumerate(self.primals):
            if training and isinstance(primal, torch.Tensor) and primal.requires_grad and \
                    not self._reals_leaf[i]:
                # dense, not `layout_keeping_clone`: the kiln backend's saved stand-in of a
                # gapped layout came out dense while its backward read it at the gaps' strides
                # (fuzz --grad seed 3701256); a view of such an input is refused instead
                clone = primal.clone()
                self.tensors[i] = clone
                self.cloned[i] = tracer.to_nodes(clone)
                self._first_grad_fn[i] = clone.grad_fn

    def tracked(self, i: int) -> bool:
        t = self.tensors[i]
        return isinstance(t, torch.Tensor) and t.requires_grad and \
            t.grad_fn is not self._first_grad_fn.get(i)

    def same_layout(self, i: int) -> bool:
        """The stand-in has the input's sizes and strides (a clone of a dense input does)."""
        t, p = self.tensors[i], self.primals[i]
        return all(_compat.known_equal(a, b) for a, b in
                   ((t.dim(), p.dim()), *zip(t.shape, p.shape), *zip(t.stride(), p.stride())))

    def input_offset(self, i: int, offset: int) -> int:
        """A storage offset in the stand-in's storage, as an offset in the input's."""
        return offset - self.tensors[i].storage_offset() + self.primals[i].storage_offset()

    def drop_unwritten(self, placeholders: list[torch.fx.Node], written: set[int]) -> None:
        """Clones of inputs nothing wrote read exactly like the input: use the input."""
        for i, node in self.cloned.items():
            if i not in written:
                node.replace_all_uses_with(placeholders[i])
                node.graph.erase_node(node)


def layout_keeping_clone(t: torch.Tensor) -> torch.Tensor:
    """A clone of a real tensor with `t`'s sizes and strides: `clone()` keeps a dense layout,
    and a strided one with gaps (`x[:, ::2]`) is allocated as it is and copied into. The
    forward's saved copy of a written input is one: the backward was compiled to read it at the
    input's strides (fuzz --grad seed 3602079: a dense copy of `x[..., ::2]` read at stride 2,
    past its end). An overlapping layout (an expand) keeps `clone()`'s dense one: eager cannot
    write it."""
    clone = t.clone()
    kept = all(_compat.known_equal(a, b) for a, b in zip(clone.stride(), t.stride()))
    if kept or any(_compat.known_equal(stride, 0) for stride in t.stride()):
        return clone
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


class MutationWatch:
    """Called by the tracer for every op that writes to an argument; notes which inputs change
    and collects the reasons to refuse the graph (reported after the trace, never raised from
    the dispatch handler)."""

    def __init__(self, stand_ins: StandIns) -> None:
        self.storages: dict[Any, list[int]] = {}
        for tensors in (stand_ins.primals, stand_ins.tensors):
            for i, t in enumerate(tensors):
                if not isinstance(t, torch.Tensor):  # an int argument: no memory
                    continue
                hits = self.storages.setdefault(_compat.storage_key(t), [])
                if i not in hits:
                    hits.append(i)
        self.mutated: set[int] = set()
        self.refusals: list[str] = []

    def __call__(self, op: _compat.OpOverload, bound: list) -> None:
        for position in mutated_arg_positions(op):
            target = bound[position]
            if not isinstance(target, torch.Tensor):
                continue
            hit = self.storages.get(_compat.storage_key(target), [])
            if not hit:
                continue
            self.mutated.update(hit)
            if op.namespace not in ("aten", "prims"):
                self.refuse(f"custom op {op} mutates input primals_{hit[0]}")
            elif torch.Tag.inplace_view in op.tags or _compat.schema(op).name in (
                    "aten::set_", "aten::resize_"):
                self.refuse(f"{op} changes the shape or strides of input primals_{hit[0]}")

    def refuse(self, reason: str) -> None:
        if reason not in self.refusals:
            self.refusals.append(reason)


def is_leaf_write(err: BaseException) -> bool:
    """Autograd's error for an in-place write into a leaf that requires grad (or a view of one)
    under grad mode: eager raises it too, so the graph runs eagerly and raises it there."""
    return isinstance(err, RuntimeError) and \
        "Variable that requires grad is being used in an in-place operation" in str(err)
