"""The explicit-attention rewrite: bmm → scale → softmax → bmm becomes SDPA (forward, and in
joint graphs its backward too) when the attention weights have no other use."""
from __future__ import annotations

import pytest
import torch

from kiln.lower import lower_graph
from kiln.lower.attention import rewrite_attention
from kiln.lower.driver import copy_graph_module
from kiln.lower.evaluate import run_ir
from lower_graphs import cached_model_graph, trace_flat

aten = torch.ops.aten
RTOL, ATOL = 1e-4, 1e-5


def _targets(gm: torch.fx.GraphModule) -> set:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def _rewritten(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, int]:
    new = copy_graph_module(gm)
    return new, rewrite_attention(new)


def _run(gm: torch.fx.GraphModule, inputs: list) -> list:
    return torch.utils._pytree.tree_leaves(gm(*inputs))


def _close(got: list, expected: list) -> None:
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)


# The SDPA variant depends on the device (kiln.lower.attention._variant): CPU flash, CUDA flash,
# efficient or cuDNN.
SDPA_FORWARD = {aten._scaled_dot_product_flash_attention_for_cpu.default,
                aten._scaled_dot_product_flash_attention.default,
                aten._scaled_dot_product_efficient_attention.default,
                getattr(aten, "_scaled_dot_product_cudnn_attention", aten.mm).default}
SDPA_BACKWARD = {aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                 aten._scaled_dot_product_flash_attention_backward.default,
                 aten._scaled_dot_product_efficient_attention_backward.default}


@pytest.mark.parametrize("training", [False, True], ids=["infer", "train"])
def test_fires_on_the_seed_block(training):
    mg = cached_model_graph("block", training)
    new, count = _rewritten(mg.gm)
    assert count == 1
    targets = _targets(new)
    assert aten._softmax.default not in targets
    assert targets & SDPA_FORWARD
    assert bool(targets & SDPA_BACKWARD) == training
    _close(_run(new, mg.inputs), mg.eager)
    graph = lower_graph(mg.gm)
    kinds = [e.kind for e in graph.externs]
    assert kinds.count("attention") == 1 and kinds.count("attention_backward") == training
    _close(run_ir(graph, mg.inputs), mg.eager)


def test_seed_block_training_folds_the_query_scale():
    mg = cached_model_graph("block", True)
    new, _ = _rewritten(mg.gm)
    (fwd,) = [n for n in new.graph.nodes if n.target in SDPA_FORWARD]
    assert fwd.kwargs["scale"] == pytest.approx(8 ** -0.5)
    assert not [n for n in new.graph.nodes if n.target is aten.bmm.default]


def _four_d(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / 8, dim=-1) @ v


def _decomposed(q, k, v):
    s = q @ k.transpose(-2, -1) * 0.125
    e = (s - s.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def _mha_fast_path_form(q, k, v):  # kiln's decomposition of _native_multi_head_attention
    probs = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125, dim=-1)
    _unused_weights = probs.mean(dim=1)
    return torch.matmul(probs, v).transpose(1, 2)


def _post_scaled_3d(q, k, v):
    return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.3, -1), v)


def _weights_returned(q, k, v):
    p = torch.softmax(q @ k.transpose(-2, -1), -1)
    return p @ v, p


def _weights_reused(q, k, v):
    p = torch.softmax(q @ k.transpose(-2, -1), -1)
    return p @ v + p.sum()


def _bert_masked(q, k, v, mask):  # BERT: additive padding mask on the scaled scores
    scores = q @ k.transpose(-1, -2) / 8.0
    return torch.softmax(scores + mask, dim=-1) @ v


def _mask_scaled_after(q, k, v, mask):  # (S + mask) * c: the mask is scaled too, not rewritten
    return torch.softmax((q @ k.transpose(-1, -2) + mask) * 0.125, dim=-1) @ v


