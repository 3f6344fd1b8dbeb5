"""The autograd stage's only door to private torch APIs (tested on torch 2.11 and 2.13).

Everything here is small and named after what the stage needs, so a torch upgrade that moves one
of these breaks in exactly one place.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.capture._compat import new_fake_mode  # one factory for every stage (capture's floor)

__all__ = [
    "FakeTensor",
    "FakeTensorMode",
    "OpOverload",
    "TorchDispatchMode",
    "core_aten_decompositions",
    "current_autograd_node",
    "fake_constant",
    "has_composite_implicit_kernel",
    "is_fake",
    "new_fake_mode",
    "original_view_tracking",
    "python_dispatcher",
    "schema",
    "sequence_nr",
    "storage_key",
    "tree_flatten",
    "tree_unflatten",
]

OpOverload = torch._ops.OpOverload

tree_flatten: Callable[[Any], tuple[list[Any], Any]] = pytree.tree_flatten
tree_unflatten: Callable[[list[Any], Any], Any] = pytree.tree_unflatten


def is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


def fake_constant(fake: Any) -> torch.Tensor | None:
    """The real tensor behind a fake one made from a constant (`torch.tensor(...)`), or None."""
    return getattr(fake, "constant", None)


def core_aten_decompositions() -> dict:
    """torch's Core ATen decomposition table as a plain dict (a lazy table object since ~2.6)."""
    from torch._decomp import core_aten_decompositions as table

    return dict(table().items())


def has_composite_implicit_kernel(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


def schema(op: OpOverload) -> Any:
    """The op's FunctionSchema (arguments with alias annotations, name, is_mutable)."""
    return op._schema


def sequence_nr(grad_fn: Any) -> int:
    """The sequence number autograd gave a graph node (shared by the forward op and its
    backward node)."""
    return grad_fn._sequence_nr()


def current_autograd_node() -> Any:
    """The autograd graph node the engine is running now (None outside a backward pass)."""
    return torch._C._current_autograd_node()


@contextlib.contextmanager
def original_view_tracking() -> Iterator[None]:
    """Autograd replays views with their original view ops (slice, select) instead of as_strided,
    so backward formulas of mutations through views stay in the readable view vocabulary."""
    with torch.autograd._force_original_view_tracking(True):
        yield


def python_dispatcher() -> contextlib.AbstractContextManager[None]:
    """Dispatch through torch's Python kernels: ops whose C++ schema hides a mutation
    (native_batch_norm, cudnn_batch_norm) become their correctly annotated variants
    (_native_batch_norm_legit), so functionalization sees the running-stat updates."""
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def storage_key(tensor: torch.Tensor) -> StorageWeakRef:
    """A key equal for two tensors exactly when they share a storage (works on fake tensors)."""
    return StorageWeakRef(tensor.untyped_storage())
