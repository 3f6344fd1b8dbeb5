"""`python -m kiln explain TARGET`: kiln's explain report for a user's code, from the shell.

TARGET is one of
  path/to/script.py:make    a zero-argument callable in a script file,
  package.module:make       a zero-argument callable in an importable module,
  suite:NAME                a built-in suite model (small size, on the CPU) and a random batch.
The callable returns `(fn_or_module, args_tuple)`; the command calls it, runs
`kiln.explain(fn_or_module)(*args)` and prints the report. With `--arg-shapes`, the callable
named by TARGET is instead the function to explain itself, called on random float32 tensors of
the given shapes (e.g. `--arg-shapes 2x16x64 8`).

Suite models are explained in inference (eval, no_grad) unless `--train` is given; other targets
run as they are, with autograd on unless `--no-grad` is given.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from kiln.tools.explain import explain
from kiln.version import __version__

__all__ = ["add_arguments", "explain_command", "load_target"]




def _load_attr(target: str) -> Any:
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise SystemExit(f"kiln explain: target {target!r} must be 'path/to/script.py:function', "
                         "'module:function' or 'suite:NAME'")
    if where.endswith(".py") or os.path.sep in where or os.path.exists(where):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise SystemExit(f"kiln explain: no script file {where!r}")
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location("__kiln_explain_target__", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(where)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"kiln explain: {where!r} has no attribute {attr!r}") from None


def _suite_target(name: str, train: bool, size: str = "small") -> tuple[Any, tuple]:
    from kiln.tools.suite.model_registry import get
    try:
        spec = get(name)
    except KeyError as exc:
        raise SystemExit(f"kiln explain: {exc.args[0]}") from None
    torch.manual_seed(0)
    model, batch = spec.build(size)
    model.train(train)
    return model, batch.inputs


def load_target(target: str, arg_shapes: list[str] | None = None,
                train: bool = False, size: str = "small") -> tuple[Callable, tuple]:
    """The function (or module) to explain and the arguments to call it with (suite models at
    `size`, "small" or "full")."""
    if target.startswith("suite:"):
        return _suite_target(target[len("suite:"):], train, size)
    obj = _load_attr(target)
    if arg_shapes:
        shapes = [[int(d) for d in s.lower().split("x") if d] for s in arg_shapes]
        return obj, tuple(torch.randn(*shape) for shape in shapes)
    made = obj()
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise SystemExit(f"kiln explain: {target} must return (fn_or_module, args_tuple), got "
                         f"{type(made).__name__}")
    fn, args = made
    return fn, tuple(args) if isinstance(args, (list, tuple)) else (args,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="script.py:make, module:make or suite:NAME; make() "
                        "returns (fn_or_module, args_tuple)")
    parser.add_argument("--arg-shapes", nargs="+", metavar="SHAPE",
                        help="TARGET is the function itself; call it on random tensors of these "
                        "shapes (e.g. 2x16x64 8)")
    parser.add_argument("--train", action="store_true",
                        help="suite models: explain in training mode (default: eval, no_grad)")
    parser.add_argument("--no-grad", action="store_true", help="run under torch.no_grad()")
    parser.add_argument("--verbose", action="store_true",
                        help="list every guard (by default: a count and an example per kind)")
    parser.add_argument("--backend", default=None,
                        help="explain under this backend (e.g. aot_eager also reports what is "
                        "saved for backward)")


def explain_command(args: argparse.Namespace) -> int:
    fn, call_args = load_target(args.target, args.arg_shapes, args.train)
    suite = args.target.startswith("suite:")
    no_grad = args.no_grad or (suite and not args.train)
    ctx = torch.no_grad() if no_grad else contextlib.nullcontext()
    with ctx:
        report = explain(fn, backend=args.backend)(*call_args)
    print(f"kiln {__version__} explain {args.target}")
    print(report.render(verbose=args.verbose))
    return 0