def _padding_mask(b, keys, dtype=torch.float32):
    lengths = torch.randint(1, keys + 1, (b, 1))
    keep = (torch.arange(keys)[None] < lengths).to(dtype)
    return ((1.0 - keep) * torch.finfo(dtype).min)[:, None, None, :]


def _grad_of(fn):
    def step(q, k, v):
        return torch.func.grad_and_value(lambda *a: fn(*a).pow(2).sum(), argnums=(0, 1, 2))(q, k, v)

    return step


def _qkv(shape):
    return tuple(torch.randn(shape) for _ in range(3))


CASES = [
    ("4d_matmul", _four_d, (2, 3, 5, 8), 1),
    ("decomposed_softmax", _decomposed, (2, 3, 5, 8), 1),
    ("mha_fast_path_form", _mha_fast_path_form, (2, 3, 5, 8), 1),
    ("post_scaled_3d", _post_scaled_3d, (6, 5, 8), 1),
    ("train_post_scaled_3d", _grad_of(_post_scaled_3d), (6, 5, 8), 1),
    ("weights_returned", _weights_returned, (2, 3, 5, 8), 0),
    ("weights_reused", _weights_reused, (2, 3, 5, 8), 0),
    ("train_4d_not_supported", _grad_of(_four_d), (2, 3, 5, 8), 0),
]


@pytest.mark.parametrize("fn,expected", [(_bert_masked, 1), (_mask_scaled_after, 0)])
def test_additive_mask_becomes_the_fused_kernels_bias(fn, expected):
    q, k, v = _qkv((2, 3, 5, 8))
    mask = _padding_mask(2, 5)
    gm, inputs = trace_flat(fn, (q, k, v, mask))
    eager = torch.utils._pytree.tree_leaves(fn(*inputs))
    new, count = _rewritten(gm)
    if q.device.type == "cuda":  # 5 keys: the bias rows would not be 16-byte aligned there
        expected = 0
    assert count == expected
    if expected:
        assert _targets(new) & SDPA_FORWARD
    _close(_run(new, inputs), eager)
    _close(run_ir(lower_graph(gm), inputs), eager)
    ref = fn(*[t.double() for t in inputs])
    assert (_run(new, inputs)[0].double() - ref).abs().max() < 1e-5


def _baddbmm_masked(q, k, v, mask):  # [N, L, S] scores: one batch dim (BLOOM-style baddbmm)
    return torch.softmax(torch.baddbmm(mask, q, k.transpose(1, 2), alpha=0.25), dim=-1) @ v


def _five_d_masked(q, k, v, mask):  # [A, B, H, L, S] scores: three batch dims
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + mask, dim=-1) @ v


@pytest.mark.parametrize("fn,shape,mask_shape", [
    (_baddbmm_masked, (6, 5, 8), (6, 5, 16)),
    (_five_d_masked, (2, 3, 2, 5, 8), (2, 1, 1, 5, 16)),
], ids=["one_batch_dim", "three_batch_dims"])
def test_masked_attention_with_other_than_two_batch_dims_gets_4d_kernel_operands(fn, shape,
                                                                                  mask_shape):
    """The fused kernels take 4-D q, k, v and bias only: a masked [N, L, S] attention was
    handed over 3-D ("Accept only 4 dims inputs", found with a BLOOM-style baddbmm)."""
    q = torch.randn(shape)
    k, v = (torch.randn(*shape[:-2], 16, shape[-1]) for _ in range(2))
    mask = torch.randn(mask_shape)
    gm, inputs = trace_flat(fn, (q, k, v, mask))
    eager = torch.utils._pytree.tree_leaves(fn(*inputs))
    new, count = _rewritten(gm)
    assert count == 1 and _targets(new) & SDPA_FORWARD
    _close(_run(new, inputs), eager)
    _close(run_ir(lower_graph(gm), inputs), eager)


