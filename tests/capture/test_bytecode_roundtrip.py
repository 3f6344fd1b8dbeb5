"""Round trips through kiln.capture.bytecode: decode -> assemble must preserve results, exceptions,
tracebacks, exception tables, stack sizes and the decoded structure, on a corpus of Python
constructs and on a sweep of stdlib code objects (3.11 and 3.12; no torch needed)."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from kiln.capture.bytecode import Instr, decode, identity_code, identity_transform

if sys.version_info[:2] >= (3, 14):
    pytest.skip("the bytecode layer supports 3.11 to 3.13", allow_module_level=True)

# --- the corpus -----------------------------------------------------------------------

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
