"""Python 3.13's instruction set (issue 19): the canonical form decode gives for 3.13's new
opcodes, and the capture paths whose stack layout changed there (the NULL slot above the
callable, CALL_KW, CALL_FUNCTION_EX). The capture tests run on every version; they pin what
3.13 changed, next to the same behaviour on 3.11 and 3.12."""

from __future__ import annotations

import sys

import pytest
import torch

import kiln
from helpers import CountingBackend
from kiln.capture import breaks
from kiln.capture.bytecode import decode, identity_transform

PY313 = sys.version_info[:2] == (3, 13)
only_313 = pytest.mark.skipif(not PY313, reason="3.13 opcodes")


def ops(fn) -> list[str]:
    return [i.opname for i in decode(fn.__code__)]


# -- decode: 3.13 opcodes -> the canonical form ---------------------------------------------------

@only_313
def test_call_kw_folds_its_names_into_one_call():
    def f(g, a):
        return g(a, key=1, other=a)
    (call,) = [i for i in decode(f.__code__) if i.opname == "CALL"]
    assert call.argval == (3, ("key", "other"))
    assert "CALL_KW" not in ops(f)
    # the names tuple is not a stack value in the canonical form
    assert not any(i.opname == "LOAD_CONST" and i.argval == ("key", "other")
                   for i in decode(f.__code__))


@only_313
def test_superinstructions_are_split_and_fused_back():
    def f(a, b):
        x, y = a, b
        return x + y
    assert "LOAD_FAST_LOAD_FAST" in {i.opname for i in __import__("dis").get_instructions(f)}
    assert ops(f).count("LOAD_FAST") >= 4
    new = identity_transform(f)
    assert new.__code__.co_code == f.__code__.co_code and new(1, 2) == 3


@only_313
def test_make_function_carries_its_attribute_flags():
    def f(k):
        return lambda a=1, *, b=2: a + b + k
    (make,) = [i for i in decode(f.__code__) if i.opname == "MAKE_FUNCTION"]
    assert make.argval == 0x01 | 0x02 | 0x08  # defaults, kwdefaults, closure
    assert "SET_FUNCTION_ATTRIBUTE" not in ops(f)
    assert "LOAD_CLOSURE" in ops(f)  # 3.13 loads the cell with LOAD_FAST


@only_313
def test_loop_exit_and_to_bool():
    def f(xs):
        n = 0
        for x in xs:
            if x:
                n += 1
        return not n
    names = ops(f)
    assert "END_FOR" not in names and "TO_BOOL" in names
    (loop,) = [i for i in decode(f.__code__) if i.opname == "FOR_ITER"]
    assert loop.target.opname == "LOAD_FAST" and loop.target.argval == "n"


@only_313
def test_fstring_opcodes_capture_constants():
    def f(x, width):
        return x * len(f"{width!r:>{width}}|{width}")
    backend = CountingBackend()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f, backend=backend)(x, 4), f(x, 4))
    assert backend.count == 1


# -- capture on every version: the layouts 3.13 changed --------------------------------------------

def _kw_helper(x, *, scale, shift=0.0):
    return x * scale + shift


class _Obj:
    def method(self, x, *rest):
        return x - sum(rest)


def _calls(x, obj):
    y = _kw_helper(x, scale=2.0, shift=1.0)  # CALL_KW on 3.13
    y = obj.method(y, 1.0)  # a method load: [meth, self]
    args, kwargs = (y,), {"scale": 3.0}
    y = _kw_helper(*args, **kwargs)  # CALL_FUNCTION_EX with its NULL
    y = obj.method(*args)  # CALL_FUNCTION_EX on a non-method attribute load
    return y, not y.shape[0] == 3


def test_calls_capture_in_one_graph():
    backend = CountingBackend()
    x = torch.randn(3)
    result = kiln.compile(_calls, backend=backend)(x, _Obj())
    expected = _calls(x, _Obj())
    torch.testing.assert_close(result[0], expected[0])
    assert result[1] == expected[1] and backend.count == 1


def _break_at_kw_call(x):
    y = x.cos()
    print("at a keyword call", end="\n", sep=" ")  # breaks at the call (T29)
    return _kw_helper(y, scale=2.0)


def test_break_at_a_keyword_call(capsys):
    backend = CountingBackend()
    x = torch.randn(3)
    out = kiln.compile(_break_at_kw_call, backend=backend)(x)
    torch.testing.assert_close(out, _break_at_kw_call(x))
    assert capsys.readouterr().out == "at a keyword call\n" * 2
    assert backend.count == 2


def test_route_only_copy_routes_star_calls(monkeypatch):
    """`f(*args, **kwargs)` in a route-only copy (3.13 packs around the NULL above `f`)."""
    from kiln.capture.settings import CompileSettings
    seen = []

    def passing_through(router, value):
        seen.append(value)
        return value

    monkeypatch.setattr(breaks.Router, "route", passing_through)
    routed = breaks.route_only(_calls, CompileSettings(CountingBackend(), "counting"))
    x = torch.randn(3)
    result = routed(x, _Obj())
    expected = _calls(x, _Obj())
    torch.testing.assert_close(result[0], expected[0])
    assert result[1] == expected[1]
    assert seen.count(_kw_helper) == 2
