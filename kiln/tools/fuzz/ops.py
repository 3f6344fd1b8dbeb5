"""The op table of the program generator: one function per construct, each emitting source lines.

Each `gen_*` function looks at the builder's variables, emits one statement (or a small compound
one) and records the new variables with their shapes and dtypes; it returns False when no
variable fits, and the generator draws another op. `OPS` maps a name to (weight, function): the
weights set the mix of the campaign.
"""
from __future__ import annotations

from kiln.tools.fuzz import effects, pyops
from kiln.tools.fuzz.views import gen_view
from kiln.tools.fuzz.state import FLOATS, Builder, Var, broadcast, promote

__all__ = ["OPS"]

_UNARY_FLOAT = ("torch.relu({})", "torch.sigmoid({})", "torch.tanh({})", "torch.sin({})",
                "torch.exp({})", "{}.abs()", "-{}", "torch.clamp({}, -0.5, 0.5)")
_UNARY_INT = ("{}.abs()", "-{}", "torch.clamp({}, -2, 2)", "{} // 2", "{} % 3")


def _scalar_dtype(dtype: str, scalar: str) -> str:
    if "." in scalar and dtype not in FLOATS:
        return "float32"
    return "int64" if dtype == "bool" else dtype


def gen_unary(b: Builder) -> bool:
    x = b.pick(lambda v: v.dtype != "bool")
    if x is None:
        return False
    form = b.rng.choice(_UNARY_FLOAT if x.is_float else _UNARY_INT)
    name = b.fresh()
    b.emit(f"{name} = {form.format(x.name)}")
    b.add(name, x.shape, x.dtype, contig=x.contig)
    return True


def gen_scalar(b: Builder) -> bool:
    x = b.pick()
    op, scalar = b.rng.choice((("*", "1.5"), ("+", "2"), ("-", "0.25"), ("*", "3"), ("/", "2.0")))
    if x.dtype == "bool" and op == "-":
        op = "+"
    name = b.fresh()
    b.emit(f"{name} = {x.name} {op} {scalar}")
    dtype = "float32" if op == "/" and not x.is_float else _scalar_dtype(x.dtype, scalar)
    b.add(name, x.shape, dtype, contig=x.contig)
    return True


def gen_binary(b: Builder) -> bool:
    x = b.pick()
    y = b.pick(lambda v: broadcast(v.shape, x.shape) is not None, recent=False)
    shape = broadcast(x.shape, y.shape)
    name = b.fresh()
    if x.dtype == "bool" and y.dtype == "bool":
        b.emit(f"{name} = {x.name} {b.rng.choice('&|^')} {y.name}")
    else:
        form = b.rng.choice(("{} + {}", "{} * {}", "{} - {}", "torch.maximum({}, {})",
                             "torch.where({0} > 0, {0}, {1})"))
        if "-" in form and "bool" in (x.dtype, y.dtype):
            form = "{} + {}"
        b.emit(f"{name} = {form.format(x.name, y.name)}")
    b.add(name, shape, promote(x.dtype, y.dtype), contig=x.contig and y.contig)
    return True


def gen_cast(b: Builder) -> bool:
    x = b.pick()
    target = b.rng.choice(("float16", "bfloat16", "float32", "int64", "bool"))
    name = b.fresh()
    if target == "bool":
        b.emit(f"{name} = {x.name} > 0")
    elif target == "int64":
        b.emit(f"{name} = ({x.name} * 3).long()" if x.is_float else f"{name} = {x.name}.long()")
    else:
        b.emit(f"{name} = {x.name}.to(torch.{target})")
    # `.to` and `.long()` to the tensor's own dtype return the tensor itself: an alias.
    same = target == x.dtype and target != "bool"
    b.add(name, x.shape, target, contig=x.contig, root=x.root if same else "",
          overlap=x.overlap and same)
    return True


def _dim(b: Builder, x: Var) -> int:
    return b.rng.randrange(len(x.shape))


def gen_reduce(b: Builder) -> bool:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    dim, keep = _dim(b, x), b.rng.random() < 0.4
    kind = b.rng.choice(("sum", "mean", "amax", "softmax", "logsumexp", "var", "sum_all"))
    if kind in ("mean", "softmax", "logsumexp", "var") and not x.is_float:
        kind = "sum"
    name = b.fresh()
    reduced = x.shape[:dim] + ((1,) if keep else ()) + x.shape[dim + 1:]
    dtype = "int64" if x.dtype in ("bool", "int64") and kind == "sum" else x.dtype
    if kind == "softmax":
        b.emit(f"{name} = torch.softmax({x.name}, dim={dim})")
        reduced = x.shape
    elif kind == "sum_all":
        b.emit(f"{name} = {x.name}.sum()")
        reduced, dtype = (), dtype if x.dtype not in ("bool", "int64") else "int64"
    elif kind == "var":
        b.emit(f"{name} = {x.name}.var(dim={dim}, keepdim={keep}, correction=0)")
    else:
        b.emit(f"{name} = torch.{kind}({x.name}, dim={dim}, keepdim={keep})")
    b.add(name, reduced, dtype)
    return True


