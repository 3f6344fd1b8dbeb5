"""The shrinker: reduce a failing program to a minimal one that still fails the same way.

Greedy passes over the program's syntax tree, repeated until none applies: delete a statement of
`fn` (or of `make_globals`), drop `a = b` copies, inline a branch or loop body, drop a returned
value, replace an assignment's right-hand side by one of the names it reads, and simplify inputs
(contiguous layout, smaller dims). A candidate is kept only when `still_fails(source)` says it
fails with the same failure class; the caller runs candidates in worker processes, so a
candidate that crashes is attributed and cannot take the shrinker down.
"""
from __future__ import annotations

import ast
import copy
import logging
from collections.abc import Callable, Iterator

__all__ = ["shrink_source"]

log = logging.getLogger("kiln.tools.fuzz")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _bodies(tree: ast.Module) -> Iterator[list[ast.stmt]]:
    for name in ("fn", "make_globals"):
        func = _function(tree, name)
        if func is not None:
            yield func.body


def _deletions(tree: ast.Module) -> Iterator[ast.Module]:
    for b, body in enumerate(_bodies(tree)):
        for i in reversed(range(len(body) - 1)):  # the last statement is the return
            cand = copy.deepcopy(tree)
            del list(_bodies(cand))[b][i]
            yield cand


def _inlines(tree: ast.Module) -> Iterator[ast.Module]:
    body = _function(tree, "fn").body
    for i, stmt in enumerate(body):
        for part in ("body", "orelse"):
            if isinstance(stmt, (ast.If, ast.For)) and getattr(stmt, part):
                cand = copy.deepcopy(tree)
                cbody = _function(cand, "fn").body
                cbody[i:i + 1] = copy.deepcopy(getattr(stmt, part))
                yield cand


def _returns(tree: ast.Module) -> Iterator[ast.Module]:
    ret = _function(tree, "fn").body[-1]
    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple):
        for i in range(len(ret.value.elts)):
            if len(ret.value.elts) > 1:
                cand = copy.deepcopy(tree)
                del _function(cand, "fn").body[-1].value.elts[i]
                yield cand


def _operands(tree: ast.Module) -> Iterator[ast.Module]:
    body = _function(tree, "fn").body
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Assign) and not isinstance(stmt.value, ast.Name):
            names = sorted({n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)
                            and n.id not in ("torch", "F")})
            for name in names:
                cand = copy.deepcopy(tree)
                _function(cand, "fn").body[i].value = ast.Name(name, ast.Load())
                yield cand


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def _renames(tree: ast.Module) -> Iterator[ast.Module]:
    """`a = b` followed by uses of `a`: use `b` and drop the copy (the operand pass leaves
    chains of these behind)."""
    body = _function(tree, "fn").body
    for i, stmt in enumerate(body):
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name)
                and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            cand = copy.deepcopy(tree)
            cbody = _function(cand, "fn").body
            rename = _Rename(stmt.targets[0].id, stmt.value.id)
            cbody[i + 1:] = [rename.visit(s) for s in cbody[i + 1:]]
            del cbody[i]
            yield cand


def _inputs(tree: ast.Module) -> Iterator[ast.Module]:
    calls = [n for n in ast.walk(_function(tree, "make_inputs")) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "make_tensor"]
    for k, call in enumerate(calls):
        layout = call.args[2]
        if isinstance(layout, ast.Constant) and layout.value != "contiguous":
            yield _edit_input(tree, k, lambda c: setattr(c.args[2], "value", "contiguous"))
        for d, dim in enumerate(getattr(call.args[0], "elts", [])):
            if isinstance(dim, ast.Constant) and dim.value > 1:
                yield _edit_input(tree, k, lambda c, d=d: setattr(c.args[0].elts[d], "value",
                                                                  c.args[0].elts[d].value - 1))


def _edit_input(tree: ast.Module, k: int, edit: Callable) -> ast.Module:
    cand = copy.deepcopy(tree)
    calls = [n for n in ast.walk(_function(cand, "make_inputs")) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "make_tensor"]
    edit(calls[k])
    return cand


_PASSES = (_deletions, _renames, _inlines, _returns, _operands, _inputs)


def shrink_source(source: str, still_fails: Callable[[str], bool], budget: int = 200) -> str:
    """The smallest variant of `source` found within `budget` checks that `still_fails`."""
    tree, tries = ast.parse(source), 0
    header = [line for line in source.splitlines() if line.startswith("#")][:1]
    progress = True
    while progress and tries < budget:
        progress = False
        for make in _PASSES:
            for cand in make(tree):
                if tries >= budget:
                    break
                tries += 1
                if still_fails(ast.unparse(cand) + "\n"):
                    tree, progress = cand, True
                    break
            if progress:
                break
    log.info("shrunk in %d checks", tries)
    return "\n".join(header + [ast.unparse(tree), ""])
