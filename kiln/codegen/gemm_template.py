"""gemm_template: a `GemmGroup` → one Triton matmul kernel with its epilogue fused into the store.

`emit_gemm(group, graph, config) -> KernelSpec` prints the Triton tutorial's grouped-order
matmul (`GROUP_M` rows of tiles share their B columns in L2), fp32 accumulator, a K loop
pipelined over `num_stages`, then the epilogue on the `[BLOCK_M, BLOCK_N]` tile:

1. addmm's bias added to the fp32 accumulator (as cuBLAS's bias epilogue does);
2. rounded once to the matmul's output dtype (`acc_out`: what eager's matmul returns), which
   the epilogue group's loads of the matmul output read from registers (`group.py`'s check
   that they read it at the index it was computed at refuses anything else);
3. the epilogue members printed by the ordinary `TritonPrinter`, their loop variables div/mod
   of the tile's rows (`rm`, `[BLOCK_M, 1]`) and columns (`rn`, `[1, BLOCK_N]`) when the
   group's loop dims split into batch × rows × columns, else of the flat `xindex`.

`gemm_configs(gemm)` gives at most 6 analytically chosen tile configs for Hopper (sm_90):
128×128 / 128×256 / 256×128 tiles with BLOCK_K 64 for 16-bit data (32 for fp32), 3-4 stages,
4-8 warps, each cut down to the problem's size. The interpreter's bf16 `tl.dot` multiplies
bit patterns, so interpreted kernels upcast 16-bit operands to fp32 first (`_kiln_dot16`).
fp32 operands use IEEE products unless torch allows TF32 for matmuls
(`torch.backends.cuda.matmul.allow_tf32`), as eager does.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping, Sequence

import torch

from kiln.codegen.kernel import _PRELUDE, KernelSpec, _define_vars, _kernel_name, next_power_of_2
from kiln.codegen.group import print_group
from kiln.codegen.triton_printer import TV, CodegenError, TritonPrinter
from kiln.lower.index import Expr
from kiln.lower.ir import IRGraph, TensorArg, loop_vars
from kiln.schedule.gemm_epilogue import GemmGroup, GemmNode, GemmOperands

__all__ = ["GemmConfig", "emit_gemm", "gemm_configs"]

KIND = "gemm_template"

_DOT_PRELUDE = '''
if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter's bf16 tl.dot is wrong
    @triton.jit
    def _kiln_dot16(a, b, acc):
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
else:
    @triton.jit
    def _kiln_dot16(a, b, acc):
        return tl.dot(a, b, acc)
'''

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the tutorial's Hopper sweet spot first
# (Inductor's best template on the seed block's GEMMs was 128x128x64, 4 warps, 3 stages).
_CONFIGS_16BIT = ((128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (128, 128, 64, 8, 4),
                  (256, 128, 64, 8, 3), (128, 128, 128, 8, 3), (64, 128, 64, 4, 4))
_CONFIGS_FP32 = ((128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                 (64, 64, 32, 4, 3))
MIN_BLOCK = 16  # tl.dot's smallest tile side
MAX_GRID_Y = 65535  # CUDA's limit on the grid's second dimension (one row per batch)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One tiling of a GEMM template: `BLOCK_M` × `BLOCK_N` output tiles, `BLOCK_K` per step
    of the K loop, `GROUP_M` tile rows per L2 group, and Triton's launch options."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 3

    kind = KIND

    def __post_init__(self) -> None:
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name}={value} must be a power of two")
        if min(self.BLOCK_M, self.BLOCK_N, self.BLOCK_K) < MIN_BLOCK:
            raise ValueError(f"blocks must be at least {MIN_BLOCK} (tl.dot), got {self.short()}")

    @property
    def meta(self) -> tuple[tuple[str, int], ...]:
        return (("BLOCK_M", self.BLOCK_M), ("BLOCK_N", self.BLOCK_N),
                ("BLOCK_K", self.BLOCK_K), ("GROUP_M", self.GROUP_M))

    def short(self) -> str:
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} GROUP_M={self.GROUP_M} "
                f"num_warps={self.num_warps} num_stages={self.num_stages}")


def gemm_configs(gemm: GemmOperands, dtype: torch.dtype) -> list[GemmConfig]:
    """Up to 6 configs, the likeliest first; blocks never exceed the problem's sizes (rounded
    up to a power of two, at least 16) and warps shrink with the tile."""
    table = _CONFIGS_FP32 if dtype == torch.float32 else _CONFIGS_16BIT
    out: list[GemmConfig] = []
    for bm, bn, bk, warps, stages in table:
        bm = min(bm, max(MIN_BLOCK, next_power_of_2(gemm.m)))
        bn = min(bn, max(MIN_BLOCK, next_power_of_2(gemm.n)))
        bk = min(bk, max(MIN_BLOCK, next_power_of_2(gemm.k)))
        warps = min(warps, max(1, bm * bn // 2048))
        config = GemmConfig(bm, bn, bk, 8, warps, stages)
        if config not in out:
            out.append(config)
    return out[:6]


# -- the epilogue printer ----------------------------------------------------------------------

class _EpiloguePrinter(TritonPrinter):
    """The ordinary printer on a `[BLOCK_M, BLOCK_N]` tile. `gemm_result` hands the matmul
    output (`GemmNode.body`) the rounded accumulator. Loads and stores whose index uses only
    the tile's rows or only its columns are broadcast to the tile (`+ xzero`), so pointer and
    mask shapes always agree."""

    def __init__(self, dtypes: Mapping[str, torch.dtype], out_dtype: torch.dtype,
                 full: set[str]) -> None:
        super().__init__(reduction=False, buffer_dtypes=dtypes)
        self.two_d = True  # constants are [1, 1] blocks
        self.rmask = None
        self.out_dtype = out_dtype
        self.full = full  # loop symbols that already span the whole tile
        self.rows: set[str] = set()
        self.cols: set[str] = set()

    def gemm_result(self, node: GemmNode) -> TV:
        return TV("acc_out", self.out_dtype)

    def _spans_tile(self, expr: Expr) -> bool:
        names = {s.name for s in expr.free_symbols()}
        return bool(names & self.full) or bool(names & self.rows and names & self.cols)

    def _load_index(self, expr: Expr) -> str:
        text = self.index(expr)
        return text if self._spans_tile(expr) else f"{text} + xzero"

    def _store_index(self, expr: Expr) -> str:
        text = self.index(expr)
        return text if self._spans_tile(expr) else f"{text} + xzero"


# -- pieces of the source ----------------------------------------------------------------------

def _index_text(arg: TensorArg, names: Sequence[str | None]) -> str:
    """`offset + i*stride + ...` of a view, one name per dim (None: a dim not indexed)."""
    parts = [str(arg.offset)] if arg.offset else []
    for name, size, stride in zip(names, arg.size, arg.stride):
        if name is None or size == 1 or stride == 0:
            continue
        parts.append(name if stride == 1 else f"{name} * {stride}")
    return " + ".join(parts) or "0"


def _dot_line(dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "acc = _kiln_dot16(a, b, acc)"
    precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return f'acc = tl.dot(a, b, acc, input_precision="{precision}")'


def _wrapped(name: str, offs: str, size: int, block: str, exact: bool,
             unit_stride: bool) -> str:
    """The operand rows (columns) a tile reads. A partial last tile wraps (`% size`: rows past
    M read row `m - M`, whose results are never stored), which keeps the loads unmasked; a
    tiling that divides the size needs no wrap, and there a unit-stride dim gets Triton's
    contiguity hint (never on a wrapped index: the hint would vectorize across the wrap and
    read past the operand)."""
    if not exact:
        return f"{name} = {offs} % {size}"
    if unit_stride:
        return f"{name} = tl.max_contiguous(tl.multiple_of({offs}, {block}), {block})"
    return f"{name} = {offs}"


def _main_loop(gemm: GemmOperands, ptrs: Mapping[str, str], config: GemmConfig,
               wide: bool) -> list[str]:
    a, b = gemm.a, gemm.b
    batch = gemm.kind == "bmm"
    to64 = ".to(tl.int64)" if wide else ""
    lines = [
        "pid = tl.program_id(0)",
        *(["bid = tl.program_id(1)" + to64] if batch else []),
        f"num_pid_m = tl.cdiv({gemm.m}, BLOCK_M)",
        f"num_pid_n = tl.cdiv({gemm.n}, BLOCK_N)",
        "num_pid_in_group = GROUP_M * num_pid_n",
        "group_id = pid // num_pid_in_group",
        "first_pid_m = group_id * GROUP_M",
        "group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
        "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
        "pid_n = (pid % num_pid_in_group) // group_size_m",
        f"offs_m = pid_m{to64} * BLOCK_M + tl.arange(0, BLOCK_M)",
        f"offs_n = pid_n{to64} * BLOCK_N + tl.arange(0, BLOCK_N)",
    ]
    lines.append(_wrapped("am", "offs_m", gemm.m, "BLOCK_M", gemm.m % config.BLOCK_M == 0,
                          a.stride[-2] == 1))
    lines.append(_wrapped("bn", "offs_n", gemm.n, "BLOCK_N", gemm.n % config.BLOCK_N == 0,
                          b.stride[-1] == 1))
    lines.append("rk = tl.arange(0, BLOCK_K)" + to64)
    lead = ["bid"] if batch else []
    a_index = _index_text(a, lead + ["am[:, None]", "rk[None, :]"])
    b_index = _index_text(b, lead + ["rk[:, None]", "bn[None, :]"])
    lines += [f"a_ptrs = {ptrs[a.name]} + ({a_index})",
              f"b_ptrs = {ptrs[b.name]} + ({b_index})",
              "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
              f"for k in range(0, tl.cdiv({gemm.k}, BLOCK_K)):"]
    if gemm.k % config.BLOCK_K == 0:
        body = ["a = tl.load(a_ptrs)", "b = tl.load(b_ptrs)"]
    else:
        body = [f"a = tl.load(a_ptrs, mask=rk[None, :] < {gemm.k} - k * BLOCK_K, other=0.0)",
                f"b = tl.load(b_ptrs, mask=rk[:, None] < {gemm.k} - k * BLOCK_K, other=0.0)"]
    body += [_dot_line(a.dtype), f"a_ptrs += BLOCK_K * {a.stride[-1]}",
             f"b_ptrs += BLOCK_K * {b.stride[-2]}"]
    return lines + [f"    {line}" for line in body]


def _tile_prologue(gemm: GemmOperands, ptrs: Mapping[str, str], masked: bool, wide: bool,
                   out_dtype: torch.dtype) -> list[str]:
    """Row/column indices of the tile, its mask, the bias and the rounded accumulator."""
    to64 = ".to(tl.int64)" if wide else ""
    int_type = "tl.int64" if wide else "tl.int32"
    batch = f"bid * {gemm.m * gemm.n} + " if gemm.kind == "bmm" else ""
    lines = [f"rm = (pid_m{to64} * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]",
             f"rn = (pid_n{to64} * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]",
             f"xzero = tl.zeros([BLOCK_M, BLOCK_N], {int_type})",
             f"xindex = {batch}rm * {gemm.n} + rn"]
    if masked:
        lines.append(f"xmask = (rm < {gemm.m}) & (rn < {gemm.n})")
    if gemm.bias is not None:
        bias = gemm.bias
        names = ["rm", "rn"][2 - len(bias.size):]
        index = _index_text(bias, names) + " + xzero"
        mask = ", mask=xmask, other=0.0" if masked else ""
        lines.append(f"acc = acc + tl.load({ptrs[bias.name]} + ({index}){mask})"
                     ".to(tl.float32)")
    rounded = {torch.bfloat16: "_to_bf16(acc)", torch.float16: "acc.to(tl.float16)"}
    lines.append(f"acc_out = {rounded.get(out_dtype, 'acc')}")
    return lines


def _split_dims(x_ranges: Sequence[int], parts: Sequence[int]) -> list[list[int]] | None:
    """The group's loop dims split into consecutive runs whose sizes multiply to `parts`
    (batch, rows, columns), or None when no such split exists."""
    runs: list[list[int]] = [[] for _ in parts]
    which, acc = 0, 1
    for d, size in enumerate(x_ranges):
        while which < len(parts) - 1 and acc == parts[which] and size != 1:
            which, acc = which + 1, 1
        runs[which].append(d)
        acc *= size
    products = [math.prod(x_ranges[d] for d in run) for run in runs]
    return runs if products == list(parts) else None


def _var_lines(x_ranges: Sequence[int], dims: Sequence[int], source: str) -> list[str]:
    """`x<d> = (source // inner) % size` for the group dims `dims` (outermost first), all
    defined from one row / column / batch index."""
    lines, inner = [], 1
    total = math.prod(x_ranges[d] for d in dims)
    for d in reversed(dims):
        size = x_ranges[d]
        if size != 1:
            text = source if inner == 1 else f"({source} // {inner})"
            if inner * size != total:
                text = f"{text} % {size}"
            lines.append(f"x{d} = {text}")
        inner *= size
    return lines[::-1]


def _loop_var_lines(group: GemmGroup, printer: _EpiloguePrinter) -> list[str]:
    gemm = group.gemm
    runs = _split_dims(group.x_ranges, (gemm.batch, gemm.m, gemm.n))
    if runs is None:
        printer.full = {f"x{d}" for d in range(len(group.x_ranges))}
        return _define_vars("x", group.x_ranges, "xindex")
    printer.rows = {f"x{d}" for d in runs[1]}
    printer.cols = {f"x{d}" for d in runs[2]}
    printer.full = set()
    lines = _var_lines(group.x_ranges, runs[0], "bid") if gemm.kind == "bmm" else []
    # batch dims are program-wide scalars: an index of them alone is broadcast like a row's
    printer.rows |= {f"x{d}" for d in runs[0]}
    return lines + _var_lines(group.x_ranges, runs[1], "rm") + \
        _var_lines(group.x_ranges, runs[2], "rn")


def _header(group: GemmGroup, config: GemmConfig) -> list[str]:
    gemm = group.gemm
    bias = " + bias" if gemm.bias is not None else ""
    lines = [f"# kiln {KIND} kernel for {group.name}: {gemm.describe()}{bias}, epilogue over "
             f"x={list(group.x_ranges)}",
             f"#   config: {config.short()}",
             f"#   a = {gemm.a.render()}", f"#   b = {gemm.b.render()}"]
    if gemm.bias is not None:
        lines.append(f"#   bias = {gemm.bias.render()}")
    for node in group.nodes:
        fate = "stored" if node.name in group.stores else "in registers"
        what = gemm.kind if isinstance(node, GemmNode) else "pointwise"
        lines.append(f"#   {node.name} ({fate}): {node.layout.render()} = {what}")
        for origin in node.origins:
            where = f" at {origin.user_location}" if origin.user_location else ""
            lines.append(f"#     from {origin.node} ({origin.op}){where}")
    return lines


def _is_wide(group: GemmGroup, graph: IRGraph | None) -> bool:
    from kiln.codegen.kernel import _is_wide as group_is_wide

    args = [a for a in (group.gemm.a, group.gemm.b, group.gemm.bias) if a is not None]
    extents = [a.offset + sum((s - 1) * st for s, st in zip(a.size, a.stride)) + 1
               for a in args]
    return max(extents) >= 2**31 - 1 or group_is_wide(group, graph)


# -- entry point -------------------------------------------------------------------------------

def emit_gemm(group: GemmGroup, graph: IRGraph | None, config: GemmConfig) -> KernelSpec:
    """The Triton kernel of a `GemmGroup` (matmul + fused epilogue, `group.stores` written).
    Raises `CodegenError` when the epilogue cannot run on the tile (it reads the matmul output
    at another index than the one the tile computes)."""
    gemm = group.gemm
    if gemm is None or not isinstance(group.nodes[0], GemmNode):
        raise CodegenError(f"{group.name}: not a GemmGroup (no GemmNode first)")
    if gemm.batch > MAX_GRID_Y:
        raise CodegenError(f"{group.name}: batch {gemm.batch} exceeds the grid's second "
                           f"dimension ({MAX_GRID_Y}); hint: the library call handles it")
    out_dtype = group.nodes[0].dtype
    dtypes = {name: buf.dtype for name, buf in (graph.buffers if graph else {}).items()}
    dtypes.update({n.name: n.dtype for n in group.nodes})
    for arg in (gemm.a, gemm.b, gemm.bias):
        if arg is not None:
            dtypes[arg.name] = arg.dtype
    masked = gemm.m % config.BLOCK_M != 0 or gemm.n % config.BLOCK_N != 0
    wide = _is_wide(group, graph)
    printer = _EpiloguePrinter(dtypes, out_dtype, set())
    printer.xmask = "xmask" if masked else None
    printer.wide = wide
    var_lines = _loop_var_lines(group, printer)
    body = print_group(group, printer, loop_vars(group.x_ranges, "x"), [], False)
    ptrs = dict(printer.loads)
    lines = (_main_loop(gemm, ptrs, config, wide) + _tile_prologue(gemm, ptrs, masked, wide,
                                                                   out_dtype)
             + var_lines + body.lines)
    name = _kernel_name(group, "kiln_gemm")
    arg_names = tuple(printer.loads.values()) + tuple(printer.stores.values())
    constexprs = tuple(f"{k}: tl.constexpr" for k, _ in config.meta)
    source = "\n".join(_header(group, config)) + "\n" + _PRELUDE + _DOT_PRELUDE
    source += f"\n\n@triton.jit\ndef {name}({', '.join(arg_names + constexprs)}):\n"
    source += "".join(f"    {line}\n" for line in lines)
    reads, writes = tuple(printer.loads), tuple(printer.stores)
    return KernelSpec(name=name, source=source, args=reads + writes, arg_names=arg_names,
                      reads=reads, writes=writes, meta=config.meta, num_warps=config.num_warps,
                      grid=functools.partial(gemm_grid, gemm.m, gemm.n, gemm.batch), kind=KIND,
                      numel=group.numel, rnumel=gemm.k, origins=group.origins, config=None,
                      num_stages=config.num_stages, members=tuple(n.name for n in group.nodes),
                      index_checks=printer.index_checks > 0)


def gemm_grid(m: int, n: int, batch: int, meta: Mapping[str, int]) -> tuple[int, ...]:
    """One program per output tile (grouped order inside the kernel), one grid row per batch."""
    tiles = -(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"])
    return (tiles, batch) if batch > 1 else (tiles,)

