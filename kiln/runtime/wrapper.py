"""wrapper: a `Schedule` and its kernels → the Python source of one `call(args)` function.

The wrapper is the whole per-call program of a compiled graph, written out as readable Python
(Inductor's "output code"): unpack the inputs; allocate each buffer with `empty_strided` on its
device right before the step that writes it (or take the storage of a dead buffer, per
`Schedule.reuse`); launch the pre-bound kernels and call the library ops in schedule order; `del`
every buffer and input after its last reader; copy graph mutations into their inputs; return the
outputs as strided views. `call(args)` empties a list `args` after unpacking it (a boxed call:
the caller hands its references over, so an input nothing else holds, such as a saved activation
passed to the backward, is freed after its last reader instead of at the end). It reads no IR
at run time: sizes, strides and ops are literals in the text, and kernels are globals bound by
name when the text is exec'd (`load_wrapper`), so the source alone plus the kernels rebuilds the
callable (the disk cache stores exactly that).

Kernels address each tensor argument from its data pointer at the IR's flat layout offsets. A
buffer's argument is the tensor itself when its layout offset is 0 and `storage_base(t)`
otherwise. Input layouts count from the input's first element (always offset 0), so the input is
passed as it comes, at any storage offset, and its views are `as_strided` from
`x.storage_offset()`: one compiled graph serves `xs[0]`, `xs[1]`, ...
"""
from __future__ import annotations

import dataclasses
import functools
import linecache
import logging
from typing import Any, Callable, Mapping, Sequence

import torch

from kiln.lower.ir import (Buffer, ConstantBuffer, ExternKernel, ExternOutput, Fallback,
                           IRGraph, InputBuffer, Layout, TensorArg)
from kiln.lower.printer import format_value
from kiln.runtime.symbolic import size_param, symbolic_prologue
from kiln.schedule import FusedGroup, Schedule

__all__ = ["WrapperCode", "aligned_bias", "fit_layout", "generate_wrapper", "load_wrapper",
           "reinterpret", "storage_base"]

log = logging.getLogger("kiln.runtime")

# Extern kinds whose library kernels need each tensor's last dim contiguous: the private SDPA
# ops skip the checks `scaled_dot_product_attention` does (the CPU flash kernel silently reads a
# transposed k wrongly), so such views are copied first.
DENSE_LAST_DIM = ("attention", "attention_backward")

# Library calls that always return a fresh contiguous tensor (ATen allocates their result with
# at::empty({...})): a contiguous recorded layout needs no `fit_layout` check after them, which
# saves a Python call per GEMM per run (host time at batch 1).
CONTIGUOUS_RESULTS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                                torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default})

_PRELUDE = """\
import torch
from kiln.runtime._compat import alias_view, empty_cpu, empty_cuda
from kiln.runtime.wrapper import aligned_bias, fit_layout, reinterpret, storage_base
from kiln.runtime.symbolic import check_extents
aten = torch.ops.aten
empty_strided = torch.empty_strided
as_strided = torch.as_strided
"""


def reinterpret(old: torch.Tensor, dtype: torch.dtype, size: tuple, stride: tuple) -> torch.Tensor:
    """A new buffer living in the storage of the dead buffer `old` (storage reuse)."""
    if old.dtype == dtype:
        return torch.as_strided(old, size, stride, 0)
    fresh = torch.empty((0,), dtype=dtype, device=old.device)
    return fresh.set_(old.untyped_storage(), 0, size, stride)


relayout_copies = [0]  # how many library outputs fit_layout had to copy (a perf smell)


def fit_layout(t: torch.Tensor, size: tuple, stride: tuple, offset: int = 0) -> torch.Tensor:
    """`t` when a library call returned the layout the IR recorded for it, else a copy in that
    layout: later kernels index the buffer's storage by the recorded strides, so a library
    kernel that picks another layout (e.g. an attention output on another backend) must not
    be read through the wrong strides. None (an undefined tensor: flash attention's philox
    seed without dropout, saved for its backward) stays None, as in eager autograd."""
    if t is None:
        return t
    if t.stride() == stride and t.storage_offset() == offset and t.shape == size:
        return t  # the usual case, without the per-dim scan below
    if t.shape == size and t.storage_offset() == offset and all(
            a == b for n, a, b in zip(size, t.stride(), stride) if n != 1):
        return t
    relayout_copies[0] += 1
    if relayout_copies[0] == 1:
        log.debug("a library call returned %s stride %s where the IR recorded %s stride %s: "
                  "copying (counted in kiln.runtime.wrapper.relayout_copies)",
                  tuple(t.shape), t.stride(), size, stride)
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t) if offset == 0 else _copy_at_offset(t, size, stride, offset)


