"""Rule tables: how capture treats each kind of callable it meets.

- `inline`: Python code interpreted symbolically (user functions, torch.nn module methods).
- `graph`: one graph node evaluated on fake tensors (torch functions, `allow_in_graph`).
- `builtin`: a Python builtin, handled by `variables.builtins`.
- `special` / `context`: kiln's escape hatches and the context managers capture models.
- `unsupported`: anything else (C extensions, I/O) stops capture with the reason.
"""
from __future__ import annotations

import builtins
import math
import operator
import sys
import types
from typing import Any

import torch

from kiln._util import is_hashable
from kiln.capture._compat import printed_name_resolves

__all__ = ["classify", "why_unsupported", "is_library_module", "is_distributed_call", "allow_in_graph", "disable",
           "runs_natively",
           "ALLOWED_IN_GRAPH", "DISABLED"]

# Keyed by id, holding the callable itself: while registered it cannot die, so its id is never
# handed to another object (a set of bare ids once marked a later test's GemmaModel.forward as
# disabled, because it was allocated at the address of a dead function wrapped by kiln.disable).
ALLOWED_IN_GRAPH: dict[int, Any] = {}
DISABLED: dict[int, Any] = {}

# torch Python functions that must be interpreted, not recorded as one node. torch.testing's
# helpers check values (assert_close returns None: as a node it would be dropped, unchecked).
_INLINE_TORCH_PREFIXES = ("torch.nn.modules.", "torch.utils._contextlib", "torch.testing")
# torch functions with side effects on global state, or that need real values.
# They are Python functions in torch, so this table is read before torch functions become graph
# nodes: as nodes they would be dropped (their results are unused) or run at the wrong time.
_UNSUPPORTED_TORCH = {
    torch.manual_seed: "sets the global random seed",
    torch.seed: "sets the global random seed",
    torch.set_rng_state: "sets the global random state",
    torch.get_rng_state: "reads the global random state",
    torch.random.fork_rng: "saves and restores the global random state",
    torch.set_default_dtype: "changes the default dtype",
    torch.set_default_device: "changes the default device",
    torch.set_grad_enabled.__init__: "changes grad mode",
}
for _name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state",
              "set_rng_state_all", "get_rng_state", "get_rng_state_all"):
    if hasattr(torch.cuda, _name):
        _UNSUPPORTED_TORCH[getattr(torch.cuda, _name)] = "reads or sets the CUDA random state"
# Recurrent modules run natively, as under torch.compile (TorchDynamo's `allow_rnn` is off by
# default): their flat-weight bookkeeping reads weakrefs (a break anyway) and the fused RNN op
# after it needs concrete sizes, so each new sequence length recompiled the code after the
# break until the recompile limit.
for _rnn in (torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM):
    _UNSUPPORTED_TORCH[_rnn.forward] = (
        "is a recurrent module: kiln runs it natively between graphs (its fused kernel needs "
        "concrete sizes; torch.compile runs it eagerly too)")
_PURE_MODULES = (math, operator)
# torch.distributed: collectives and process-group calls communicate (in place, or through a
# Work handle), so as graph nodes on fake tensors they would be dropped. They break and run
# natively. These few only read process-wide facts that never change while a process group
# lives; they are called at compile time like other torch functions.
_DISTRIBUTED_QUERIES = ("get_rank", "get_world_size", "is_initialized", "is_available",
                        "get_backend", "is_gloo_available", "is_nccl_available")


def is_library_module(name: str) -> bool:
    top = name.split(".")[0]
    return top in ("torch", "kiln", "builtins", "math", "operator") or top in \
        sys.stdlib_module_names


def allow_in_graph(fn: Any) -> Any:
    ALLOWED_IN_GRAPH[id(fn)] = fn
    return fn


def disable(fn: Any) -> Any:
    DISABLED[id(fn)] = fn
    return fn


def runs_natively(fn: Any) -> bool:
    """Whether compiling `fn` itself (a compiled module's forward, a routed call) must give
    back `fn`: wrapped by kiln.disable, or a torch function capture never reads
    (`_UNSUPPORTED_TORCH`: a recurrent module's forward, the RNG setters)."""
    return id(fn) in DISABLED or _unsupported_torch(fn) is not None


