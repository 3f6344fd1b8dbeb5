"""Graph breaks (issue 5): every break cause, resume into `with` blocks (the exception-depth
regression), resume caching, nested helpers, layer loops, side-effect order, live stack values,
fullgraph=True, the seed diagnostic call and explain's de-duplication.

Every test compares the compiled run with an eager run of the same code on fresh `torch.randn`
inputs, and counts graphs with a CountingBackend (the number of graphs the backend was handed) and
with `kiln.explain`. Expected counts follow kiln's scheme:

- a break at a CALL or a data-dependent branch that is not inside a loop or a `try` resumes: one
  graph for the code before the break, one for the code after it (a resume function compiled by
  kiln); a branch has one resume function per direction taken;
- a break inside a loop or a `try` (or at an instruction kiln cannot resume after) makes the
  function route-only: no graph of its own, but every call it makes is routed through kiln;
- a break inside an inlined callee becomes a break at the caller's call site; the callee is then
  called through kiln and gets its own graphs.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import logging
import os
import subprocess
import sys
import textwrap
import traceback
import zlib

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.errors
from child_env import child_env
from helpers import (CountingBackend, assert_same_structure_and_values, line_of, mentions_line,
                     target_names)
from kiln.capture import breaks
from kiln.tools.seed_model import TransformerBlock

THIS_FILE = os.path.basename(__file__)


def _line_of(marker: str) -> int:
    return line_of(__file__, marker)


def _source_of(marker: str) -> str:
    """The stripped source text of that line (as linecache gives it, comment included)."""
    with open(__file__) as f:
        return f.readlines()[_line_of(marker) - 1].strip()


def _mentions_line(text: str, lineno: int) -> bool:
    return mentions_line(text, THIS_FILE, lineno)


def _points_at(record, marker: str) -> bool:
    """The break record's own location is this file's line carrying `marker`."""
    loc = record.location
    return loc is not None and os.path.basename(loc.filename) == THIS_FILE and \
        loc.lineno == _line_of(marker)


def _mentions_marker(record, marker: str) -> bool:
    """The record's location or inline stack names this file's line carrying `marker`."""
    lineno = _line_of(marker)
    frames = ([record.location] if record.location is not None else []) + list(record.stack)
    return any(os.path.basename(f.filename) == THIS_FILE and f.lineno == lineno for f in frames)


def _render_all(out) -> str:
    return "\n".join(r.render() for r in out.break_reasons)


def _compare(fn, compiled, make_args, calls=3):
    """Call eager and compiled on the same fresh inputs (deep copies for eager); outputs and
    argument mutations must match. Returns the last compiled output."""
    actual = None
    for _ in range(calls):
        args = make_args()
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        actual = compiled(*args)
        assert_same_structure_and_values(expected, actual)
        assert_same_structure_and_values(eager_args, args, path="args")
    return actual


def _randn(*shape):
    return lambda: (torch.randn(*shape),)


# ==================================================================================================
# 1. Break causes (issue item 4)
# ==================================================================================================

# --- print ----------------------------------------------------------------------------------------

def print_between(x):
    y = x.sin()
    print("between:", y)  # BRK-PRINT
    return y.cos()


def print_twice(x):
    print("start", tuple(x.shape))
    y = x * 2
    print("middle", y.sum())
    z = y.exp()
    print("end", z.mean())
    return z


def test_print_between_ops_two_graphs_and_same_output(capsys):
    backend = CountingBackend()
    compiled = kiln.compile(print_between, backend=backend)
    for _ in range(3):
        x = torch.randn(5)
        expected = print_between(x.clone())
        eager_text = capsys.readouterr().out
        actual = compiled(x)
        assert capsys.readouterr().out == eager_text  # printed once, same text, same values
        assert_same_structure_and_values(expected, actual)
    # graph 1: sin (before the print); graph 2: cos (the resume function). No recompile.
    assert backend.count == 2
    assert target_names(backend.gms[0]) == ["sin"]
    assert target_names(backend.gms[1]) == ["cos"]

    out = kiln.explain(print_between)(torch.randn(5))
    assert out.graph_count == 2
    assert out.graph_break_count == 1
    (record,) = out.break_reasons
    assert record.code == "print"
    assert _points_at(record, "BRK-PRINT"), record.render()
    assert record.location.source == _source_of("BRK-PRINT")


def test_print_order_preserved_across_three_breaks(capsys):
    backend = CountingBackend()
    compiled = kiln.compile(print_twice, backend=backend)
    for _ in range(3):
        x = torch.randn(3, 4)
        expected = print_twice(x.clone())
        eager_text = capsys.readouterr().out
        actual = compiled(x)
        compiled_text = capsys.readouterr().out
        assert compiled_text == eager_text
        assert [line.split()[0] for line in compiled_text.splitlines()] == \
            ["start", "middle", "end"]
        assert_same_structure_and_values(expected, actual)
    # No op runs before the first print, so no graph there; then mul+sum, then exp+mean: 2
    # graphs (the three prints are three breaks).
    assert backend.count == 2
    out = kiln.explain(print_twice)(torch.randn(3, 4))
    assert out.graph_count == 2
    assert out.graph_break_count == 3


# --- logging --------------------------------------------------------------------------------------

LOG = logging.getLogger("kiln_test_graph_breaks")


def log_in_forward(x):
    y = x.sin()
    LOG.info("sin sum %.6f", y.sum())  # BRK-LOG-1
    z = y.cos()
    LOG.warning("cos shape %s", tuple(z.shape))  # BRK-LOG-2
    return z * 2


# With kiln.config.reorder_logging (the default) these calls are replayed after one graph
# (tests/capture/test_logging_calls.py); here it is off, so each call is a break.
@kiln.config.config.patch(reorder_logging=False)
def test_logging_inside_forward_keeps_record_order(caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    backend = CountingBackend()
    compiled = kiln.compile(log_in_forward, backend=backend)
    for _ in range(3):
        x = torch.randn(6)
        caplog.clear()
        expected = log_in_forward(x.clone())
        eager_records = [(r.levelname, r.getMessage()) for r in caplog.records]
        caplog.clear()
        actual = compiled(x)
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == eager_records
        assert_same_structure_and_values(expected, actual)
    assert [lvl for lvl, _ in eager_records] == ["INFO", "WARNING"]
    # Each logger call is a break at this file's call site (logging is not captured): graph 1
    # sin, graph 2 cos, graph 3 mul.
    assert backend.count == 3


@kiln.config.config.patch(reorder_logging=False)
def test_logging_breaks_reported_per_call_site(caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    log_in_forward(torch.randn(6))  # the program logged before: the logger's level cache is warm
    out = kiln.explain(log_in_forward)(torch.randn(6))
    assert out.graph_count == 3
    # two different logger calls in user code are two breaks, each pointing at its own line
    assert out.graph_break_count == 2, _render_all(out)
    for marker in ("BRK-LOG-1", "BRK-LOG-2"):
        assert any(_mentions_marker(r, marker) for r in out.break_reasons), \
            f"no break names {THIS_FILE}:{_line_of(marker)}:\n{_render_all(out)}"


# --- tensor values used in Python: .item(), float(), int(), bool(), .tolist(), .numpy() ---------

def use_item(x):
    y = x.sin()
    s = y.sum().item()  # BRK-ITEM
    return y * s


def use_float(x):
    y = x.sin()
    s = float(y.sum())  # BRK-FLOAT
    return y * s


def use_int(x):
    y = x * 10
    n = int(y.max())  # BRK-INT
    return y + n


def use_bool(x):
    y = x.sin()
    flag = bool((y > 0).all())  # BRK-BOOL
    return y * 2 if flag else y * 3


def use_tolist(x):
    y = x.sin()
    vals = y.tolist()  # BRK-TOLIST
    return y + vals[0]


def use_numpy(x):
    y = x.sin()
    arr = y.numpy()
    return y.cos() + float(arr.max())  # BRK-NUMPY


# Graphs on the first call. One break each: graph 1 = the ops before the break (they produce
# the tensor whose value Python needs), the value is read natively, graph 2 = the resume function
# (the ops after the break). In use_numpy, .numpy() and `arr.max()` are traced as tensor ops
# (tests/capture/test_numpy*.py); float() of the NumPy scalar is the break: sin, cos, amax | add.
VALUE_CASES = [
    (use_item, "BRK-ITEM", 2),
    (use_float, "BRK-FLOAT", 2),
    (use_int, "BRK-INT", 2),
    (use_bool, "BRK-BOOL", 2),
    (use_tolist, "BRK-TOLIST", 2),
    (use_numpy, "BRK-NUMPY", 2),
]


@pytest.mark.parametrize("fn,marker,graphs", VALUE_CASES,
                         ids=[f.__name__ for f, _, _ in VALUE_CASES])
def test_tensor_value_used_in_python(fn, marker, graphs):
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    _compare(fn, compiled, _randn(7), calls=1)
    assert backend.count == graphs, \
        f"{backend.count} graphs: {[target_names(g) for g in backend.gms]}"
    _compare(fn, compiled, _randn(7), calls=3)  # and the results stay right on new inputs

    out = kiln.explain(fn)(torch.randn(7))
    assert out.graph_count == graphs
    assert any(_points_at(r, marker) for r in out.break_reasons), _render_all(out)


# --- data-dependent if / while --------------------------------------------------------------------

def branch_on_sum(x):
    y = x * 2
    if y.sum() > 0:  # BRK-IF
        return y + 1
    return y - 1


def test_data_dependent_if_both_branches_alternating():
    backend = CountingBackend()
    compiled = kiln.compile(branch_on_sum, backend=backend)
    pos = lambda: (torch.rand(6) + 0.1,)  # noqa: E731 - takes the `if` branch
    neg = lambda: (-torch.rand(6) - 0.1,)  # noqa: E731 - takes the fall-through
    _compare(branch_on_sum, compiled, pos, calls=1)
    # graph 1: mul, sum, gt (the condition); graph 2: the resume for the taken direction
    assert backend.count == 2
    _compare(branch_on_sum, compiled, neg, calls=1)
    # the other direction has its own resume function: one more graph
    assert backend.count == 3
    for i in range(10):  # the same compiled function, alternating: always eager's result
        _compare(branch_on_sum, compiled, pos if i % 2 else neg, calls=1)
    assert backend.count == 3  # nothing compiled again

    out = kiln.explain(branch_on_sum)(torch.rand(6) + 0.1)
    assert out.graph_count == 2
    (record,) = out.break_reasons
    assert record.code == "data-dependent-branch"
    assert _points_at(record, "BRK-IF")


def while_on_value(x):
    while x.sum() < 20:  # BRK-WHILE
        x = x + 1
    return x * 2


def test_data_dependent_while_is_route_only():
    backend = CountingBackend()
    compiled = kiln.compile(while_on_value, backend=backend)
    few = lambda: (torch.rand(4) + 3.0,)  # noqa: E731 - 1 or 2 iterations
    many = lambda: (torch.rand(4) - 10.0,)  # noqa: E731 - about 14 iterations
    _compare(while_on_value, compiled, few, calls=2)
    _compare(while_on_value, compiled, many, calls=2)
    # The first test of the condition sits before the loop: graph 1 computes it (sum, lt). The
    # resume function continues inside the loop, where resuming is unsafe: it runs route-only
    # (no graph). So one graph, whatever the number of iterations; no resume chain.
    assert backend.count == 1, f"{backend.count} graphs for a data-dependent while loop"
    out = kiln.explain(while_on_value)(torch.rand(4) - 10.0)
    assert out.graph_count == 1
    assert all(_points_at(r, "BRK-WHILE") for r in out.break_reasons), _render_all(out)


# --- non-torch C code, kiln.graph_break(), kiln.disable -----------------------------------------

def crc_of_tensor(x):
    y = x * 2
    c = zlib.crc32(y.numpy().tobytes())  # BRK-CRC
    return y + (c % 7)


def test_call_into_non_torch_c_code():
    backend = CountingBackend()
    compiled = kiln.compile(crc_of_tensor, backend=backend)
    _compare(crc_of_tensor, compiled, _randn(8), calls=1)
    # graph 1: mul (before .numpy()); .numpy(), .tobytes() and zlib.crc32 run natively (breaks
    # with no op between them: no graph); graph 2: the last resume (mod, add).
    assert backend.count == 2, f"{backend.count} graphs"
    _compare(crc_of_tensor, compiled, _randn(8), calls=3)
    out = kiln.explain(crc_of_tensor)(torch.randn(8))
    assert out.graph_count == 2
    assert any(_points_at(r, "BRK-CRC") for r in out.break_reasons), _render_all(out)


def explicit_break(x):
    y = x.sin()
    kiln.graph_break()  # BRK-GB
    return y.cos()


def test_kiln_graph_break():
    backend = CountingBackend()
    compiled = kiln.compile(explicit_break, backend=backend)
    _compare(explicit_break, compiled, _randn(5), calls=3)
    assert backend.count == 2  # sin | cos
    out = kiln.explain(explicit_break)(torch.randn(5))
    assert out.graph_count == 2 and out.graph_break_count == 1
    (record,) = out.break_reasons
    assert record.code == "graph-break-call" and record.category == "user-fixable"
    assert _points_at(record, "BRK-GB")


@kiln.disable
def disabled_helper(t):
    return t * 3 + 1


def calls_disabled(x):
    y = x.sin()
    z = disabled_helper(y)  # BRK-DISABLE
    return z.cos()


def test_a_dead_disabled_function_does_not_disable_the_next_one_at_its_address():
    """CI, 2026-12-07: the registry held bare ids, so a function created where a dead disabled
    one had lived (HF's GemmaModel.forward, after another test's kiln.disable) counted as
    disabled: a graph break Dynamo does not have."""
    from kiln.capture.rules import classify

    def make():
        def helper(t):
            return t + 1
        return helper

    kiln.disable(make())  # the only reference to it is the registry's
    fresh = []
    for _ in range(50):  # with bare ids, CPython hands the freed address to the next function
        fresh.append(make())
    assert all(classify(f) == "inline" for f in fresh)


def test_function_wrapped_by_kiln_disable():
    backend = CountingBackend()
    compiled = kiln.compile(calls_disabled, backend=backend)
    _compare(calls_disabled, compiled, _randn(5), calls=3)
    # graph 1: sin; the disabled function runs natively (not compiled: no graph of its own);
    # graph 2: cos.
    assert backend.count == 2, f"{backend.count} graphs"
    for gm in backend.gms:
        assert "mul" not in target_names(gm)  # disabled_helper's ops are never captured
    out = kiln.explain(calls_disabled)(torch.randn(5))
    assert out.graph_count == 2
    assert any(_points_at(r, "BRK-DISABLE") for r in out.break_reasons), _render_all(out)


# --- unsupported builtins, objects and opcodes ----------------------------------------------------

def uses_id(x):
    y = x.sin()
    k = id(y)  # BRK-ID
    return y.cos() + (k != 0)


def test_unsupported_builtin_id():
    backend = CountingBackend()
    compiled = kiln.compile(uses_id, backend=backend)
    _compare(uses_id, compiled, _randn(5), calls=1)
    assert backend.count == 2  # sin | cos, add
    _compare(uses_id, compiled, _randn(5), calls=2)
    out = kiln.explain(uses_id)(torch.randn(5))
    assert out.graph_count == 2
    assert any(r.code == "id" and _points_at(r, "BRK-ID") for r in out.break_reasons), \
        _render_all(out)


def two_values(t):
    yield t * 2
    yield t * 3


def uses_generator(x):
    y = x.sin()
    gen = two_values(y)  # BRK-GEN
    a = next(gen)  # BRK-NEXT
    return (a + y).cos()


def test_generator_object_next():
    backend = CountingBackend()
    compiled = kiln.compile(uses_generator, backend=backend)
    _compare(uses_generator, compiled, _randn(5), calls=3)
    # A generator that is not consumed at once is not inlined: next(gen) is the break (the
    # unstarted generator is created again natively there). graph 1: sin; the resume function:
    # graph 2 = add, cos.
    assert backend.count == 2, f"{backend.count} graphs"
    out = kiln.explain(uses_generator)(torch.randn(5))
    assert out.graph_count == 2
    for record in out.break_reasons:  # every break says where it happened
        assert record.location is not None, record.render()
    assert any(_mentions_marker(r, "BRK-NEXT") for r in out.break_reasons), _render_all(out)


def try_in_forward(x):
    y = x.sin()
    try:
        print("inside try", y.shape)  # BRK-TRY
        z = routed_helper(y)
    except ValueError:
        z = y
    return z * 2


def routed_helper(t):
    return t.cos() + 1


def test_try_except_in_forward_is_route_only(capsys):
    backend = CountingBackend()
    compiled = kiln.compile(try_in_forward, backend=backend)
    for _ in range(3):
        x = torch.randn(5)
        expected = try_in_forward(x.clone())
        eager_text = capsys.readouterr().out
        assert_same_structure_and_values(expected, compiled(x))
        assert capsys.readouterr().out == eager_text
    # A break inside `try` cannot resume: try_in_forward runs route-only (no graph of its own),
    # but routed_helper, which it calls, is compiled through kiln: exactly 1 graph (cos, add).
    assert backend.count == 1
    assert target_names(backend.gm) == ["cos", "add"]
    out = kiln.explain(try_in_forward)(torch.randn(5))
    assert out.graph_count == 1
    (record,) = out.break_reasons
    assert _points_at(record, "BRK-TRY")
    assert any("try" in h for h in record.hints), record.render()


class Box:
    """A plain object; equal when its attributes are (compared with eager's deep copy)."""

    def __eq__(self, other):
        return type(other) is Box and vars(self) == vars(other)


def defines_class(x, box):
    y = x.sin()
    box.tmp = y.sum()
    class Local:  # BRK-CLASS
        pass
    box.kind = Local.__name__
    return y.cos()


def test_unsupported_opcode_class_statement():
    backend = CountingBackend()
    compiled = kiln.compile(defines_class, backend=backend)
    _compare(defines_class, compiled, lambda: (torch.randn(5), Box()), calls=3)
    # LOAD_BUILD_CLASS is not a call or a branch: kiln cannot resume after it, so the function
    # runs route-only (no graph of its own; it calls nothing kiln could compile): 0 graphs.
    assert backend.count == 0
    out = kiln.explain(defines_class)(torch.randn(5), Box())
    assert out.graph_count == 0
    (record,) = out.break_reasons
    assert record.code == "unsupported-opcode" and _points_at(record, "BRK-CLASS")


# --- new input values do not recompile the resume functions over and over -----------------------

STORM_CASES = [print_between, use_item, use_float, use_int, use_bool, use_tolist, use_numpy,
               crc_of_tensor, branch_on_sum, explicit_break, calls_disabled, uses_id]


@pytest.mark.parametrize("fn", STORM_CASES, ids=[f.__name__ for f in STORM_CASES])
def test_fresh_inputs_do_not_recompile_resume_functions(fn):
    """The values that cross a break (a Python number read from a tensor, a NumPy array or
    scalar, bytes from a C call, an id) change on every call with fresh inputs. Each compiled
    function (the original and every resume function) may recompile at most once (TorchDynamo's
    automatic dynamic: a value that changed becomes an input), never once per new value until the
    recompile limit. Ten calls with fresh inputs (both branch directions for branch_on_sum)."""
    from kiln import records
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(10):
                _compare(fn, compiled, _randn(7), calls=1)
    finally:
        records.active_recorders().remove(recorder)
    per_function = collections.Counter(r.function for r in recorder.recompiles)
    storm = {name: n for name, n in per_function.items() if n > 1}
    assert not storm, "recompiled more than once: " + "; ".join(
        f"{name} x{n}" for name, n in storm.items()) + \
        f"\nfirst reason: {recorder.recompiles[0].render()}"


# ==================================================================================================
# 2. Resume into a `with` block, then an exception with a non-empty operand stack (T17, T33)
# ==================================================================================================

def raises_value_error(t):
    raise ValueError(f"bad value of shape {tuple(t.shape)}")


@kiln.disable
def raises_value_error_natively(t):
    raise ValueError(f"bad value of shape {tuple(t.shape)}")


def with_break_then_raise(x):
    y = x.sin()
    with torch.no_grad():
        print("inside no_grad", torch.is_grad_enabled())
        z = [1, 2, raises_value_error(y)]
    return z


def with_break_then_raise_native(x):
    y = x.sin()
    with torch.no_grad():
        print("inside no_grad", torch.is_grad_enabled())
        for _ in range(1):  # the resume function breaks inside this loop: it runs route-only,
            z = [1, 2, raises_value_error(y)]  # i.e. its own bytecode raises here
    return z


def nested_withs_break_then_raise(x):
    y = x.sin()
    with torch.no_grad():
        with torch.enable_grad():
            print("inside enable_grad", torch.is_grad_enabled())
            z = (y, 3, raises_value_error_natively(y))
    return z


def with_break_then_caught(x):
    y = x.sin()
    with torch.no_grad():
        print("inside no_grad", torch.is_grad_enabled())
        try:
            z = [1, 2, raises_value_error_natively(y)]
        except ValueError as err:
            z = [str(err), torch.is_grad_enabled(), y * 2]
    return z, torch.is_grad_enabled()


RAISING = [with_break_then_raise, with_break_then_raise_native, nested_withs_break_then_raise]


@pytest.mark.parametrize("fn", RAISING, ids=[f.__name__ for f in RAISING])
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_exception_after_resume_into_with_block(fn, grad, capsys):
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        x = torch.randn(3, requires_grad=True)
        with torch.set_grad_enabled(grad):
            with pytest.raises(ValueError) as eager_info:
                fn(x)
            eager_text = capsys.readouterr().out
            with pytest.raises(ValueError) as info:
                compiled(x)
            assert torch.is_grad_enabled() is grad  # restored after the exception
        assert capsys.readouterr().out == eager_text
        assert type(info.value) is ValueError
        assert str(info.value) == str(eager_info.value) == "bad value of shape (3,)"
    assert torch.is_grad_enabled()
    # graph 1: sin (before the print), plus the grad-mode switches of the `with` blocks
    assert backend.count >= 1
    assert "sin" in target_names(backend.gms[0])


def test_exception_raised_by_native_resume_bytecode_unwinds_the_with_block():
    """The ValueError passes through a frame of the resume function itself (its bytecode ran:
    the break inside the loop makes it route-only), raised with the loop iterator and [1, 2] on
    the operand stack inside the `with` region the resume prefix jumped into: the exception
    table depths of that region are exercised (research §4.1)."""
    compiled = kiln.compile(with_break_then_raise_native, backend="eager")
    with pytest.raises(ValueError) as info:
        compiled(torch.randn(3, requires_grad=True))
    names = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert any(name.startswith("__resume_at_") for name in names), names
    assert torch.is_grad_enabled()


def test_exception_caught_inside_resumed_with_block(capsys):
    backend = CountingBackend()
    compiled = kiln.compile(with_break_then_caught, backend=backend)
    _compare(with_break_then_caught, compiled, lambda: (torch.randn(3, requires_grad=True),),
             calls=3)
    assert torch.is_grad_enabled()


_SUBPROCESS_SCENARIO = textwrap.dedent("""
    import sys
    import torch, kiln

    @kiln.disable
    def bad(t):
        raise ValueError("bad " + str(tuple(t.shape)))

    def plain_bad(t):
        raise ValueError("bad " + str(tuple(t.shape)))

    def f(x):
        y = x.sin()
        with torch.no_grad():
            print("inside", torch.is_grad_enabled())
            for _ in range(1):  # the resume breaks in a loop: its own bytecode runs and raises
                z = [1, 2, plain_bad(y)]
        return z

    def g(x):
        y = x.sin()
        with torch.no_grad():
            with torch.enable_grad():
                print("inside", torch.is_grad_enabled())
                z = (y, 3, plain_bad(y))
        return z

    def h(x):
        y = x.sin()
        with torch.no_grad():
            print("inside", torch.is_grad_enabled())
            try:
                z = [1, 2, bad(y)]
            except ValueError as err:
                z = [str(err), torch.is_grad_enabled()]
        return z

    fn = {"f": f, "g": g, "h": h}[sys.argv[1]]
    compiled = kiln.compile(fn, backend="eager")
    for _ in range(3):
        if fn is h:
            assert compiled(torch.randn(3)) == ["bad (3,)", False]
        else:
            try:
                compiled(torch.randn(3, requires_grad=True))
            except ValueError as err:
                assert str(err) == "bad (3,)", str(err)
            else:
                raise AssertionError("no ValueError")
        assert torch.is_grad_enabled()
    print("SCENARIO-OK")
""")


@pytest.mark.parametrize("scenario", ["f", "g", "h"],
                         ids=["native_resume_raises", "nested_withs_raise", "caught_in_resume"])
def test_exception_depth_scenario_in_subprocess(scenario, tmp_path):
    """The same scenarios in a fresh interpreter: a segfault (the §4.1 failure mode on 3.11)
    fails this test instead of killing pytest. f: the resume function's own bytecode raises
    inside the re-entered no_grad with [1, 2] on the stack; g: two nested blocks, captured
    resume; h: the ValueError is caught by a try inside the resumed with block."""
    script = tmp_path / "exception_depth.py"
    script.write_text(_SUBPROCESS_SCENARIO)
    proc = subprocess.run([sys.executable, str(script), scenario], capture_output=True, text=True,
                          timeout=300, env=child_env())
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "SCENARIO-OK" in proc.stdout


# ==================================================================================================
# 3. 1000 calls compile each resume function once (T24)
# ==================================================================================================

SINK = io.StringIO()


def two_breaks(x, w):
    y = x @ w
    kiln.graph_break()
    z = y.relu()
    print("z mean", z.mean(), file=SINK)
    return z.sum(dim=0)


def test_thousand_calls_compile_each_resume_once():
    backend = CountingBackend()
    compiled = kiln.compile(two_breaks, backend=backend)
    w = torch.randn(4, 3)
    _compare(two_breaks, compiled, lambda: (torch.randn(5, 4), w), calls=1)
    # graph 1: matmul; graph 2: relu, mean (before the print); graph 3: sum
    assert backend.count == 3
    assert len(breaks._resume_fns) == 2  # one per break point
    resume_fns = dict(breaks._resume_fns)
    for _ in range(1000):
        x = torch.randn(5, 4)
        out = compiled(x, w)
    torch.testing.assert_close(out, two_breaks(x, w), rtol=0, atol=0)
    assert backend.count == 3
    assert len(breaks._resume_fns) == 2
    assert dict(breaks._resume_fns) == resume_fns  # the same compiled resume functions
    assert len(breaks._resume_codes) == 2


# ==================================================================================================
# 4. A break inside a nested helper (T18)
# ==================================================================================================

def printing_helper(t):
    u = t.sin()
    print("helper sees", u.sum())  # BRK-HELPER
    return u.cos()


def calls_printing_helper(x):
    y = x * 2
    z = printing_helper(y)  # BRK-CALLSITE
    return z + 1


def test_break_inside_nested_helper(capsys):
    backend = CountingBackend()
    compiled = kiln.compile(calls_printing_helper, backend=backend)
    for _ in range(3):
        x = torch.randn(4)
        expected = calls_printing_helper(x.clone())
        eager_text = capsys.readouterr().out
        assert_same_structure_and_values(expected, compiled(x))
        assert capsys.readouterr().out == eager_text
    # The caller breaks at the call site: graph 1 = mul. The helper is called through kiln and
    # breaks at its own print: graph 2 = sin, sum; graph 3 = cos. The caller's resume: graph 4 =
    # add. Nothing recompiles on the next calls.
    assert backend.count == 4
    assert [target_names(g) for g in backend.gms] == [["mul"], ["sin", "sum"], ["cos"], ["add"]]

    out = kiln.explain(calls_printing_helper)(torch.randn(4))
    assert out.graph_count == 4
    assert all(r.code == "print" and _points_at(r, "BRK-HELPER") for r in out.break_reasons)
    # the caller's break shows the call site in its inline stack
    assert any(_mentions_marker(r, "BRK-CALLSITE") for r in out.break_reasons), _render_all(out)


# ==================================================================================================
# 5. A break inside a layer loop (T20)
# ==================================================================================================

class Layer(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


class LoopNet(nn.Module):
    def __init__(self, n=8, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([Layer(n) for _ in range(depth)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            print("layer", i, "sum", x.sum())  # BRK-LOOP
        return x


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval_no_grad"])
def test_break_inside_layer_loop(train, capsys):
    torch.manual_seed(0)
    model = LoopNet()
    reference = copy.deepcopy(model)
    model.train(train)
    reference.train(train)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    for call in range(20):
        x = torch.randn(2, 8)
        with torch.set_grad_enabled(train):
            expected = reference(x)
            eager_text = capsys.readouterr().out
            actual = compiled(x)
        assert capsys.readouterr().out == eager_text
        assert_same_structure_and_values(expected, actual)
        if call == 0:
            # forward runs route-only (break inside a loop); each layer instance is routed
            # through kiln, and layers (one class, same guarded state) share a graph (linear,
            # relu), each call reading its own layer's parameters. The first layer's input
            # differs (a leaf input vs a layer output: requires_grad), so at most 2 graphs,
            # as TorchDynamo.
            first = backend.count
            assert 1 <= first <= 2
            for gm in backend.gms:
                assert "linear" in target_names(gm) and "relu" in target_names(gm), \
                    target_names(gm)
    assert backend.count == first  # 20 calls: no recompile storm

    out = kiln.explain(copy.deepcopy(reference))(torch.randn(2, 8))
    assert out.graph_count <= 2  # explain runs with grad on: the leaf-input layer differs
    assert any(_points_at(r, "BRK-LOOP") for r in out.break_reasons), _render_all(out)
    record = next(r for r in out.break_reasons if _points_at(r, "BRK-LOOP"))
    assert any("loop" in h for h in record.hints), record.render()


def loop_then_with(x):
    for i in range(2):
        print("step", i)  # BRK-LOOP-WITH
        x = routed_helper(x)
    with torch.no_grad():
        y = x * 2
    return y, torch.is_grad_enabled()


def test_route_only_function_with_a_with_block(capsys):
    """A function that runs route-only (break inside a loop) and also has a `with` block that
    exits normally: the rewritten call sites must leave the `with` exit call alone."""
    backend = CountingBackend()
    compiled = kiln.compile(loop_then_with, backend=backend)
    for _ in range(3):
        x = torch.randn(4, requires_grad=True)
        expected = loop_then_with(x)
        eager_text = capsys.readouterr().out
        assert_same_structure_and_values(expected, compiled(x))
        assert capsys.readouterr().out == eager_text
        assert torch.is_grad_enabled()
    assert backend.count == 1  # routed_helper: cos, add (one graph, reused)


# ==================================================================================================
# 6. Side effects before a break happen in program order (T26)
# ==================================================================================================

STEP = 0


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.tag = "init"

    def forward(self, x, log, cfg):
        global STEP
        y = self.lin(x)
        self.tag = "before-print"
        log.append("appended-before")
        cfg["seen"] = len(log)
        STEP = STEP + 1
        print("during:", self.tag, log, cfg, STEP)
        self.tag = "after-print"
        log.append("appended-after")
        STEP = STEP + 10
        return y.relu()


def test_side_effects_before_a_break_happen_in_program_order(capsys):
    global STEP
    torch.manual_seed(0)
    model = Stateful()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=CountingBackend())
    for _ in range(2):
        x = torch.randn(2, 4)
        start = STEP
        eager_log, eager_cfg = ["start"], {"k": 1}
        expected = reference(x, eager_log, eager_cfg)
        eager_text = capsys.readouterr().out
        eager_step = STEP

        STEP = start
        log, cfg = ["start"], {"k": 1}
        actual = compiled(x, log, cfg)
        assert capsys.readouterr().out == eager_text
        assert eager_text.startswith("during: before-print ['start', 'appended-before'] "
                                     "{'k': 1, 'seen': 2}")
        assert_same_structure_and_values(expected, actual)
        assert log == eager_log and cfg == eager_cfg
        assert model.tag == reference.tag == "after-print"
        assert STEP == eager_step


def side_effects_fn(x, obj, items):
    global STEP
    obj.count = obj.count + 1
    items.append(obj.count)
    STEP = STEP + 1
    y = x.exp()
    print("state", obj.count, items, STEP, y.sum())
    items.append("late")
    return y


def test_side_effects_in_plain_function(capsys):
    global STEP
    compiled = kiln.compile(side_effects_fn, backend=CountingBackend())
    eager_obj, obj = Box(), Box()
    eager_obj.count = obj.count = 0
    for _ in range(2):
        x = torch.randn(3)
        start = STEP
        eager_items = []
        expected = side_effects_fn(x, eager_obj, eager_items)
        eager_text = capsys.readouterr().out
        eager_step = STEP
        STEP = start
        items = []
        actual = compiled(x, obj, items)
        assert capsys.readouterr().out == eager_text
        assert_same_structure_and_values(expected, actual)
        assert items == eager_items and obj.count == eager_obj.count and STEP == eager_step


# ==================================================================================================
# 7. Breaks with live stack values (T21, T22, T29)
# ==================================================================================================

def g_breaks(t):
    print("g got", t.shape)
    return t * 3


def combine(a, b, c):
    return a + b * c


def call_with_breaking_middle_arg(x, y, z):
    return combine(x.sin(), g_breaks(y), z.cos())


def add_float_of_sum(x, y):
    return x + float(y.sum())


class Scaler:
    def __init__(self, w):
        self.w = w

    def scale(self, v):
        return self.w * v


def method_chain(x, t, obj):
    y = x.cos()
    return obj.scale(float(t)).relu() + y  # BRK-METHOD


def kw_helper(a, k=1.0, *, m=2.0):
    return a * k + m


def keyword_at_break(x, t):
    y = x.sin()
    return kw_helper(y, k=float(t), m=0.5)


def kw_breaking(a, *, scale):
    print("kw_breaking", scale)
    return a * scale


def break_at_keyword_call(x):
    y = x.sin()
    return kw_breaking(y, scale=2.0).cos()


LIVE_STACK_CASES = [
    (call_with_breaking_middle_arg, lambda: (torch.randn(4), torch.randn(4), torch.randn(4))),
    (add_float_of_sum, lambda: (torch.randn(4), torch.randn(4))),
    (method_chain, lambda: (torch.randn(4), torch.randn(()), Scaler(torch.randn(4)))),
    (keyword_at_break, lambda: (torch.randn(4), torch.randn(()))),
    (break_at_keyword_call, lambda: (torch.randn(4),)),
]


@pytest.mark.parametrize("fn,make", LIVE_STACK_CASES, ids=[f.__name__ for f, _ in LIVE_STACK_CASES])
def test_break_with_live_stack_values(fn, make, capsys):
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(3):
        args = make()
        expected = fn(*copy.deepcopy(args))
        eager_text = capsys.readouterr().out
        assert_same_structure_and_values(expected, compiled(*args))
        assert capsys.readouterr().out == eager_text
    assert backend.count >= 2


def test_live_stack_graph_counts():
    """Exact counts: graphs before and after the break, plus the broken callee's own."""
    counts = {}
    for fn, make in LIVE_STACK_CASES:
        kiln.reset()
        backend = CountingBackend()
        kiln.compile(fn, backend=backend)(*make())
        counts[fn.__name__] = backend.count
    assert counts == {
        # sin | g_breaks routed: print first (no graph), then mul | cos, combine's add, mul
        "call_with_breaking_middle_arg": 3,
        # sum | add
        "add_float_of_sum": 2,
        # cos | mul (inlined scale), relu, add: the bound method obj.scale waits on the stack
        "method_chain": 2,
        # sin | mul, add (inlined kw_helper)
        "keyword_at_break": 2,
        # sin | kw_breaking routed: print first (no graph), then mul | cos
        "break_at_keyword_call": 3,
    }, counts


def test_method_call_chain_break_is_reported_at_the_call():
    out = kiln.explain(method_chain)(torch.randn(4), torch.randn(()), Scaler(torch.randn(4)))
    assert any(_points_at(r, "BRK-METHOD") for r in out.break_reasons), _render_all(out)
    assert out.graph_count == 2


# ==================================================================================================
# 8. fullgraph=True raises at the first break (T27)
# ==================================================================================================

def two_different_breaks(x):
    y = x.sin()
    print("first break", y.shape)  # BRK-FULLGRAPH
    s = float(y.sum())
    return y * s


def test_fullgraph_raises_at_first_break(capsys):
    backend = CountingBackend()
    compiled = kiln.compile(two_different_breaks, backend=backend, fullgraph=True)
    with pytest.raises(kiln.errors.UnsupportedError) as info:
        compiled(torch.randn(3))
    msg = str(info.value)
    assert THIS_FILE in msg, msg
    assert _mentions_line(msg, _line_of("BRK-FULLGRAPH")), msg
    assert _source_of("BRK-FULLGRAPH") in msg, msg
    assert "float(y.sum())" not in msg, msg  # the first break only
    assert backend.count == 0
    assert capsys.readouterr().out == ""  # nothing ran


def test_fullgraph_raises_for_break_inside_helper():
    compiled = kiln.compile(calls_printing_helper, backend="eager", fullgraph=True)
    with pytest.raises(kiln.errors.UnsupportedError) as info:
        compiled(torch.randn(3))
    msg = str(info.value)
    assert _mentions_line(msg, _line_of("BRK-HELPER")), msg
    assert _mentions_line(msg, _line_of("BRK-CALLSITE")), msg  # the user stack


# ==================================================================================================
# 9. The seed diagnostic call: explain on the seed block with a print and a float (issue 5)
# ==================================================================================================

class DiagnosedBlock(TransformerBlock):
    def forward(self, x):
        attn_out, _ = self.attn(x, x, x)
        x = self.norm1(x + attn_out)
        print("after attention:", tuple(x.shape))  # BRK-SEED-PRINT
        scale = float(x.mean())  # BRK-SEED-FLOAT
        mlp_out = self.mlp(x)
        x = self.norm2(x + mlp_out * (1.0 + scale))
        return x


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar")
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval_no_grad"])
def test_seed_diagnostic_call_reports_both_breaks(train, capsys):
    torch.manual_seed(0)
    model = DiagnosedBlock(d_model=32, nhead=4)
    reference = copy.deepcopy(model)
    model.train(train)
    reference.train(train)
    x = torch.randn(2, 8, 32)
    with torch.set_grad_enabled(train):
        expected = reference(x)
        eager_text = capsys.readouterr().out
        out = kiln.explain(model)(x)
        explain_text = capsys.readouterr().out
        actual = kiln.compile(model, backend=CountingBackend())(x)
        compiled_text = capsys.readouterr().out
    assert explain_text == eager_text == compiled_text
    assert_same_structure_and_values(expected, actual)

    assert out.graph_break_count == 2, _render_all(out)
    by_marker = {}
    for marker in ("BRK-SEED-PRINT", "BRK-SEED-FLOAT"):
        hits = [r for r in out.break_reasons if _points_at(r, marker)]
        assert hits, f"no break at {THIS_FILE}:{_line_of(marker)}:\n{_render_all(out)}"
        by_marker[marker] = hits[0]
        assert hits[0].location.source == _source_of(marker)
        rendered = hits[0].render()
        assert THIS_FILE in rendered and _mentions_line(rendered, _line_of(marker))
        assert _source_of(marker) in rendered
    assert by_marker["BRK-SEED-PRINT"].code == "print"
    # graph 1: attention + norm1; graph 2: mean (between the breaks); graph 3: mlp + norm2
    assert out.graph_count == 3
    text = str(out)
    assert _source_of("BRK-SEED-PRINT") in text and _source_of("BRK-SEED-FLOAT") in text


# ==================================================================================================
# 10. Identical breaks are reported once
# ==================================================================================================

def calls_helper_twice(x):
    y = printing_helper(x)
    z = printing_helper(y * 2)
    return z


def test_identical_breaks_reported_once(capsys):
    out = kiln.explain(calls_helper_twice)(torch.randn(4))
    assert out.graph_break_count == 1, _render_all(out)
    (record,) = out.break_reasons
    assert record.code == "print" and _points_at(record, "BRK-HELPER")
    capsys.readouterr()
    compiled = kiln.compile(calls_helper_twice, backend="eager")
    x = torch.randn(4)
    expected = calls_helper_twice(x.clone())
    eager_text = capsys.readouterr().out
    assert_same_structure_and_values(expected, compiled(x))
    assert capsys.readouterr().out == eager_text


# ==================================================================================================
# 11. Every break record is complete: a location in user code and one or two hints (issue item 6)
# ==================================================================================================

RECORD_CASES = [
    (print_between, _randn(5)), (use_item, _randn(5)), (use_float, _randn(5)),
    (use_int, _randn(5)), (use_bool, _randn(5)), (use_tolist, _randn(5)),
    (use_numpy, _randn(5)), (crc_of_tensor, _randn(5)), (branch_on_sum, _randn(5)),
    (explicit_break, _randn(5)), (calls_disabled, _randn(5)), (uses_id, _randn(5)),
    (uses_generator, _randn(5)), (try_in_forward, _randn(5)),
    (defines_class, lambda: (torch.randn(5), Box())),
    (method_chain, lambda: (torch.randn(4), torch.randn(()), Scaler(torch.randn(4)))),
    (calls_printing_helper, _randn(5)),
]


@pytest.mark.parametrize("fn,make", RECORD_CASES, ids=[f.__name__ for f, _ in RECORD_CASES])
def test_break_record_has_location_and_hints(fn, make, capsys):
    out = kiln.explain(fn)(*make())
    assert out.break_reasons, f"{fn.__name__}: no break recorded"
    for record in out.break_reasons:
        assert record.location is not None, f"no location:\n{record.render()}"
        assert _mentions_marker_file(record), f"no frame in {THIS_FILE}:\n{record.render()}"
        assert 1 <= len(record.hints) <= 2, f"{len(record.hints)} hints:\n{record.render()}"


def _mentions_marker_file(record) -> bool:
    frames = ([record.location] if record.location is not None else []) + list(record.stack)
    return any(os.path.basename(f.filename) == THIS_FILE and f.source for f in frames)
