"""Shared by the cache-safety audit (test_cache_safety_audit.py, test_cache_safety_state.py)."""

from __future__ import annotations

import torch

from kiln.backends.registry import lookup_backend
from helpers import assert_same_structure_and_values as assert_same

BACKENDS = ["eager", "aot_eager"]


class Counting:
    """A registered backend, counting the graphs it is given."""

    def __init__(self, name: str) -> None:
        self.inner = lookup_backend(name)
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return self.inner(gm, example_inputs)


def same(compiled, eager, *args, **kwargs):
    """Eager's answer, then the compiled one, compared; returns the compiled one."""
    expected = eager(*args, **kwargs)
    actual = compiled(*args, **kwargs)
    assert_same(expected, actual)
    return actual


def randn(*shape, **kw):
    return torch.randn(*shape, **kw)


def class_closure(cls, name, var):
    """The cell of free variable `var` of the function `name` defined on `cls`."""
    fn = cls.__dict__[name]
    return fn.__closure__[fn.__code__.co_freevars.index(var)]