def _copy_at_offset(t: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    extent = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
    base = torch.empty(extent, dtype=t.dtype, device=t.device)
    view = torch.as_strided(base, size, stride, offset)
    view.copy_(t)
    return view


BIAS_ALIGNMENT = 16  # elements: torch pads SDPA masks the same way before its kernels


def aligned_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """An attention bias whose rows start 16-element aligned. The CUDA attention kernels
    refuse others ("attn_bias is not correctly aligned (strideM)"); the public SDPA pads the
    mask and slices it back, the private ops kiln calls do not, so the wrapper does. The
    stride of a size-1 dim is never stepped and the kernels do not check it (GPT-2's causal
    mask, strides (1, 1, L, 1), was padded per layer per call before)."""
    if bias is None or bias.dim() < 2:
        return bias
    if bias.stride(-1) == 1 and all(s % BIAS_ALIGNMENT == 0 or n == 1 for n, s in
                                    zip(bias.shape[:-1], bias.stride()[:-1])):
        return bias
    last = bias.shape[-1]
    width = -(-last // BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    padded = bias.new_zeros((*bias.shape[:-1], width))
    padded[..., :last].copy_(bias)
    return padded[..., :last]


def storage_base(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of `t` as a 1-D tensor starting at storage offset 0."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0)


@dataclasses.dataclass(frozen=True)
class WrapperCode:
    """The generated wrapper. source: a module defining `call(args)`; kernels: the kernel
    globals it calls, in launch order; externs: the number of library calls per run."""

    source: str
    kernels: tuple[str, ...]
    externs: int

    @property
    def launches(self) -> int:
        return len(self.kernels) + self.externs


class WrapperError(RuntimeError):
    """The schedule and the kernels disagree (a bug in an earlier stage)."""


def generate_wrapper(schedule: Schedule, specs: Mapping[str, Any],
                     name: str = "graph") -> WrapperCode:
    """The wrapper source for `schedule`; `specs` maps each `FusedGroup.name` to its
    `KernelSpec` (`args` = buffer names in call order, `writes` = buffers it stores)."""
    return _Writer(schedule, specs, name).write()


class _Writer:
    def __init__(self, schedule: Schedule, specs: Mapping[str, Any], name: str) -> None:
        self.schedule = schedule
        self.graph: IRGraph = schedule.graph
        self.specs = specs
        self.name = name
        self.globals: dict[str, str] = {}  # literal text -> global name (devices)
        self.lines: list[str] = []
        self.kernels: list[str] = []
        self.externs = 0
        self.steps = schedule.steps
        self.reads = [self._step_reads(step) for step in self.steps]
        self.last_use = self._last_use()
        self.dropped = self._dropped_extern_outputs()
        self.reuse = self._valid_reuse()

    # -- analysis ---------------------------------------------------------------------------

    def _step_reads(self, step: FusedGroup | ExternKernel) -> list[str]:
        if isinstance(step, FusedGroup):
            return [self._resolve_name(n) for n in self.specs[step.name].args]
        return [self._resolve(a).name for a in step.tensor_args()]

    def _kept(self) -> set[str]:
        """Buffers that live to the end: outputs, mutated inputs and their sources, constants.
        Other inputs are dropped after their last reader like buffers (never donated: the
        caller may still hold them), which frees them when the caller handed its references
        over (a boxed call: the backward's saved activations)."""
        kept = set(self.graph.constants)
        for out in self.graph.outputs:
            if isinstance(out, TensorArg):
                kept.add(self._resolve(out).name)
        kept |= {self._resolve(arg).name for _, arg in self.graph.mutations}
        kept |= {name for name, _ in self.graph.mutations}
        return kept

    def _last_use(self) -> dict[str, int]:
        kept = self._kept()
        last: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for written in self._step_writes(step):
                last.setdefault(written, i)
            for read in self.reads[i]:
                last[read] = i
        return {name: i for name, i in last.items() if name not in kept}

    def _unread_inputs(self) -> list[str]:
        """Inputs no step reads and the graph does not keep (sizes come from the prologue)."""
        read = {name for names in self.reads for name in names}
        kept = self._kept() | set(self.graph.moved_inputs)
        return [buf.name if buf is not None else f"_unused{i}"
                for i, buf in enumerate(self.graph.inputs)
                if i not in self.graph.size_inputs
                and (buf is None or buf.name not in read and buf.name not in kept)]

    def _dropped_extern_outputs(self) -> set[str]:
        """Library outputs nothing reads (attention's philox seed and offset, its debug mask):
        never bound. A library may return None for them (flash attention without dropout
        does) where the meta function gave a tensor."""
        dropped = set()
        for i, step in enumerate(self.steps):
            if isinstance(step, ExternKernel):
                dropped.update(name for name in self._step_writes(step)
                               if self.last_use.get(name) == i)
        return dropped

    def _step_writes(self, step: FusedGroup | ExternKernel) -> list[str]:
        if isinstance(step, FusedGroup):
            return list(self.specs[step.name].writes)
        return [o.name for o in step.output_buffers()]

    def _valid_reuse(self) -> dict[str, str]:
        """`Schedule.reuse` entries that are safe here: the old buffer is dead before the new
        one is allocated, large enough, on the same device, and reused once."""
        written_at: dict[str, int] = {}  # buffers the wrapper allocates: kernel outputs
        fresh: set[str] = set()  # storages nothing else views: allocated, or library results
        for i, step in enumerate(self.steps):
            names = self._step_writes(step)
            if isinstance(step, FusedGroup):
                for name in names:
                    written_at.setdefault(name, i)
            if not isinstance(step, Fallback):  # a fallback op may return a view of an input
                fresh.update(names)
        taken: set[str] = set()
        valid: dict[str, str] = {}
        for new, old in self.schedule.reuse.items():
            if new not in written_at or old in taken or old not in self.last_use \
                    or old not in fresh or old in self.dropped:
                continue
            if self.last_use[old] >= written_at[new] or not _fits(self._buf(old), self._buf(new)):
                continue
            valid[new] = old
            taken.add(old)
        return valid

    def _buf(self, name: str) -> Buffer:
        return self.graph.buffers[name]

    def _resolve(self, arg: TensorArg) -> TensorArg:
        """An elided buffer's readers read the view the schedule recorded instead."""
        view = self.schedule.elided.get(arg.name)
        if view is None:
            return arg
        lay = self._buf(arg.name).layout
        if (arg.size, arg.stride, arg.offset) != (lay.size, lay.stride, lay.offset):
            raise WrapperError(f"{arg.name} is elided (read as {view.render()}) but is read "
                               f"through another view {arg.render()}")
        return view

    def _resolve_name(self, name: str) -> str:
        if name in self.schedule.elided:
            raise WrapperError(f"a kernel reads the elided buffer {name}; the schedule must "
                               "rewrite its readers to the recorded view")
        return name

    # -- rendering --------------------------------------------------------------------------

    def _device(self, device: torch.device) -> str:
        text = f"torch.device({str(device)!r})"
        if text not in self.globals:
            self.globals[text] = f"device_{len(self.globals)}"
        return self.globals[text]

    def _view(self, arg: TensorArg, returned: bool = False) -> str:
        """The text of `arg` as a tensor: its buffer, or a view of it (`returned`: an output
        of the graph, always an `as_strided` view, whose `_base` autograd reads)."""
        arg = self._resolve(arg)
        lay = self._buf(arg.name).layout
        if (arg.size, arg.stride, arg.offset) == (lay.size, lay.stride, lay.offset) \
                and arg.dtype == lay.dtype:
            return arg.name
        if arg.dtype != lay.dtype:
            raise WrapperError(f"view {arg.render()} changes the dtype of {arg.name}")
        if not returned and self._inside_own_layout(arg):  # its offset counts from the buffer's
            return f"alias_view({arg.name}, {arg.size}, {arg.stride}, {arg.offset - lay.offset})"
        if isinstance(self._buf(arg.name), InputBuffer):  # input layouts count from the input
            return (f"as_strided({arg.name}, {arg.size}, {arg.stride}, "
                    f"{arg.name}.storage_offset() + {arg.offset})")
        return f"as_strided({arg.name}, {arg.size}, {arg.stride}, {arg.offset})"

    def _inside_own_layout(self, arg: TensorArg) -> bool:
        """Whether the view `arg` reads only elements of its buffer's own layout, a buffer this
        wrapper laid out (allocated, reused, or a library result `fit_layout` checked): then
        the view needs no bounds check at run time (`alias_view`). Inputs and constants keep
        `as_strided`'s check: their layout is what capture assumed, and a wrong assumption
        must raise, not read other memory."""
        buf = self._buf(arg.name)
        if isinstance(buf, (InputBuffer, ConstantBuffer)):
            return False
        lay = buf.layout
        return _within(_index_range(arg.size, arg.stride, arg.offset),
                       _index_range(lay.size, lay.stride, lay.offset))

    def _value(self, value: Any) -> str:
        if isinstance(value, TensorArg):
            return self._view(value)
        if isinstance(value, list):
            return "[" + ", ".join(self._value(v) for v in value) + "]"
        if isinstance(value, tuple):
            inner = ", ".join(self._value(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self._value(v)}" for k, v in value.items()) + "}"
        return format_value(value)

    def _kernel_arg(self, name: str) -> str:
        lay = self._buf(name).layout
        return name if lay.offset == 0 else f"storage_base({name})"

    def _line(self, text: str) -> None:
        self.lines.append("    " + text)

    # -- writing ----------------------------------------------------------------------------

    def write(self) -> WrapperCode:
        graph = self.graph
        params = [buf.name if buf is not None
                  else size_param(i) if i in graph.size_inputs else f"_unused{i}"
                  for i, buf in enumerate(graph.inputs)]
        if params:
            self._line(f"{', '.join(params)}, = args")
            # a boxed call hands the caller's references over: inputs die at their last use
            self._line("if type(args) is list: args.clear()")
        if graph.symbolic:
            for line in symbolic_prologue(graph):
                self._line(line)
        for name in graph.moved_inputs:  # a CPU scalar tensor: kernels cannot read host memory
            # a fill kernel taking the value, not `.to(device)`: a copy from pageable host
            # memory synchronizes the stream, every call (a float argument is such an input)
            lay = graph.buffers[name].layout
            self._line(f"{name} = torch.full((), {name}.item(), dtype={lay.dtype}, "
                       f"device={self._device(lay.device)})")
        for cname in graph.constants:
            self._line(f"{cname} = constants[{cname!r}]")
        unread = self._unread_inputs()
        if unread:
            self._line(f"del {', '.join(unread)}")
        for i, step in enumerate(self.steps):
            self._write_step(i, step)
            self._write_frees(i)
        for name, arg in graph.mutations:
            self._line(f"{name}.copy_({self._view(arg)})")
        outs = [self._view(o, returned=True) if isinstance(o, TensorArg) else self._value(o)
                for o in graph.outputs]
        self._line(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        return WrapperCode(self._module(params), tuple(self.kernels), self.externs)

    def _module(self, params: list[str]) -> str:
        steps = len(self.kernels) + self.externs
        head = [f"# kiln wrapper for graph {self.name!r}: {len(self.kernels)} generated kernels, "
                f"{self.externs} library calls ({steps} launches per call).",
                "# Kernels are globals bound by name when this module is loaded "
                "(kiln.runtime.wrapper.load_wrapper).", _PRELUDE]
        head += [f"{name} = {text}" for text, name in self.globals.items()]
        lines = self.lines
        cuda = self._cuda_index
        if cuda is not None:  # launchers launch on the current device (Inductor's guard too)
            lines = [f"    with torch.cuda.device({cuda}):"] + \
                    [("    " + line) if line else line for line in lines]
        body = ["", "", "def call(args):",
                f'    """inputs: {", ".join(params) or "none"}"""', *lines]
        return "\n".join(head + body) + "\n"

    @functools.cached_property
    def _cuda_index(self) -> int | None:
        for buf in self.graph.buffers.values():
            if buf.layout.device.type == "cuda":
                return buf.layout.device.index or 0
        return None

    def _write_step(self, i: int, step: FusedGroup | ExternKernel) -> None:
        if isinstance(step, FusedGroup):
            self._write_kernel(step)
        else:
            self._write_extern(step)

    def _allocate(self, name: str) -> None:
        lay = self._buf(name).layout
        old = self.reuse.get(name)
        if old is not None:
            self._line(f"{name} = reinterpret({old}, {lay.dtype}, {lay.size}, {lay.stride})"
                       f"  # reuses {old}")
            self._line(f"del {old}")
            return
        fast = self._fast_empty(lay.device)
        if fast:  # without the dispatcher: a few us per buffer per call on a GPU host
            self._line(f"{name} = {fast}({lay.size}, {lay.stride}, {lay.dtype})")
            return
        self._line(f"{name} = empty_strided({lay.size}, {lay.stride}, dtype={lay.dtype}, "
                   f"device={self._device(lay.device)})")

    def _fast_empty(self, device: torch.device) -> str | None:
        """`empty_cpu` for CPU buffers; `empty_cuda` for buffers of the device the wrapper's
        guard makes current (it allocates there); None for any other device."""
        if device.type == "cpu":
            return "empty_cpu"
        if device.type == "cuda" and (device.index or 0) == self._cuda_index:
            return "empty_cuda"
        return None

    def _write_kernel(self, group: FusedGroup) -> None:
        spec = self.specs[group.name]
        nodes = ", ".join(n.name for n in group.nodes)
        self.lines.append("")
        self._line(f"# {group.name}: {spec.kind} [{nodes}] {_origins(group.origins)}")
        # buffers taking a dead one's storage first: the plan holds donors only until the
        # next fresh allocation (kiln.schedule.memory)
        for name in sorted(spec.writes, key=lambda n: n not in self.reuse):
            self._allocate(name)
        args = ", ".join([self._kernel_arg(self._resolve_name(n)) for n in spec.args]
                         + list(getattr(spec, "size_args", ())))
        self._line(f"{spec.name}({args})")
        self.kernels.append(spec.name)

    def _write_extern(self, node: ExternKernel) -> None:
        self.externs += 1
        self.lines.append("")
        self._line(f"# {type(node).__name__.lower()} {node.kind} {_origins(node.origins)}")
        dense = node.kind in DENSE_LAST_DIM
        names = [a.name for a in node.op._schema.arguments]
        args = [self._extern_arg(a, dense, names[i] if i < len(names) else "")
                for i, a in enumerate(node.args)]
        if node.op is torch.ops.aten.as_strided_scatter.default:
            args[0] = self._at_storage_position(node.args[0], args[0])
        args += [f"{k}={self._extern_arg(v, dense, k)}" for k, v in node.kwargs.items()]
        call = f"{format_value(node.op)}({', '.join(args)})"
        targets = [o.name if isinstance(o, ExternOutput) and o.name not in self.dropped else "_"
                   for o in node.outputs]
        if _returns_single(node):
            self._line(f"{targets[0]} = {call}")
        elif any(t != "_" for t in targets):
            self._line(f"{', '.join(targets)}, = {call}")
        else:
            self._line(call)
        for out in node.outputs:
            if isinstance(out, ExternOutput) and out.layout.numel > 0 \
                    and out.name not in self.dropped and not _layout_certain(node, out.layout):
                lay = out.layout
                self._line(f"{out.name} = fit_layout({out.name}, {tuple(lay.size)}, "
                           f"{tuple(lay.stride)}, {lay.offset})")

    def _at_storage_position(self, arg: Any, text: str) -> str:
        """`as_strided_scatter` names positions from the start of its input's storage. A view
        of a graph input is laid out from the input's first element, so at the storage offset
        the graph was compiled for it goes as it is; elsewhere, as a copy at that offset."""
        if not isinstance(arg, TensorArg) or not isinstance(self._buf(arg.name), InputBuffer):
            return text
        offset = arg.offset + self.graph.input_offsets.get(arg.name, 0)
        return f"fit_layout({text}, {tuple(arg.size)}, {tuple(arg.stride)}, {offset})"

    def _extern_arg(self, value: Any, dense_last_dim: bool, name: str = "") -> str:
        text = self._value(value)
        if dense_last_dim and isinstance(value, TensorArg) and value.size \
                and value.size[-1] > 1 and value.stride[-1] != 1:
            text += ".contiguous()"  # the fused attention kernels misread a strided last dim
        if dense_last_dim and name == "attn_bias" and isinstance(value, TensorArg):
            text = f"aligned_bias({text})"
        return text

    def _write_frees(self, i: int) -> None:
        reused = set(self.reuse.values())
        dead = [name for name, last in self.last_use.items()
                if last == i and name not in reused and name not in self.dropped]
        if dead:
            self._line(f"del {', '.join(dead)}")


def _fits(old: Buffer, new: Buffer) -> bool:
    def nbytes(buf: Buffer) -> int:
        return buf.layout.storage_size() * buf.dtype.itemsize

    try:
        big_enough = nbytes(old) >= nbytes(new)
    except TypeError:  # symbolic sizes whose order depends on the sizes: no reuse
        return False
    return old.layout.device == new.layout.device and big_enough \
        and not isinstance(old, (InputBuffer, ConstantBuffer))


def _index_range(size: Sequence[Any], stride: Sequence[Any],
                 offset: Any) -> tuple[Any, Any] | None:
    """The lowest and highest storage element a layout reaches; None when it reaches none (a
    zero-size dim) or cannot be told. Symbolic layouts (`Expr`s over sizes >= 2): when every
    stride is >= 0 for every size, the range is `offset` to `offset + sum((n-1)*s)`."""
    if any(type(n) is int and n == 0 for n in size):
        return None
    if all(type(v) is int for v in (*size, *stride, offset)):
        low = offset + sum(min(0, (n - 1) * s) for n, s in zip(size, stride))
        high = offset + sum(max(0, (n - 1) * s) for n, s in zip(size, stride))
        return low, high
    try:
        if not all(s >= 0 for s in stride):
            return None
    except TypeError:  # a stride whose sign depends on the sizes
        return None
    return offset, offset + sum((n - 1) * s for n, s in zip(size, stride))


def _within(inner: tuple[Any, Any] | None, outer: tuple[Any, Any] | None) -> bool:
    """Whether range `inner` lies in `outer` for every size (symbolic ends compare by their
    bounds; an order that depends on the sizes is not within)."""
    if inner is None or outer is None:
        return False
    try:
        return bool(outer[0] <= inner[0] and inner[1] <= outer[1])
    except TypeError:
        return False


def _layout_certain(node: ExternKernel, lay: Layout) -> bool:
    return node.op in CONTIGUOUS_RESULTS and lay.offset == 0 and lay.is_contiguous()


def _returns_single(node: ExternKernel) -> bool:
    returns = node.op._schema.returns
    text = str(returns[0].type) if len(returns) == 1 else ""
    return len(returns) == 1 and not (text.endswith("[]") or text.startswith("List["))  # Tensor[]


def _origins(origins: Sequence[Any]) -> str:
    seen: list[str] = []
    for origin in origins:
        text = origin.render()
        if text not in seen:
            seen.append(text)
    shown = ", ".join(seen[:4]) + (f", +{len(seen) - 4}" if len(seen) > 4 else "")
    return f"<- {shown}" if shown else ""


_loaded = [0]


def load_wrapper(source: str, kernels: Mapping[str, Callable[..., Any]],
                 constants: Mapping[str, torch.Tensor] | None = None,
                 name: str = "graph") -> Callable[[Sequence[Any]], tuple]:
    """exec the wrapper `source` with its kernels bound by name; returns its `call(args)`.
    The source is registered with linecache, so tracebacks show the wrapper's lines."""
    _loaded[0] += 1
    filename = f"<kiln wrapper {name} #{_loaded[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"kiln_wrapper_{_loaded[0]}", **kernels,
                                 "constants": dict(constants or {})}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["call"]

