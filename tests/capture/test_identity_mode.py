"""The identity-transform mode (KILN_IDENTITY_TRANSFORM=1): decode -> normalize -> assemble of
every compiled function, no capture. Run over the test suite's own functions and real models."""
from __future__ import annotations

import importlib
import pathlib
import sys
import types

import pytest
import torch

import kiln
from kiln.capture.bytecode import assemble, decode, decode_fresh
from kiln.config import config

TESTS = pathlib.Path(__file__).resolve().parent.parent


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _suite_codes():
    sys.path.insert(0, str(TESTS))
    try:
        for path in sorted(TESTS.rglob("*.py")):
            source = path.read_text()
            yield path.name, compile(source, str(path), "exec")
    finally:
        sys.path.remove(str(TESTS))


def _shape(instrs):
    """Opnames, argument values and jump targets by index (a jump's argval is its old byte
    offset, which may move when constants are renumbered)."""
    def arg(i):
        if i.target is not None:
            return None
        return "<code>" if isinstance(i.argval, types.CodeType) else repr(i.argval)
    return [(i.opname, arg(i), i.target.index if i.target is not None else None) for i in instrs]


def test_every_code_object_of_the_test_suite_round_trips():
    count = 0
    for name, module_code in _suite_codes():
        for code in _code_objects(module_code):
            rebuilt = assemble(decode_fresh(code), code)
            assert _shape(decode(rebuilt)) == _shape(decode(code)), f"{name}: {code.co_qualname}"
            count += 1
    assert count > 300


def _helper(x, scale=2.0, *rest, flag=True, **extra):
    total = sum(t.sum() for t in rest) if rest else 0
    with torch.no_grad():
        y = x * scale if flag else x
    try:
        y = y + extra["bias"]
    except KeyError:
        pass
    return [v * 2 for v in (y, total)], {k: v for k, v in extra.items()}


def test_identity_mode_compile_runs_the_transformed_code():
    x, b = torch.randn(4), torch.randn(4)
    with config.patch(identity_transform=True):
        compiled = kiln.compile(_helper)
    assert compiled is not _helper and compiled.__code__ is not _helper.__code__
    expected = _helper(x, 3.0, x, flag=False, bias=b)
    actual = compiled(x, 3.0, x, flag=False, bias=b)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize("train", [True, False])
def test_identity_mode_on_the_seed_block(train):
    from models import TransformerBlock
    torch.manual_seed(0)
    model = TransformerBlock(32, 4).train(train)
    x = torch.randn(2, 8, 32)
    with config.patch(identity_transform=True):
        compiled = kiln.compile(model)
    with torch.set_grad_enabled(train):
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


_ = importlib
