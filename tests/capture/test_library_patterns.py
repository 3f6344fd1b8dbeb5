"""Patterns real libraries (transformers, timm) use around their models, each captured into graphs
with outputs equal to eager: function reflection attributes, star-args calls, mapping registries.
"""
from __future__ import annotations

import functools

import torch

import kiln


def _explain(fn, *args, **kwargs):
    kiln.reset()
    return kiln.explain(fn)(*args, **kwargs)


def _reasons(out) -> list[str]:
    return [str(r).splitlines()[0] for r in out.break_reasons]


def _config_defaults(func):
    """Like transformers' `merge_with_config_defaults`: reads the wrapped function's code."""
    @functools.wraps(func)
    def wrapper(x, *args, **kwargs):
        if "scale" in func.__code__.co_varnames and func.__defaults__ == (2.0,):
            kwargs.setdefault("scale", 3.0)
        return func(x, *args, **kwargs)
    return wrapper


@_config_defaults
def _scaled(x, scale=2.0):
    return torch.sin(x) * scale


def test_function_attributes_are_guarded_constants():
    x = torch.randn(4, 5)
    out = _explain(_scaled, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    kiln.reset()
    compiled = kiln.compile(_scaled)
    torch.testing.assert_close(compiled(x), _scaled(x), rtol=0, atol=0)


def test_function_defaults_change_recompiles():
    def f(x, k=2.0):
        return x * k

    def g(x):
        return f(x) + f.__defaults__[0]

    kiln.reset()
    compiled = kiln.compile(g)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), g(x))
    f.__defaults__ = (5.0,)
    torch.testing.assert_close(compiled(x), g(x))
