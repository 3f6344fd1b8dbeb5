"""ir: the loop IR that the lower stage builds and the schedule/codegen stages consume.

An `IRGraph` is a list of nodes in execution order (`ComputedBuffer`, `Extern`, `Fallback`),
each writing named buffers with a `Layout`; what each node and buffer is, and how a view becomes
an index map instead of a node, is `nodes.py`'s docstring. The node and buffer classes are
re-exported here, so the IR is read from one module. `str(graph)` is runnable Python (see
`printer.py`); `evaluate.run_ir` runs a graph on the CPU.
"""
from __future__ import annotations

from typing import Any

from kiln.lower.nodes import (
    Buffer,
    ComputedBuffer,
    ConstantBuffer,
    Extern,
    ExternKernel,
    ExternOutput,
    Fallback,
    InputBuffer,
    Layout,
    Node,
    Origin,
    Pointwise,
    Reduction,
    TensorArg,
    compute_dtype,
    contiguous_strides,
    loop_vars,
    map_nested,
)
from kiln.lower.printer import print_graph

__all__ = [
    "Buffer",
    "ComputedBuffer",
    "ConstantBuffer",
    "Extern",
    "ExternKernel",
    "ExternOutput",
    "Fallback",
    "IRGraph",
    "InputBuffer",
    "Layout",
    "Node",
    "Origin",
    "Pointwise",
    "Reduction",
    "TensorArg",
    "compute_dtype",
    "contiguous_strides",
    "loop_vars",
    "map_nested",
]


class IRGraph:
    """The lower stage's output.

    inputs: one `InputBuffer` per FX placeholder, in order (a non-tensor placeholder is None).
    constants: `ConstantBuffer`s by name.
    nodes: `ComputedBuffer` / `Extern` / `Fallback` in execution order.
    outputs: the flattened graph outputs: a `TensorArg` (a strided view of a buffer, with
        eager's strides) or a Python constant / None.
    mutations: (input name, TensorArg) pairs: copy the value into the input after the run
        (in-place updates of graph inputs, e.g. BatchNorm running statistics).
    buffers: every buffer by name.
    moved_inputs: names of 0-dim CPU inputs of a graph that computes on another device (eager
        mixes a CPU scalar tensor with CUDA tensors): their layouts say the graph's device and
        the wrapper copies them there first, since a kernel cannot read host memory.
    input_offsets: the example inputs' storage offsets by input name. Input layouts count from
        each input's first element (offset 0); an `as_strided` of an input's storage names
        positions from the storage's start, so its lowering subtracts this.
    size_inputs: position -> the size expression of each non-tensor input that is a symbolic
        size (a backward graph reads `sym_size_int` saved by its forward): the wrapper binds
        the size symbol from it when no input dim has it.
    """

    def __init__(self) -> None:
        self.inputs: list[InputBuffer | None] = []
        self.constants: dict[str, ConstantBuffer] = {}
        self.nodes: list[Node] = []
        self.outputs: list[TensorArg | Any] = []
        self.mutations: list[tuple[str, TensorArg]] = []
        self.buffers: dict[str, Buffer] = {}
        self.moved_inputs: list[str] = []
        self.input_offsets: dict[str, Any] = {}
        self.size_inputs: dict[int, Any] = {}
        self.symbolic = False  # sizes are expressions of `Size` atoms (kiln.lower.symbolic)

    def add_buffer(self, buf: Buffer) -> Buffer:
        if buf.name in self.buffers:
            raise ValueError(f"duplicate buffer name {buf.name}")
        self.buffers[buf.name] = buf
        return buf

    @property
    def fallbacks(self) -> list[Fallback]:
        return [n for n in self.nodes if isinstance(n, Fallback)]

    @property
    def externs(self) -> list[Extern]:
        return [n for n in self.nodes if isinstance(n, Extern)]

    @property
    def computed(self) -> list[ComputedBuffer]:
        return [n for n in self.nodes if isinstance(n, ComputedBuffer)]

    def __str__(self) -> str:
        return print_graph(self)

    def __repr__(self) -> str:
        return (f"<IRGraph {len(self.inputs)} inputs, {len(self.computed)} computed, "
                f"{len(self.externs)} externs, {len(self.fallbacks)} fallbacks>")
