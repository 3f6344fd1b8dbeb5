"""tiling: the 2-D tile of a pointwise kernel whose accesses disagree on the contiguous dim.

A 1-D pointwise kernel walks its first stored buffer in memory order (`kernel.memory_order`),
so a read that is contiguous along another loop dim (a permute fused with elementwise math:
NCHW in, NHWC out) steps far between neighbouring lanes. On the H200 convnext's layer scale +
residual through a permute ran at 5.6 % of the copy roofline that way. A tiled kernel covers
`[XBLOCK, YBLOCK]` blocks of two flattened axes of the loop:

- Y: the stored buffer's unit-stride dim `j`, then the dims that continue it contiguously in
  that buffer (the store's contiguous run), innermost last;
- X: every other dim. The read's unit-stride dim `i` and the dims continuing it contiguously in
  the read come last, the rest before them by decreasing stride in the read (broadcast dims
  outermost), so X walks the read in memory order.

The store is then contiguous along Y and the read along X; Triton converts the tile's layout
between the two through shared memory. The dims that are neither `i` nor `j` ride on X, whose
grid axis (`program_id(0)`) has no practical limit, so any rank works, whether or not the two
dims are adjacent. `plan_tiles` decides (None keeps the 1-D kernel); `TilePlan.loop_vars` gives
the loop variables in the tile's flat indices `xindex` / `yindex` (the printer tells the axes
apart by that prefix); `tile_prologue` prints the index lines; `tile_grid` counts programs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from kiln.codegen.group import group_accesses
from kiln.lower.index import Expr, affine_form, as_expr, sym

__all__ = ["TilePlan", "plan_tiles", "tile_grid", "tile_prologue"]

# A tile pays off only when both sides have a contiguous run at least this long (elements);
# a shorter run (an RGB channel dim of 3) is served about as well by the 1-D kernel.
MIN_RUN = 8
# Y takes dims beyond `j` only until its run is this long (the largest YBLOCK candidate): a
# longer run gains the store nothing and could take dims the read's run needs (a reversed
# [17, 16, 9, 2] permute: Y = 17*16, leaving 9*2 contiguous for the read).
Y_RUN = 128
# ... nor past what CUDA's second grid dimension (65535 programs) covers in 16-wide blocks.
MAX_Y_NUMEL = 65535 * 16


@dataclasses.dataclass(frozen=True)
class TilePlan:
    """How a pointwise group is tiled.

    x_dims / y_dims: loop dims (indices into the group's `x_ranges`, sizes > 1) on each tile
        axis, outermost first; size-1 dims are on neither (their variables are the constant 0).
    x_numel / y_numel: the products of their sizes (the axes' lengths).
    store / read: the buffers contiguous along Y and along X.
    """

    x_dims: tuple[int, ...]
    y_dims: tuple[int, ...]
    x_numel: int
    y_numel: int
    store: str
    read: str

    def loop_vars(self, ranges: Sequence[int]) -> list[Expr]:
        """The group's loop variables, one per loop dim, as div/mod of the flat index of the
        axis carrying it (`xindex`, `yindex`). Written this way the index algebra merges the
        dims of a contiguous run back into one term (`96*xindex + yindex`, not `5376*x0 +
        96*x2 + ...`), which lets Triton see the contiguity it lays each access out by."""
        out = [as_expr(0)] * len(ranges)
        for flat, dims in ((sym("xindex", self.x_numel), self.x_dims),
                           (sym("yindex", self.y_numel), self.y_dims)):
            inner, total = 1, _numel(dims, ranges)
            for d in reversed(dims):
                var = flat // inner
                out[d] = var if inner * ranges[d] == total else var % ranges[d]
                inner *= ranges[d]
        return out

    def describe(self) -> str:
        return (f"tile: x=dims {list(self.x_dims)} ({self.read} contiguous), "
                f"y=dims {list(self.y_dims)} ({self.store} contiguous)")


def plan_tiles(group) -> TilePlan | None:
    """The tiling of a pointwise `group` whose first stored buffer and largest disagreeing
    access (a read, or another store) are contiguous along different loop dims; None when
    they agree, a stride is not affine, or a contiguous run is too short to gain from a tile."""
    ranges = tuple(group.x_ranges)
    if group.is_reduction or sum(size > 1 for size in ranges) < 2:
        return None
    reads, writes, _, _ = group_accesses(group)
    if not writes:
        return None
    store_strides = _strides(writes[0].index, ranges)
    j = _unit_dim(store_strides, ranges)
    if j is None:
        return None
    other = _largest_disagreeing(reads + writes[1:], j, ranges)
    if other is None:
        return None
    read_strides = _strides(other.index, ranges)
    i = _unit_dim(read_strides, ranges)
    y_dims = _contiguous_run(store_strides, j, ranges, {i}, Y_RUN, MAX_Y_NUMEL)
    x_run = _contiguous_run(read_strides, i, ranges, avoid=set(y_dims))
    if _numel(y_dims, ranges) < MIN_RUN or _numel(x_run, ranges) < MIN_RUN:
        return None
    rest = [d for d, size in enumerate(ranges)
            if size > 1 and d not in y_dims and d not in x_run]
    # zero strides (broadcast dims) first: inner to `i` they would break the read's run
    rest.sort(key=lambda d: (read_strides.get(d, 0) != 0, -abs(read_strides.get(d, 0))))
    x_dims = tuple(rest) + x_run
    return TilePlan(x_dims, y_dims, _numel(x_dims, ranges), _numel(y_dims, ranges),
                    writes[0].name, other.name)


def _numel(dims: Sequence[int], ranges: Sequence[int]) -> int:
    return math.prod(ranges[d] for d in dims)


def _strides(index: Expr, ranges: Sequence[int]) -> dict[int, int] | None:
    """{loop dim: memory step} of an access in the group's `x{d}` variables (dims it does not
    use are absent); None when the index is not affine in them (a div/mod that `affine_form`
    cannot resolve). Indirect symbols are ignored: they do not move with the loop."""
    coefs = affine_form(index).linear_coefficients()
    if coefs is None:
        return None
    names = {f"x{d}": d for d in range(len(ranges))}
    return {names[s.name]: c for s, c in coefs.items() if s.name in names}


def _unit_dim(strides: Mapping[int, int] | None, ranges: Sequence[int]) -> int | None:
    """The innermost loop dim (size > 1) along which the access moves by one element."""
    if strides is None:
        return None
    units = [d for d, step in strides.items() if abs(step) == 1 and ranges[d] > 1]
    return max(units) if units else None


def _footprint(strides: Mapping[int, int], ranges: Sequence[int]) -> int:
    """Elements an access touches: the product of the sizes of the dims it moves along."""
    return math.prod(ranges[d] for d, step in strides.items() if step != 0)


def _largest_disagreeing(deps: Sequence, j: int, ranges: Sequence[int]):
    """The access (a `MemoryDep`) touching the most elements among those contiguous along a
    loop dim other than `j` and moving along `j`; the first of equals; None when there is none.
    An access constant along `j` (a BatchNorm's per-channel weight in an NCHW kernel) is one
    address for neighbouring lanes of the 1-D kernel, a broadcast a tile cannot improve: tiling
    for it made every BatchNorm of MobileNetV3 a 2-D kernel and the model eager's speed."""
    best, best_size = None, 0
    for dep in deps:
        strides = _strides(dep.index, ranges)
        i = _unit_dim(strides, ranges)
        if i is None or i == j or strides.get(j, 0) == 0:
            continue
        size = _footprint(strides, ranges)
        if size > best_size:
            best, best_size = dep, size
    return best


def _contiguous_run(strides: Mapping[int, int], start: int, ranges: Sequence[int],
                    avoid: set, enough: int | None = None,
                    limit: int | None = None) -> tuple[int, ...]:
    """`start` and the dims continuing it contiguously in memory (each one's step is the
    product of the sizes before it: W then H of an NCHW read), outermost first; stops at a
    dim in `avoid`, once the run has `enough` elements, or before it would pass `limit`."""
    run, span = [start], ranges[start]
    while enough is None or span < enough:
        nxt = next((d for d, step in strides.items() if abs(step) == span and ranges[d] > 1
                    and d not in run and d not in avoid), None)
        if nxt is None or (limit is not None and span * ranges[nxt] > limit):
            break
        run.append(nxt)
        span *= ranges[nxt]
    return tuple(reversed(run))


# -- printing ----------------------------------------------------------------------------------

def tile_prologue(plan: TilePlan, wide: bool, xmasked: bool, ymasked: bool) -> list[str]:
    """The kernel lines before the body: the tile's `[XBLOCK, 1]` / `[1, YBLOCK]` indices and
    their masks (only where the blocks do not divide the axes)."""
    pid = ".to(tl.int64)" if wide else ""
    lines = [f"xnumel = {plan.x_numel}", f"ynumel = {plan.y_numel}",
             f"xoffset = tl.program_id(0){pid} * XBLOCK",
             "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
             f"yoffset = tl.program_id(1){pid} * YBLOCK",
             "yindex = yoffset + tl.arange(0, YBLOCK)[None, :]"]
    lines += ["xmask = xindex < xnumel"] if xmasked else []
    lines += ["ymask = yindex < ynumel"] if ymasked else []
    return lines


def tile_grid(plan: TilePlan, meta: Mapping[str, int]) -> tuple[int, int]:
    """Programs along X and Y for the block sizes in `meta`."""
    return (-(-plan.x_numel // meta["XBLOCK"]), -(-plan.y_numel // meta["YBLOCK"]))
