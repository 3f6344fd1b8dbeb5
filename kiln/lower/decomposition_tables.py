"""decomposition_tables: the lower stage's decomposition machinery; the policy is the autograd
stage's.

Which ops are decomposed here, and why, is `kiln.autograd.decompositions` (kiln's one policy):

- `lowering_table()`: what the FX interpreter uses for an op that has no lowering rule (or whose
  rules' checkers all refuse): torch's Core ATen table minus what the lower stage keeps, plus the
  policy's `LOWER_EXTRAS`.
- `trace_table()`: what tests and tools trace ATen graphs with (`trace_aten`): the core table
  minus what the lower stage keeps.

A decomposition is applied by tracing it on fake tensors of the node's metadata
(`decompose(op, args, kwargs)`) and lowering the small ATen graph in place of the node; the
traced graphs are cached by op and argument metadata. A decomposition that traces to non-ATen
ops (prims) is refused, and the node falls back.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.fx

from kiln.autograd.decompositions import LOWER_EXTRAS, keeps
from kiln.autograd.rng import eager_rng, is_random
from kiln.lower import _compat

__all__ = ["decompose", "lowering_table", "reset", "trace_aten", "trace_table"]

log = logging.getLogger("kiln.lower")

_tables: dict[tuple[str, bool], dict] = {}
_traced: dict[Any, torch.fx.GraphModule | None] = {}


def trace_table() -> dict:
    key = ("trace", eager_rng())
    if key not in _tables:
        core = _compat.core_aten_decompositions()
        _tables[key] = {op: fn for op, fn in core.items() if _decomposed(op)}
    return _tables[key]


def _decomposed(op: Any) -> bool:
    """Whether the lower stage decomposes `op`. Under eager RNG (`rng.eager_rng`) a random op
    runs as the op itself, a library call drawing from torch's generator as eager does
    (decomposed, `native_dropout` drew `rand_like` where eager draws `bernoulli_`)."""
    return not keeps(op, "lower") and not (eager_rng() and is_random(op))


def trace_aten(fn: Callable[..., Any], *inputs: Any, decompositions: dict | None = None,
               functionalize: bool = True) -> torch.fx.GraphModule:
    """An ATen graph of `fn(*inputs)` for tests and tools: make_fx with `decompositions`
    (default: `trace_table()`, torch's core table minus what the lower stage keeps),
    functionalized so the graph does not mutate (views stay views)."""
    if decompositions is None:
        decompositions = trace_table()
    return _compat.make_aten_graph(fn, inputs, decompositions, functionalize)


def lowering_table() -> dict:
    key = ("lower", eager_rng())
    if key not in _tables:
        table = dict(trace_table())
        full = _compat.full_decomposition_table()
        for op in LOWER_EXTRAS:
            if op in full and _decomposed(op):
                table[op] = full[op]
        _tables[key] = table
    return _tables[key]


def reset() -> None:
    """Forget cached tables and traced decompositions (kiln.reset())."""
    _tables.clear()
    _traced.clear()


def _meta_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                value.dtype, str(value.device))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_meta_key(v) for v in value))
    if isinstance(value, dict):
        return ("D", tuple((k, _meta_key(v)) for k, v in sorted(value.items())))
    if isinstance(value, float) and value != value:
        return ("nan",)
    return (type(value).__name__, value)


def decompose(op: Any, meta_args: tuple, meta_kwargs: dict) -> torch.fx.GraphModule | None:
    """The decomposition of `op` traced on fake tensors shaped like `meta_args` (tensors are
    fake/meta values; everything else is passed as is), or None when there is none or it leaves
    ATen. The graph's placeholders are the flattened tensor arguments, in order."""
    table = lowering_table()
    fn = table.get(op)
    if fn is None:
        return None
    key = (op, _meta_key(meta_args), _meta_key(meta_kwargs))
    if key not in _traced:
        _traced[key] = _trace(fn, meta_args, meta_kwargs, table)
    return _traced[key]


def decompose_symbolic(op: Any, meta_args: tuple,
                       meta_kwargs: dict) -> torch.fx.GraphModule | None:
    """`decompose` for fake tensors with symbolic sizes: traced on those very tensors (their
    ShapeEnv's symbols flow into the graph's metas), never cached (the symbols differ)."""
    table = lowering_table()
    fn = table.get(op)
    if fn is None:
        return None
    return _trace(fn, meta_args, meta_kwargs, table, symbolic=True)


def _trace(fn: Callable[..., Any], meta_args: tuple, meta_kwargs: dict,
           table: dict, symbolic: bool = False) -> torch.fx.GraphModule | None:
    leaves, spec = _compat.tree_flatten((meta_args, meta_kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    if symbolic:
        fakes = [leaves[i] for i in positions]
        mode = _compat.fake_mode_of(fakes)
    else:
        mode = _compat.new_fake_mode(allow_non_fake_inputs=True)
        fakes = [_compat.fake_tensor_like(mode, leaves[i].shape, leaves[i].stride(),
                                          leaves[i].dtype, leaves[i].device,
                                          leaves[i].storage_offset())
                 for i in positions]

    def call(*tensors: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        args, kwargs = _compat.tree_unflatten(filled, spec)
        out = fn(*args, **kwargs)
        return tuple(out) if isinstance(out, tuple) else out

    try:
        gm = _compat.trace_fake(call, fakes, table, mode)
    except Exception as err:  # a decomposition that cannot trace these arguments: fall back
        log.debug("decomposition %s failed to trace (%s: %s); falling back",
                  getattr(fn, "__name__", fn), type(err).__name__, err)
        return None
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, _compat.OpOverload) \
                and node.target.namespace != "aten":
            return None
        if node.op == "get_attr":
            return None
    return gm