def _index_literal(b: Builder, size: int, count: int, name: str) -> list[int]:
    # Out-of-range indices only on the CPU: eager must raise there, and kiln must raise too. On
    # CUDA the eager side would hit a device-side assert that poisons the worker process.
    if b.device == "cpu" and b.rng.random() < 0.03:
        b.tags.append("index.out_of_range")
        b.returned.append(name)
        return [size] * count
    return [b.rng.randrange(size) for _ in range(count)]


def gen_index(b: Builder) -> bool:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    name, kind = b.fresh(), b.rng.choice(("int", "mask", "index_select", "gather", "embedding"))
    dim = _dim(b, x)
    if kind == "int":
        (index,) = _index_literal(b, x.shape[0], 1, name)
        b.emit(f"{name} = {x.name}[{index}] + 0")
        b.add(name, x.shape[1:], x.dtype if x.dtype != "bool" else "int64")
    elif kind == "mask":
        b.emit(f"{name} = {x.name}[{x.name} > 0].sum()" if x.dtype != "bool" else
               f"{name} = {x.name}[{x.name}].sum()")
        b.add(name, (), "int64" if x.dtype in ("bool", "int64") else x.dtype)
    elif kind == "index_select":
        idx = _index_literal(b, x.shape[dim], b.rng.randrange(1, 4), name)
        b.emit(f"{name} = {x.name}.index_select({dim}, "
               f"torch.tensor({idx}, device={x.name}.device))")
        b.add(name, x.shape[:dim] + (len(idx),) + x.shape[dim + 1:], x.dtype)
    elif kind == "gather":
        shape = [b.rng.randrange(1, d + 1) for d in x.shape]
        count = 1
        for d in shape:
            count *= d
        idx = _index_literal(b, x.shape[dim], count, name)
        b.emit(f"{name} = torch.gather({x.name}, {dim}, torch.tensor({idx}, "
               f"device={x.name}.device).view({', '.join(map(str, shape))}))")
        b.add(name, tuple(shape), x.dtype)
    elif x.is_float and len(x.shape) == 2:
        idx = _index_literal(b, x.shape[0], b.rng.randrange(1, 5), name)
        b.emit(f"{name} = F.embedding(torch.tensor({idx}, device={x.name}.device), {x.name})")
        b.add(name, (len(idx), x.shape[1]), x.dtype)
    else:
        return False
    b.tags.append(f"index.{kind}")
    return True


def gen_module(b: Builder) -> bool:
    x = b.pick(lambda v: v.dtype == "float32" and len(v.shape) >= 1)
    if x is None:
        return False
    mod, name, last = b.fresh("m"), b.fresh(), x.shape[-1]
    kind = b.rng.choice(("linear", "layernorm", "conv", "matmul"))
    if kind == "conv" and len(x.shape) == 3:
        channels, width = x.shape[1], b.rng.choice((1, 2, 3))
        b.globals.append(f"{mod} = torch.nn.Conv1d({channels}, 2, {width}, padding=1)")
        b.emit(f"{name} = {mod}({x.name})")
        b.add(name, (x.shape[0], 2, x.shape[2] + 3 - width), "float32")
    elif kind == "layernorm":
        b.globals.append(f"{mod} = torch.nn.LayerNorm({last})")
        b.emit(f"{name} = {mod}({x.name})")
        b.add(name, x.shape, "float32")
    elif kind == "matmul" and len(x.shape) >= 2:
        y = b.pick(lambda v: v.dtype == "float32" and len(v.shape) == 2 and v.shape[0] == last,
                   recent=False)
        if y is None:
            return False
        b.emit(f"{name} = {x.name} @ {y.name}")
        b.add(name, x.shape[:-1] + (y.shape[1],), "float32")
    else:
        kind, out = "linear", b.rng.randrange(1, 5)
        b.globals.append(f"{mod} = torch.nn.Linear({last}, {out})")
        b.emit(f"{name} = {mod}({x.name})")
        b.add(name, x.shape[:-1] + (out,), "float32")
    b.tags.append(f"module.{kind}")
    return True


def _ops():
    return {
        "unary": (6, gen_unary), "scalar": (5, gen_scalar), "binary": (8, gen_binary),
        "cast": (4, gen_cast), "reduce": (6, gen_reduce), "view": (10, gen_view),
        "inplace": (7, effects.gen_inplace), "setitem": (5, effects.gen_setitem),
        "index": (5, gen_index), "module": (3, gen_module), "break": (2, effects.gen_break),
        "branch": (2, effects.gen_branch), "loop": (2, effects.gen_loop),
        "container": (2, effects.gen_container), "python": (3, pyops.gen_python),
    }


OPS = _ops()
