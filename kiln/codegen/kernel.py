"""kernel: a `FusedGroup` → one Triton kernel (`KernelSpec`).

`emit_group(group, graph, config)` prints the members' bodies (`group.py`) into one of three
kernel kinds (`KernelConfig.kind`, chosen by `config.candidate_configs` unless given):

- pointwise: 1-D, `xindex` covers `numel` in blocks of `XBLOCK`; the loop variables are div/mod
  of `xindex`. The mask is elided when `XBLOCK` divides numel, so contiguous loads vectorize.
- pointwise_2d: tiles `[XBLOCK, YBLOCK]` over two flattened axes of the loop dims, 2-D grid,
  when a read is contiguous along another dim than the write (`tiling.py`: the store's
  contiguous dims on Y, the read's on X, the other dims folded into X).
- persistent_reduction: tile `[XBLOCK, RBLOCK]` (`RBLOCK >= rnumel`), `XBLOCK` rows per program,
  the whole row in registers, reduced once along axis 1.
- looped_reduction: `XBLOCK` rows per program, `for roffset in range(0, rnumel, RBLOCK)` with
  accumulators; several loops when a member needs an earlier reduction's result (`group.py`).

Column ("outer") reductions use the same tile; their configs give a small `XBLOCK` and a large
`RBLOCK` and Triton's coalescing makes x the fast axis of the layout since the loads are
contiguous along x. Sizes are specialized into the source (static shapes). Indices are int32
unless a size or storage extent reaches 2**31 (then int64). The source starts with a comment
header listing every member with its IR and the FX nodes / user lines it came from.

`emit_kernel(node, graph)` is `emit_group` of the one-node group that stores `node`.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
from typing import Any, Callable, Mapping, Sequence

from kiln.codegen.kernel_configs import (
    KernelConfig,
    check_config,
    default_config,
    next_power_of_2,
    reduction_class,
)
from kiln.codegen.group import print_group
from kiln.codegen.fast_math import FAST_MATH_HELPERS
from kiln.codegen.reductions import PRELUDE_HELPERS
from kiln.codegen.tiling import plan_tiles, tile_grid, tile_prologue
from kiln.codegen.triton_printer import CodegenError, TritonPrinter
from kiln.codegen.triton_types import triton_dtype
from kiln.lower.deps import read_writes
from kiln.lower.index import size_hint, size_names
from kiln.lower.ir import ComputedBuffer, IRGraph, Origin, Reduction, loop_vars
from kiln.schedule import FusedGroup

__all__ = ["KernelSpec", "emit_group", "emit_kernel", "grid_source", "next_power_of_2"]

_PRELUDE = '''import os

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter does not patch libdevice
    from kiln.codegen import _interp_libdevice as libdevice
else:
    from triton.language.extra import libdevice

if os.environ.get("TRITON_INTERPRET") == "1":  # device asserts are no-ops when interpreted
    from kiln.codegen._interp_libdevice import check_index as _check_index
else:
    @triton.jit
    def _check_index(ok):
        tl.device_assert(ok, "kiln: index out of bounds")

if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter truncates float -> bf16
    from kiln.codegen._interp_libdevice import to_bf16 as _to_bf16
else:
    @triton.jit
    def _to_bf16(x):
        return x.to(tl.bfloat16)


@triton.jit
def _pow_int(a, b, BITS: tl.constexpr, SIGNED: tl.constexpr):
    # torch's integer pow (ATen's powi): squaring over the exponent's bits, wrapping like
    # torch; a negative exponent gives 0, except for the bases 1 and -1
    result = a * 0 + 1
    base = a
    e = b
    for _ in tl.static_range(BITS):
        result = tl.where((e & 1) != 0, result * base, result)
        e = e >> 1
        base = base * base
    if SIGNED:
        odd = (b & 1) != 0
        negative = tl.where(a == 1, 1, tl.where(a == -1, tl.where(odd, -1, 1), 0))
        result = tl.where(b < 0, negative.to(result.dtype), result)
    return result

''' + PRELUDE_HELPERS + FAST_MATH_HELPERS

_PREFIX = {"pointwise": "kiln_poi", "pointwise_2d": "kiln_tile", "persistent_reduction": "kiln_per",
           "looped_reduction": "kiln_red"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A generated kernel.

    name: the `@triton.jit` function's name in `source` (a whole module: imports, helpers,
        the kernel). args: buffer names, one per pointer argument, in call order (reads, then
        writes); arg_names: the pointer parameter names. reads / writes: buffer names.
    meta: constexpr arguments (XBLOCK, RBLOCK or YBLOCK); num_warps / num_stages: launch
        options. grid: `grid(meta) -> tuple` of program counts. kind: "pointwise" |
        "pointwise_2d" | "persistent_reduction" | "looped_reduction". numel / rnumel: the
        output and reduction sizes. origins: FX nodes it came from. config: the
        `KernelConfig` it was emitted with. members: the group's buffer names in order.
        reduction_class: "inner" | "outer" ("" for pointwise).
    index_checks: the kernel bounds-checks indirect indices with `tl.device_assert`, which
        Triton compiles only with debug=True (`compile_options`).
    size_args: the symbolic sizes the kernel takes after its pointers (`s0`, in this order;
        empty for a static kernel); `numel` / `rnumel` are then expressions of them and
        `grid(meta, sizes)` takes their values (without `sizes`: at the example's sizes).
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
    config: KernelConfig | None = None
    num_stages: int = 1
    members: tuple[str, ...] = ()
    reduction_class: str = ""
    index_checks: bool = False
    size_args: tuple[str, ...] = ()

    @property
    def meta_dict(self) -> dict[str, int]:
        return dict(self.meta)

    @property
    def key(self) -> str:
        """A content hash of the source (the compile cache key)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:20]

    def launch_options(self) -> dict[str, int]:
        """The keyword arguments of `kernel[grid](*pointers, **options)`."""
        return {**self.meta_dict, "num_warps": self.num_warps, "num_stages": self.num_stages,
                **self.compile_options()}

    def compile_options(self) -> dict[str, bool]:
        """Triton compile options beyond warps and stages (every launch route passes them, and
        they are part of the binary cache key, `kiln.runtime.binaries.binary_key`):

        - `enable_fp_fusion=False` unless `config.fp_fusion`: no FMA contraction. Eager rounds
          every op's result; a contracted `x * 3 - mean` does not round the product, so
          LayerNorm(1) of `x * 3` returned the product's rounding error times rsqrt(eps) ~ 316
          (5e-5) where eager returns 0 (H200 fuzz, seed 670). Explicit `tl.fma` stays fused.
        - debug mode keeps the bounds checks' device asserts; its integer-overflow sanitizer
          stays off (eager wraps).
        """
        from kiln.config import config

        options: dict[str, bool] = {}
        if not config.fp_fusion and _cuda_option("enable_fp_fusion"):
            options["enable_fp_fusion"] = False
        if self.index_checks:
            options["debug"] = True
            if _cuda_option("sanitize_overflow"):
                options["sanitize_overflow"] = False
        return options


