"""Tests of kiln.capture.bytecode: canonical decoding (golden), decode -> assemble round trips on a
corpus of Python constructs, and the exception-depth regression of research §4.1 (T33).

Runs on 3.11 and 3.12 without torch (run with `-p no:conftest`-free conftest or `--noconftest`
where torch is missing)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import types

import pytest

from kiln.capture.bytecode import (ExnEntry, Instr, assemble, decode, decode_fresh, emit,
                                   identity_code,
                                   format_instrs, identity_transform)
from kiln.capture.bytecode.ir import UnsupportedBytecode

PY312 = sys.version_info[:2] == (3, 12)
if sys.version_info[:2] >= (3, 13):
    pytest.skip("the bytecode layer supports 3.11 and 3.12", allow_module_level=True)

REMOVED = {"CACHE", "PRECALL", "KW_NAMES", "EXTENDED_ARG", "END_FOR", "RETURN_CONST",
           "BINARY_SLICE", "STORE_SLICE", "LOAD_METHOD", "JUMP_FORWARD", "JUMP_BACKWARD",
           "JUMP_BACKWARD_NO_INTERRUPT", "LIST_TO_TUPLE", "UNARY_POSITIVE"}


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
    assert lines[1:] == [
        "LOAD_FAST 'x'",
        f"POP_JUMP_IF_FALSE {lines[2].split()[1]} -> {len(lines) - 2}",
        "LOAD_GLOBAL NULL+'g'",
        "LOAD_FAST 'x'",
        "LOAD_CONST 1",
        "CALL 2 kw=('k',)",
        "RETURN_VALUE",
        "LOAD_CONST None",
        "RETURN_VALUE",
    ]


# --- the round-trip corpus -----------------------------------------------------------------------

G_COUNTER = 0


def c_loops(n):
    out = []
    for i in range(n):
        if i == 2:
            continue
        if i == 7:
            break
        out.append(i)
    else:
        out.append("else")
    k = 0
    while k < n:
        k += 3
    return out, k


def c_try(x):
    log = []
    try:
        try:
            log.append(1 / x)
        except ZeroDivisionError as e:
            log.append(type(e).__name__)
            raise KeyError(x) from e
        finally:
            log.append("fin")
    except KeyError as e:
        log.append(repr(e))
    return log


class _CM:
    def __init__(self, log, swallow=False):
        self.log, self.swallow = log, swallow

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, t, v, tb):
        self.log.append(("exit", t))
        return self.swallow


def c_with(x):
    log = []
    with _CM(log, swallow=True) as cm:
        log.append(cm.swallow)
        1 / x
    with _CM(log):
        log.append(x)
    return log


def c_closure(n):
    total = 0

    def add(k):
        nonlocal total
        total += k
        return total
    for i in range(n):
        add(i)
    return total, add(100)


def c_cell_arg(a, b=2):
    def inner():
        return a * b
    a += 1
    return inner()


def c_lambda(xs):
    return sorted(xs, key=lambda v: (-v, v)), list(map(lambda v: v * 2, xs))


def c_generator(n):
    def gen(m):
        try:
            for i in range(m):
                got = yield i
                if got:
                    yield ("got", got)
        finally:
            yield "cleanup"
    g = gen(n)
    out = [next(g), g.send(None), g.send("hi"), next(g)]
    out.extend(g)
    return out


def c_yield_from(n):
    def inner(m):
        yield from range(m)
        return "done"

    def outer(m):
        r = yield from inner(m)
        yield r
    return list(outer(n))


def c_kwcalls(*args, **kwargs):
    def target(a, b=1, *rest, c, d=4, **kw):
        return a, b, rest, c, d, sorted(kw.items())
    return (target(1, c=3), target(*args, c=5, **kwargs), target(1, 2, 3, c=0, z=9),
            dict(x=1, **kwargs))


def c_fstrings(x, w):
    return f"{x}|{x!r}|{x!s:>{w}}|{x!a}|{x:08.3f}|{w=}"


def c_comprehensions(xs):
    i = "outer"
    a = [i * 2 for i in xs if i % 2]
    b = {i: i ** 2 for i in xs}
    c = {i % 3 for i in xs}
    d = sum(i for i in xs)
    e = [[j for j in range(i)] for i in xs[:3]]
    return a, b, c, d, e, i


def c_walrus(xs):
    out = []
    while (n := len(xs)) > 2:
        xs = xs[1:]
        out.append(n)
    return out, [y for v in range(5) if (y := v * v) > 3], n


class _Base:
    def m(self, x):
        return ("base", x)


class _Child(_Base):
    def m(self, x):
        return ("child", super().m(x + 1), super(_Child, self).m(0))


def c_super(x):
    return _Child().m(x)


def c_slices(xs):
    ys = list(xs)
    ys[1:3] = ["a", "b", "c"]
    del ys[0:1]
    ys[::2] = ys[::2]
    return ys[1:], ys[:-1], ys[::-1], ys[1:4:2]


def c_boolops(a, b, c):
    return (a and b, a or b, a and b or c, not a, 0 < a < b <= c, a == b != c,
            a if b else c, (a > 1) is True, a in (1, 2), a not in [c])


def c_unpack(seq):
    a, *b, c = seq
    (d, e), f = (a, c), b
    first, *_ = seq
    return a, b, c, d, e, f, first, [*b, *seq], {**{"k": a}}


def c_del_global(x):
    global G_COUNTER
    G_COUNTER += x
    y = x
    del y
    try:
        return y  # noqa: F821
    except UnboundLocalError:
        return G_COUNTER


def c_raise(x):
    if x > 1:
        raise ValueError(f"bad {x}")
    return x


def c_except_star(x):
    out = []
    try:
        raise ExceptionGroup("g", [ValueError(x), KeyError(x)])
    except* ValueError as eg:
        out.append(("v", len(eg.exceptions)))
    except* KeyError:
        out.append("k")
    return out


def c_class_in_function(x):
    class Local:
        attr = x

        def get(self):
            return self.attr + x

        @property
        def prop(self):
            return Local.attr
    return Local().get(), Local().prop, Local.__qualname__


def c_import_assert(x):
    import math
    from os import path as p
    assert x >= 0, "negative"
    return math.sqrt(x), p.sep


def c_misc_ops(a, b):
    return (a % b, a ** 2, a << 1, a >> 1, a & b, a | b, a ^ b, ~a, -a, a / b,
            divmod(a, b), "%s-%d" % (a, b), isinstance(a, int), [a] * 2)


def c_nested_try_loops(n):
    out = []
    for i in range(n):
        try:
            for j in range(i):
                try:
                    if j == 2:
                        raise IndexError(j)
                    out.append((i, j))
                except IndexError:
                    out.append("ie")
                    continue
                finally:
                    out.append("f")
        except Exception:
            out.append("never")
    return out


async def _aco(x):
    await asyncio.sleep(0)
    return x * 2


def c_coroutine(x):
    async def main():
        r = await _aco(x)
        async with _ACM() as v:
            r += v
        return r
    return asyncio.run(main())


class _ACM:
    async def __aenter__(self):
        return 1

    async def __aexit__(self, *a):
        return False


def _make_many_consts():
    body = " + ".join(f"{i}.5" for i in range(300))
    src = f"def c_many_consts(x):\n    return x + {body}\n"
    ns: dict = {}
    exec(compile(src, "<many_consts>", "exec"), ns)
    return ns["c_many_consts"]


def _make_far_jumps():
    lines = ["def c_far_jumps(x):", "    acc = 0", "    for i in range(x):", "        if i % 2:"]
    lines += [f"            acc += i * {k}" for k in range(200)]
    lines += ["        else:", "            acc -= 1", "    while acc > 1000:",
              "        acc //= 3"]
    lines += [f"        acc -= {k}" for k in range(150)]
    lines += ["    return acc"]
    ns: dict = {}
    exec(compile("\n".join(lines) + "\n", "<far_jumps>", "exec"), ns)
    return ns["c_far_jumps"]


c_many_consts = _make_many_consts()
c_far_jumps = _make_far_jumps()

CORPUS = [
    (c_loops, (10,)), (c_loops, (3,)), (c_try, (0,)), (c_try, (2,)), (c_try, ("s",)),
    (c_with, (0,)), (c_with, (1,)), (c_closure, (5,)), (c_cell_arg, (3,)), (c_lambda, ([3, 1, 2],)),
    (c_generator, (4,)), (c_yield_from, (3,)), (c_kwcalls, (7, 8)), (c_kwcalls, (1,)),
    (c_fstrings, (3.14159, 7)), (c_comprehensions, ([1, 2, 3, 4, 5],)), (c_walrus, ([1, 2, 3, 4],)),
    (c_super, (1,)), (c_slices, (range(8),)), (c_boolops, (1, 2, 3)), (c_boolops, (0, 2, 2)),
    (c_unpack, ([1, 2, 3, 4],)), (c_unpack, ([1],)), (c_del_global, (2,)), (c_raise, (1,)),
    (c_raise, (5,)), (c_except_star, (1,)), (c_class_in_function, (2,)),
    (c_import_assert, (4,)), (c_import_assert, (-1,)), (c_misc_ops, (7, 3)),
    (c_nested_try_loops, (5,)), (c_coroutine, (3,)), (c_many_consts, (1.0,)),
    (c_far_jumps, (30,)), (c_far_jumps, (1,)),
]
CORPUS_FUNCS = list(dict.fromkeys(fn for fn, _ in CORPUS))


def _all_codes(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _all_codes(c)


def _outcome(fn, args):
    """(result or exception type/message, line of the innermost raising frame in fn's file)."""
    global G_COUNTER
    G_COUNTER = 0
    try:
        return ("ok", repr(fn(*args)))
    except Exception as e:  # compare the exception as the user sees it
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        return ("raised", type(e).__name__, str(e), tb.tb_lineno, tb.tb_frame.f_code.co_name)


@pytest.mark.parametrize("fn,args", CORPUS, ids=[f"{f.__name__}{a!r}"[:40] for f, a in CORPUS])
def test_identity_round_trip(fn, args):
    new = identity_transform(fn)
    assert new.__code__ is not fn.__code__
    assert _outcome(new, args) == _outcome(fn, args)
    for old_code, new_code in zip(_all_codes(fn.__code__), _all_codes(new.__code__)):
        assert shape(decode(new_code)) == shape(decode(old_code)), old_code.co_name
        assert new_code.co_stacksize == old_code.co_stacksize, old_code.co_name
        assert exn_table(new_code) == exn_table(old_code), old_code.co_name
        assert new_code.co_code == old_code.co_code or _only_const_order(new_code, old_code)
        assert list(new_code.co_positions()) == list(old_code.co_positions()), old_code.co_name
        assert new_code.co_varnames == old_code.co_varnames
        for attr in ("co_name", "co_qualname", "co_filename", "co_firstlineno", "co_flags",
                     "co_cellvars", "co_freevars", "co_argcount", "co_kwonlyargcount"):
            assert getattr(new_code, attr) == getattr(old_code, attr), attr


def test_identity_keeps_function_attributes():
    def f(a, *, k=3):
        """doc"""
        return a + k
    f.extra = 1
    new = identity_transform(f)
    assert (new.__doc__, new.__kwdefaults__, new.__qualname__, new.__module__, new.extra) == (
        "doc", {"k": 3}, f.__qualname__, f.__module__, 1)
    assert new(1) == 4 and new.__code__.co_consts[0] == "doc"


def test_traceback_points_to_user_source():
    new = identity_transform(c_raise)
    with pytest.raises(ValueError) as info:
        new(9)
    entry = info.traceback[-1]
    assert entry.lineno + 1 == c_raise.__code__.co_firstlineno + 2
    assert "raise ValueError" in str(entry.statement)


def shape(instrs: list[Instr]) -> list[tuple]:
    """Everything that decode guarantees, with references as indices (for structural equality)."""
    def val(v):
        if isinstance(v, types.CodeType):
            return ("code", v.co_qualname, tuple(shape(decode(v))))
        if isinstance(v, float):
            return ("float", repr(v))
        return (type(v).__name__, repr(v))
    return [(i.opname, val(i.argval) if i.opname not in JUMPS else None, i.push_null, i.method,
             i.target.index if i.target is not None else None, i.lineno, i.positions,
             (i.exn.target.index, i.exn.depth, i.exn.lasti) if i.exn else None)
            for i in instrs]


JUMPS = {"JUMP", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE",
         "POP_JUMP_IF_NOT_NONE", "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", "FOR_ITER",
         "SEND"}


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


def _resume_into_try():
    def prefix(target):
        return [emit.load_fast("x"), emit.jump(target)]
    return _resume_at(_try_body, lambda ins: ins.opname == "PUSH_NULL", prefix)


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
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{root!r}, {here!r}]
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