def classify(value: Any) -> str:
    if id(value) in DISABLED:
        return "unsupported"
    if id(value) in ALLOWED_IN_GRAPH:
        return "graph"
    if isinstance(value, types.ModuleType):
        return "module"
    from kiln.capture.variables.builtins import SPECIAL_FUNCTIONS
    if is_hashable(value) and value in SPECIAL_FUNCTIONS:
        return "special"
    if _is_builtin(value):
        return "builtin"
    if isinstance(value, type):
        return "class"
    if isinstance(value, types.MethodType):
        return "method"
    module = getattr(value, "__module__", None) or ""
    if _unsupported_torch(value) is not None or is_distributed_call(value, module):
        return "unsupported"
    if isinstance(value, types.FunctionType):
        if module.startswith("torch") and not module.startswith(_INLINE_TORCH_PREFIXES) \
                and printed_name_resolves(value):
            return "graph"  # a lambda or closure in torch's files is read like user code
        if _is_stdlib(module):
            return "unsupported"  # logging, I/O, ...: run natively at a graph break
        return "inline"
    if module.startswith("torch") or isinstance(value, (types.MethodDescriptorType,
                                                        types.WrapperDescriptorType)) and \
            getattr(value, "__objclass__", None) is torch._C.TensorBase:
        return "graph"
    if getattr(value, "__module__", None) in ("math", "operator", "_operator"):
        return "builtin"
    return "unsupported"


# Standard-library modules whose Python functions capture may read (pure helpers).
_INLINE_STDLIB = {"functools", "operator", "math", "typing", "collections", "enum", "dataclasses",
                  "abc", "numbers", "contextlib", "copy"}


def _is_stdlib(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names and top not in _INLINE_STDLIB


def why_unsupported(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    module = getattr(value, "__module__", None) or "?"
    if id(value) in DISABLED:
        return f"{name} is wrapped by kiln.disable"
    if _unsupported_torch(value) is not None:
        return f"{module}.{name} {_unsupported_torch(value)}"
    if is_distributed_call(value, module):
        return (f"{module}.{name} communicates between processes (torch.distributed), which "
                "kiln runs natively between graphs (torch.compile traces some collectives as "
                "functional collectives; kiln does not yet)")
    if isinstance(value, types.FunctionType) and _is_stdlib(module):
        return f"{module}.{name} is standard-library code (I/O, logging, ...), which runs natively"
    return (f"{module}.{name} is not Python code capture can read and not a torch function "
            f"(a C extension or an unknown callable of type {type(value).__name__})")


def is_distributed_call(value: Any, module: str | None = None) -> bool:
    """A torch.distributed function other than the read-only queries (and not a class)."""
    if module is None:
        module = getattr(value, "__module__", None) or ""
    if not module.startswith("torch.distributed") or isinstance(value, type):
        return False
    return getattr(value, "__name__", None) not in _DISTRIBUTED_QUERIES


def _unsupported_torch(value: Any) -> str | None:
    """Why `value` (or a function it wraps) is in _UNSUPPORTED_TORCH. torch._dynamo replaces
    `torch.manual_seed` by a functools.wraps wrapper when it is imported, so identity alone
    misses it."""
    for _ in range(8):  # a few layers of __wrapped__ at most
        if is_hashable(value) and value in _UNSUPPORTED_TORCH:
            return _UNSUPPORTED_TORCH[value]
        value = getattr(value, "__wrapped__", None)
        if value is None:
            return None
    return None


def _is_builtin(value: Any) -> bool:
    if getattr(value, "__module__", None) in ("builtins",) and is_hashable(value):
        return getattr(builtins, getattr(value, "__name__", ""), None) is value
    owner = getattr(value, "__self__", None)
    if isinstance(value, types.BuiltinFunctionType) and owner in _PURE_MODULES:
        return True
    # methods of immutable constants: "a,b".split, (1, 2).index, torch.float32.to_real ...
    return isinstance(value, types.BuiltinMethodType) and isinstance(
        owner, (str, bytes, int, float, tuple, frozenset, torch.dtype, torch.device))

