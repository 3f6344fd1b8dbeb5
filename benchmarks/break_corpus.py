"""Graph-break corpus: small functions with breaks, kiln vs TorchDynamo side by side.

Each case is a small function (or module) with one or more graph breaks: print at various
places, .item()/float()/int()/.tolist()/.numpy(), data-dependent if/while, nested helpers,
breaks inside `with` blocks, loops and try blocks, calls into non-torch C code, logging.

Per case, in one process:
  kiln    `kiln.explain(fn)(*args)` after `kiln.reset()`: graph_count, graph_break_count
  dynamo  `torch._dynamo.explain(fn)(*args)` after `torch._dynamo.reset()`: graph_count and
          len(break_reasons) (Dynamo's own graph_break_count is graph_count - 1)
  ok      kiln.compile(fn, backend="eager") matches an eager run on fresh inputs (outputs, argument
          mutations, printed text)

Usage: python benchmarks/break_corpus.py [--json PATH]
Prints a markdown table for RESULTS.md. tests/capture/test_graph_break_corpus.py runs the same
cases and asserts kiln's graph count is never above TorchDynamo's.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import logging
import os
import platform
import sys
import warnings
import zlib
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import kiln  # noqa: E402

# The corpus' logger writes to a buffer (never the console); records really are emitted, so
# logging runs its full path under both compilers.
LOG = logging.getLogger("kiln_break_corpus")
LOG.propagate = False
LOG.setLevel(logging.INFO)
LOG_STREAM = io.StringIO()
LOG.addHandler(logging.StreamHandler(LOG_STREAM))


# --- helpers the corpus functions call ------------------------------------------------------------

def _helper_print(t):
    u = t.sin()
    print("helper:", u.sum())
    return u.cos()


def _inner_print(t):
    print("inner:", t.shape)
    return t * 2


def _outer(t):
    u = t + 1
    return _inner_print(u).exp()


def _g_breaks(t):
    print("g:", t.mean())
    return t * 3


def _combine(a, b, c):
    return a + b * c


def _kw(a, k=1.0, *, m=2.0):
    return a * k + m


class _Scaler:
    def __init__(self, w):
        self.w = w

    def scale(self, v):
        return self.w * v


# --- the corpus -----------------------------------------------------------------------------------

def print_middle(x):
    y = x.sin()
    print("middle:", y.sum())
    return y.cos()


def print_first(x):
    print("first:", x.shape)
    return x.sin().cos()


def print_last(x):
    y = x.sin().cos()
    print("last:", y.mean())
    return y


def print_twice(x):
    y = x * 2
    print("one:", y.sum())
    z = y.exp()
    print("two:", z.sum())
    return z - 1


def item_scale(x):
    y = x.sin()
    s = y.sum().item()
    return y * s


def float_scale(x):
    y = x.relu()
    return y * float(y.mean())


def int_shift(x):
    y = x * 10
    n = int(y.max())
    return y + n


def tolist_first(x):
    y = x.sin()
    vals = y.tolist()
    return y + vals[0]


def numpy_sum(x):
    y = x.sin()
    arr = y.numpy()
    return y.cos() + float(arr.sum())


def numpy_chain(x):
    a = x.numpy()
    b = np.where(a > 0, a, 0.0) * 2
    m = b.mean(axis=0, keepdims=True)
    return torch.from_numpy(np.exp(b - m)) + x


def crc_checksum(x):
    y = x * 2
    c = zlib.crc32(y.numpy().tobytes())
    return y + (c % 7)


def if_on_sum(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def if_on_bool(x):
    y = x.sin()
    flag = bool((y > -2).all())
    z = y * 2 if flag else y * 3
    return z.cos()


def while_on_value(x):
    while x.sum() < 20:
        x = x + 1
    return x * 2


def nested_helper(x):
    y = x * 2
    z = _helper_print(y)
    return z + 1


def nested_two_levels(x):
    y = x.sin()
    z = _outer(y)
    return z.cos()


def helper_twice(x):
    y = _helper_print(x)
    return _helper_print(y * 2)


def break_in_no_grad(x):
    y = x.sin()
    with torch.no_grad():
        z = y * 2
        print("no_grad:", torch.is_grad_enabled())
        w = z.exp()
    return y + w


def break_in_nested_withs(x):
    y = x.sin()
    with torch.no_grad():
        with torch.enable_grad():
            z = y * 2
            print("enable_grad:", torch.is_grad_enabled())
            w = z.cos()
    return w + 1


def break_in_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("autocast:", y.dtype)
        z = y @ w
    return z.float().sum(dim=0)


def break_in_for_loop(x):
    for i in range(3):
        x = x * 2
        print("step", i)
    return x.sin()


def break_in_try(x):
    y = x.sin()
    try:
        print("try:", y.shape)
        z = y.cos()
    except ValueError:
        z = y
    return z * 2


def live_stack_call(x, y, z):
    return _combine(x.sin(), _g_breaks(y), z.cos())


def float_in_binary_op(x, y):
    x = x.cos()
    return x + float(y.sum())


def keyword_at_break(x, t):
    y = x.sin()
    return _kw(y, k=float(t), m=0.5)


def method_call_chain(x, t, obj):
    y = x.cos()
    return obj.scale(float(t)).relu() + y


def side_effects_then_print(x, items):
    y = x.exp()
    items.append(len(items))
    print("items:", items)
    items.append("late")
    return y * 2


def logging_call(x):
    y = x.sin()
    LOG.warning("shape %s", tuple(y.shape))
    return y.cos()


class _Layer(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


class LayerLoopPrint(nn.Module):
    def __init__(self, n=8, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([_Layer(n) for _ in range(depth)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            print("layer", i, x.shape)
        return x


class ModuleItemBreak(nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.a = nn.Linear(n, n)
        self.b = nn.Linear(n, n)

    def forward(self, x):
        h = self.a(x).relu()
        scale = h.abs().max().item()
        return self.b(h / scale)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable[..., Any] | None  # a function, or None for a module case
    make_args: Callable[[], tuple]
    what: str
    module: Callable[[], nn.Module] | None = None

    def target(self) -> Callable[..., Any]:
        """A fresh target: the function, or a new module (fixed seed) in eval mode."""
        if self.module is None:
            return self.fn
        torch.manual_seed(0)
        return self.module()


def _t(*shape):
    return lambda: (torch.randn(*shape),)


CASES: list[Case] = [
    Case("print_middle", print_middle, _t(8), "print between two ops"),
    Case("print_first", print_first, _t(8), "print before any op"),
    Case("print_last", print_last, _t(8), "print after the last op"),
    Case("print_twice", print_twice, _t(8), "two prints"),
    Case("item_scale", item_scale, _t(8), ".item() used in Python"),
    Case("float_scale", float_scale, _t(8), "float(tensor)"),
    Case("int_shift", int_shift, _t(8), "int(tensor)"),
    Case("tolist_first", tolist_first, _t(8), ".tolist()"),
    Case("numpy_sum", numpy_sum, _t(8), ".numpy() kept live"),
    Case("numpy_chain", numpy_chain, lambda: (torch.randn(4, 3),),
         "NumPy ops on .numpy(), then from_numpy (no break)"),
    Case("crc_checksum", crc_checksum, _t(8), "zlib.crc32 (C extension)"),
    Case("if_on_sum", if_on_sum, lambda: (torch.rand(8) + 0.1,), "data-dependent if"),
    Case("if_on_bool", if_on_bool, _t(8), "bool(tensor) then if"),
    Case("while_on_value", while_on_value, lambda: (torch.rand(4) + 2.0,), "data-dependent while"),
    Case("nested_helper", nested_helper, _t(8), "print inside a helper"),
    Case("nested_two_levels", nested_two_levels, _t(8), "print two calls deep"),
    Case("helper_twice", helper_twice, _t(8), "same breaking helper called twice"),
    Case("break_in_no_grad", break_in_no_grad, lambda: (torch.randn(8, requires_grad=True),),
         "print inside no_grad"),
    Case("break_in_nested_withs", break_in_nested_withs,
         lambda: (torch.randn(8, requires_grad=True),), "print inside no_grad/enable_grad"),
    Case("break_in_autocast", break_in_autocast, lambda: (torch.randn(4, 8), torch.randn(8, 8)),
         "print inside autocast"),
    Case("break_in_for_loop", break_in_for_loop, _t(8), "print inside a for loop"),
    Case("break_in_try", break_in_try, _t(8), "print inside try/except"),
    Case("live_stack_call", live_stack_call, lambda: (torch.randn(8), torch.randn(8),
                                                     torch.randn(8)), "f(a, g(b), c), g breaks"),
    Case("float_in_binary_op", float_in_binary_op, lambda: (torch.randn(8), torch.randn(8)),
         "x + float(y.sum())"),
    Case("keyword_at_break", keyword_at_break, lambda: (torch.randn(8), torch.randn(())),
         "foo(x, k=float(t))"),
    Case("method_call_chain", method_call_chain,
         lambda: (torch.randn(8), torch.randn(()), _Scaler(torch.randn(8))),
         "obj.method(float(t)).relu()"),
    Case("side_effects_then_print", side_effects_then_print, lambda: (torch.randn(8), [7]),
         "list.append, then print"),
    Case("logging_call", logging_call, _t(8), "logger.warning in forward"),
    Case("layer_loop_print", None, lambda: (torch.randn(2, 8),), "print in a layer loop (module)",
         module=LayerLoopPrint),
    Case("module_item_break", None, lambda: (torch.randn(2, 8),), ".item() between layers "
         "(module)", module=ModuleItemBreak),
]


# --- measuring ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Row:
    name: str
    what: str
    kiln_graphs: int
    kiln_breaks: int
    dynamo_graphs: int
    dynamo_breaks: int
    ok: bool
    error: str = ""


@contextlib.contextmanager
def _quiet():
    """Silence the corpus' own prints and the compilers' warnings."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _run_capturing(fn: Callable[..., Any], args: tuple) -> tuple[Any, str]:
    """fn(*args) and everything it printed or logged, in order."""
    buf = io.StringIO()
    LOG_STREAM.seek(0)
    LOG_STREAM.truncate()
    with contextlib.redirect_stdout(buf), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fn(*args)
    return result, buf.getvalue() + LOG_STREAM.getvalue()


