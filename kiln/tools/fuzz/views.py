"""Generator ops that make views: one function per view kind, in the table `VIEWS`.

Every view records the root variable whose storage it shares (so in-place writes through it are
known to reach that root) and whether it overlaps itself (an expand: in-place writes raise).
"""
from __future__ import annotations

from kiln.tools.fuzz.state import Builder, Var

__all__ = ["VIEWS", "gen_view"]


def _view_of(b: Builder, x: Var, name: str, shape, contig=False, overlap=None) -> None:
    b.add(name, tuple(shape), x.dtype, contig=contig, root=x.root,
          overlap=x.overlap if overlap is None else overlap)


def _permute(b: Builder, x: Var, name: str) -> bool:
    rank = len(x.shape)
    if rank < 2:
        return False
    perm = list(range(rank))
    if b.rng.random() < 0.5:
        i, j = b.rng.sample(range(rank), 2)
        perm[i], perm[j] = j, i
        b.emit(f"{name} = {x.name}.transpose({i}, {j})")
    else:
        b.rng.shuffle(perm)
        b.emit(f"{name} = {x.name}.permute({', '.join(map(str, perm))})")
    _view_of(b, x, name, [x.shape[p] for p in perm])
    return True


def _expand(b: Builder, x: Var, name: str) -> bool:
    shape = list(x.shape)
    new = [d if d != 1 else b.rng.choice((1, 2, 3)) for d in shape]
    lead = [b.rng.choice((2, 3))] if len(shape) < 3 and b.rng.random() < 0.5 else []
    b.emit(f"{name} = {x.name}.expand({', '.join(map(str, lead + new))})")
    _view_of(b, x, name, lead + new, overlap=x.overlap or lead != [] or new != shape)
    return True


def _slice(b: Builder, x: Var, name: str) -> bool:
    shape, dim = list(x.shape), b.rng.randrange(len(x.shape))
    start, step = b.rng.randrange(max(1, shape[dim] // 2 + 1)), b.rng.choice((1, 1, 2, 3))
    index = ", ".join([":"] * dim + [f"{start}::{step}"])
    shape[dim] = len(range(start, shape[dim], step))
    b.emit(f"{name} = {x.name}[{index}]")
    _view_of(b, x, name, shape)
    return True


def _narrow(b: Builder, x: Var, name: str) -> bool:
    shape, dim = list(x.shape), b.rng.randrange(len(x.shape))
    length = b.rng.randrange(1, shape[dim] + 1)
    start = b.rng.randrange(shape[dim] - length + 1)
    b.emit(f"{name} = {x.name}.narrow({dim}, {start}, {length})")
    shape[dim] = length
    _view_of(b, x, name, shape)
    return True


def _unsqueeze(b: Builder, x: Var, name: str) -> bool:
    shape, dim = list(x.shape), b.rng.randrange(len(x.shape) + 1)
    b.emit(f"{name} = {x.name}.unsqueeze({dim})")
    _view_of(b, x, name, shape[:dim] + [1] + shape[dim:], contig=x.contig)
    return True


def _squeeze(b: Builder, x: Var, name: str) -> bool:
    if 1 not in x.shape:
        return False
    shape = list(x.shape)
    dim = shape.index(1)
    b.emit(f"{name} = {x.name}.squeeze({dim})")
    _view_of(b, x, name, shape[:dim] + shape[dim + 1:], contig=x.contig)
    return True


def _reshape(b: Builder, x: Var, name: str) -> bool:
    shape, rank = list(x.shape), len(x.shape)
    if rank < 2:
        return False
    dim = b.rng.randrange(rank - 1)
    new = shape[:dim] + [shape[dim] * shape[dim + 1]] + shape[dim + 2:]
    choice = b.rng.random()
    if choice < 0.3:
        b.emit(f"{name} = {x.name}.flatten({dim}, {dim + 1})")
    else:  # `.view` only where eager accepts it: known-contiguous tensors
        method = "view" if x.contig and choice < 0.65 else "reshape"
        b.emit(f"{name} = {x.name}.{method}({', '.join(map(str, new))})")
    _view_of(b, x, name, new, contig=x.contig)
    return True


def _select(b: Builder, x: Var, name: str) -> bool:
    dim = b.rng.randrange(len(x.shape))
    index = b.rng.randrange(x.shape[dim])
    b.emit(f"{name} = {x.name}.select({dim}, {index})" if dim else
           f"{name} = {x.name}[{index}]")
    _view_of(b, x, name, x.shape[:dim] + x.shape[dim + 1:], contig=x.contig and dim == 0)
    return True


VIEWS = {"permute": _permute, "expand": _expand, "slice": _slice, "narrow": _narrow,
         "unsqueeze": _unsqueeze, "squeeze": _squeeze, "reshape": _reshape, "select": _select}


def gen_view(b: Builder) -> bool:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    kind = b.rng.choice(tuple(VIEWS))
    if not VIEWS[kind](b, x, b.fresh("v")):
        return False
    b.tags.append(f"view.{kind}")
    return True
