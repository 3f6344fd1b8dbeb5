"""kernel: one `ComputedBuffer` → one Triton kernel (`KernelSpec`).

- `Pointwise` → a 1-D flattened kernel: `xindex` covers `prod(ranges)` in blocks of `XBLOCK`
  (next power of 2 of numel, at most 1024), the loop variables are div/mod of `xindex`.
- `Reduction` → a persistent reduction: one program per output row (`XBLOCK = 1`), the whole
  row in registers (`RBLOCK = next_pow2(rnumel)`), tile `[XBLOCK, RBLOCK]` with the reduction
  axis fastest, so reads whose innermost reduction stride is 1 coalesce. Looped reductions
  (rnumel too large for registers) and column ("outer") tilings are not emitted yet.

Sizes are specialized into the source (static shapes). Indices are int32 unless a size or
storage offset reaches 2**31. The source starts with a comment header naming the buffer, its IR
and the FX nodes / user lines it came from.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Callable, Mapping


from kiln.lower.ir import ComputedBuffer, IRGraph, Origin, Reduction
from kiln.lower.ops import use_handler
from kiln.codegen.triton_printer import CodegenError, TritonPrinter

__all__ = ["KernelSpec", "emit_kernel", "next_power_of_2"]

MAX_XBLOCK = 1024
MAX_PERSISTENT_RBLOCK = 4096

_PRELUDE = '''import os

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter does not patch libdevice
    from kiln.codegen import _interp_libdevice as libdevice
else:
    from triton.language.extra import libdevice


@triton.jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _prod_combine(a, b):
    return a * b
'''


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A generated kernel.

    name: the `@triton.jit` function's name in `source` (a whole module: imports, helpers,
        the kernel). args: buffer names, one per pointer argument, in call order (reads, then
        writes); arg_names: the pointer parameter names. reads / writes: buffer names.
    meta: constexpr arguments (XBLOCK, RBLOCK); num_warps: launch option.
    grid: `grid(meta) -> tuple` of program counts. kind: "pointwise" | "persistent_reduction".
    numel / rnumel: the output and reduction sizes. origins: FX nodes it came from.
    """

    name: str
    source: str
    args: tuple[str, ...]
    arg_names: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    meta: tuple[tuple[str, int], ...]
    num_warps: int
    grid: Callable[[Mapping[str, int]], tuple[int, ...]]
    kind: str
    numel: int
    rnumel: int
    origins: tuple[Origin, ...]

    @property
    def meta_dict(self) -> dict[str, int]:
        return dict(self.meta)

    @property
    def key(self) -> str:
        """A content hash of the source (the compile cache key)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:20]


def _kernel_name(node: ComputedBuffer, prefix: str) -> str:
    ops: list[str] = []
    for origin in node.origins:
        op = origin.op.split("/")[0].removeprefix("aten.").split(".")[0]
        if op and op not in ops:
            ops.append(op)
    parts = [prefix] + ops[:4] + [node.name]
    return re.sub(r"[^0-9A-Za-z_]", "_", "_".join(parts))


def _header(node: ComputedBuffer, kind: str) -> list[str]:
    data = node.data
    if isinstance(data, Reduction):
        what = (f"Reduction {data.reduction_type} ranges={list(data.ranges)} "
                f"reduction_ranges={list(data.reduction_ranges)}")
    else:
        what = f"Pointwise ranges={list(data.ranges)}"
    lines = [f"# kiln {kind} kernel for {node.name}: {node.layout.render()}", f"#   {what}"]
    for origin in node.origins:
        where = f" at {origin.user_location}" if origin.user_location else ""
        lines.append(f"#   from {origin.node} ({origin.op}){where}")
    return lines


def _define_vars(prefix: str, ranges: tuple[int, ...], source: str) -> list[str]:
    """`x0 = xindex // 16`, `x1 = xindex % 16`, ... (size-1 dims never appear in indices)."""
    lines = []
    inner = 1
    defs = []
    for d in reversed(range(len(ranges))):
        size = ranges[d]
        if size != 1:
            text = source if inner == 1 else f"({source} // {inner})"
            if inner * size != math.prod(ranges):
                text = f"{text} % {size}"
            defs.append(f"{prefix}{d} = {text}")
        inner *= size
    lines.extend(reversed(defs))
    return lines


def emit_kernel(node: ComputedBuffer, graph: IRGraph | None = None) -> KernelSpec:
    """The Triton kernel computing `node` alone. `graph` supplies the dtypes and storage
    sizes of the buffers it reads (needed for dtype-dependent ops and 64-bit indexing)."""
    if not isinstance(node, ComputedBuffer):
        raise TypeError(f"emit_kernel takes a ComputedBuffer, got {type(node).__name__}")
    buffers = graph.buffers if graph is not None else {}
    dtypes = {name: buf.dtype for name, buf in buffers.items()}
    dtypes[node.name] = node.dtype
    is_red = node.is_reduction
    data = node.data
    numel = math.prod(data.ranges)
    rnumel = math.prod(data.reduction_ranges) if is_red else 1
    if numel == 0 or rnumel == 0:
        raise CodegenError(f"{node.name}: empty loop nest")

    printer = TritonPrinter(reduction=is_red, buffer_dtypes=dtypes)
    index, rindex = node.loop_vars()
    with use_handler(printer):
        node.body(index, rindex)

    sizes = [numel * rnumel, node.layout.storage_size()]
    sizes += [buffers[n].layout.storage_size() for n in printer.loads if n in buffers]
    wide = max(sizes) >= 2**31 - 1
    idx_cast = ".to(tl.int64)" if wide else ""

    if is_red:
        kind = "persistent_reduction"
        rblock = next_power_of_2(rnumel)
        if rblock > MAX_PERSISTENT_RBLOCK:
            raise CodegenError(f"{node.name}: rnumel {rnumel} needs a looped reduction")
        meta = (("XBLOCK", 1), ("RBLOCK", rblock))
        num_warps = 1 if rblock <= 64 else 4 if rblock <= 1024 else 8
        name = _kernel_name(node, "kiln_per")
        prologue = [
            f"xnumel = {numel}",
            f"rnumel = {rnumel}",
            "xoffset = tl.program_id(0) * XBLOCK",
            f"xindex = (xoffset + tl.arange(0, XBLOCK)[:, None]){idx_cast}",
            "xmask = xindex < xnumel",
            f"rindex = tl.arange(0, RBLOCK)[None, :]{idx_cast}",
            "rmask = rindex < rnumel",
        ]
        prologue += _define_vars("x", data.ranges, "xindex")
        prologue += _define_vars("r", data.reduction_ranges, "rindex")
        constexprs = "XBLOCK: tl.constexpr, RBLOCK: tl.constexpr"
    else:
        kind = "pointwise"
        xblock = min(next_power_of_2(numel), MAX_XBLOCK)
        meta = (("XBLOCK", xblock),)
        num_warps = 4 if xblock <= 1024 else 8
        name = _kernel_name(node, "kiln_poi")
        prologue = [
            f"xnumel = {numel}",
            "xoffset = tl.program_id(0) * XBLOCK",
            f"xindex = (xoffset + tl.arange(0, XBLOCK)){idx_cast}",
            "xmask = xindex < xnumel",
        ]
        prologue += _define_vars("x", data.ranges, "xindex")
        constexprs = "XBLOCK: tl.constexpr"

    reads = tuple(printer.loads)
    writes = tuple(printer.stores)
    arg_names = tuple(printer.loads.values()) + tuple(printer.stores.values())
    body = prologue + printer.lines
    src = "\n".join(_header(node, kind)) + "\n" + _PRELUDE + "\n\n@triton.jit\n"
    src += f"def {name}({', '.join(arg_names + (constexprs,))}):\n"
    src += "".join(f"    {line}\n" for line in body)

    def grid(meta: Mapping[str, int], _numel: int = numel) -> tuple[int, ...]:
        return (_cdiv(_numel, meta["XBLOCK"]),)

    return KernelSpec(name=name, source=src, args=reads + writes, arg_names=arg_names,
                      reads=reads, writes=writes, meta=meta, num_warps=num_warps, grid=grid,
                      kind=kind, numel=numel, rnumel=rnumel, origins=tuple(node.origins))
