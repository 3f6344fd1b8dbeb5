"""The FSDP2 cases of the gloo run (`gloo_cases` runs them on both ranks).

- `layers`: `fully_shard` per layer and on the root, each layer `kiln.compile(layer)` assigned
  back (regional compilation); `whole`: `kiln.compile(sharded_root)`.
- `mp`: the per-layer case under `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`,
  against eager FSDP2 under the same policy.
- `gpt2-*`: the suite's GPT-2 with 4 blocks, both ways: the 4 blocks share one capture.
- `layers-root`: each layer sharded, compiled and assigned back, then the root sharded (the
  root's `fully_shard` meets the wrappers, which must count as the sharded layers).
- the whole model compiled, then sharded (issue 20), GPT-2 and under mixed precision the stack:
  `compile-shard` is `m = kiln.compile(model)`, `fully_shard` per layer, `fully_shard(m)`;
  `shard-compile-shard` shards the layers first, then `fully_shard(kiln.compile(model))`.

The GPT-2 and mixed precision cases start from an empty kiln cache, so the graphs they report
are all they captured.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.nn as nn

from gloo_common import MAKERS, Trained, train

__all__ = ["fsdp_case", "fsdp_cases"]


def _mesh(device: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    # The device said outright: fully_shard's default mesh takes the accelerator where there is
    # one, and on a one-GPU machine gloo's rank 1 then picks cuda:1, which does not exist.
    return init_device_mesh(device, (torch.distributed.get_world_size(),))


def _policy(mixed: bool) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if not mixed:
        return MixedPrecisionPolicy()
    # bf16 all-gathers and compute, gradients reduce-scattered in fp32: gloo on the CPU does both
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _shard(model: nn.Module, mixed: bool, device: str, root: nn.Module | None = None
           ) -> nn.Module:
    """`fully_shard` on each layer of `model`, then on `root` (default: `model`; a
    `kiln.compile(model)` for the whole-model orders)."""
    from torch.distributed.fsdp import fully_shard
    mesh, policy = _mesh(device), _policy(mixed)
    for layer in _layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    root = model if root is None else root
    fully_shard(root, mesh=mesh, mp_policy=policy)
    return root


def _layers(model: nn.Module) -> nn.ModuleList:
    return model.h if hasattr(model, "h") else model.layers  # GPT-2's blocks, the Stack's


def fsdp_case(name: str, how: str, backend: str, rank: int, mixed: bool = False,
               device: str = "cpu") -> Trained:
    import kiln
    if name == "gpt2" or mixed:  # captured afresh: the case's graphs are all it compiled
        kiln.reset()
    torch.manual_seed(0)
    base = MAKERS[name]().to(device)  # made on the CPU: the same weights on every device
    ref = _shard(copy.deepcopy(base), mixed, device)
    ref_opt = train(ref, ref, name, rank, device)
    model = copy.deepcopy(base)
    run: Callable
    if how in WHOLE_THEN_SHARD:
        from torch.distributed.fsdp import FSDPModule, fully_shard
        if how == "compile-shard":  # fully_shard(kiln.compile(model)), layers after compile too
            run = _shard(model, mixed, device, root=kiln.compile(model, backend=backend))
        else:  # layers sharded, the root compiled, then sharded
            mesh, policy = _mesh(device), _policy(mixed)
            for layer in _layers(model):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            run = fully_shard(kiln.compile(model, backend=backend), mesh=mesh, mp_policy=policy)
        # the compiled wrapper is the FSDP root; the original keeps its class
        assert isinstance(run, FSDPModule) and not isinstance(model, FSDPModule), type(run)
    elif how == "layers-root":  # each layer sharded, compiled and assigned back, then the root
        from torch.distributed.fsdp import fully_shard
        mesh, policy = _mesh(device), _policy(mixed)
        layers = _layers(model)
        for i, layer in enumerate(layers):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
            layers[i] = kiln.compile(layer, backend=backend)
        run = fully_shard(model, mesh=mesh, mp_policy=policy)
    else:
        _shard(model, mixed, device)
        layers = _layers(model)
        if how == "layers":  # each sharded layer compiled and assigned back (layer.compile style)
            for i, layer in enumerate(layers):
                layers[i] = kiln.compile(layer, backend=backend)
            run = model
        else:  # kiln.compile(fully_shard(model)): the layer calls break, each compiles alone
            run = kiln.compile(model, backend=backend)
    # the optimizer takes the parameters of what is called: the wrapper's are the original's
    return Trained(ref, model, ref_opt, train(run, run, name, rank, device))


WHOLE_THEN_SHARD = ("compile-shard", "shard-compile-shard")
# the whole model with aot_eager too would add 2-4 s to CI for no path the others miss
GPT2_WAYS = {"aot_eager": ("layers", *WHOLE_THEN_SHARD),
             "kiln": ("layers", "whole", *WHOLE_THEN_SHARD)}
# mixed precision over the stack: per layer on both backends, and each whole-model order on one
MP_WAYS = {"aot_eager": ("layers", "shard-compile-shard"), "kiln": ("layers", "compile-shard")}


def fsdp_cases(backends: tuple[str, ...]) -> dict[str, Callable[[int], Any]]:
    cases: dict[str, Callable[[int], Any]] = {}
    for backend in backends:
        for how in ("layers", "whole", *(("layers-root",) if backend == "kiln" else ())):
            cases[f"fsdp2-{how}-{backend}"] = (
                lambda rank, h=how, b=backend: fsdp_case("stack", h, b, rank))
        for how in MP_WAYS[backend]:
            label = "" if how == "layers" else f"{how}-"
            cases[f"fsdp2-mp-{label}{backend}"] = (
                lambda rank, h=how, b=backend: fsdp_case("stack", h, b, rank, mixed=True))
        for how in GPT2_WAYS[backend]:
            cases[f"fsdp2-gpt2-{how}-{backend}"] = (
                lambda rank, h=how, b=backend: fsdp_case("gpt2", h, b, rank))
    return cases
