"""The generator's model of a program under construction: typed variables and body lines.

The generator tracks every variable's shape, dtype and aliasing facts so that most generated
programs are valid in eager (a program eager rejects still tests kiln: it must raise the same
exception type), and so that in-place writes go where they mean something (inputs, views of
inputs, intermediates) rather than into expanded tensors, which eager refuses.
"""
from __future__ import annotations

import dataclasses
import random

import torch

__all__ = ["Builder", "Var", "broadcast", "promote"]

FLOATS = ("float32", "float16", "bfloat16")


@dataclasses.dataclass
class Var:
    """A tensor variable: its name in the source, shape, dtype and layout facts.

    `contig`: known contiguous (so `.view` is safe). `overlap`: some elements share memory (an
    expand), so in-place writes raise in eager. `root`: the name of the variable whose storage it
    views (itself when it owns its storage). `is_input`: a parameter of `fn`."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    contig: bool = True
    overlap: bool = False
    root: str = ""
    is_input: bool = False

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS


def promote(a: str, b: str) -> str:
    """torch's result dtype of a binary op between tensors of dtypes `a` and `b`."""
    return str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix("torch.")


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast shape of `a` and `b`, or None when they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y) if 1 not in (x, y) else x * y)
    return tuple(reversed(out))


class Builder:
    """Accumulates the body of `fn` (indented lines) and module globals for one program."""

    def __init__(self, rng: random.Random, device: str, max_dim: int) -> None:
        self.rng, self.device, self.max_dim = rng, device, max_dim
        self.vars: list[Var] = []
        self.lines: list[str] = []
        self.globals: list[str] = []
        self.helpers: list[list[str]] = []  # module-level function definitions, line by line
        self.tags: list[str] = []
        self.numbers: list[tuple[str, str]] = []  # Python number parameters: (name, kind)
        # Variables the program must return: a value computed from out-of-range indices, which
        # a compiler may drop (dead code) if nothing reads it.
        self.returned: list[str] = []
        self._count = 0

    def fresh(self, prefix: str = "t") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def add(self, name: str, shape: tuple[int, ...], dtype: str, **facts: object) -> Var:
        var = Var(name, tuple(shape), dtype, **facts)
        var.root = var.root or name
        self.vars.append(var)
        return var

    def pick(self, pred=None, recent: bool = True) -> Var | None:
        """A variable satisfying `pred`, biased towards recent ones (longer dependency chains)."""
        pool = [v for v in self.vars if pred is None or pred(v)]
        if not pool:
            return None
        if recent and self.rng.random() < 0.6:
            return pool[-1 - min(self.rng.randrange(3), len(pool) - 1)]
        return self.rng.choice(pool)

    def aliases_of(self, var: Var) -> list[Var]:
        return [v for v in self.vars if v.root == var.root]
