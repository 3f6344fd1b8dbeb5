"""Where to cut a graph captured under DDP so each piece's parameters fill about one bucket.

DDP's reducer puts parameters in buckets in the order their gradients become ready, and a
gradient is ready when the backward of the earliest piece using its parameter has run. So the
walk goes from the graph's end to its start, counting each parameter's bytes at its first use,
and closes a piece once its bytes reach the cap (`first_cap` for the first bucket filled, the
one the backward finishes first: DDP keeps it small so communication starts early).

Only the plan lives here (plain FX, no DDP): `ddp_split` finds the parameters and cuts.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx

__all__ = ["Piece", "plan_pieces"]


@dataclasses.dataclass
class Piece:
    """A run of consecutive graph nodes, and the parameters first used in it."""

    nodes: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    params: list[torch.fx.Node] = dataclasses.field(default_factory=list)
    nbytes: int = 0


def plan_pieces(graph: torch.fx.Graph, param_bytes: dict[torch.fx.Node, int],
                first_cap: int, cap: int) -> list[Piece]:
    """The pieces of `graph`, in forward order. `param_bytes`: the placeholders that are
    parameters DDP reduces, with their bytes. One piece means: do not split."""
    body = [n for n in graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    at = _first_uses(body, param_bytes)
    unsafe = _unsafe_cuts(body)
    pieces = [Piece()]  # pieces[0]: the one being filled, the earliest so far
    for i in reversed(range(len(body))):
        piece = pieces[0]
        piece.nodes.insert(0, body[i])
        first_used = at.get(body[i], [])
        piece.params[:0] = first_used
        piece.nbytes += sum(param_bytes[p] for p in first_used)
        full = piece.nbytes >= (first_cap if len(pieces) == 1 else cap)
        if full and i > 0 and i not in unsafe:
            pieces.insert(0, Piece())
    return _merge_empty(pieces)


def _first_uses(body: list[torch.fx.Node], param_bytes: dict[torch.fx.Node, int]
                ) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Per node, the parameters it is the first user of (where their gradient completes)."""
    seen: set[torch.fx.Node] = set()
    at: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in body:
        for inp in node.all_input_nodes:
            if inp in param_bytes and inp not in seen:
                seen.add(inp)
                at.setdefault(node, []).append(inp)
    return at


def _unsafe_cuts(body: list[torch.fx.Node]) -> set[int]:
    """Positions i where cutting before body[i] would pass a value that is not a tensor
    (a tuple before its getitems, a size) from one piece to the next: the autograd stage takes
    tensors only, and would run such a piece eagerly."""
    index = {n: i for i, n in enumerate(body)}
    unsafe: set[int] = set()
    for j, node in enumerate(body):
        if isinstance(node.meta.get("val"), torch.Tensor) or not node.users:
            continue
        last = max(index.get(user, len(body)) for user in node.users)
        unsafe.update(range(j + 1, last + 1))
    return unsafe


def _merge_empty(pieces: list[Piece]) -> list[Piece]:
    """A first piece with no parameters (ops before any parameter is used) joins the next:
    as a piece of its own it would only add a call."""
    if not pieces[0].nodes:
        pieces.pop(0)
    if len(pieces) > 1 and pieces[0].nbytes == 0:
        first = pieces.pop(0)
        pieces[0].nodes[:0] = first.nodes
    return pieces
