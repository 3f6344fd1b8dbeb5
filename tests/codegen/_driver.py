"""Test driver for fused groups: run an `IRGraph` with some nodes grouped into generated kernels.

`run_groups(graph, groups, inputs, configs)` runs every node in order; the first member of a
group launches the group's kernel (its `stores` get storages; members kept in registers get a
NaN-filled storage that must stay untouched), other computed buffers run one kernel each, and
externs run through the reference runtime.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from kiln.codegen import KernelSpec, emit_group
from kiln.codegen.triton_build import compile_kernel
from kiln.runtime import cross_compile
from kiln.codegen.kernel import single_group
from kiln.lower.evaluate import _new_storage, _run_node, run_ir
from kiln.lower.ir import ComputedBuffer

__all__ = ["launch_spec", "run_groups"]


def launch_spec(spec: KernelSpec, tensors: Sequence[torch.Tensor]) -> None:
    """Launch with every option the spec carries (meta, num_warps, num_stages)."""
    fn = compile_kernel(spec)
    flat = [torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
            for t in tensors]
    if cross_compile.target() is not None and os.environ.get("TRITON_INTERPRET") == "1":
        options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages,
                   **spec.compile_options()}
        cross_compile.cross_compile(spec, [t.dtype for t in tensors], spec.meta_dict, options)
    fn[spec.grid(spec.meta_dict)](*flat, **spec.launch_options())


def run_groups(graph, groups, inputs: Sequence[Any], configs=None, specs_out=None) -> tuple:
    """(outputs, runtime storages)."""
    configs = configs or {}
    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    first = {g.nodes[0].name: g for g in groups}
    grouped = {n.name for g in groups for n in g.nodes}

    def run_node(rt: Any, node: Any) -> None:
        if not isinstance(node, ComputedBuffer):
            _run_node(rt, node)
            return
        if node.name in grouped and node.name not in first:
            return
        group = first.get(node.name) or single_group(node)
        for member in group.nodes:
            lay = member.layout
            storage = _new_storage(lay.dtype, lay.size, lay.stride, lay.offset).to(device)
            if member.name not in group.stores and storage.is_floating_point():
                storage.fill_(float("nan"))
            rt.storages[member.name] = storage
        spec = emit_group(group, graph, configs.get(group.name))
        if specs_out is not None:
            specs_out.append(spec)
        launch_spec(spec, [rt.storages[n] for n in spec.args])

    rt_holder = {}
    outs = run_ir(graph, inputs, _capture(run_node, rt_holder))
    return outs, rt_holder.get("rt")


def _capture(run_node, holder):
    def wrapped(rt, node):
        holder["rt"] = rt
        run_node(rt, node)
    return wrapped
