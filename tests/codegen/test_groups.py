"""Fused kernel groups (kiln.codegen.emit_group) against eager and the IR evaluator.

Groups are built by hand from the lowered IR of small torch functions (the fusion pass builds
them in the pipeline). Each test runs every candidate config (and forced looped configs), under
Triton's interpreter on CPU (~1 ms per program instance, so shapes stay tiny).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

# DEVICE below is the GPU where there is one; oracles run on CPU copies
pytestmark = pytest.mark.explicit_device

from kiln.codegen import CodegenError, KernelConfig, candidate_configs, emit_group  # noqa: E402
from kiln.codegen.kernel_configs import reduction_class  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.lower.evaluate import run_ir  # noqa: E402
from kiln.schedule import FusedGroup  # noqa: E402
from tests.codegen._driver import run_groups  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _lower(fn, *inputs):
    return lower_graph(trace_aten(fn, *inputs))


def _group(graph, x_ranges, r_ranges=(), stores=None, name="g0"):
    """All computed buffers of `graph` in one group; stores default to the graph outputs."""
    nodes = graph.computed
    if stores is None:
        stores = tuple(dict.fromkeys(o.name for o in graph.outputs if hasattr(o, "name")))
    return FusedGroup(name, nodes, tuple(x_ranges), tuple(r_ranges), tuple(stores))


def _run(graph, group, inputs, config=None):
    specs = []
    dev_inputs = [t.to(DEVICE) for t in inputs]
    outs, rt = run_groups(graph, [group], dev_inputs, {group.name: config}, specs)
    return [o.cpu() for o in outs], specs[0], rt


def _check_all(fn, graph, group, inputs, extra_configs=(), atol=1e-5, rtol=1e-5, tol_ir=None):
    """Every candidate config (and `extra_configs`) matches eager and run_ir; returns the specs."""
    want = fn(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    oracle = run_ir(graph, list(inputs))
    configs = candidate_configs(group, graph) + list(extra_configs)
    assert len(configs) >= 3
    specs = []
    for config in configs:
        got, spec, _ = _run(graph, group, inputs, config)
        specs.append(spec)
        for g, w, o in zip(got, want, oracle):
            assert g.dtype == w.dtype and g.shape == w.shape, config
            torch.testing.assert_close(g, o, equal_nan=True, **(tol_ir or {}))
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True,
                                       msg=lambda m, c=config: f"{c}: {m}")
    # one argument list per group, whatever the config (the wrapper binds it once)
    stored = tuple(n.name for n in group.nodes if n.name in group.stores)
    assert len({s.args for s in specs}) == 1 and specs[0].writes == stored
    return specs


def test_pointwise_chain_one_kernel_stores_only_live_buffers():
    def fn(x, y):
        a = x.sin() * y + x
        return a, (a.exp() + a) * y

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    graph = _lower(fn, x, y)
    assert len(graph.computed) == 2
    group = _group(graph, (8, 32))
    specs = _check_all(fn, graph, group, [x, y])
    assert all(s.kind == "pointwise" and s.members == tuple(n.name for n in group.nodes)
               for s in specs)
    # the consumer reads `a` from registers: x and y are the only loads, each once
    src = specs[0].source
    assert specs[0].reads == ("x_1", "y_1") and src.count("tl.load(") == 2
    assert "xmask" not in src  # 256 elements, XBLOCK divides numel: no mask
    # a buffer kept in registers is never written
    first, second = group.nodes
    only_second = FusedGroup("g0", group.nodes, (8, 32), (), (second.name,))
    spec = emit_group(only_second, graph)
    assert spec.writes == (second.name,) and src.count("tl.store(") == 2
    assert "in registers" in spec.source and f"#   {first.name} (in registers)" in spec.source


def test_pointwise_masked_tail():
    def fn(x):
        return torch.tanh(x) * 3 - x

    x = torch.randn(5, 7)
    graph = _lower(fn, x)
    specs = _check_all(fn, graph, _group(graph, (5, 7)), [x])
    assert "xmask = xindex < xnumel" in specs[0].source


def _residual_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (x.shape[-1],), w, b)


LOOPED_MASKED = KernelConfig("looped_reduction", 2, 16, 2)  # 40 = 16 + 16 + 8: masked tail
LOOPED_EXACT = KernelConfig("looped_reduction", 1, 8, 1, 2)  # 40 = 5 * 8: no r mask


def test_residual_layer_norm_one_kernel():
    x, r, w, b = torch.randn(4, 40), torch.randn(4, 40), torch.randn(40), torch.randn(40)
    graph = _lower(_residual_layer_norm, x, r, w, b)
    assert [n.is_reduction for n in graph.computed] == [True, True, False, False]
    group = _group(graph, (4,), (40,))
    specs = _check_all(_residual_layer_norm, graph, group, [x, r, w, b],
                       [LOOPED_MASKED, LOOPED_EXACT], atol=1e-5, rtol=1e-4)
    kinds = {s.kind for s in specs}
    assert kinds == {"persistent_reduction", "looped_reduction"}
    assert specs[0].kind == "persistent_reduction" and specs[0].reduction_class == "inner"
    looped = specs[-2].source
    # mean pass, variance pass, normalize pass
    assert looped.count("for roffset in range(0, rnumel, RBLOCK):") == 3
    assert "evict_last" in looped and "evict_first" in looped
    assert "rmask" in looped and "rmask" not in specs[-1].source.split("@triton.jit")[-1]
    assert specs[0].meta_dict == {"XBLOCK": 4, "RBLOCK": 64}  # short rows: 4 rows per program


def test_layer_norm_training_outputs_mean_rstd():
    """native_layer_norm's mean and rstd are x-only members (one value per row) of the group."""
    def fn(x, w, b):
        return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)

    x, w, b = torch.randn(6, 24), torch.randn(24), torch.randn(24)
    graph = _lower(fn, x, w, b)
    group = _group(graph, (6,), (24,))
    specs = _check_all(fn, graph, group, [x, w, b], [KernelConfig("looped_reduction", 2, 8, 1)],
                       atol=1e-5, rtol=1e-4)
    assert len(specs[0].writes) == 3


