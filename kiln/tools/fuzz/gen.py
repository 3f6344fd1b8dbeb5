"""The program generator: a seed → the Python source text of one small program.

A program is a module with `make_inputs(device)` (fresh inputs, same values and layouts on every
call), `make_globals(device)` (the nn modules it calls, seeded) and `fn(x0, x1, ...)`, the
function under test. The same seed, device and size always give the same text. With `grow`,
the module also sets `GROWTH = (0, 1, 2)`: the oracle checks it again with every input dim of 2
or more grown by 1 and by 2 (dynamic shapes; `inputs.grown`), and `fn` may take Python number
arguments that change with the growth (`numbers.py`). With `grad`, `GRADS = True`: float inputs
require grad and the oracle compares gradients too (`grads.py`).
"""
from __future__ import annotations

import dataclasses
import random

from kiln.tools.fuzz.inputs import LAYOUTS
from kiln.tools.fuzz.numbers import add_numbers, gen_number
from kiln.tools.fuzz.ops import OPS
from kiln.tools.fuzz.state import Builder

__all__ = ["SIZES", "Program", "generate_program", "render"]

# size → (largest dim, number of statements); "tiny" keeps Triton's interpreter and GPU compiles
# short (fewer, smaller kernels).
SIZES = {"tiny": (3, (2, 5)), "small": (5, (3, 9)), "medium": (5, (6, 14))}
_INPUT_DTYPES = ("float32",) * 6 + ("float16", "bfloat16", "int64", "bool")


@dataclasses.dataclass(frozen=True)
class Program:
    """One generated program: its seed, source text and the constructs it uses (`tags`)."""
    seed: int
    source: str
    tags: tuple[str, ...]


def _inputs(b: Builder) -> list[str]:
    specs = []
    for i in range(b.rng.choice((1, 2, 2, 3))):
        rank = b.rng.choice((1, 2, 2, 3, 3))
        shape = tuple(b.rng.randint(1, b.max_dim) if b.rng.random() < 0.2 else
                      b.rng.randint(2, b.max_dim) for _ in range(rank))
        dtype = b.rng.choice(_INPUT_DTYPES)
        layout = b.rng.choice(LAYOUTS) if b.rng.random() < 0.5 else "contiguous"
        b.add(f"x{i}", shape, dtype, contig=layout in ("contiguous", "offset"), is_input=True)
        specs.append(f"        make_tensor({shape!r}, {dtype!r}, {layout!r}, g, device),")
    return specs


def _returns(b: Builder) -> str:
    made = [v for v in b.vars if not v.is_input] or b.vars
    chosen = [made[-1]] + [v for v in b.vars if v.name in b.returned and v is not made[-1]]
    if made[-1].root != made[-1].name and b.rng.random() < 0.3:  # a view with its base
        chosen += [v for v in b.vars if v.name == made[-1].root]
    for _ in range(b.rng.choice((0, 1, 1, 2))):
        extra = b.rng.choice(b.vars)
        if extra not in chosen:
            chosen.append(extra)
    return f"return ({', '.join(v.name for v in chosen)},)"


def generate_program(seed: int, device: str = "cpu", size: str = "small",
                     grow: bool = False, grad: bool = False) -> Program:
    """The program of `seed`: deterministic for (seed, device, size, grow); `grow` adds the
    dynamic-shape sizes and number arguments, `grad` the gradient check (`GRADS = True`; the
    program is the same with and without it)."""
    rng = random.Random(f"{seed}/{device}/{size}")
    max_dim, (low, high) = SIZES[size]
    b = Builder(rng, device, max_dim)
    specs = _inputs(b)
    table = dict(OPS)
    if grow:  # number arguments, which change with the growth too (numbers.py)
        specs += add_numbers(b)
        table["number"] = (6, gen_number)
    names, weights = zip(*((n, w) for n, (w, _) in table.items()))
    target = rng.randint(low, high)
    done = 0
    while done < target:
        name = rng.choices(names, weights)[0]
        if table[name][1](b):
            b.tags.append(name)
            done += 1
    params = ", ".join([v.name for v in b.vars if v.is_input] + [n for n, _ in b.numbers])
    helpers = [line for helper in b.helpers for line in helper + ["", ""]]
    flags = ["GROWTH = (0, 1, 2)"] * grow + ["GRADS = True"] * grad
    source = render(seed, specs, b.globals, helpers, params, b.lines + [_returns(b)], flags)
    return Program(seed, source, tuple(sorted(set(b.tags + ["grow"] * grow + ["grad"] * grad))))


def render(seed: int, specs: list[str], globals_: list[str], helpers: list[str], params: str,
           body: list[str], flags: list[str] = ()) -> str:
    """The program's module source; `flags` are module-level lines the oracle reads
    (`GROWTH = ...`, `GRADS = True`)."""
    setup = ["    global " + ", ".join(g.split(" = ")[0] for g in globals_)] if globals_ else []
    # The module is built on the CPU under the seed, then moved: same weights on every device.
    setup += [f"    {g}" for g in globals_]
    setup += [f"    {g.split(' = ')[0]}.to(device)" for g in globals_]
    return "\n".join([
        f"# kiln fuzz program, seed {seed}",
        "import io", "", "import torch", "import torch.nn.functional as F", "",
        "from kiln.tools.fuzz.inputs import make_number, make_tensor", "", "_sink = io.StringIO()",
        *flags, "", "",
        "def make_inputs(device):", f"    g = torch.Generator().manual_seed({seed})",
        "    return [", *specs, "    ]", "", "",
        "def make_globals(device):", f"    torch.manual_seed({seed})", *setup,
        "    return None", "", "", *helpers,
        f"def fn({params}):", *[f"    {line}" for line in body], ""])
