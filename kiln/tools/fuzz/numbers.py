"""Python number arguments of generated programs (with `--grow`): floats and ints passed to `fn`
beside its tensors, with another value at every growth step (`inputs.make_number`), so the
oracle's later calls exercise kiln's automatic dynamic numbers: a changing float or negative
int becomes a 0-dim tensor input, an int >= 2 a size symbol. Each use is one statement: a
binary op with a tensor, `clamp`/`masked_fill` (which check the value fits), arithmetic among
numbers feeding a tensor op, and a branch on the value.
"""
from __future__ import annotations

from kiln.tools.fuzz.state import Builder

__all__ = ["NUMBER_KINDS", "add_numbers", "gen_number"]

# kind -> base values drawn at generation (`make_number` moves them with the growth)
NUMBER_KINDS = {"float": (0.37, -1.25, 2.5, 0.8125), "negint": (-3, -7, -2),
                "int": (2, 3, 5)}


def add_numbers(b: Builder) -> list[str]:
    """0 to 2 number parameters (`a0`, `a1`): their `make_inputs` lines."""
    specs = []
    for i in range(b.rng.choice((0, 1, 1, 2))):
        kind = b.rng.choice(tuple(NUMBER_KINDS))
        b.numbers.append((f"a{i}", kind))
        specs.append(f"        make_number({b.rng.choice(NUMBER_KINDS[kind])!r}, "
                     f"{kind!r}),")
    return specs


def _result_dtype(dtype: str, kind: str) -> str:
    """torch's dtype of `tensor op number` (a Python number never promotes a float tensor)."""
    if kind == "float":
        return dtype if dtype in ("float32", "float16", "bfloat16") else "float32"
    return "int64" if dtype == "bool" else dtype


def gen_number(b: Builder) -> bool:
    if not b.numbers:
        return False
    a, kind = b.rng.choice(b.numbers)
    x = b.pick(lambda v: v.dtype != "bool") if b.rng.random() < 0.9 else b.pick()
    if x is None:
        return False
    name = b.fresh()
    form = b.rng.choice(("binary", "reversed", "clamp", "fill", "arith", "branch", "compare"))
    dtype = _result_dtype(x.dtype, kind)
    if x.dtype == "bool" and form in ("reversed", "clamp", "fill"):
        form = "binary"
    if form == "binary":
        b.emit(f"{name} = {x.name} {b.rng.choice('*+')} {a}")
    elif form == "reversed":
        b.emit(f"{name} = {a} - {x.name}")
    elif form == "clamp":
        b.emit(f"{name} = torch.clamp({x.name}, min={a})")
    elif form == "fill":
        b.emit(f"{name} = {x.name}.masked_fill({x.name} > 0, {a})")
        dtype = x.dtype
    elif form == "arith":
        k = b.fresh("k")
        b.emit(f"{k} = {a} * 2 - 1" if kind != "negint" else f"{k} = {a} // 2 + {a} % 3",
               f"{name} = {x.name} * {k}")
    elif form == "branch":
        b.emit(f"if {a} > 0:", f"    {name} = {x.name} + {a}", "else:",
               f"    {name} = {x.name} - {a}")
    else:
        b.emit(f"{name} = ({x.name} > {a}) | ({x.name} < -{a})")
        dtype = "bool"
    b.add(name, x.shape, dtype, contig=x.contig)
    b.tags.append(f"number.{kind}.{form}")
    return True
