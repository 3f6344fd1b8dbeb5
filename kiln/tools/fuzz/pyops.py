"""Generator ops for Python-level code around tensors, where capture does its hardest work:
comprehensions and generator expressions, helper functions (with a graph break inside),
closures and lambdas.
"""
from __future__ import annotations

from kiln.tools.fuzz.state import Builder, broadcast

__all__ = ["gen_python"]


def _numeric(b: Builder):
    return b.pick(lambda v: v.dtype != "bool")


def gen_python(b: Builder) -> bool:
    x = _numeric(b)
    if x is None:
        return False
    name, kind = b.fresh(), b.rng.choice(("listcomp", "genexpr", "helper", "helper_break",
                                          "closure", "lambda"))
    dtype = x.dtype
    if kind == "listcomp":
        parts = b.fresh("c")
        b.emit(f"{parts} = [{x.name} * k for k in (1, 2)]", f"{name} = {parts}[0] - {parts}[1]")
    elif kind == "genexpr":
        b.emit(f"{name} = sum({x.name} * k for k in range(3))")
    elif kind in ("helper", "helper_break"):
        helper = f"_h{name}"
        brk = ["    print(a.shape, file=_sink)"] if kind == "helper_break" else []
        b.helpers.append([f"def {helper}(a):", *brk, "    return a * 2 + 1"])
        b.emit(f"{name} = {helper}({x.name})")
    elif kind == "closure":
        y = b.pick(lambda v: broadcast(v.shape, x.shape) == x.shape and v.dtype == x.dtype,
                   recent=False)
        b.emit(f"def inner{name}(a):", f"    return a + {y.name}", f"{name} = inner{name}({x.name})")
    else:
        b.emit(f"f{name} = lambda a: a * 3 - 1", f"{name} = f{name}({x.name})")
    b.add(name, x.shape, dtype, contig=x.contig)
    b.tags.append(f"python.{kind}")
    return True
