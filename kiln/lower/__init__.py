"""lower: ATen FX graph → loop IR (`IRGraph`).

Input: a functional ATen-level `torch.fx.GraphModule` (inference, forward, backward or joint)
whose nodes carry `meta["val"]` fake tensors, and optionally the example inputs.
Output: an `IRGraph` (`ir.py`): computed buffers (`Pointwise`, `Reduction` loop nests whose
bodies are closures over one ops-handler interface, `ops.py`), `Extern` calls (matmul,
convolution, attention) and `Fallback` calls (any other ATen op), in execution order.

Steps, in order:
1. copy the graph and run graph passes on the copy: dead-code elimination and the explicit
   attention rewrite into SDPA (`attention.py`);
2. interpret it node by node (`lowering.py`): rule table → decomposition → fallback, inlining
   pointwise chains into their consumers.

Invariants: views are index maps, never copies; every graph output is a strided view of a
buffer with eager's strides; bodies compute in float32 for bf16/fp16 data and round once at each
store; every IR node records the FX nodes and user lines it came from; `str(graph)` is runnable
Python and `evaluate.run_ir(graph, inputs)` equals eager.

Never: mutates the caller's graph, fuses across realized buffers (the schedule stage does),
chooses kernel configurations or emits device code (codegen does), or needs a GPU.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
import torch.fx

from kiln.lower.ir import IRGraph
from kiln.lower.lowering import LoweringError

__all__ = ["IRGraph", "LoweringError", "lower_graph", "reset"]

log = logging.getLogger("kiln.lower")


def lower_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, *,
                attention_rewrite: bool = True) -> IRGraph:
    """Lower an ATen graph to an `IRGraph`. `example_inputs` (one per placeholder) supply
    layouts for placeholders without `meta["val"]`; `attention_rewrite=False` skips the SDPA
    rewrite pass."""
    from kiln.lower.driver import build_graph

    return build_graph(gm, example_inputs, attention_rewrite=attention_rewrite)


def reset() -> None:
    """Clear the stage's caches (traced decompositions, proven affine index forms); for
    kiln.reset()."""
    from kiln.lower import decomposition_tables, index

    decomposition_tables.reset()
    index._affine_cache.clear()
