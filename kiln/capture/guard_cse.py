"""guard_cse: read each object path of a guard expression once per call.

A cache entry's guards are one `and` chain evaluated on every call. Guards on one object repeat
its path: a transformers config is reached as `self._modules['transformer'].__dict__['config']`
by ~40 guards of one GPT-2 entry, and each `.__dict__` / attribute read on it runs the config's
Python `__getattribute__` (two levels in transformers 5: ~0.7 us each, half of kiln's host time
per call at batch 1). `share_reads(expr)` names a path the first time the chain evaluates it
(`(__kc0 := self._modules['transformer'])`) and reuses the name after.

The entry's graph call shares its inputs' paths the same way (`capture/entry.py`): a layer's
parameters are `self._modules['h']._modules['0']..._parameters['weight']` and its siblings, and
a call's arguments, like an `and` chain's conjuncts, are all evaluated, left to right.

Safe because an `and` chain evaluates left to right and stops at the first false guard: a name
is only defined in a position that every later use is sure to have evaluated (a top-level
conjunct, outside nested `and`/`or`, conditional expressions, chained comparisons, lambdas and
comprehensions). Only attribute and constant-subscript paths rooted at a name are shared: they
read state, they do not change it (a getter with side effects would run once instead of several
times per call: the guard still sees what one read of it returns).
"""
from __future__ import annotations

import ast
from collections import Counter

__all__ = ["share_reads"]

PREFIX = "__kc"
# nodes under which a sub-expression may not run: no name is defined there
_CONDITIONAL = (ast.BoolOp, ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                ast.GeneratorExp)


def share_reads(expr: str) -> str:
    """`expr` (a guard chain) with each attribute / subscript path it reads twice or more read
    once; unchanged when nothing repeats."""
    tree = ast.parse(expr, mode="eval")
    counts = Counter(ast.dump(node) for node in ast.walk(tree) if _is_path(node))
    repeated = {key for key, n in counts.items() if n > 1}
    if not repeated:
        return expr
    sharer = _Sharer(repeated)
    body = tree.body
    if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And):
        body.values = [sharer.rewrite(v, may_define=True) for v in body.values]
    else:
        tree.body = sharer.rewrite(body, may_define=True)
    return ast.unparse(ast.fix_missing_locations(tree))


def _is_path(node: ast.AST) -> bool:
    """`a.b`, `a['k']`, `a.b['k'].c`: attribute reads and constant subscripts down from a name
    (a bare name is a local read already)."""
    if not isinstance(node, (ast.Attribute, ast.Subscript)):
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant):
            return False
        node = node.value
    return isinstance(node, ast.Name)


class _Sharer:
    def __init__(self, repeated: set[str]):
        self.repeated = repeated
        self.names: dict[str, str] = {}

    def rewrite(self, node: ast.AST, may_define: bool) -> ast.AST:
        """`node` with known paths replaced by their names and, where `may_define`, the first
        evaluation of a repeated path bound to a new name (children first: inner paths too)."""
        key = ast.dump(node) if _is_path(node) else None
        if key is not None and key in self.names:
            return ast.Name(self.names[key], ast.Load())
        inner = may_define and not isinstance(node, _CONDITIONAL) and not (
            isinstance(node, ast.Compare) and len(node.ops) > 1)
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                setattr(node, field, self.rewrite(value, inner))
            elif isinstance(value, list):
                setattr(node, field, [self.rewrite(v, inner) if isinstance(v, ast.AST) else v
                                      for v in value])
        if key is not None and key in self.repeated and may_define:
            name = self.names[key] = f"{PREFIX}{len(self.names)}"
            return ast.NamedExpr(ast.Name(name, ast.Store()), node)
        return node
