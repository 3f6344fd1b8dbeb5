"""kernel_configs: kernel configurations (block sizes, warps, stages) and the kind of kernel a
group gets.

A `KernelConfig` fixes everything `emit_group` needs besides the group itself: the kernel kind
("pointwise", "persistent_reduction", "looped_reduction"), the constexpr blocks `XBLOCK` /
`RBLOCK` and the launch options `num_warps` / `num_stages`. `candidate_configs(group, graph)`
gives the heuristic default first, then a few alternatives for max-autotune; every candidate is
valid for the group (power-of-two blocks; persistent only when `RBLOCK >= rnumel`).

The heuristics, per reduction class (`reduction_class`):

- inner (the reduced axis is the contiguous one: a row sum, LayerNorm, softmax): persistent
  while the row fits (`rnumel <= MAX_PERSISTENT_RBLOCK`); rows of 256..1024 elements get one
  warp each, four rows per program (the row's reduction stays within a warp; rows of 1024 only
  when at most two full tensors stream through, see `_row_per_warp`), shorter rows
  several per program so that one program still covers ~1-2K elements; longer rows than the
  persistent limit are looped over `RBLOCK` chunks.
- outer (loads are contiguous along x, the reduced axis has a large stride: a bias gradient
  `sum(dim=0)`): x is the fast axis of the tile (Triton's coalescing follows the contiguous
  axis), `XBLOCK` is kept small enough that the grid still fills the GPU, and the r loop takes
  large chunks so enough bytes are in flight per program.
"""
from __future__ import annotations

import dataclasses
import math

from kiln.lower.index import affine_form
from kiln.lower.ir import IRGraph, loop_vars

__all__ = [
    "MAX_PERSISTENT_RBLOCK",
    "KernelConfig",
    "candidate_configs",
    "check_config",
    "default_config",
    "next_power_of_2",
    "reduction_class",
    "transpose_split",
]

MAX_XBLOCK = 1024
MAX_PERSISTENT_RBLOCK = 4096
MAX_TILE = 16384  # elements of one [XBLOCK, RBLOCK] tile (registers)
TARGET_PROGRAMS = 128  # about one program per SM on an H100/H200 (132 SMs)
ROW_PER_WARP = (256, 1024)  # inner-reduction row lengths that get one warp per row

KINDS = ("pointwise", "pointwise_2d", "persistent_reduction", "looped_reduction")
MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """How one group is emitted. kind: one of `KINDS`. XBLOCK: outputs (rows) per program;
    RBLOCK: reduction elements per tile (1 for pointwise; >= rnumel when persistent).
    num_warps / num_stages: Triton launch options (stages pipeline the r loop's loads)."""

    kind: str
    XBLOCK: int
    RBLOCK: int = 1
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kernel kind {self.kind!r}; one of {KINDS}")
        for name in ("XBLOCK", "RBLOCK", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name}={value} must be a power of two")

    @property
    def meta(self) -> tuple[tuple[str, int], ...]:
        if self.kind == "pointwise":
            return (("XBLOCK", self.XBLOCK),)
        if self.kind == "pointwise_2d":
            return (("XBLOCK", self.XBLOCK), ("YBLOCK", self.RBLOCK))
        return (("XBLOCK", self.XBLOCK), ("RBLOCK", self.RBLOCK))

    def short(self) -> str:
        r = "" if self.kind == "pointwise" else f" RBLOCK={self.RBLOCK}"
        if self.kind == "pointwise_2d":
            r = f" YBLOCK={self.RBLOCK}"
        return (f"{self.kind} XBLOCK={self.XBLOCK}{r} num_warps={self.num_warps} "
                f"num_stages={self.num_stages}")


def check_config(config: KernelConfig, numel: int, rnumel: int, is_reduction: bool) -> None:
    """Raise ValueError when `config` cannot emit a group of these sizes."""
    if is_reduction != (config.kind not in ("pointwise", "pointwise_2d")):
        raise ValueError(f"{config.kind} config for a {'reduction' if is_reduction else 'pointwise'}"
                         " group")
    if config.kind == "persistent_reduction" and config.RBLOCK < rnumel:
        raise ValueError(f"persistent reduction needs RBLOCK >= rnumel ({rnumel}), "
                         f"got {config.RBLOCK}; use a looped_reduction config")
    if config.XBLOCK * config.RBLOCK > 4 * MAX_TILE:
        raise ValueError(f"tile {config.XBLOCK}x{config.RBLOCK} is too large for registers")


