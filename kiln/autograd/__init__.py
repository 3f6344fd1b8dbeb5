"""autograd: torch-level FX graph -> functional ATen graphs + the callable that runs them.

Input: a captured GraphModule (placeholders with fake `meta["val"]` and `meta["source"]`, user
lines on call nodes) and example inputs. Output: a callable with the captured graph's signature.

Steps (`aot_compile`):
    trace_raw           stage 1: ATen trace on fake tensors; training calls autograd.grad inside
                        the trace, so forward and backward land in one raw joint graph
    functionalize_raw   stage 2: replay under torch.func.functionalize with the decomposition
                        policy; input mutations become extra outputs -> JointGraph
    joint_passes        the backend's passes on the JointGraph
    partition_joint     forward graph + backward graph (min-cut by default)
    CompiledGraph       one autograd.Function per training graph; backward compiled on first
                        use; then the Epilogue: mutations written back, outputs aliasing
                        inputs rebuilt as views

Symbolic sizes (`aot_compile(symbolic=True)`, docs/dynamic_shapes.md stage B): a graph captured
with symbolic sizes is traced once, on FakeTensors sharing the capture's ShapeEnv, and its graphs
serve every size: their placeholders carry symbolic `meta["val"]` (`is_symbolic_graph`), sizes
an op takes are `sym_size.int` nodes and int arithmetic, and the forward saves the sizes the
backward needs as ints (`symbolic.py`). A variant whose symbolic trace fails is traced per size.

Invariants: the graphs handed to compilers are functional ATen graphs that follow
`decompositions.py`; every node has meta["val"]; random ops are never recomputed; gradients are
never wrong: in-place writes into inputs follow eager's autograd (`mutation.py`), a backward
that reads a tensor the program overwrote raises eager's error (`backward.py`), and what the
stage cannot support (mutated inputs sharing memory that require grad) runs eagerly with the
reason logged.

Never: calls torch's AOTAutograd, supports double backward, or imports private torch APIs outside
`_compat.py`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kiln.autograd.compiled_graph import (CompiledGraph, Compilers, DoubleBackwardError,
                                          identity_compiler)
from kiln.autograd.joint import AutogradUnsupported, JointGraph, OutputInfo, TensorSpec
from kiln.autograd.symbolic import SymbolicUnsupported, has_unbacked_sizes, is_symbolic_graph
from kiln.autograd.trace import trace_inference, trace_joint

__all__ = [
    "AutogradUnsupported",
    "CompiledGraph",
    "Compilers",
    "DoubleBackwardError",
    "JointGraph",
    "OutputInfo",
    "SymbolicUnsupported",
    "TensorSpec",
    "aot_compile",
    "has_unbacked_sizes",
    "identity_compiler",
    "is_symbolic_graph",
    "trace_inference",
    "trace_joint",
]


def aot_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                fw_compiler: Callable = identity_compiler,
                bw_compiler: Callable = identity_compiler,
                inference_compiler: Callable | None = None,
                joint_passes: Sequence[Callable[[JointGraph], JointGraph]] = (),
                partition_policy: str = "min_cut", symbolic: bool = False) -> CompiledGraph:
    """Compile a captured graph through the autograd stage; see the module docstring.
    `symbolic`: a graph captured with symbolic sizes is traced once for every size, and the
    compilers receive graphs whose placeholders have symbolic `meta["val"]`
    (`is_symbolic_graph`); else it is traced for the sizes of each call's inputs."""
    compilers = Compilers(fw_compiler, bw_compiler, inference_compiler, tuple(joint_passes),
                          partition_policy)
    return CompiledGraph(gm, list(example_inputs), compilers, symbolic=symbolic)
