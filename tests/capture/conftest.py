"""Fixtures for capture tests: a clean kiln before every test, a counting backend, and
`check_capture`, which compiles one function with fullgraph=True and compares it with eager."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import pytest
import torch

import kiln
from helpers import CountingBackend, assert_same_structure_and_values



@pytest.fixture
def counting_backend() -> CountingBackend:
    """Records each graph it is given (`.gms`) and runs it unchanged; `.count` = graphs compiled."""
    return CountingBackend()


def _compare_inputs(expected: Any, actual: Any, path: str) -> None:
    """Tensors reachable through containers and dataclasses are equal after the call (input
    mutations match eager); other objects are checked by the tests themselves."""
    if isinstance(expected, torch.Tensor):
        assert_same_structure_and_values(expected, actual, path=path)
    elif dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        for field in dataclasses.fields(expected):
            _compare_inputs(getattr(expected, field.name), getattr(actual, field.name),
                            f"{path}.{field.name}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: len {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            _compare_inputs(e, a, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            _compare_inputs(expected[k], actual[k], f"{path}[{k!r}]")


@pytest.fixture
def check_capture(counting_backend: CountingBackend) -> Callable[..., Any]:
    """`check_capture(fn, *args, graphs=1, **kwargs)`: run `fn` eagerly on deep copies of the
    arguments, then compiled (fullgraph=True, counting backend) on the originals; assert the outputs
    have the same structure, types and values, the arguments were mutated the same way, and
    exactly `graphs` graphs were compiled (None: do not check). Returns the compiled output."""

    def check(fn: Callable[..., Any], *args: Any, graphs: int | None = 1, **kwargs: Any) -> Any:
        eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
        expected = fn(*eager_args, **eager_kwargs)
        compiled = kiln.compile(fn, backend=counting_backend, fullgraph=True)
        actual = compiled(*args, **kwargs)
        assert_same_structure_and_values(expected, actual)
        _compare_inputs(eager_args, args, "args")
        _compare_inputs(eager_kwargs, kwargs, "kwargs")
        if graphs is not None:
            assert counting_backend.count == graphs, \
                f"expected {graphs} graph(s), the backend got {counting_backend.count}"
        return actual

    return check