def test_masked_attention_in_a_joint_graph_is_left_alone():
    q, k, v = _qkv((2, 3, 5, 8))
    mask = _padding_mask(2, 5)

    def step(q, k, v):
        return torch.func.grad_and_value(
            lambda *a: _bert_masked(*a, mask).pow(2).sum(), argnums=(0, 1, 2))(q, k, v)

    gm, inputs = trace_flat(step, (q, k, v))
    assert _rewritten(gm)[1] == 0


@pytest.mark.parametrize("name,fn,shape,expected", CASES, ids=[c[0] for c in CASES])
def test_forms(name, fn, shape, expected):
    gm, inputs = trace_flat(fn, _qkv(shape))
    eager = torch.utils._pytree.tree_leaves(fn(*inputs))
    new, count = _rewritten(gm)
    assert count == expected
    _close(_run(new, inputs), eager)
    _close(run_ir(lower_graph(gm), inputs), eager)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("training", [False, True])
def test_cuda_variants(dtype, training):
    q, k, v = (torch.randn(4, 64, 32, device="cuda", dtype=dtype) for _ in range(3))
    fn = _grad_of(_post_scaled_3d) if training else _post_scaled_3d
    gm, inputs = trace_flat(fn, (q, k, v))
    new, count = _rewritten(gm)
    assert count == 1
    if dtype == torch.bfloat16 and not training and torch.cuda.get_device_capability() >= (9, 0):
        assert aten._scaled_dot_product_cudnn_attention.default in _targets(new)
    ref = [t.double() for t in torch.utils._pytree.tree_leaves(
        fn(*[t.double() for t in inputs]))]
    got = _run(new, inputs)
    base = _run(gm, inputs)
    for g, b, r in zip(got, base, ref, strict=True):
        err, base_err = (g.double() - r).abs().max(), (b.double() - r).abs().max()
        assert err <= 2 * base_err + (1e-5 if dtype == torch.float32 else 2e-2) * r.abs().max()


@pytest.mark.gpu
def test_cuda_masked_variant():
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = _padding_mask(2, 64, torch.bfloat16).cuda()
    gm, inputs = trace_flat(_bert_masked, (q, k, v, mask))
    new, count = _rewritten(gm)
    assert count == 1
    fused = {aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_cudnn_attention.default}
    assert fused & _targets(new)
    ref = _bert_masked(*[t.double() for t in inputs])
    got, base = _run(new, inputs)[0], _run(gm, inputs)[0]
    err, base_err = (got.double() - ref).abs().max(), (base.double() - ref).abs().max()
    assert err <= 2 * base_err + 2e-2 * ref.abs().max()


def test_bf16_joint_graph_with_upcast_softmax_backward():
    fn = _grad_of(_post_scaled_3d)
    gm, inputs = trace_flat(fn, tuple(t.bfloat16() for t in _qkv((6, 5, 8))))
    assert aten._to_copy.default in _targets(gm)
    new, count = _rewritten(gm)
    assert count == 1 and aten._to_copy.default not in _targets(new)
    ref = [t.double() for t in torch.utils._pytree.tree_leaves(
        fn(*[t.double() for t in inputs]))]
    for got, base, r in zip(_run(new, inputs), _run(gm, inputs), ref, strict=True):
        err, base_err = (got.double() - r).abs().max(), (base.double() - r).abs().max()
        assert err <= 2 * base_err + 1e-2 * r.abs().max()


def test_joint_graph_with_softmax_backward_data_kept_whole():
    from kiln.lower.decomposition_tables import trace_aten
    from kiln.lower.decomposition_tables import trace_table

    table = {op: fn for op, fn in trace_table().items()
             if op is not aten._softmax_backward_data.default}
    fn = _grad_of(_post_scaled_3d)
    inputs = _qkv((6, 5, 8))
    gm = trace_aten(fn, *inputs, decompositions=table)
    assert aten._softmax_backward_data.default in _targets(gm)
    new, count = _rewritten(gm)
    assert count == 1
    _close(_run(new, inputs), torch.utils._pytree.tree_leaves(fn(*inputs)))
