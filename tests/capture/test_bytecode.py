"""Tests of kiln.capture.bytecode: golden checks of the canonical form, code built with `emit` +
`assemble`, and the exception-depth regression of research §4.1 (T33). Round trips are in
test_bytecode_roundtrip.py. Needs no torch (3.11 and 3.12)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

from kiln.capture.bytecode import (ExnEntry, Instr, assemble, decode, decode_fresh, emit,
                                   format_instrs)
from kiln.capture.bytecode.instructions import UnsupportedBytecode
from test_bytecode_roundtrip import CORPUS_FUNCS, _CM, _all_codes, _exn_table

if sys.version_info[:2] >= (3, 14):
    pytest.skip("the bytecode layer supports 3.11 to 3.13", allow_module_level=True)

REMOVED = {"CACHE", "PRECALL", "KW_NAMES", "EXTENDED_ARG", "END_FOR", "RETURN_CONST",
           "BINARY_SLICE", "STORE_SLICE", "LOAD_METHOD", "JUMP_FORWARD", "JUMP_BACKWARD",
           "JUMP_BACKWARD_NO_INTERRUPT", "LIST_TO_TUPLE", "UNARY_POSITIVE", "CALL_KW",
           "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST",
           "SET_FUNCTION_ATTRIBUTE"}


def ops(fn) -> list[str]:
    return [i.opname for i in decode(fn.__code__)]


def find(fn, opname: str, **attrs) -> list[Instr]:
    return [i for i in decode(fn.__code__) if i.opname == opname
            and all(getattr(i, k) == v for k, v in attrs.items())]


# --- golden normalization ------------------------------------------------------------------------

def test_kw_call_is_one_call_with_kwnames():
    def f(g, x):
        return g(x, a=1, b=2)
    (call,) = find(f, "CALL")
    assert call.argval == (3, ("a", "b"))
    assert not {"PRECALL", "KW_NAMES"} & set(ops(f))


def test_method_call_is_method_load_attr():
    def f(xs):
        xs.append(1)
        return xs.real
    loads = find(f, "LOAD_ATTR")
    assert [(i.argval, i.method) for i in loads] == [("append", True), ("real", False)]
    assert find(f, "CALL")[0].argval == (1, ())


def test_load_global_push_null():
    def f():
        return len(ZZ)  # noqa: F821
    loads = find(f, "LOAD_GLOBAL")
    assert [(i.argval, i.push_null) for i in loads] == [("len", True), ("ZZ", False)]


def test_is_none_branch_is_directionless():
    def f(x):
        if x is None:
            return 1
        while x is not None:
            x = None
        return 2
    conds = [i for i in decode(f.__code__) if i.opname.startswith("POP_JUMP")]
    assert conds and all(i.opname in ("POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE") for i in conds)
    assert all(isinstance(i.target, Instr) for i in conds)
    instrs = decode(f.__code__)
    assert all(instrs[i.target.index] is i.target for i in conds)


def test_slices_become_build_slice_subscr():
    def f(a, b):
        a[0:1] = b
        return a[1:2]
    seq = ops(f)
    assert "BINARY_SLICE" not in seq and "STORE_SLICE" not in seq
    k = seq.index("STORE_SUBSCR")
    assert seq[k - 1] == "BUILD_SLICE" and find(f, "BUILD_SLICE")[0].argval == 2
    k = seq.index("BINARY_SUBSCR")
    assert seq[k - 1] == "BUILD_SLICE"


def test_return_const_is_load_const_return_value():
    def f():
        return 1
    assert ops(f)[-2:] == ["LOAD_CONST", "RETURN_VALUE"]
    load, ret = decode(f.__code__)[-2:]
    assert load.argval == 1 and load.offset is not None and ret.lineno == load.lineno


def test_for_loop_target_is_after_loop():
    def f(xs):
        t = 0
        for x in xs:
            t += x
        return t
    instrs = decode(f.__code__)
    (fi,) = [i for i in instrs if i.opname == "FOR_ITER"]
    assert "END_FOR" not in ops(f)
    after = fi.target
    assert after.opname == "LOAD_FAST" and after.argval == "t"
    back = instrs[after.index - 1]
    assert back.opname == "JUMP" and back.target is fi


def test_operator_argvals():
    def f(a, b):
        return (a < b, a @ b, a // b, +a, f"{a!r:>3}{b}", (*a,))
    (cmp,) = find(f, "COMPARE_OP")
    assert cmp.argval == "<"
    assert [i.argval for i in find(f, "BINARY_OP")] == ["@", "//"]
    assert [i.argval for i in find(f, "CALL_INTRINSIC_1")] == ["INTRINSIC_UNARY_POSITIVE",
                                                               "INTRINSIC_LIST_TO_TUPLE"]
    if sys.version_info[:2] >= (3, 13):  # FORMAT_VALUE was split into three opcodes
        assert [i.argval for i in find(f, "CONVERT_VALUE")] == ["repr"]
        assert len(find(f, "FORMAT_WITH_SPEC")) == 1 and len(find(f, "FORMAT_SIMPLE")) == 1
    else:
        assert [i.argval for i in find(f, "FORMAT_VALUE")] == [("repr", True), (None, False)]


def test_no_removed_opcodes_and_every_instr_has_a_line():
    for fn in CORPUS_FUNCS:
        for code in _all_codes(fn.__code__):
            instrs = decode(code)
            assert not REMOVED & {i.opname for i in instrs}, code.co_name
            assert all(i.lineno is not None for i in instrs), code.co_name
            assert [i.index for i in instrs] == list(range(len(instrs)))


def test_exception_entries_are_instr_objects():
    def f(cm, g):
        with cm:
            y = [1, 2, g()]
        return y
    instrs = decode(f.__code__)
    (call,) = [i for i in instrs if i.opname == "CALL" and i.argval == (0, ())]
    exn = call.exn
    assert isinstance(exn, ExnEntry) and exn.depth == 1 and exn.lasti
    assert exn.target.opname == "PUSH_EXC_INFO"
    assert instrs[exn.start.index] is exn.start and exn.start.index <= call.index <= exn.end.index
    assert "exn ->" in format_instrs(instrs)


def test_decode_is_cached_and_fresh_is_not():
    def f(x):
        return x
    assert decode(f.__code__) is decode(f.__code__)
    fresh = decode_fresh(f.__code__)
    assert fresh is not decode(f.__code__) and [i.opname for i in fresh] == ops(f)


def test_format_instrs_golden():
    def f(x):
        if x:
            return g(x, k=1)  # noqa: F821
        return None
    text = format_instrs(decode(f.__code__))
    lines = [" ".join(line.split()[2:]) for line in text.splitlines()]  # drop index and line
    to_bool = ["TO_BOOL"] if sys.version_info[:2] >= (3, 13) else []  # jumps need a bool
    jump = lines[2 + len(to_bool)]
    assert lines[1:] == [
        "LOAD_FAST 'x'",
        *to_bool,
        f"POP_JUMP_IF_FALSE {jump.split()[1]} -> {len(lines) - 2}",
        "LOAD_GLOBAL NULL+'g'",
        "LOAD_FAST 'x'",
        "LOAD_CONST 1",
        "CALL 2 kw=('k',)",
        "RETURN_VALUE",
        "LOAD_CONST None",
        "RETURN_VALUE",
    ]


# --- transforms built with emit -----------------------------------------------------------------

def _resume_at(fn, target_pred, prefix_factory):
    """A resume-style function: the header (up to RESUME), then `prefix`, then the whole original
    body (now only reachable through the prefix's jump)."""
    instrs = decode_fresh(fn.__code__)
    k = next(i for i, ins in enumerate(instrs) if ins.opname == "RESUME") + 1
    target = next(ins for ins in instrs[k:] if target_pred(ins))
    prefix = prefix_factory(target)
    emit.at(prefix, lineno=fn.__code__.co_firstlineno)
    code = assemble(instrs[:k] + prefix + instrs[k:], fn.__code__)
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _with_body(cm, g):
    y = 0
    with cm:
        y = [1, 2, g()]
    return y


def _try_body(x, f):
    try:
        return x + f()
    except ValueError:
        return "caught"


def _is_load_2_in_with(ins):
    return ins.opname == "LOAD_CONST" and ins.argval == 2 and ins.exn is not None


def _resume_into_with():
    # stack at `LOAD_CONST 2` inside the with body: [__exit__, 1]; the prefix re-enters the with
    # block (BEFORE_WITH) and rebuilds it, then jumps over the original TryBegin.
    def prefix(target):
        with_exn = target.exn
        body = [emit.load_const(0), emit.store_fast("y"), emit.load_fast("cm"),
                Instr("BEFORE_WITH"), emit.pop_top(), emit.load_const(1), emit.jump(target)]
        for ins in body[4:]:
            ins.exn = with_exn
        return body
    return _resume_at(_with_body, _is_load_2_in_with, prefix)


def _starts_call_of_f(ins):
    """The first instruction of `f()`: PUSH_NULL on 3.11/3.12; 3.13 loads f, then the NULL."""
    if sys.version_info[:2] >= (3, 13):
        return ins.opname == "LOAD_FAST" and ins.argval == "f"
    return ins.opname == "PUSH_NULL"


def _resume_into_try():
    def prefix(target):
        return [emit.load_fast("x"), emit.jump(target)]
    return _resume_at(_try_body, _starts_call_of_f, prefix)


def _boom():
    raise ValueError("boom")


def run_exception_depth_cases() -> str:
    """The T33 regression; returns a summary line (run in a subprocess by the test: on 3.11 a
    wrong exception depth segfaults the interpreter)."""
    fn = _resume_into_with()
    log: list = []
    try:
        fn(_CM(log), _boom)
    except ValueError as e:
        assert str(e) == "boom"
    else:
        raise AssertionError("ValueError did not propagate")
    assert log == ["enter", ("exit", ValueError)], log
    log2: list = []
    assert fn(_CM(log2), lambda: 3) == [1, 2, 3] and log2 == ["enter", ("exit", None)]
    swallowed: list = []
    assert fn(_CM(swallowed, swallow=True), _boom) == 0
    tf = _resume_into_try()
    assert tf(1, _boom) == "caught"
    assert tf(1, lambda: 2) == 3
    return "T33 OK"


def test_exception_depth_regression_in_subprocess():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    # a torch-less runner may have loaded kiln/kiln.capture as bare packages: do the same
    bare = [n for n in ("kiln", "kiln.capture")
            if n in sys.modules and getattr(sys.modules[n], "__file__", None) is None]
    code = textwrap.dedent(f"""
        import sys, types
        sys.path[:0] = [{root!r}, {here!r}]
        for name in {bare!r}:
            m = types.ModuleType(name)
            m.__path__ = [{root!r} + "/" + name.replace(".", "/")]
            sys.modules[name] = m
        import test_bytecode
        print(test_bytecode.run_exception_depth_cases())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "T33 OK" in proc.stdout


def test_exception_depth_is_the_decoded_one():
    fn = _resume_into_with()
    entries = {(e.depth, e.lasti) for e in _exn_table(fn.__code__)}
    orig = {(e.depth, e.lasti) for e in _exn_table(_with_body.__code__)}
    assert entries == orig and max(d for d, _ in entries) < 100


def test_emitted_loop_with_backward_forward_only_jumps():
    # FOR_ITER/conditional jumps whose target lies behind them need trampolines on 3.12
    def f(xs):
        return xs
    instrs = decode_fresh(f.__code__)
    k = next(i for i, ins in enumerate(instrs) if ins.opname == "RESUME") + 1
    ret = emit.return_value()
    exit_ = emit.load_fast("acc")
    acc0 = [emit.load_const(0), emit.store_fast("acc")]
    head = [emit.load_fast("xs"), emit.get_iter()]
    fi = emit.for_iter(exit_)
    body = [emit.store_fast("x"), emit.load_fast("x"), emit.pop_jump_if(False, fi),
            emit.load_fast("acc"), emit.load_fast("x"), emit.binary_op("+="),
            emit.store_fast("acc"), emit.jump(fi)]
    # layout: exit block placed BEFORE the loop, reached by a jump over it
    start = head[0]
    new = instrs[:k] + acc0 + [emit.jump(start), exit_, ret] + head + [fi] + body
    emit.at(new[k:], lineno=f.__code__.co_firstlineno)
    code = assemble(new, f.__code__)
    g = types.FunctionType(code, {}, "g")
    assert g([1, 0, 2, 3]) == 6 and g([]) == 0


def test_assemble_rejects_dangling_target():
    def f(x):
        return x
    instrs = decode_fresh(f.__code__)
    stray = emit.nop()
    k = next(i for i, ins in enumerate(instrs) if ins.opname == "RESUME") + 1
    with pytest.raises(Exception, match="not in the instruction list"):
        assemble(instrs[:k] + [emit.jump(stray)] + instrs[k:], f.__code__)


def test_stack_underflow_is_reported():
    def f(x):
        return x
    instrs = decode_fresh(f.__code__)
    k = next(i for i, ins in enumerate(instrs) if ins.opname == "RESUME") + 1
    with pytest.raises(Exception, match="stack underflow at POP_TOP"):
        assemble(instrs[:k] + [emit.pop_top()] + instrs[k:], f.__code__)


def test_unsupported_version_error_is_clear():
    assert issubclass(UnsupportedBytecode, NotImplementedError)