def exn_table(code) -> list:
    """The exception table with entry starts moved past EXTENDED_ARG prefixes (CPython starts an
    entry at the prefix, the `bytecode` package at the instruction: the same coverage)."""
    import dis
    ext = {i.offset for i in dis.get_instructions(code) if i.opname == "EXTENDED_ARG"}
    out = []
    for e in _exn_table(code):
        start = e.start
        while start in ext:
            start += 2
        out.append(e._replace(start=start))
    return out


def _exn_table(code):
    from kiln.capture.bytecode._compat import exception_table
    return exception_table(code)


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


def _only_const_order(new, old) -> bool:
    """co_code may differ only in co_consts/co_names indices (the package re-orders tables)."""
    import dis
    a = [(i.opname, i.argrepr if i.opcode in dis.hasjrel else i.argval)
         for i in dis.get_instructions(new)]
    b = [(i.opname, i.argrepr if i.opcode in dis.hasjrel else i.argval)
         for i in dis.get_instructions(old)]
    return len(new.co_code) == len(old.co_code) and _eq_consts(a, b)


def _eq_consts(a, b) -> bool:
    if len(a) != len(b):
        return False
    for (n1, v1), (n2, v2) in zip(a, b):
        if n1 != n2:
            return False
        if isinstance(v1, types.CodeType) or isinstance(v2, types.CodeType):
            if getattr(v1, "co_qualname", 1) != getattr(v2, "co_qualname", 2):
                return False
        elif repr(v1) != repr(v2):
            return False
    return True