@functools.lru_cache(maxsize=None)
def _cuda_option(name: str) -> bool:
    """Whether this Triton's CUDA options know `name` (an unknown keyword is a KeyError at
    launch). Triton 3.6 and 3.9 know both `enable_fp_fusion` and `sanitize_overflow`."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return name in getattr(CUDAOptions, "__dataclass_fields__", {})


# -- naming and header -------------------------------------------------------------------------

def _kernel_name(group: FusedGroup, prefix: str) -> str:
    ops: list[str] = []
    for origin in group.origins:
        op = origin.op.split("/")[0].removeprefix("aten.").split(".")[0]
        if op and op not in ops:
            ops.append(op)
    parts = [prefix] + ops[:4] + [group.name]
    return re.sub(r"[^0-9A-Za-z_]", "_", "_".join(parts))


def _describe(node: ComputedBuffer) -> str:
    data = node.data
    if isinstance(data, Reduction):
        return (f"Reduction {data.reduction_type} ranges={list(data.ranges)} "
                f"reduction_ranges={list(data.reduction_ranges)}")
    return f"Pointwise ranges={list(data.ranges)}"


def _header(group: FusedGroup, config: KernelConfig, red_class: str,
            notes: Sequence[str] = ()) -> list[str]:
    what = f" ({red_class} reduction)" if red_class else ""
    lines = [f"# kiln {config.kind} kernel for {group.name}{what}: "
             f"x={list(group.x_ranges)} r={list(group.r_ranges)}",
             f"#   config: {config.short()}"] + [f"#   {note}" for note in notes]
    for node in group.nodes:
        fate = "stored" if node.name in group.stores else "in registers"
        lines.append(f"#   {node.name} ({fate}): {node.layout.render()} = {_describe(node)}")
        for origin in node.origins:
            where = f" at {origin.user_location}" if origin.user_location else ""
            lines.append(f"#     from {origin.node} ({origin.op}){where}")
    return lines


def _define_vars(prefix: str, ranges: tuple[int, ...], source: str,
                 order: Sequence[int] | None = None) -> list[str]:
    """`x0 = xindex // 16`, `x1 = xindex % 16`, ... (size-1 dims never appear in indices).
    `order`: the dims from outermost to innermost in `source` (default: as listed), so a
    pointwise kernel can walk its output's memory order (a channels-last buffer's C fastest)."""
    order = tuple(range(len(ranges))) if order is None else tuple(order)
    defs = {}
    inner = 1
    for d in reversed(order):
        size = ranges[d]
        if size != 1:
            text = source if inner == 1 else f"({source} // {_operand(inner)})"
            if inner * size != math.prod(ranges):
                text = f"{text} % {_operand(size)}"
            defs[d] = f"{prefix}{d} = {text}"
        inner *= size
    return [defs[d] for d in sorted(defs)]


def _operand(size: Any) -> str:
    """A size as an operand of `//` or `%` (a symbolic product is parenthesized)."""
    text = str(size)
    return text if text.isidentifier() or text.isdigit() else f"({text})"


def memory_order(group: FusedGroup) -> tuple[int, ...] | None:
    """The order (outermost first) in which a pointwise group walks its loop so that its first
    stored buffer is written contiguously: the dims by decreasing stride. None when that is the
    listed order, or no store spans the loop dim for dim. Without it a kernel writing a
    channels-last buffer steps C elements between neighbouring lanes (3x slower on the H200's
    ResNet-50 than eager)."""
    by_name = {node.name: node for node in group.nodes}
    for name in group.stores:
        node = by_name.get(name)
        if node is None or tuple(node.data.ranges) != tuple(group.x_ranges):
            continue
        stride = node.layout.stride
        if len(stride) != len(group.x_ranges):
            return None
        big = [d for d in range(len(stride)) if group.x_ranges[d] != 1]
        # by the example's strides: any order is correct, and symbolic ones may not compare
        order = sorted(big, key=lambda d: -size_hint(stride[d]))
        return None if order == big else tuple(order) + tuple(
            d for d in range(len(stride)) if group.x_ranges[d] == 1)
    return None


# -- prologues ---------------------------------------------------------------------------------

def _x_prologue(group: FusedGroup, config: KernelConfig, masked: bool, wide: bool) -> list[str]:
    tile = "[:, None]" if config.kind != "pointwise" else ""
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    lines = [f"xnumel = {group.numel}"]
    if config.kind != "pointwise":
        lines.append(f"rnumel = {group.rnumel}")
    lines += [f"xoffset = {pid} * XBLOCK",
              f"xindex = xoffset + tl.arange(0, XBLOCK){tile}"]
    if masked:
        lines.append("xmask = xindex < xnumel")
    order = memory_order(group) if config.kind == "pointwise" else None
    return lines + _define_vars("x", group.x_ranges, "xindex", order)


def _r_prologue(group: FusedGroup, config: KernelConfig, masked: bool, wide: bool) -> list[str]:
    base = "tl.arange(0, RBLOCK)[None, :]"
    if config.kind == "looped_reduction":
        base = f"roffset + {base}"
    lines = [f"rindex = ({base}).to(tl.int64)" if wide else f"rindex = {base}"]
    if masked:
        lines.append("rmask = rindex < rnumel")
    return lines + _define_vars("r", group.r_ranges, "rindex")


def _is_wide(group: FusedGroup, graph: IRGraph | None) -> bool:
    """Whether any index can reach 2**31 (then every index is int64). A kernel with symbolic
    sizes uses int32: the wrapper refuses sizes whose extents reach 2**31 at every call."""
    if graph is not None and getattr(graph, "symbolic", False):
        return False
    sizes = [group.numel * group.rnumel] + [n.layout.storage_size() for n in group.nodes]
    buffers = graph.buffers if graph is not None else {}
    for node in group.nodes:
        reads = read_writes(node).read_names
        sizes += [buffers[r].layout.storage_size() for r in reads if r in buffers]
    return max(sizes) >= 2**31 - 1


# -- entry points ------------------------------------------------------------------------------

def _check_group(group: FusedGroup) -> None:
    if not group.nodes:
        raise CodegenError(f"{group.name}: empty group")
    for node in group.nodes:
        if not isinstance(node, ComputedBuffer):
            raise TypeError(f"{group.name}: members must be ComputedBuffers, got "
                            f"{type(node).__name__}")
    if group.numel == 0 or (group.r_ranges and group.rnumel == 0):
        raise CodegenError(f"{group.name}: empty loop nest")
    if group.is_reduction and not group.r_ranges:
        raise CodegenError(f"{group.name}: reduction members but no r_ranges")
    for node in group.nodes:  # complex values have no Triton type, not even for a plain copy
        triton_dtype(node.dtype)


def _dtypes(group: FusedGroup, graph: IRGraph | None) -> dict:
    dtypes = {name: buf.dtype for name, buf in (graph.buffers if graph else {}).items()}
    dtypes.update({n.name: n.dtype for n in group.nodes})
    return dtypes


def _source(group: FusedGroup, config: KernelConfig, name: str, printer: TritonPrinter,
            lines: list[str], constexprs: tuple[str, ...], red_class: str = "",
            notes: Sequence[str] = (), size_args: tuple[str, ...] = ()) -> str:
    arg_names = tuple(printer.loads.values()) + tuple(printer.stores.values()) + size_args
    src = "\n".join(_header(group, config, red_class, notes)) + "\n" + _PRELUDE
    src += "\n\n" + _jit_decorator(size_args) + "\n"
    src += f"def {name}({', '.join(arg_names + constexprs)}):\n"
    return src + "".join(f"    {line}\n" for line in lines)


def _jit_decorator(size_args: tuple[str, ...]) -> str:
    """`@triton.jit`; size arguments unspecialized: Triton would otherwise compile one binary
    per size class (a size of 1, a multiple of 16, any other) and pick it at every launch,
    where one binary serves every size (masks are on for symbolic extents anyway), and the
    bound launch route needs one binary per argument dtypes (runtime/launcher.py)."""
    if not size_args:
        return "@triton.jit"
    return f"@triton.jit(do_not_specialize={list(size_args)!r})"


def _spec(group: FusedGroup, config: KernelConfig, name: str, source: str,
          printer: TritonPrinter, grid, red_class: str = "",
          size_args: tuple[str, ...] = ()) -> KernelSpec:
    reads, writes = tuple(printer.loads), tuple(printer.stores)
    arg_names = tuple(printer.loads.values()) + tuple(printer.stores.values())
    return KernelSpec(name=name, source=source, args=reads + writes, arg_names=arg_names,
                      reads=reads, writes=writes, meta=config.meta, num_warps=config.num_warps,
                      grid=grid, kind=config.kind, numel=group.numel, rnumel=group.rnumel,
                      origins=group.origins, config=config, num_stages=config.num_stages,
                      members=tuple(n.name for n in group.nodes), reduction_class=red_class,
                      index_checks=printer.index_checks > 0, size_args=size_args)


def _emit_tiled(group: FusedGroup, graph: IRGraph | None, config: KernelConfig) -> KernelSpec:
    """A 2-D tiled pointwise kernel (`tiling.py`): a `[XBLOCK, YBLOCK]` tile over the plan's X
    and Y axes, so the store (contiguous along Y) and the transposed read (along X) both touch
    whole rows of the tile; Triton converts the layout between them through shared memory."""
    plan = plan_tiles(group)
    if plan is None:
        raise ValueError(f"{group.name}: pointwise_2d needs a read transposed to the write")
    printer = TritonPrinter(reduction=False, buffer_dtypes=_dtypes(group, graph))
    printer.two_d, printer.inner_prefix = True, "y"
    xmasked = plan.x_numel % config.XBLOCK != 0
    ymasked = plan.y_numel % config.YBLOCK != 0
    printer.xmask = "xmask" if xmasked else None
    printer.rmask = "ymask" if ymasked else None
    printer.wide = wide = _is_wide(group, graph)
    body = print_group(group, printer, plan.loop_vars(group.x_ranges), [], False)
    prologue = tile_prologue(plan, wide, xmasked, ymasked)
    name = _kernel_name(group, _PREFIX[config.kind])
    src = _source(group, config, name, printer, prologue + body.lines,
                  ("XBLOCK: tl.constexpr", "YBLOCK: tl.constexpr"), notes=(plan.describe(),))
    return _spec(group, config, name, src, printer, functools.partial(tile_grid, plan))


def emit_group(group: FusedGroup, graph: IRGraph | None = None,
               config: KernelConfig | None = None) -> KernelSpec:
    """The Triton kernel computing `group` (members in order, `group.stores` written).
    `graph` supplies the dtypes and storage sizes of the buffers it reads (needed for
    dtype-dependent ops and 64-bit indexing); `config` defaults to the heuristic choice."""
    _check_group(group)
    is_red = group.is_reduction
    config = config or default_config(group, graph)
    check_config(config, group.numel, group.rnumel, is_red)
    if config.kind == "pointwise_2d":
        return _emit_tiled(group, graph, config)
    dtypes = _dtypes(group, graph)
    wide = _is_wide(group, graph)
    xmasked = group.numel % config.XBLOCK != 0
    rmasked = is_red and group.rnumel % config.RBLOCK != 0
    if config.kind == "persistent_reduction":
        rmasked = group.rnumel != config.RBLOCK

    printer = TritonPrinter(reduction=is_red, buffer_dtypes=dtypes)
    printer.xmask = "xmask" if xmasked else None
    printer.rmask = "rmask" if rmasked else None
    printer.wide, printer.rnumel = wide, group.rnumel
    xvars = loop_vars(group.x_ranges, "x")
    rvars = loop_vars(group.r_ranges, "r")
    r_pro = _r_prologue(group, config, rmasked, wide) if is_red else []
    looped = config.kind == "looped_reduction"
    body = print_group(group, printer, xvars, rvars, looped, r_pro)

    red_class = reduction_class(group, graph) if is_red else ""
    name = _kernel_name(group, _PREFIX[config.kind])
    prologue = _x_prologue(group, config, xmasked, wide)
    if is_red and not looped:
        prologue += r_pro
    constexprs = ("XBLOCK: tl.constexpr",) + (("RBLOCK: tl.constexpr",) if is_red else ())
    size_args = used_sizes(prologue + body.lines, graph)
    src = _source(group, config, name, printer, prologue + body.lines, constexprs, red_class,
                  size_args=size_args)
    grid = functools.partial(_symbolic_grid, group.numel) if size_args else \
        functools.partial(_grid, group.numel)
    return _spec(group, config, name, src, printer, grid, red_class, size_args)


def _grid(numel: int, meta: Mapping[str, int]) -> tuple[int, ...]:
    return (_cdiv(numel, meta["XBLOCK"]),)


def _symbolic_grid(numel: Any, meta: Mapping[str, int],
                   sizes: Mapping[str, int] | None = None) -> tuple[int, ...]:
    value = numel.evaluate(sizes or {}) if hasattr(numel, "evaluate") else numel
    return (_cdiv(int(value), meta["XBLOCK"]),)


def grid_source(spec: KernelSpec) -> tuple[str, str, str] | None:
    """The grid of a kernel with size arguments as three Python expressions of them (the
    bound launch route computes it per call without evaluating an Expr), or None when its
    grid is not `_symbolic_grid`'s."""
    grid = spec.grid
    if not (isinstance(grid, functools.partial) and grid.func is _symbolic_grid):
        return None
    xblock = int(spec.meta_dict["XBLOCK"])
    return (f"(({grid.args[0]}) + {xblock - 1}) // {xblock}", "1", "1")


