"""Test graphs for the lower stage: ATen graphs of the shared test models, traced with make_fx
through `kiln.lower.decomposition_tables.trace_aten` (functionalized, core decompositions minus the
lower stage's keep list), with flat tensor inputs and eager reference outputs."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch.func import functional_call

import models
from kiln.lower.decomposition_tables import trace_aten

__all__ = ["MODELS", "ModelGraph", "model_graph", "trace_flat"]


def trace_flat(fn: Callable[..., Any], inputs: tuple) -> tuple[torch.fx.GraphModule, list]:
    """(gm, flat_inputs) for `fn(*inputs)` where inputs may be nested (dicts of params)."""
    flat, spec = torch.utils._pytree.tree_flatten(inputs)

    def flat_fn(*leaves):
        return fn(*torch.utils._pytree.tree_unflatten(list(leaves), spec))

    return trace_aten(flat_fn, *flat), flat


@dataclasses.dataclass
class ModelGraph:
    gm: torch.fx.GraphModule
    inputs: list
    eager: list  # flat outputs of the eager run


def _loss(out: Any) -> torch.Tensor:
    if isinstance(out, tuple):
        out = out[1] if out[1] is not None else out[0]
    return out if out.dim() == 0 else out.float().pow(2).mean()


def model_graph(model: torch.nn.Module, args: tuple, training: bool) -> ModelGraph:
    """The inference graph (eval mode, no grad) or the training joint graph (loss and parameter
    gradients through torch.func.grad_and_value) of `model` on `args`."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    if training:
        model.train()

        def loss_fn(p, *a):
            fresh = {k: v.clone() for k, v in buffers.items()}  # running stats stay local
            return _loss(functional_call(model, {**p, **fresh}, a))

        def fn(p, *a):
            grads, loss = torch.func.grad_and_value(loss_fn)(p, *a)
            return loss, grads
    else:
        model.eval()

        def fn(p, *a):
            with torch.no_grad():
                return functional_call(model, {**p, **buffers}, a)

    gm, flat = trace_flat(fn, (params, *args))
    eager = torch.utils._pytree.tree_leaves(fn(params, *args))
    return ModelGraph(gm, flat, eager)


def _block():
    return models.TransformerBlock(32, 4), (torch.randn(2, 8, 32),)


def _gpt():
    return models.GPT(), (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))


def _gpt_generate():
    return models.GPT(), (torch.randint(0, 64, (2, 16)),)


def _resnet():
    return models.TinyResNet(), (torch.randn(2, 3, 16, 16),)


MODELS: dict[str, Callable[[], tuple]] = {
    "block": _block, "gpt": _gpt, "gpt_generate": _gpt_generate, "resnet": _resnet,
}
_cache: dict[tuple[str, bool], ModelGraph] = {}


def cached_model_graph(name: str, training: bool) -> ModelGraph:
    """One traced graph per (model, mode) per test session (tracing dominates test time)."""
    if (name, training) not in _cache:
        torch.manual_seed(0)
        model, args = MODELS[name]()
        _cache[name, training] = model_graph(model, args, training)
    return _cache[name, training]
