"""mutation: in-place writes on graph inputs, traced the way eager runs them.

Stage 1 (`trace.py`) uses two pieces from here:

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

The runtime writes each new value back into its input after the call, under autograd when the
write carried autograd history (`StandIns.tracked`), so the input's grad_fn is what eager's is.

Never: refuses a write that eager allows.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from kiln.autograd import _compat

__all__ = ["MutationWatch", "StandIns", "is_leaf_write", "mutated_arg_positions"]

_write_args_cache: dict[Any, tuple[int, ...]] = {}


def mutated_arg_positions(op: _compat.OpOverload) -> tuple[int, ...]:
    """Positions of the schema arguments `op` writes to (`Tensor(a!)`)."""
    found = _write_args_cache.get(op)
    if found is None:
        found = tuple(i for i, arg in enumerate(_compat.schema(op).arguments)
                      if arg.alias_info is not None and arg.alias_info.is_write)
        _write_args_cache[op] = found
    return found


class StandIns:
    """What the replayed program receives for each primal (see the module docstring).

    tensors[i]: the primal itself, or its clone (`cloned[i]` is the clone's node in the raw
    graph); `tracked(i)`: after the forward, whether the input's new value carries autograd
    history the program wrote (then it gets a tangent and the runtime writes it back under
    autograd)."""

    def __init__(self, primals: list[torch.Tensor], reals: list[Any]) -> None:
        self.primals = primals
        self.tensors = list(primals)
        self.cloned: dict[int, torch.fx.Node] = {}
        self._first_grad_fn: dict[int, Any] = {}
        self._reals_leaf = [not isinstance(r, torch.Tensor) or r.is_leaf for r in reals]

    def make(self, tracer: Any) -> None:
        """Clone the non-leaf inputs that require grad; call inside the trace (recorded)."""
        for i, primal in enumerate(self.primals):
            if primal.requires_grad and not self._reals_leaf[i]:
                clone = primal.clone()
                self.tensors[i] = clone
                self.cloned[i] = tracer.to_nodes(clone)
                self._first_grad_fn[i] = clone.grad_fn

    def tracked(self, i: int) -> bool:
        t = self.tensors[i]
        return t.requires_grad and t.grad_fn is not self._first_grad_fn.get(i)

    def same_layout(self, i: int) -> bool:
        """The stand-in has the input's sizes and strides (a clone of a dense input does)."""
        t, p = self.tensors[i], self.primals[i]
        return t.shape == p.shape and t.stride() == p.stride()

    def input_offset(self, i: int, offset: int) -> int:
        """A storage offset in the stand-in's storage, as an offset in the input's."""
        return offset - self.tensors[i].storage_offset() + self.primals[i].storage_offset()

    def drop_unwritten(self, placeholders: list[torch.fx.Node], written: set[int]) -> None:
        """Clones of inputs nothing wrote read exactly like the input: use the input."""
        for i, node in self.cloned.items():
            if i not in written:
                node.replace_all_uses_with(placeholders[i])
                node.graph.erase_node(node)


class MutationWatch:
    """Called by the tracer for every op that writes to an argument; notes which inputs change
    and collects the reasons to refuse the graph (reported after the trace, never raised from
    the dispatch handler)."""

    def __init__(self, stand_ins: StandIns) -> None:
        self.storages: dict[Any, list[int]] = {}
        for tensors in (stand_ins.primals, stand_ins.tensors):
            for i, t in enumerate(tensors):
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