STDLIB_MODULES = ["argparse", "asyncio.base_events", "collections", "contextlib", "dataclasses",
                  "difflib", "email.message", "enum", "functools", "inspect", "json.decoder",
                  "pathlib", "pickle", "re._parser", "typing", "unittest.case", "zipfile"]


def test_stdlib_code_objects_round_trip_structurally():
    """A wide sweep over real-world bytecode (works without torch, so it covers 3.12 too)."""
    import gc
    import importlib
    codes = []
    for name in STDLIB_MODULES:
        mod = importlib.import_module(name)
        for obj in gc.get_referrers(mod.__dict__):
            if isinstance(obj, types.FunctionType) and obj.__module__ == mod.__name__:
                codes.append(obj.__code__)
    codes = list({id(c): c for c in codes}.values())
    assert len(codes) > 1000
    failures = []
    for code in codes:
        try:
            new = identity_code(code)
        except Exception as e:
            failures.append(f"{code.co_qualname}: {type(e).__name__}: {e}")
            continue
        for old_c, new_c in zip(_all_codes(code), _all_codes(new)):
            if (shape(decode(new_c)) != shape(decode(old_c))
                    or exn_table(new_c) != exn_table(old_c)
                    or new_c.co_stacksize != old_c.co_stacksize
                    or not _only_const_order(new_c, old_c)):
                failures.append(f"{old_c.co_qualname} differs")
    assert not failures, "\n".join(failures[:30])
