"""The per-code cache: most recently hit entry first, shared by function objects of one code."""
from __future__ import annotations

import torch

import kiln


def _entries(compiled):
    return compiled._kiln_compiled.cache.entries


def test_most_recently_hit_entry_is_checked_first(counting_backend):
    def f(x):
        return x * 2

    compiled = kiln.compile(f, backend=counting_backend, dynamic=False)  # one entry per shape
    small, large = torch.randn(2), torch.randn(5)
    compiled(small)
    compiled(large)
    small_entry, large_entry = _entries(compiled)[::-1]
    assert _entries(compiled)[0] is large_entry  # newest first
    cf = compiled._kiln_compiled
    variant = lambda entry: cf.dispatcher.variants[id(entry)]  # noqa: E731
    assert cf.dispatch is variant(large_entry)
    torch.testing.assert_close(compiled(small), small * 2, rtol=0, atol=0)
    # a hit of another entry (checked inline, without the lock) points the function at it
    assert cf.dispatch is variant(small_entry)
    torch.testing.assert_close(compiled(small), small * 2, rtol=0, atol=0)
    assert cf.dispatch is variant(small_entry)  # the front hit needs no repointing
    torch.testing.assert_close(compiled(large), large * 2, rtol=0, atol=0)
    assert cf.dispatch is variant(large_entry)
    assert counting_backend.count == 2


def test_function_objects_sharing_code_share_entries(counting_backend):
    def make(k):
        def g(x):
            return x + k
        return g

    a, b = kiln.compile(make(1.0), backend=counting_backend), kiln.compile(make(2.0),
                                                                            backend=counting_backend)
    x = torch.randn(3)
    torch.testing.assert_close(a(x), x + 1.0, rtol=0, atol=0)
    torch.testing.assert_close(b(x), x + 2.0, rtol=0, atol=0)  # closure guard: a new entry
    torch.testing.assert_close(a(x), x + 1.0, rtol=0, atol=0)
    assert counting_backend.count == 2


def test_a_kiln_bug_runs_the_function_eagerly_or_raises_internal_error(monkeypatch):
    import pytest

    from kiln.capture import convert
    from kiln.config import config
    from kiln.errors import InternalError

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kiln bug")

    monkeypatch.setattr(convert, "build_entry_code", broken)

    def f(x):
        return x.sin() + 1

    x = torch.randn(3)
    report = kiln.explain(f)(x)
    assert report.graph_count == 0 and "simulated kiln bug" in report.break_reasons[0].render()
    torch.testing.assert_close(kiln.compile(f)(x), f(x), rtol=0, atol=0)
    kiln.reset()
    with config.patch(suppress_errors=False), pytest.raises(InternalError, match="simulated"):
        kiln.compile(f)(x)


def test_python_version_the_bytecode_layer_refuses_runs_eagerly(monkeypatch):
    from kiln.capture import translator
    from kiln.capture.bytecode import UnsupportedBytecode

    def refuse(code):
        raise UnsupportedBytecode("Python 3.99 bytecode is not supported")

    monkeypatch.setattr(translator, "decode", refuse)

    def f(x):
        return x * 3

    x = torch.randn(2)
    report = kiln.explain(f)(x)
    assert report.break_reasons[0].code == "unsupported-python"
    torch.testing.assert_close(kiln.compile(f)(x), x * 3, rtol=0, atol=0)


def _cell_captured_by_lambda(x):
    scale = 3.0
    g = lambda t: t * scale  # noqa: E731 - `scale` becomes a cell variable
    y = g(x).sin()
    print("break")
    return y + scale


def _inner_function_live_after_break(x):
    k = 2.0

    def inner(t):
        return t * k

    y = inner(x)
    print("break")
    k = 5.0  # the inner function must see the new value
    return inner(y)


def test_break_in_a_function_with_cell_variables_resumes(counting_backend, capsys):
    compiled = kiln.compile(_cell_captured_by_lambda, backend=counting_backend)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), _cell_captured_by_lambda(x), rtol=0, atol=0)
    assert counting_backend.count == 2  # before and after the print: the frame resumed
    assert capsys.readouterr().out == "break\n" * 6


def test_inner_function_live_across_a_break_stays_correct(capsys):
    compiled = kiln.compile(_inner_function_live_after_break)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), _inner_function_live_after_break(x),
                                   rtol=0, atol=0)
    report = kiln.explain(_inner_function_live_after_break)(torch.randn(4))
    # the inner function cannot be handed to the resume function yet: the frame runs route-only
    assert [r.code for r in report.break_reasons] == ["output-value"]