def _equal(expected: Any, actual: Any) -> bool:
    """Same structure, types, dtypes and shapes; tensor values equal up to assert_close's
    tolerances (a traced NumPy reduction sums in another order than NumPy's pairwise sum)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or expected.dtype != actual.dtype or \
                expected.shape != actual.shape:
            return False
        try:
            torch.testing.assert_close(actual, expected, equal_nan=True)
        except AssertionError:
            return False
        return True
    if isinstance(expected, (list, tuple)):
        return type(expected) is type(actual) and len(expected) == len(actual) and \
            all(_equal(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, _Scaler):
        return isinstance(actual, _Scaler) and _equal(expected.w, actual.w)
    return type(expected) is type(actual) and expected == actual


def check_kiln(case: Case, calls: int = 2) -> tuple[bool, str]:
    """kiln.compile(target, backend="eager") vs eager on fresh inputs: outputs, argument
    mutations, printed text and log records."""
    kiln.reset()
    target = case.target()
    reference = copy.deepcopy(target) if isinstance(target, nn.Module) else target
    compiled = kiln.compile(target, backend="eager")
    for _ in range(calls):
        args = case.make_args()
        eager_args = copy.deepcopy(args)
        expected, eager_text = _run_capturing(reference, eager_args)
        actual, compiled_text = _run_capturing(compiled, args)
        if not _equal(expected, actual):
            return False, "output differs from eager"
        if not _equal(list(eager_args), list(args)):
            return False, "arguments mutated differently"
        if compiled_text != eager_text:
            return False, f"printed {compiled_text!r}, eager printed {eager_text!r}"
    return True, ""


def measure_kiln(case: Case) -> tuple[int, int]:
    kiln.reset()
    torch.manual_seed(0)
    args = case.make_args()
    with _quiet():
        out = kiln.explain(case.target())(*args)
    kiln.reset()
    return out.graph_count, out.graph_break_count


def measure_dynamo(case: Case) -> tuple[int, int]:
    import torch._dynamo
    torch._dynamo.reset()
    torch.manual_seed(0)
    args = case.make_args()
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    with _quiet():
        out = torch._dynamo.explain(case.target())(*args)
    torch._dynamo.reset()
    return out.graph_count, len(out.break_reasons)


def measure(case: Case) -> Row:
    ok, error = check_kiln(case)
    kg, kb = measure_kiln(case)
    dg, db = measure_dynamo(case)
    return Row(case.name, case.what, kg, kb, dg, db, ok, error)


def markdown(rows: list[Row]) -> str:
    lines = ["| function | what breaks | kiln graphs | kiln breaks | dynamo graphs | "
             "dynamo breaks | kiln = eager |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        flag = "" if r.kiln_graphs <= r.dynamo_graphs else " **(more)**"
        lines.append(f"| `{r.name}` | {r.what} | {r.kiln_graphs}{flag} | {r.kiln_breaks} | "
                     f"{r.dynamo_graphs} | {r.dynamo_breaks} | "
                     f"{'yes' if r.ok else 'NO: ' + r.error} |")
    kg = sum(r.kiln_graphs for r in rows)
    dg = sum(r.dynamo_graphs for r in rows)
    lines.append(f"| **total** ({len(rows)} functions) | | {kg} | "
                 f"{sum(r.kiln_breaks for r in rows)} | {dg} | "
                 f"{sum(r.dynamo_breaks for r in rows)} | "
                 f"{sum(r.ok for r in rows)}/{len(rows)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    opts = parser.parse_args()
    rows = [measure(case) for case in CASES]
    print(f"Python {platform.python_version()}, torch {torch.__version__}, "
          f"kiln {kiln.__version__}\n")
    print(markdown(rows))
    worse = [r.name for r in rows if r.kiln_graphs > r.dynamo_graphs]
    print(f"\nkiln graphs > dynamo graphs: {', '.join(worse) if worse else 'none'}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"python": platform.python_version(), "torch": torch.__version__,
                       "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
