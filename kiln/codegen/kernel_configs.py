"""kernel_configs: kernel configurations (block sizes, warps, stages) and the kind of kernel a
group gets.

A `KernelConfig` fixes everything `emit_group` needs besides the group itself: the kernel kind
("pointwise", "pointwise_2d", "persistent_reduction", "looped_reduction"), the constexpr blocks
`XBLOCK` / `RBLOCK` (`YBLOCK` for a 2-D tile) and the launch options `num_warps` /
`num_stages`. `candidate_configs(group, graph)` gives the heuristic default first, then a few
alternatives for max-autotune; every candidate is valid for the group (power-of-two blocks;
persistent only when `RBLOCK >= rnumel`).

A pointwise group whose store and largest read are contiguous along different loop dims (a
permute fused with elementwise math) gets 2-D tiles first (`tiling.plan_tiles`, `_tiled_configs`),
then two 1-D configs; any other pointwise group gets 1-D configs only.

The reduction heuristics, per reduction class (`reduction_class`):

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

from kiln.codegen.group import group_accesses
from kiln.codegen.tiling import plan_tiles
from kiln.config import config
from kiln.lower.index import is_static, size_hint
from kiln.lower.ir import IRGraph

__all__ = [
    "MAX_PERSISTENT_RBLOCK",
    "KernelConfig",
    "candidate_configs",
    "check_config",
    "default_config",
    "next_power_of_2",
    "reduction_class",
]

MAX_XBLOCK = 1024
MAX_PERSISTENT_RBLOCK = 4096
MAX_TILE = 16384  # elements of one [XBLOCK, RBLOCK] tile (registers)
TARGET_PROGRAMS = 128  # about one program per SM on an H100/H200 (132 SMs)
ROW_PER_WARP = (256, 1024)  # inner-reduction row lengths that get one warp per row

KINDS = ("pointwise", "pointwise_2d", "persistent_reduction", "looped_reduction")
MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension
MIN_TILE_SIDE = 16  # a 2-D tile's Y block: 32 bytes of bf16, one DRAM sector
MAX_TILE_PADDING = 1.125  # masked lanes a tile's Y blocks may add, relative to the axis


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """How one group is emitted. kind: one of `KINDS`. XBLOCK: outputs (rows) per program;
    RBLOCK: reduction elements per tile (1 for pointwise; >= rnumel when persistent; the
    tile's Y block, `YBLOCK`, for pointwise_2d).
    num_warps / num_stages: Triton launch options (stages pipeline the r loop's loads)."""

    kind: str
    XBLOCK: int
    RBLOCK: int = 1
    num_warps: int = 4
    num_stages: int = 1

    @property
    def YBLOCK(self) -> int:
        """A pointwise_2d tile's second block (kept in the `RBLOCK` field)."""
        return self.RBLOCK

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
    if config.kind == "persistent_reduction" and not is_static(rnumel):
        raise ValueError("a persistent reduction needs a static rnumel; use a looped_reduction "
                         "config for a reduction over a symbolic size")
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

    reads, _, xvars, rvars = group_accesses(group, reductions_only=True)
    return reduction_axis_class([dep.index for dep in reads], innermost(xvars), innermost(rvars))


def row_streams(group) -> int:
    """How many full [x, r] tensors a reduction group reads or writes (a LayerNorm 2, a
    residual add + LayerNorm with both outputs 4); weights indexed by r alone don't count."""
    reads, writes, xvars, rvars = group_accesses(group)
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


def _tiled_configs(group, plan, graph: IRGraph | None) -> list[KernelConfig]:
    """2-D tiles `[XBLOCK, YBLOCK]` for a transposed pointwise group (`tiling.plan_tiles`),
    the default first: 64x64 with 8 warps when every element the tile moves is 16-bit (8 KiB
    per tile, 16 values per thread), else 32x32 with 4 warps (Inductor's default tile). A
    block larger than its axis is cut to the axis and the other block grows, up to the same
    tile area, so a short axis (C=16) still gets a full tile."""
    small = _widest_element(group, plan, graph) <= 2
    shapes = ((64, 64, 8), (32, 32, 4)) if small else ((32, 32, 4), (64, 64, 8))
    shapes += ((64, 32, 4), (32, 64, 4), (128, 16, 4), (16, 128, 4))
    out = []
    for xb, yb, warps in shapes:
        xb, yb = _fit_tile(xb, yb, plan.x_numel, plan.y_numel)
        if _cdiv(plan.y_numel, yb) <= MAX_GRID_Y:
            out.append(KernelConfig("pointwise_2d", xb, yb, min(warps, _warps_for(xb * yb))))
    return out


def _fit_tile(xb: int, yb: int, x_numel: int, y_numel: int) -> tuple[int, int]:
    """The blocks of a tile of `xb * yb` elements over axes of these lengths: YBLOCK halves
    (down to MIN_TILE_SIDE) while its last block would be mostly masked (C=96 takes 32-wide
    blocks, not 64 with a quarter of the lanes idle), XBLOCK takes what Y gives up, and
    neither exceeds its axis."""
    area = xb * yb
    yb = min(yb, next_power_of_2(y_numel))
    while yb > MIN_TILE_SIDE and _padded(y_numel, yb) > MAX_TILE_PADDING * y_numel:
        yb //= 2
    xb = min(area // yb, next_power_of_2(x_numel), MAX_XBLOCK)
    yb = min(max(yb, area // xb), next_power_of_2(y_numel))
    return xb, yb


def _padded(numel: int, block: int) -> int:
    return _cdiv(numel, block) * block


def _widest_element(group, plan, graph: IRGraph | None) -> int:
    """Bytes per element of the wider of the tile's two buffers (4 when unknown)."""
    dtypes = {n.name: n.dtype for n in group.nodes}
    if graph is not None:
        dtypes.update({name: graph.buffers[name].dtype for name in (plan.store, plan.read)
                       if name in graph.buffers})
    sizes = [dtypes[name].itemsize for name in (plan.store, plan.read) if name in dtypes]
    return max(sizes) if len(sizes) == 2 else 4


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
    if not (is_static(numel) and is_static(rnumel)):
        return symbolic_configs(group, graph)
    if not group.is_reduction:
        plan = plan_tiles(group) if config.tile_pointwise else None
        tiled = _tiled_configs(group, plan, graph) if plan is not None else []
        # two 1-D configs stay in a tiled group's list: autotuning may find them faster
        tiled = list(dict.fromkeys(tiled))[:4]
        configs = tiled + _pointwise_configs(numel)[:6 - len(tiled)]
    elif reduction_class(group, graph) == "outer":
        configs = _outer_configs(numel, rnumel)
    else:
        configs = _inner_configs(numel, rnumel, row_streams(group))
    unique = list(dict.fromkeys(configs))
    return unique[:6]


def symbolic_configs(group, graph: IRGraph | None = None) -> list[KernelConfig]:
    """Configs of a group with symbolic sizes: the static heuristics at the size hint (the
    example's sizes, each rounded up to a power of two, so sizes in one bucket share configs),
    1-D only, and a reduction over a symbolic r looped (a persistent one needs a static
    RBLOCK >= rnumel)."""
    numel = next_power_of_2(size_hint(group.numel))
    rnumel = next_power_of_2(size_hint(group.rnumel))
    if not group.is_reduction:
        return _pointwise_configs(numel)[:6]
    if reduction_class(group, graph) == "outer":
        configs = _outer_configs(numel, rnumel)
    else:
        configs = _inner_configs(numel, rnumel, row_streams(group))
    if not is_static(group.rnumel):
        configs = [c if c.kind == "looped_reduction" else
                   KernelConfig("looped_reduction", c.XBLOCK, min(c.RBLOCK, 1024), c.num_warps,
                                c.num_stages) for c in configs]
    return list(dict.fromkeys(configs))[:6]


def default_config(group, graph: IRGraph | None = None) -> KernelConfig:
    return candidate_configs(group, graph)[0]

