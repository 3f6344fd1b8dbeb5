"""decode -> assemble over every plain-Python function of torch.nn.modules, and real modules run
with their `forward` replaced by the identity-transformed one (compared with eager)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types

import pytest

torch = pytest.importorskip("torch")
if sys.version_info[:2] >= (3, 14):
    pytest.skip("the bytecode layer supports 3.11 to 3.13", allow_module_level=True)

import torch.nn as nn  # noqa: E402

from kiln.capture.bytecode import decode, identity_code, identity_transform  # noqa: E402
from test_bytecode_roundtrip import _all_codes, exn_table, shape  # noqa: E402


def _nn_module_functions() -> list[types.FunctionType]:
    """Every function object (methods, static/class methods, property accessors) found in the
    classes defined in torch.nn.modules.*, once each."""
    found: dict[types.CodeType, types.FunctionType] = {}
    for info in pkgutil.iter_modules(nn.modules.__path__, "torch.nn.modules."):
        mod = importlib.import_module(info.name)
        for cls in vars(mod).values():
            if not (inspect.isclass(cls) and cls.__module__ == mod.__name__):
                continue
            for attr in vars(cls).values():
                for fn in _functions_of(attr):
                    found.setdefault(fn.__code__, fn)
    return list(found.values())


def _functions_of(attr) -> list[types.FunctionType]:
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    if isinstance(attr, property):
        return [f for f in (attr.fget, attr.fset, attr.fdel) if isinstance(f, types.FunctionType)]
    attr = inspect.unwrap(attr) if callable(attr) else attr
    return [attr] if isinstance(attr, types.FunctionType) else []


NN_FUNCTIONS = _nn_module_functions()


def test_nn_modules_has_many_functions():
    assert len(NN_FUNCTIONS) > 500


def test_every_nn_function_round_trips_structurally():
    failures = []
    for fn in NN_FUNCTIONS:
        try:
            new = identity_code(fn.__code__)
            for old_code, new_code in zip(_all_codes(fn.__code__), _all_codes(new)):
                if shape(decode(new_code)) != shape(decode(old_code)):
                    failures.append(f"{fn.__qualname__}: decoded shape differs")
                elif exn_table(new_code) != exn_table(old_code):
                    failures.append(f"{fn.__qualname__}: exception table differs")
                elif new_code.co_stacksize != old_code.co_stacksize:
                    failures.append(f"{fn.__qualname__}: stacksize differs")
        except Exception as e:  # collect all failures, report them together
            failures.append(f"{fn.__qualname__}: {type(e).__name__}: {e}")
    assert not failures, "\n".join(failures[:30])


def _mha(train: bool):
    m = nn.MultiheadAttention(16, 4, dropout=0.0, batch_first=True)
    return m.train(train), (torch.randn(2, 5, 16),) * 3


MODULES = {
    "Linear": lambda: (nn.Linear(8, 4), (torch.randn(3, 8),)),
    "LayerNorm": lambda: (nn.LayerNorm(8), (torch.randn(3, 8),)),
    "MHA-train": lambda: _mha(True),
    "MHA-eval": lambda: _mha(False),
    "Conv2d": lambda: (nn.Conv2d(3, 4, 3, padding=1), (torch.randn(2, 3, 8, 8),)),
    "BatchNorm2d-train": lambda: (nn.BatchNorm2d(3).train(), (torch.randn(4, 3, 5, 5),)),
    "GELU": lambda: (nn.GELU(approximate="tanh"), (torch.randn(5, 7),)),
    "Dropout0": lambda: (nn.Dropout(p=0.0), (torch.randn(5, 7),)),
    "Sequential": lambda: (nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2)),
                           (torch.randn(4, 6),)),
    "Embedding": lambda: (nn.Embedding(10, 4, padding_idx=0), (torch.randint(0, 10, (3, 5)),)),
    "TransformerEncoderLayer": lambda: (
        nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True),
        (torch.randn(2, 5, 16),)),
    "TransformerEncoderLayer-eval": lambda: (
        nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0,
                                   batch_first=True).eval(), (torch.randn(2, 5, 16),)),
    "LSTM": lambda: (nn.LSTM(4, 6, batch_first=True), (torch.randn(2, 3, 4),)),
}


def _transform_forwards(module: nn.Module) -> None:
    """Replace `forward` of every submodule by the identity-transformed class function."""
    for sub in module.modules():
        fn = type(sub).forward
        setattr(sub, "forward", types.MethodType(identity_transform(fn), sub))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_identity_transformed_forward_matches_eager(name):
    torch.manual_seed(0)
    module, inputs = MODULES[name]()
    expected = module(*inputs)
    if isinstance(module, nn.BatchNorm2d):  # running stats moved: rebuild the same module
        torch.manual_seed(0)
        module, _ = MODULES[name]()
    _transform_forwards(module)
    assert all("forward" in vars(m) for m in module.modules())
    actual = module(*inputs)
    torch.testing.assert_close(actual, expected)