def test_bf16_layer_norm_rounds_once_per_store():
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    r = torch.randn(4, 32, dtype=torch.bfloat16)
    w, b = torch.randn(32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    graph = _lower(_residual_layer_norm, x, r, w, b)
    group = _group(graph, (4,), (32,))
    specs = _check_all(_residual_layer_norm, graph, group, [x, r, w, b],
                       [KernelConfig("looped_reduction", 1, 8, 1)], atol=2e-2, rtol=2e-2)
    for spec in specs:
        body = spec.source.split("@triton.jit")[-1]
        # h = x + r rounds once where it is stored, and layer norm reads that rounded h (eager's
        # layer norm sees the bfloat16 h), its first element too (the shifted mean's pivot): a
        # persistent kernel reuses h; a looped one computes h again in its second loop and
        # rounds it there too. The output rounds where stored.
        counts = {"persistent_reduction": 3, "looped_reduction": 7}
        assert "tl.float32" in body and body.count("_to_bf16(") == counts[spec.kind], \
            (spec.kind, body.count("_to_bf16("))


def test_softmax_one_kernel():
    def fn(x):
        return torch.softmax(x, -1)

    x = torch.randn(4, 48) * 4
    graph = _lower(fn, x)
    group = _group(graph, (4,), (48,))
    specs = _check_all(fn, graph, group, [x], [KernelConfig("looped_reduction", 1, 16, 1)])
    looped = [s for s in specs if s.kind == "looped_reduction"]
    assert looped and all(s.source.count("for roffset") == 3 for s in looped)
    assert specs[0].kind == "persistent_reduction" and specs[0].writes == (graph.outputs[0].name,)


def test_bf16_log_softmax_out():
    def fn(x):
        return torch.log_softmax(x.float(), -1).to(torch.bfloat16)

    x = torch.randn(4, 40, dtype=torch.bfloat16)
    graph = _lower(fn, x)
    group = _group(graph, (4,), (40,))
    _check_all(fn, graph, group, [x], [LOOPED_MASKED], atol=2e-2, rtol=2e-2)


def test_column_sum_bias_grad_is_outer_and_coalesced():
    """sum(dim=0) of a bf16 gradient (bias grad): loads are contiguous along x, so the tile's
    fast axis is x; the bf16 cast of the fp32 sum is an x-only member of the same kernel."""
    def fn(g):
        return g.float().sum(0).to(torch.bfloat16)

    g = torch.randn(48, 32, dtype=torch.bfloat16)
    graph = _lower(fn, g)
    group = _group(graph, (32,), (48,))
    extra = [KernelConfig("looped_reduction", 8, 16, 2), KernelConfig("looped_reduction", 32, 4, 4)]
    specs = _check_all(fn, graph, group, [g], extra, atol=1e-2, rtol=1e-2,
                       tol_ir={"atol": 1e-2, "rtol": 1e-2})
    assert all(s.reduction_class == "outer" for s in specs)
    assert "(outer reduction)" in specs[0].source
    # the default tile keeps the grid large: XBLOCK stays small and RBLOCK takes the rows
    default = candidate_configs(group, graph)[0]
    assert default.XBLOCK <= 32 and default.XBLOCK * default.RBLOCK >= 48
    load = next(line for line in specs[0].source.splitlines() if "tl.load(" in line)
    assert "32*r0 + x0" in load  # x has stride 1, r stride 32


def test_big_column_sum_defaults_to_looped_outer():
    g = torch.randn(2, 2)
    graph = _lower(lambda g: g.sum(0), g)
    group = _group(graph, (2,), (2,))
    assert candidate_configs(group, graph)[0].kind == "persistent_reduction"
    # a [16384, 1024] bias grad: looped, x-contiguous tiles, enough programs for 132 SMs
    from kiln.codegen.kernel_configs import _outer_configs

    cfg = _outer_configs(1024, 16384)[0]
    assert cfg.kind == "looped_reduction" and 1024 // cfg.XBLOCK >= 64


def test_argmax_argmin_looped_with_nan_and_ties():
    def fn(x):
        return x.argmax(-1), x.argmin(-1), x.amax(-1)

    x = torch.randint(-3, 4, (4, 40)).float()
    x[1, 17] = float("nan")
    x[2, 33] = float("nan")
    x[2, 5] = float("nan")
    graph = _lower(fn, x)
    group = _group(graph, (4,), (40,))
    specs = _check_all(fn, graph, group, [x], [LOOPED_MASKED, LOOPED_EXACT])
    assert any(s.kind == "looped_reduction" for s in specs)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # masked lanes read 0
def test_integer_ops_fused():
    def fn(a, b):
        q = torch.div(a, b, rounding_mode="floor")
        return q.sum(-1), torch.remainder(a, b).amax(-1), (a > 0).any(-1), a.prod(-1)

    a = torch.randint(-20, 20, (4, 12))
    b = torch.randint(1, 5, (4, 12)) * torch.where(torch.rand(4, 12) > 0.5, 1, -1)
    graph = _lower(fn, a, b)
    group = _group(graph, (4,), (12,))
    _check_all(fn, graph, group, [a, b], [KernelConfig("looped_reduction", 2, 4, 1)])


def test_read_at_another_index_is_refused():
    def fn(x):
        b = x.exp().sum(-1, keepdim=True)
        return x * b.t()  # reads row sums along the other axis

    x = torch.randn(8, 8)
    graph = _lower(fn, x)
    group = _group(graph, (8,), (8,))
    with pytest.raises(CodegenError, match="registers cannot serve"):
        emit_group(group, graph)


def test_wide_indices_use_int64():
    """A group over 2**31 elements indexes in int64 (source only: never launched)."""
    from kiln.lower.ir import ComputedBuffer, InputBuffer, IRGraph, Layout, Pointwise
    from kiln.lower.ops import ops

    n = 2**31 + 64
    graph = IRGraph()
    lay = Layout.contiguous(torch.float32, torch.device("cpu"), (n,))
    graph.add_buffer(InputBuffer("x", lay))
    node = ComputedBuffer("buf0", lay, Pointwise(
        (n,), lambda idx: ops.exp(ops.load("x", lay.index(idx))), torch.float32))
    graph.add_buffer(node)
    spec = emit_group(FusedGroup("g0", [node], (n,), (), ("buf0",)), graph)
    assert "tl.program_id(0).to(tl.int64)" in spec.source
    assert spec.grid(spec.meta_dict) == (-(-n // spec.meta_dict["XBLOCK"]),)


def test_configs_are_valid():
    x = torch.randn(4, 40)
    graph = _lower(lambda x: torch.softmax(x, -1), x)
    group = _group(graph, (4,), (40,))
    for config in candidate_configs(group, graph):
        if config.kind == "persistent_reduction":
            assert config.RBLOCK >= 40
        for v in (config.XBLOCK, config.RBLOCK, config.num_warps):
            assert v & (v - 1) == 0
    with pytest.raises(ValueError, match="RBLOCK >= rnumel"):
        emit_group(group, graph, KernelConfig("persistent_reduction", 1, 16, 1))
    with pytest.raises(ValueError, match="power of two"):
        KernelConfig("looped_reduction", 3, 16)


def test_transposed_read_gets_a_2d_tile():
    def fn(x, y):
        a = (x.t() * 2).sin() + y
        return a, a.cos() * y

    x, y = torch.randn(16, 24), torch.randn(24, 16)
    graph = _lower(fn, x, y)
    group = _group(graph, (24, 16))
    specs = _check_all(fn, graph, group, [x, y])
    assert specs[0].kind == "pointwise_2d" and "pointwise" in {s.kind for s in specs}
    # the outputs follow x.t()'s layout (column-major): stores run along dim 0 (Y, 24), the
    # read of y along dim 1 (X, 16)
    assert specs[0].meta_dict == {"XBLOCK": 16, "YBLOCK": 32}
    assert specs[0].grid(specs[0].meta_dict) == (1, 1)
    assert "xmask" not in specs[0].source and "ymask = yindex < ynumel" in specs[0].source


def test_full_reduction_and_multi_dim_r():
    """numel 1 (x.sum()) and a reduction over dims (0, 2) with var's x-only epilogue."""
    def full(x):
        return x.sum(), x.amax()

    x = torch.randn(8, 16)
    graph = _lower(full, x)
    first = graph.computed[0]
    assert first.data.ranges == ()
    group = _group(graph, (), (8, 16))
    _check_all(full, graph, group, [x], [KernelConfig("looped_reduction", 1, 32, 2)],
               atol=1e-4, rtol=1e-4)

    def over_0_2(x):
        return x.sum((0, 2)), x.var((0, 2))

    x = torch.randn(3, 5, 6)
    graph = _lower(over_0_2, x)
    group = _group(graph, (5,), (3, 6))
    _check_all(over_0_2, graph, group, [x], [KernelConfig("looped_reduction", 2, 4, 2)],
               atol=1e-4, rtol=1e-4)


def test_bias_grad_through_permuted_heads_is_outer():
    """The in_proj bias gradient: a column sum read through a [B, H, L, D] → [B·L, H·D]
    permute (div/mod indices, no linear coefficients). The contiguous axis (D) is part of x,
    so the tile must run along x ("outer"); judging by linear coefficients saw "inner" and
    made a 1 ms kernel on the H200."""
    def fn(dq):  # dq: [B, H, L, D] -> bias grad [H*D]
        b, h, l, d = dq.shape
        return dq.permute(0, 2, 1, 3).reshape(b * l, h * d).sum(0)

    dq = torch.randn(2, 4, 8, 16)
    graph = _lower(fn, dq)
    group = _group(graph, (64,), (16,))
    assert reduction_class(group, graph) == "outer"
    specs = _check_all(fn, graph, group, [dq], atol=1e-4, rtol=1e-4)
    assert specs[0].reduction_class == "outer"


def test_layer_norm_weight_grad_with_per_row_stats_is_outer():
    """dγ = Σ_rows g · (x − mean) · rstd: the per-row statistics are contiguous along r but
    are read once per row; the [rows, cols] reads decide the tiling (outer)."""
    def fn(g, x, mean, rstd):
        return (g * (x - mean) * rstd).sum(0)

    g, x = torch.randn(48, 32), torch.randn(48, 32)
    mean, rstd = torch.randn(48, 1), torch.rand(48, 1) + 0.5
    graph = _lower(fn, g, x, mean, rstd)
    group = _group(graph, (32,), (48,))
    assert reduction_class(group, graph) == "outer"
    _check_all(fn, graph, group, [g, x, mean, rstd], atol=1e-4, rtol=1e-4)


def test_square_is_a_multiply_not_libdevice_pow():
    """x ** 2 (RMSNorm's mean of squares) as x * x: libdevice.pow made the kernel ALU-bound."""
    def fn(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    graph = _lower(fn, x, w)
    group = _group(graph, (8,), (64,))
    specs = _check_all(fn, graph, group, [x, w], atol=2e-2, rtol=2e-2,
                       tol_ir={"atol": 2e-2, "rtol": 2e-2})
    assert "libdevice.pow" not in specs[0].source


def test_row_per_warp_default_depends_on_row_length_and_streams():
    """Rows of 256..1024 get one warp per row (4 rows, 4 warps) — at 1024 only when at most
    two full tensors stream through; residual add + LayerNorm (2 in, 2 out) keeps 1 row."""
    from kiln.codegen.kernel_configs import row_streams
    from kiln.schedule import schedule

    def first_group(fn, *inputs):
        return next(iter(schedule(_lower(fn, *inputs)).groups))

    big = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731 (never run: 256 MiB)
    w = big(1024)
    ln = first_group(lambda x, w: F.layer_norm(F.gelu(x), (1024,), w), big(131072, 1024), w)
    resid = first_group(_residual_layer_norm, big(131072, 1024), big(131072, 1024), w, w)
    soft = first_group(lambda x: torch.softmax(x, -1), big(262144, 512))
    assert (row_streams(ln), row_streams(resid), row_streams(soft)) == (2, 4, 2)
    pick = lambda g: candidate_configs(g, None)[0]  # noqa: E731
    assert (pick(ln).XBLOCK, pick(ln).num_warps) == (4, 4)
    assert (pick(resid).XBLOCK, pick(resid).num_warps) == (1, 4)
    assert (pick(soft).XBLOCK, pick(soft).num_warps) == (4, 4)


def _realized_residual_layer_norm(a, b, c, d, e, w):
    h = a + b + c + d + e  # five loads and two readers: realized, not inlined into the norm
    return h * 2, F.layer_norm(h, (h.shape[-1],), w)


def _residual_inputs(dtype):
    """Rows of 40; row 0 of every input constant, at values whose mean as sum / n rounds."""
    xs = [torch.randn(3, 40, dtype=dtype) for _ in range(5)]
    for x in xs:
        x[0] = torch.randn(()).to(dtype) * 10
    return xs + [torch.randn(40, dtype=dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_realized_residual_and_its_layer_norm_share_a_kernel(dtype):
    """The scheduler fuses a realized residual with the LayerNorm over it: the shifted mean's
    pivot (the residual at r = 0) is recomputed from the inputs as an x-only value. Every
    config matches eager, bf16 too, and a constant row normalizes to exactly 0 as eager's does
    (a pivot off by a rounding would leave ~1e-3 there)."""
    from kiln.schedule import schedule

    inputs = _residual_inputs(dtype)
    graph = _lower(_realized_residual_layer_norm, *inputs)
    (group,) = schedule(graph).groups
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    specs = _check_all(_realized_residual_layer_norm, graph, group, inputs,
                       [LOOPED_MASKED, LOOPED_EXACT], **tol)
    assert {s.kind for s in specs} == {"persistent_reduction", "looped_reduction"}
    if dtype == torch.float32:  # (eager's own bf16 CPU norm is not exact on a constant row)
        assert (_realized_residual_layer_norm(*inputs)[1][0] == 0).all()
        for spec in specs:
            got = _run(graph, group, inputs, spec.config)[0][1]
            assert (got[0] == 0).all(), spec.config


def test_training_layer_norm_mean_and_rstd_outputs_share_the_kernel():
    """native_layer_norm's mean and rstd outputs (one value per row) join the reduction's
    kernel in the scheduler: one kernel for the forward of a training LayerNorm."""
    from kiln.schedule import schedule

    def fn(x, w, b):
        return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)

    x, w, b = torch.randn(6, 40), torch.randn(40), torch.randn(40)
    graph = _lower(fn, x, w, b)
    (group,) = schedule(graph).groups
    specs = _check_all(fn, graph, group, [x, w, b], [LOOPED_MASKED], atol=1e-5, rtol=1e-4)
    assert all(len(s.writes) == 3 for s in specs)