def used_sizes(lines: Sequence[str], graph: IRGraph | None) -> tuple[str, ...]:
    """The symbolic sizes (`s0`) the kernel's lines name, sorted: its size arguments."""
    names = graph_sizes(graph)
    if not names:
        return ()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(lines)))
    return tuple(sorted(names & words, key=lambda n: (len(n), n)))


def graph_sizes(graph: IRGraph | None) -> set[str]:
    """Names of the symbolic sizes in the graph's buffer layouts and int inputs (an int
    argument may only bound a loop: `torch.arange(n).sum()` keeps `n` in no layout)."""
    if graph is None or not getattr(graph, "symbolic", False):
        return set()
    found: set[str] = set()
    for value in graph.size_inputs.values():
        found |= size_names(value)
    for buf in graph.buffers.values():
        lay = buf.layout
        for value in (*lay.size, *lay.stride, lay.offset):
            found |= size_names(value)
    return found


def single_group(node: ComputedBuffer) -> FusedGroup:
    """The one-node group that computes and stores `node`."""
    rr = tuple(node.data.reduction_ranges) if node.is_reduction else ()
    return FusedGroup(node.name, [node], tuple(node.data.ranges), rr, (node.name,))


def emit_kernel(node: ComputedBuffer, graph: IRGraph | None = None,
                config: KernelConfig | None = None) -> KernelSpec:
    """The Triton kernel computing `node` alone (`emit_group` of its one-node group)."""
    if not isinstance(node, ComputedBuffer):
        raise TypeError(f"emit_kernel takes a ComputedBuffer, got {type(node).__name__}")
    return emit_group(single_group(node), graph, config)

