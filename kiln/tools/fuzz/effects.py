"""Generator ops with effects or control flow: in-place writes, graph breaks, branches on tensor
values, Python loops and containers.

In-place writes target inputs, views of inputs and intermediates alike, because kiln must
reproduce every write a caller can observe (an input's post-call value, an alias's value).
"""
from __future__ import annotations

import torch

from kiln.tools.fuzz.state import Builder, Var, broadcast, promote

__all__ = ["gen_branch", "gen_break", "gen_container", "gen_inplace", "gen_loop", "gen_setitem"]


def _can_write(dst: Var, src_dtype: str) -> bool:
    return torch.can_cast(getattr(torch, promote(dst.dtype, src_dtype)), getattr(torch, dst.dtype))


# A source that shares memory with the written tensor is left out: eager's result then depends
# on its loop order (or it raises "some elements ... refer to a single memory location"), which
# no compiler is bound to reproduce.


def _writable(b: Builder) -> Var | None:
    return b.pick(lambda v: not v.overlap and len(v.shape) >= 1)


def gen_inplace(b: Builder) -> bool:
    dst = _writable(b)
    if dst is None:
        return False
    kind = b.rng.choice(("add_", "mul_", "copy_", "clamp_", "index_put_"))
    src = b.pick(lambda v: broadcast(v.shape, dst.shape) == dst.shape and v.root != dst.root,
                 recent=False)
    fits = src is not None and (kind == "copy_" or _can_write(dst, src.dtype))
    if kind in ("add_", "copy_") and fits:
        b.emit(f"{dst.name}.{kind}({src.name})")
    elif kind == "clamp_" and dst.dtype != "bool":
        b.emit(f"{dst.name}.clamp_(-1, 1)")
    elif kind in ("add_", "copy_", "clamp_") and dst.dtype != "bool":
        kind = "mul_"
        b.emit(f"{dst.name}.mul_({'0.5' if dst.is_float else '2'})")
    elif kind == "index_put_":
        rows = sorted({b.rng.randrange(dst.shape[0]) for _ in range(2)})
        value = "0.5" if dst.is_float else "1"
        acc = b.rng.random() < 0.3 and dst.dtype != "bool"
        b.emit(f"{dst.name}.index_put_((torch.tensor({rows}, device={dst.name}.device),), "
               f"torch.tensor({value}, dtype={dst.name}.dtype, device={dst.name}.device)"
               f"{', accumulate=True' if acc else ''})")
    else:
        return False
    b.tags.append(f"inplace.{kind}" + (".input" if dst.root.startswith("x") else ""))
    return True


def gen_setitem(b: Builder) -> bool:
    dst = _writable(b)
    if dst is None:
        return False
    kind = b.rng.choice(("slice", "int", "mask"))
    if kind == "mask" and dst.dtype != "bool":
        b.emit(f"{dst.name}[{dst.name} > 0] = 0")
    elif kind == "int":
        b.emit(f"{dst.name}[{b.rng.randrange(dst.shape[0])}] = 1")
    else:
        dim = b.rng.randrange(len(dst.shape))
        start, step = b.rng.randrange(dst.shape[dim]), b.rng.choice((1, 2))
        index = ", ".join([":"] * dim + [f"{start}::{step}"])
        sliced = list(dst.shape)
        sliced[dim] = len(range(start, dst.shape[dim], step))
        src = b.pick(lambda v: broadcast(v.shape, tuple(sliced)) == tuple(sliced)
                     and _can_write(dst, v.dtype) and v.root != dst.root, recent=False)
        value = src.name if src is not None and b.rng.random() < 0.6 else "2"
        b.emit(f"{dst.name}[{index}] = {value}")
    b.tags.append(f"setitem.{kind}")
    return True


def gen_break(b: Builder) -> bool:
    x = b.pick()
    if b.rng.random() < 0.4:
        b.emit(f"print({x.name}.shape, file=_sink)")
        b.tags.append("break.print")
        return True
    y = b.pick(lambda v: v.dtype != "bool")
    if y is None:
        return False
    scalar, name = b.fresh("s"), b.fresh()
    b.emit(f"{scalar} = {x.name}.float().sum().item()", f"{name} = {y.name} * {scalar}")
    b.add(name, y.shape, y.dtype if y.dtype != "int64" else "float32", contig=y.contig)
    b.tags.append("break.item")
    return True


def gen_branch(b: Builder) -> bool:
    x = b.pick(lambda v: v.dtype != "bool")
    if x is None:
        return False
    name = b.fresh()
    if b.rng.random() < 0.7:
        cond = f"{x.name}.sum() > 0"
        b.tags.append("branch.tensor")
    else:
        cond = f"{x.name}.shape[0] > 2" if x.shape else f"{x.name}.dim() == 0"
        b.tags.append("branch.python")
    b.emit(f"if {cond}:", f"    {name} = {x.name} * 2", "else:", f"    {name} = {x.name} - 1")
    b.add(name, x.shape, x.dtype, contig=x.contig)
    return True


def gen_loop(b: Builder) -> bool:
    x = b.pick(lambda v: len(v.shape) >= 1 and v.dtype != "bool")
    if x is None:
        return False
    name = b.fresh("acc")
    n = min(x.shape[0], 3)
    b.emit(f"{name} = torch.zeros_like({x.name}[0])", f"for i in range({n}):",
           f"    {name} = {name} + {x.name}[i] * (i + 1)")
    b.add(name, x.shape[1:], x.dtype)
    b.tags.append("loop")
    return True


def gen_container(b: Builder) -> bool:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    y = b.pick(lambda v: v.shape == x.shape and v.dtype == x.dtype, recent=False)
    holder, name = b.fresh("c"), b.fresh()
    if b.rng.random() < 0.5:
        dim = b.rng.randrange(len(x.shape))
        b.emit(f"{holder} = [{x.name}, {y.name}]")
        if b.rng.random() < 0.5:
            b.emit(f"{name} = torch.stack({holder}, dim={dim})")
            shape = x.shape[:dim] + (2,) + x.shape[dim:]
        else:
            b.emit(f"{name} = torch.cat({holder}, dim={dim})")
            shape = x.shape[:dim] + (2 * x.shape[dim],) + x.shape[dim + 1:]
        b.add(name, shape, x.dtype)
        b.tags.append("container.list")
    else:
        op = "&" if x.dtype == "bool" else "+"
        b.emit(f'{holder} = {{"a": {x.name}, "b": {y.name}}}',
               f'{name} = {holder}["a"] {op} {holder}["b"]')
        b.add(name, x.shape, x.dtype)
        b.tags.append("container.dict")
    return True
