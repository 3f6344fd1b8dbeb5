"""2-D tiled pointwise kernels (kiln/codegen/tiling.py): a pointwise kernel whose store and
largest read are contiguous along different loop dims (a permute fused with elementwise math)
tiles `[XBLOCK, YBLOCK]` with a 2-D grid; everything else stays 1-D.

Three layers: the tiling decision on lowered groups; every candidate config of a tiled group
against eager and the IR evaluator (masks on both axes, non-adjacent tile dims, size-1 dims,
broadcast reads, storage offsets); and functions compiled with the kiln backend against eager
(fp64 references for bf16) with the kinds of the kernels they generated. CPU runs the kernels in
Triton's interpreter, so shapes stay tiny (odd sizes: no block divides them)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.codegen import candidate_configs, emit_group  # noqa: E402
from kiln.codegen.tiling import plan_tiles  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.lower.evaluate import run_ir  # noqa: E402
from kiln.runtime import pipeline  # noqa: E402
from kiln.schedule import FusedGroup  # noqa: E402
from tests.codegen._driver import run_groups  # noqa: E402

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _one_group(fn, *inputs):
    """(graph, group): every computed buffer of `fn`'s IR in one group over the output's loop,
    storing the graph outputs."""
    graph = lower_graph(trace_aten(fn, *inputs))
    nodes = graph.computed
    stores = tuple(dict.fromkeys(o.name for o in graph.outputs if hasattr(o, "name")))
    return graph, FusedGroup("g0", nodes, tuple(nodes[-1].data.ranges), (), stores)


def _nchw_to_nhwc(x, w):
    return x.permute(0, 2, 3, 1).contiguous() * w + 1.0


# -- the decision ------------------------------------------------------------------------------

def test_nchw_to_nhwc_tiles_channels_against_width_and_height():
    """The store (NHWC) runs along C: Y = [C]. The read (NCHW) runs along W, then H (H*W is
    one contiguous run): X = [N, H, W], N folded in front."""
    x, w = torch.randn(3, 37, 29, 5), torch.randn(37)
    _, group = _one_group(_nchw_to_nhwc, x, w)
    assert group.x_ranges == (3, 29, 5, 37)
    plan = plan_tiles(group)
    assert plan is not None and plan.y_dims == (3,) and plan.x_dims == (0, 1, 2)
    assert (plan.x_numel, plan.y_numel) == (3 * 29 * 5, 37)


def test_nhwc_to_nchw_puts_the_stores_contiguous_run_on_y():
    """The reverse (convnext's layer scale + residual): the NCHW store's run is H*W (Y), the
    NHWC read's run is C (X)."""
    def fn(y, gamma, shortcut):
        return y.permute(0, 3, 1, 2).contiguous() * gamma.view(1, -1, 1, 1) + shortcut

    y, gamma, shortcut = torch.randn(3, 29, 5, 37), torch.randn(37), torch.randn(3, 37, 29, 5)
    _, group = _one_group(fn, y, gamma, shortcut)
    plan = plan_tiles(group)
    assert plan is not None and plan.y_dims == (2, 3) and plan.x_dims == (0, 1)


def test_y_stops_growing_where_the_read_needs_the_dims():
    """A reversed permute of [2, 9, 16, 17] + a contiguous [17, 16, 9, 2]: the output keeps
    x's memory order, so the store's run is 17, 16, 9, ... and the read's is 2, 9, 16, ....
    Y stops at 17*16 >= Y_RUN, leaving 9*2 contiguous for the read on X."""
    def fn(x, y):
        return x.permute(3, 2, 1, 0).sin() + y

    x, y = torch.randn(2, 9, 16, 17), torch.randn(17, 16, 9, 2)
    _, group = _one_group(fn, x, y)
    plan = plan_tiles(group)
    assert plan is not None and plan.y_dims == (1, 0) and plan.x_dims == (2, 3)
    _all_configs_match(fn, x, y)


def test_contiguous_and_short_runs_stay_1d():
    x, y = torch.randn(6, 40), torch.randn(6, 40)
    _, group = _one_group(lambda x, y: x * 2 + y, x, y)
    assert plan_tiles(group) is None
    assert {c.kind for c in candidate_configs(group)} == {"pointwise"}
    # an RGB image to NHWC: the store's run is 3 channels, too short to gain from a tile
    _, group = _one_group(lambda x: x.permute(0, 2, 3, 1).contiguous(), torch.randn(2, 3, 9, 9))
    assert plan_tiles(group) is None


def test_default_tile_is_64x64_for_16_bit_and_32x32_for_32_bit():
    for dtype, want in ((torch.bfloat16, (64, 64, 8)), (torch.float32, (32, 32, 4))):
        x = torch.randn(2, 64, 8, 16, dtype=dtype)
        graph, group = _one_group(lambda x: x.permute(0, 2, 3, 1).contiguous(), x)
        config = candidate_configs(group, graph)[0]
        assert config.kind == "pointwise_2d"
        assert (config.XBLOCK, config.YBLOCK, config.num_warps) == want


# -- every config of a tiled group -------------------------------------------------------------

def _all_configs_match(fn, *inputs, atol=1e-5, rtol=1e-5):
    """Each candidate config of `fn`'s one group gives eager's and the IR evaluator's answer;
    returns the specs (the tiled ones first)."""
    graph, group = _one_group(fn, *inputs)
    want = fn(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    oracle = run_ir(graph, list(inputs))
    specs = []
    for config in candidate_configs(group, graph):
        got, _ = run_groups(graph, [group], list(inputs), {group.name: config}, specs)
        for g, w, o in zip(got, want, oracle):
            assert g.shape == w.shape and g.stride() == o.stride(), config
            torch.testing.assert_close(g, o, equal_nan=True)
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"{config}: {m}")
    assert specs[0].kind == "pointwise_2d"
    return specs


def test_masks_on_both_axes_and_a_broadcast_bias():
    """3x37x29x5: neither axis (435, 37) is a multiple of any block."""
    specs = _all_configs_match(_nchw_to_nhwc, torch.randn(3, 37, 29, 5), torch.randn(37))
    tiled = [s for s in specs if s.kind == "pointwise_2d"]
    assert len(tiled) >= 3 and {"pointwise"} < {s.kind for s in specs}
    assert all("xmask = xindex < xnumel" in s.source and "ymask = yindex < ynumel" in s.source
               for s in tiled)


def test_tile_dims_not_adjacent_in_3d():
    """Loop [9, 5, 7]: the output keeps x's memory order (x.permute(2, 0, 1) comes first), so
    the store runs along loop dim 0; z is contiguous, so the read runs along dim 2, then 1.
    Loop dim 1 sits between the two tile dims."""
    def fn(x, z):
        return x.permute(2, 0, 1).sin() * 2 + z

    x, z = torch.randn(5, 7, 9), torch.randn(9, 5, 7)
    _, group = _one_group(fn, x, z)
    plan = plan_tiles(group)
    assert plan is not None and plan.y_dims == (0,) and plan.x_dims == (1, 2)
    _all_configs_match(fn, x, z)


def test_size_1_dims_offsets_and_broadcast_reads():
    """A size-1 H, a channels-last input read at a storage offset (a slice) into an NCHW store,
    a read broadcast along N and a per-channel bias, and two stores of different layouts."""
    def fn(x, scale, bias):
        x = x[1:]  # storage offset C*H*W
        y = x * scale + bias.view(1, -1, 1, 1)
        return y.contiguous(), (y * 2).permute(0, 2, 3, 1)

    x = torch.randn(4, 1, 11, 19).permute(0, 3, 1, 2)  # NCHW sizes, C contiguous in memory
    scale, bias = torch.randn(1, 19, 1, 11), torch.randn(19)
    _all_configs_match(fn, x, scale, bias)


def test_reads_broadcast_along_the_stores_contiguous_dim_do_not_tile():
    """A BatchNorm over NCHW: its per-channel statistics are contiguous along C, the store
    along W, but neighbouring lanes of the 1-D kernel read one address of them (MobileNetV3's
    BatchNorms were all tiled for this, at eager's speed on the H200)."""
    def fn(x, mean, weight):
        return ((x - mean.view(1, -1, 1, 1)) * weight.view(1, -1, 1, 1)).clamp(0, 6)

    _, group = _one_group(fn, torch.randn(2, 40, 7, 7), torch.randn(40), torch.randn(40))
    assert plan_tiles(group) is None


def test_wide_tiles_index_in_int64():
    """A transpose over 2**31 elements indexes in int64 (source only: never launched)."""
    from kiln.lower.ir import ComputedBuffer, InputBuffer, IRGraph, Layout, Pointwise
    from kiln.lower.ops import ops

    rows, cols = 2**16, 2**15 + 3
    graph = IRGraph()
    cpu = torch.device("cpu")
    src = Layout(torch.float32, cpu, (rows, cols), (1, rows))  # a transposed input
    graph.add_buffer(InputBuffer("x", src))
    out = Layout.contiguous(torch.float32, cpu, (rows, cols))
    node = ComputedBuffer("buf0", out, Pointwise(
        (rows, cols), lambda idx: ops.load("x", src.index(idx)), torch.float32))
    graph.add_buffer(node)
    spec = emit_group(FusedGroup("g0", [node], (rows, cols), (), ("buf0",)), graph)
    assert spec.kind == "pointwise_2d"
    assert "tl.program_id(0).to(tl.int64)" in spec.source
    assert "tl.program_id(1).to(tl.int64)" in spec.source


# -- compiled with the kiln backend --------------------------------------------------------------

@pytest.fixture
def emitted(monkeypatch):
    """The `KernelSpec`s the kiln backend generates during the test."""
    specs = []
    original = pipeline.emit_group

    def spy(*args, **kwargs):
        specs.append(original(*args, **kwargs))
        return specs[-1]

    monkeypatch.setattr(pipeline, "emit_group", spy)
    return specs


def _as_eager_within_fp64(fn, inputs):
    """Compiled `fn` matches eager: float32 closely; low precision no further from the fp64
    reference than 1.5x eager's own error (plus one ulp of slack at the output's scale)."""
    got = kiln.compile(fn, backend="kiln")(*inputs)
    want = fn(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.stride() == want.stride()
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    ref = fn(*[t.double() for t in inputs])
    err = (got.double() - ref).abs().max().item()
    eager_err = (want.double() - ref).abs().max().item()
    ulp = torch.finfo(want.dtype).eps * ref.abs().max().item()
    assert err <= 1.5 * eager_err + ulp, (err, eager_err)


def _tiled(specs):
    return [s for s in specs if s.kind == "pointwise_2d"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_permute_then_elementwise(dtype, device, emitted):
    def fn(x, w):
        return torch.relu(x.permute(0, 2, 3, 1).contiguous() * w + 0.5)

    x = torch.randn(3, 37, 29, 5, device=device, dtype=dtype)
    _as_eager_within_fp64(fn, [x, torch.randn(37, device=device, dtype=dtype)])
    (spec,) = _tiled(emitted)
    assert "tl.program_id(1)" in spec.source and "YBLOCK: tl.constexpr" in spec.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_transpose_2d_add(dtype, device, emitted):
    a = torch.randn(37, 45, device=device, dtype=dtype)
    b = torch.randn(45, 37, device=device, dtype=dtype)
    _as_eager_within_fp64(lambda a, b: (a.t() + b).contiguous(), [a, b])
    assert len(_tiled(emitted)) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_nhwc_to_nchw_layer_scale_and_residual(dtype, device, emitted):
    """convnext's `kiln_poi_permute_view_mul_add`: a linear's [N*H*W, C] output viewed as
    NHWC, permuted to NCHW, scaled per channel, plus the NCHW shortcut."""
    def fn(y, gamma, shortcut):
        n, c, h, w = shortcut.shape
        x = y.view(n, h, w, c).permute(0, 3, 1, 2)
        return x * gamma.reshape(1, -1, 1, 1) + shortcut

    n, c, h, w = 3, 37, 29, 5
    inputs = [torch.randn(n * h * w, c, device=device, dtype=dtype),
              torch.randn(c, device=device, dtype=dtype),
              torch.randn(n, c, h, w, device=device, dtype=dtype)]
    _as_eager_within_fp64(fn, inputs)
    (spec,) = _tiled(emitted)
    assert spec.name.startswith("kiln_tile_")


def test_compiled_contiguous_elementwise_stays_1d(device, emitted):
    x, y = torch.randn(3, 37, 29, 5, device=device), torch.randn(3, 37, 29, 5, device=device)
    _as_eager_within_fp64(lambda x, y: (x * 2 + y).sigmoid(), [x, y])
    assert emitted and all(s.kind == "pointwise" for s in emitted)
    assert all("tl.program_id(1)" not in s.source for s in emitted)