def _warps_for(elements: int) -> int:
    """~256 elements per warp (8 per thread), 1..8 warps."""
    return max(1, min(8, next_power_of_2(elements) // 256))


# -- reduction class ---------------------------------------------------------------------------

def reduction_class(group, graph: IRGraph | None) -> str:
    """"inner" or "outer" (a column reduction: loads contiguous along x) for the group's
    reduction members' reads of buffers outside the group, in the group's loop variables
    (`deps.reduction_axis_class`; e.g. a bias gradient read through permuted q/k/v layouts is
    outer)."""
    from kiln.lower.deps import innermost, reduction_axis_class

    reads, _, xvars, rvars = _group_accesses(group, reductions_only=True)
    return reduction_axis_class([dep.index for dep in reads], innermost(xvars), innermost(rvars))


def _group_accesses(group, reductions_only: bool = False) -> tuple[list, list, list, list]:
    """(reads of buffers outside the group, writes, x vars, r vars) of the group's members, as
    `MemoryDep`s (name, index in the group's loop variables; a buffer several members read
    appears once per member)."""
    from kiln.codegen.group import member_indices
    from kiln.lower.deps import DepsCollector
    from kiln.lower.ops import use_handler

    members = {n.name for n in group.nodes}
    xvars = loop_vars(group.x_ranges, "x")
    rvars = loop_vars(group.r_ranges, "r")
    reads, writes = [], []
    for node in group.nodes:
        if reductions_only and not node.is_reduction:
            continue
        collector = DepsCollector()
        index, rindex = member_indices(node, group, xvars, rvars)
        with use_handler(collector):
            node.body(index, rindex)
        reads += [dep for dep in collector.reads if dep.name not in members]
        writes += [dep for dep in collector.writes if dep.name in group.stores]
    return reads, writes, xvars, rvars


def row_streams(group) -> int:
    """How many full [x, r] tensors a reduction group reads or writes (a LayerNorm 2, a
    residual add + LayerNorm with both outputs 4); weights indexed by r alone don't count."""
    reads, writes, xvars, rvars = _group_accesses(group)
    xs = {s.name for v in xvars for s in v.free_symbols()}
    rs = {s.name for v in rvars for s in v.free_symbols()}

    def full(deps: list) -> set[str]:
        names = [(dep.name, {s.name for s in dep.index.free_symbols()}) for dep in deps]
        return {name for name, used in names if used & xs and used & rs}

    return len(full(reads)) + len(full(writes))


# -- candidates --------------------------------------------------------------------------------

def _pointwise_configs(numel: int) -> list[KernelConfig]:
    top = min(next_power_of_2(numel), MAX_XBLOCK)
    default = KernelConfig("pointwise", top, num_warps=_warps_for(top) if top < 1024 else 4)
    out = [default]
    for xblock, warps in ((top // 2, 4), (min(2 * top, 2048), 8), (top // 4, 2), (top, 8)):
        if xblock >= 1 and xblock <= next_power_of_2(numel) * 2:
            out.append(KernelConfig("pointwise", max(1, xblock), num_warps=warps))
    return out


def transpose_split(group, graph: IRGraph | None = None) -> int | None:
    """For a pointwise group that reads some buffer transposed to how it writes (the unit
    stride on another loop variable), the dim `k` splitting `x_ranges` into the tile's two
    axes `x_ranges[:k]` × `x_ranges[k:]` (one holds each unit-stride variable); else None."""
    from kiln.codegen.group import member_indices
    from kiln.lower.deps import DepsCollector
    from kiln.lower.ops import use_handler

    if group.is_reduction or len(group.x_ranges) < 2:
        return None
    members = {n.name for n in group.nodes}
    xvars = loop_vars(group.x_ranges, "x")
    loads, stores = [], []
    for node in group.nodes:
        collector = DepsCollector()
        index, _ = member_indices(node, group, xvars, [])
        with use_handler(collector):
            node.body(index, [])
        loads += [d.index for d in collector.reads if d.name not in members]
        stores += [d.index for d in collector.writes if d.name in group.stores]
    store_dims = {_unit_dim(i) for i in stores} - {None}
    if len(store_dims) != 1:
        return None
    (j,) = store_dims
    for index in loads:
        i = _unit_dim(index)
        if i is not None and i != j:
            k = max(i, j)
            a, b = math.prod(group.x_ranges[:k]), math.prod(group.x_ranges[k:])
            if a >= 8 and b >= 8:
                return k
    return None


def _unit_dim(index) -> int | None:
    coefs = affine_form(index).linear_coefficients() or {}
    for s, c in coefs.items():
        if abs(c) == 1 and s.name.startswith("x") and s.size > 1:
            return int(s.name[1:])
    return None


def _tiled_configs(group, k: int) -> list[KernelConfig]:
    a, b = math.prod(group.x_ranges[:k]), math.prod(group.x_ranges[k:])
    out = []
    for xb, yb, warps in ((32, 32, 4), (64, 64, 8), (16, 64, 4), (64, 16, 4)):
        xb, yb = min(xb, next_power_of_2(a)), min(yb, next_power_of_2(b))
        if -(-b // yb) <= MAX_GRID_Y:
            out.append(KernelConfig("pointwise_2d", xb, yb, min(warps, _warps_for(xb * yb) * 2)))
    return out


def _rows_per_program(numel: int, rblock: int, elements: int) -> int:
    """Rows per program so that a tile holds ~`elements`, without starving the grid."""
    xblock = max(1, min(next_power_of_2(numel), elements // rblock, 64))
    while xblock > 1 and _cdiv(numel, xblock) < TARGET_PROGRAMS and numel >= TARGET_PROGRAMS:
        xblock //= 2
    return xblock


def _inner_configs(numel: int, rnumel: int, streams: int) -> list[KernelConfig]:
    rtop = next_power_of_2(rnumel)
    out: list[KernelConfig] = []
    if rtop <= MAX_PERSISTENT_RBLOCK:
        xblock = _rows_per_program(numel, rtop, 1024)
        warps = _warps_for(xblock * rtop)
        out.append(KernelConfig("persistent_reduction", xblock, rtop, warps))
        out.append(KernelConfig("persistent_reduction", xblock, rtop, min(8, 2 * warps)))
        more = _rows_per_program(numel, rtop, 4096)
        if more != xblock:
            out.append(KernelConfig("persistent_reduction", more, rtop, _warps_for(more * rtop)))
        if ROW_PER_WARP[0] <= rtop <= ROW_PER_WARP[1] and (rtop < 1024 or streams <= 2):
            out.insert(0, _row_per_warp(numel, rtop))
        rblock = max(1, min(rtop // 2, 1024))
    else:
        rblock = 2048
    xb = 1 if rblock >= 256 else max(1, min(next_power_of_2(numel), 256 // rblock))
    out.append(KernelConfig("looped_reduction", xb, rblock, _warps_for(xb * rblock), 1))
    out.append(KernelConfig("looped_reduction", xb, max(1, rblock // 2), 4, 2))
    if rblock >= 2048:
        out.append(KernelConfig("looped_reduction", 1, 4096, 8, 1))
        out.append(KernelConfig("looped_reduction", 2, 1024, 8, 2))
    return out


def _row_per_warp(numel: int, rtop: int) -> KernelConfig:
    """Rows of 256..1024 elements: four rows per program, one warp each. Measured on the H200
    (bf16, benchmarks/RESULTS.md): softmax over [262144, 512] 130 us vs 139 us at 8 rows / 8
    warps; x + b -> GELU -> LayerNorm over [131072, 1024] 188 us vs 229 us at 1 row / 4 warps.
    Rows of 1024 that stream more than two full tensors (residual add + LayerNorm: two in, two
    out; 32 values per thread per tensor) keep 1 row / 4 warps: 257 us vs 265 us."""
    rows = 4
    while rows > 1 and _cdiv(numel, rows) < TARGET_PROGRAMS and numel >= TARGET_PROGRAMS:
        rows //= 2
    return KernelConfig("persistent_reduction", rows, rtop, rows)


def _outer_configs(numel: int, rnumel: int) -> list[KernelConfig]:
    rtop = next_power_of_2(rnumel)
    out: list[KernelConfig] = []
    xblock = max(1, min(next_power_of_2(numel), 64))
    while xblock > 8 and _cdiv(numel, xblock) < TARGET_PROGRAMS:
        xblock //= 2
    if rtop * xblock <= 4096:
        out.append(KernelConfig("persistent_reduction", xblock, rtop, _warps_for(xblock * rtop)))
    rblock = max(1, min(rtop, 8192 // xblock))
    out.append(KernelConfig("looped_reduction", xblock, rblock, 8, 1))
    for xb, rb, warps, stages in ((2 * xblock, rblock // 2, 8, 1), (xblock, rblock // 2, 4, 2),
                                  (xblock // 2, 2 * rblock, 8, 1)):
        xb = max(1, min(xb, next_power_of_2(numel)))
        rb = max(1, min(rb, rtop))
        out.append(KernelConfig("looped_reduction", xb, rb, warps, stages))
    return out


def candidate_configs(group, graph: IRGraph | None = None) -> list[KernelConfig]:
    """The heuristic default config first, then up to 5 alternatives (max-autotune)."""
    numel, rnumel = group.numel, group.rnumel
    if not group.is_reduction:
        k = transpose_split(group, graph)
        tiled = _tiled_configs(group, k) if k is not None else []
        configs = tiled + _pointwise_configs(numel)[:6 - min(len(tiled), 4)]
    elif reduction_class(group, graph) == "outer":
        configs = _outer_configs(numel, rnumel)
    else:
        configs = _inner_configs(numel, rnumel, row_streams(group))
    unique = list(dict.fromkeys(configs))
    return unique[:6]


def default_config(group, graph: IRGraph | None = None) -> KernelConfig:
    return candidate_configs(group, graph)[0]

