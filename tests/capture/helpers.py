"""Helpers for capture tests: a counting backend, exact eager-vs-compiled comparison of nested
outputs, and readers for the captured FX graphs (placeholders, sources, call targets, provenance).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

__all__ = [
    "CountingAot",
    "CountingBackend",
    "line_of",
    "mentions_line",
    "assert_grads_equal",
    "assert_graph_provenance",
    "assert_params_lifted",
    "assert_same_structure_and_values",
    "call_nodes",
    "eager_copy",
    "normalize_source",
    "placeholder_sources",
    "placeholders",
    "target_name",
    "target_names",
]


class CountingBackend:
    """A backend that records every graph it is given and runs it unchanged.

    `gms[i]` is the i-th captured GraphModule and `example_inputs[i]` its example inputs;
    `count` is how many graphs were compiled."""

    def __init__(self) -> None:
        self.gms: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[Any]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        assert isinstance(gm, torch.fx.GraphModule), type(gm)
        self.gms.append(gm)
        self.example_inputs.append(list(example_inputs))
        return gm.forward

    @property
    def count(self) -> int:
        return len(self.gms)

    @property
    def gm(self) -> torch.fx.GraphModule:
        """The only graph; fails when there is not exactly one."""
        assert self.count == 1, f"expected exactly 1 graph, got {self.count}"
        return self.gms[0]


class CountingAot(CountingBackend):
    """aot_eager (the autograd stage, no generated kernels), counting the graphs capture hands
    it (the captures)."""

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        from kiln.backends.aot_eager import aot_eager
        super().__call__(gm, example_inputs)
        return aot_eager(gm, example_inputs)


# --- comparison -----------------------------------------------------------------------------------

def assert_same_structure_and_values(expected: Any, actual: Any, *, rtol: float = 0.0,
                                     atol: float = 0.0, path: str = "out") -> None:
    """Assert that two nested outputs have the same structure (container types, lengths, keys,
    namedtuple/dataclass types, None positions, Python scalars) and equal tensors (dtype, shape,
    device, requires_grad, values within rtol/atol; exact by default)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        assert type(actual) is type(expected), \
            f"{path}: tensor type {type(actual).__name__} != {type(expected).__name__}"
        assert actual.requires_grad == expected.requires_grad, \
            f"{path}: requires_grad {actual.requires_grad} != {expected.requires_grad}"
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
        return
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        for field in dataclasses.fields(expected):
            assert_same_structure_and_values(getattr(expected, field.name),
                                             getattr(actual, field.name), rtol=rtol, atol=atol,
                                             path=f"{path}.{field.name}")
        return
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{path}: len {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same_structure_and_values(e, a, rtol=rtol, atol=atol, path=f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert list(actual.keys()) == list(expected.keys()), \
            f"{path}: keys {list(actual.keys())} != {list(expected.keys())}"
        for k in expected:
            assert_same_structure_and_values(expected[k], actual[k], rtol=rtol, atol=atol,
                                             path=f"{path}[{k!r}]")
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_grads_equal(expected_module: torch.nn.Module, actual_module: torch.nn.Module, *,
                       rtol: float = 0.0, atol: float = 0.0) -> None:
    """Every parameter's .grad of two identical modules is equal (both None, or both close)."""
    exp = dict(expected_module.named_parameters())
    act = dict(actual_module.named_parameters())
    assert list(exp) == list(act)
    for name in exp:
        ge, ga = exp[name].grad, act[name].grad
        assert (ge is None) == (ga is None), \
            f"{name}.grad: eager {ge is None=}, compiled {ga is None=}"
        if ge is not None:
            torch.testing.assert_close(ga, ge, rtol=rtol, atol=atol,
                                       msg=lambda m, n=name: f"{n}.grad: {m}")


def eager_copy(module: torch.nn.Module) -> torch.nn.Module:
    """An identical, independent copy to run eagerly next to the compiled original."""
    return copy.deepcopy(module)


# --- graph readers --------------------------------------------------------------------------------

def placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def call_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def target_name(node: torch.fx.Node) -> str:
    """A readable name of a call node's target: 'add', 'scaled_dot_product_attention', ..."""
    t = node.target
    if isinstance(t, str):
        return t
    return getattr(t, "__name__", None) or str(t)


def target_names(gm: torch.fx.GraphModule) -> list[str]:
    return [target_name(n) for n in call_nodes(gm)]


_ITEM = re.compile(r"\[\s*(['\"]?)([^\]'\"]+)\1\s*\]")


def normalize_source(source: Any) -> str:
    """Render a placeholder's source as a dotted path: `L['self'].mlp._modules['0']._parameters
    ['weight']`, `self.mlp[0].weight` and `self.mlp.0.weight` all become `...mlp.0.weight`."""
    s = str(source)
    s = _ITEM.sub(lambda m: "." + m.group(2), s)
    for private in ("._modules", "._parameters", "._buffers"):
        s = s.replace(private, "")
    return s


def placeholder_sources(gm: torch.fx.GraphModule) -> list[str]:
    return [normalize_source(n.meta.get("source", "")) for n in placeholders(gm)]


def _provenance(node: torch.fx.Node) -> str:
    return f"{node.meta.get('user_location', '')}\n{node.meta.get('stack_trace', '')}"


def assert_graph_provenance(gm: torch.fx.GraphModule, user_file: str) -> None:
    """The capture contract for one graph: every placeholder has a FakeTensor `val` (for tensor
    inputs) and a string `source`; every call node has `val` and a user location; at least one
    node points at `user_file` (a basename)."""
    for node in placeholders(gm):
        assert "source" in node.meta, f"placeholder {node.name} has no meta['source']"
        assert isinstance(node.meta["source"], str) and node.meta["source"], \
            f"placeholder {node.name}: meta['source'] = {node.meta['source']!r}"
        assert "val" in node.meta, f"placeholder {node.name} has no meta['val']"
        if isinstance(node.meta["val"], torch.Tensor):
            assert isinstance(node.meta["val"], FakeTensor), \
                f"placeholder {node.name}: meta['val'] is {type(node.meta['val'])}, not FakeTensor"
    calls = call_nodes(gm)
    assert calls, "graph has no call nodes"
    for node in calls:
        assert "val" in node.meta, f"{node.format_node()}: no meta['val']"
        assert node.meta.get("user_location") or node.meta.get("stack_trace"), \
            f"{node.format_node()}: neither meta['user_location'] nor meta['stack_trace']"
    base = os.path.basename(user_file)
    assert any(base in _provenance(n) for n in calls), \
        f"no call node's user_location/stack_trace mentions {base}; " \
        f"first: {_provenance(calls[0])!r}"


def assert_params_lifted(gm: torch.fx.GraphModule, module: torch.nn.Module,
                         names: Iterable[str] | None = None) -> None:
    """Each named parameter and buffer of `module` (or the given names) is a placeholder whose
    source names it and whose FakeTensor matches its shape and dtype."""
    tensors = dict(module.named_parameters())
    tensors.update(dict(module.named_buffers()))
    names = list(tensors) if names is None else list(names)
    by_source = [(normalize_source(n.meta.get("source", "")), n) for n in placeholders(gm)]
    for name in names:
        hits = [n for s, n in by_source if s == name or s.endswith("." + name)]
        assert hits, f"no placeholder with a source naming {name!r}; sources: " \
                     f"{[s for s, _ in by_source]}"
        val = hits[0].meta.get("val")
        assert isinstance(val, FakeTensor), f"{name}: meta['val'] is {type(val)}"
        assert val.shape == tensors[name].shape and val.dtype == tensors[name].dtype, \
            f"{name}: fake {val.shape} {val.dtype} != real {tensors[name].shape} " \
            f"{tensors[name].dtype}"


def line_of(path: str, marker: str) -> int:
    """1-based line number of the only line of the file `path` ending in the comment
    `# marker` (tests mark the lines their break reasons must point at)."""
    with open(path) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def mentions_line(text: str, filename: str, lineno: int) -> bool:
    """Whether rendered text points at `lineno` ("line N" or "<filename>:N")."""
    return re.search(rf"(line {lineno}\b|{re.escape(filename)}:{lineno}\b)", text) is not None
