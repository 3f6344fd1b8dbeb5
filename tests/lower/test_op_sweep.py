"""Op sweep (OpInfo style): each lowered op × float32 / bfloat16 / int64 where valid, traced to
ATen, lowered, run by the reference evaluator and compared with eager (torch.testing's default
tolerances per dtype; bf16 rtol 1.6e-2). No case may fall back, and outputs keep eager's strides.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import zlib

import torch
import torch.nn.functional as F

from kiln.lower import lower_graph
from kiln.lower.decomposition_tables import trace_aten
from kiln.lower.evaluate import run_ir

FP = (torch.float32, torch.bfloat16)
ALL = (torch.float32, torch.bfloat16, torch.int64)
F32 = (torch.float32,)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    inputs: tuple  # (kind, shape): "f" random, "p" positive, "n" nonzero, "i" index, "b" bool
    dtypes: tuple = FP


def _make(kind: str, shape: Any, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if kind == "i":
        return torch.randint(0, shape[1], shape[0], generator=gen)
    if kind == "b":
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        low = 1 if kind in ("p", "n") else -8
        x = torch.randint(low, 9, shape, generator=gen, dtype=dtype)
        return torch.where(x == 0, torch.ones_like(x), x) if kind == "n" else x
    x = torch.randn(shape, generator=gen)
    if kind == "p":
        x = x.abs() + 0.5
    elif kind == "n":
        x = torch.where(x.abs() < 0.1, x.sign() * 0.5 + 0.1, x)
    return x.to(dtype)


f48, p48, n48 = ("f", (4, 8)), ("p", (4, 8)), ("n", (4, 8))

CASES = [
    # unary
    *[Case(n, fn, (f48,), ALL) for n, fn in [
        ("neg", torch.neg), ("abs", torch.abs), ("sign", torch.sign), ("relu", torch.relu),
        ("square", torch.square), ("logical_not", torch.logical_not)]],
    *[Case(n, fn, (f48,)) for n, fn in [
        ("exp", torch.exp), ("exp2", torch.exp2), ("expm1", torch.expm1), ("sin", torch.sin),
        ("cos", torch.cos), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("erf", torch.erf),
        ("floor", torch.floor), ("ceil", torch.ceil), ("trunc", torch.trunc),
        ("round", torch.round), ("gelu", F.gelu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
        ("silu", lambda x: F.silu(x)), ("softplus", lambda x: F.softplus(x)),
        ("hardtanh", lambda x: F.hardtanh(x)), ("leaky_relu", lambda x: F.leaky_relu(x)),
        ("hardswish", lambda x: F.hardswish(x)), ("elu", lambda x: F.elu(x)),
        ("isnan", torch.isnan), ("tan", lambda x: torch.tan(x * 0.5))]],
    *[Case(n, fn, (p48,)) for n, fn in [
        ("log", torch.log), ("log1p", torch.log1p), ("log2", torch.log2), ("sqrt", torch.sqrt),
        ("rsqrt", torch.rsqrt), ("reciprocal", torch.reciprocal)]],
    Case("bitwise_not", torch.bitwise_not, (f48,), (torch.int64,)),
    # binary
    *[Case(n, fn, (f48, ("f", (8,))), ALL) for n, fn in [
        ("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
        ("add_alpha", lambda a, b: torch.add(a, b, alpha=2)),
        ("maximum", torch.maximum), ("minimum", torch.minimum), ("eq", torch.eq),
        ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge),
        ("logical_and", torch.logical_and), ("logical_or", torch.logical_or),
        ("logical_xor", torch.logical_xor), ("rsub", torch.rsub)]],
    *[Case(n, fn, (f48, ("n", (4, 1))), ALL) for n, fn in [
        ("div", torch.div), ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
        ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
        ("remainder", torch.remainder), ("fmod", torch.fmod),
        ("floor_divide", torch.floor_divide)]],
    *[Case(n, fn, (f48, f48), (torch.int64,)) for n, fn in [
        ("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or),
        ("bitwise_xor", torch.bitwise_xor)]],
    Case("pow_scalar", lambda x: x ** 2, (f48,), ALL),
    Case("pow_float", lambda x: x ** 0.5, (p48,)),
    Case("pow_tensor", torch.pow, (p48, ("f", (8,)))),
    Case("rpow", lambda x: 2.0 ** x, (f48,)),
    Case("atan2", torch.atan2, (f48, n48)),
    Case("scalar_chain", lambda x: (x * 3 + 2) / 4 - 1, (f48,), (torch.float32, torch.int64)),
    Case("where", lambda c, a, b: torch.where(c, a, b), (("b", (4, 8)), f48, ("f", (1, 8))), ALL),
    Case("where_scalar", lambda c, a: torch.where(c, a, 0.5), (("b", (4, 8)), f48)),
    Case("clamp", lambda x: torch.clamp(x, -0.5, 0.7), (f48,)),
    Case("clamp_int", lambda x: torch.clamp(x, -3, 4), (f48,), (torch.int64,)),
    Case("clamp_min", lambda x: torch.clamp_min(x, 0.1), (f48,)),
    Case("clamp_tensor", lambda x, lo: torch.clamp(x, min=lo), (f48, ("f", (8,)))),
    Case("lerp", lambda a, b: torch.lerp(a, b, 0.3), (f48, f48)),
    Case("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.5), (f48, f48, f48)),
    Case("masked_fill", lambda x, m: x.masked_fill(m, -1.0), (f48, ("b", (4, 8)))),
    Case("mixed_int_float", lambda a, b: a * b.to(torch.int64) + 1, (f48, ("f", (4, 8)))),
    # casts and creation
    Case("to_bf16", lambda x: x.to(torch.bfloat16), (f48,), F32),
    Case("to_f32", lambda x: x.float() * 2, (f48,), ALL),
    Case("to_int", lambda x: (x * 4).to(torch.int64), (f48,)),
    Case("to_bool", lambda x: x.bool(), (f48,), ALL),
    Case("round_trip_bf16", lambda x: x.to(torch.bfloat16).float() - x, (f48,), F32),
    Case("full_like", lambda x: torch.full_like(x, 2.5) + x, (f48,)),
    Case("zeros_ones", lambda x: torch.zeros_like(x) + torch.ones_like(x) * x, (f48,), ALL),
    Case("arange", lambda x: x + torch.arange(8, dtype=x.dtype), (f48,), ALL),
    Case("arange_step", lambda x: x * torch.arange(1, 17, 2), (f48,)),
    Case("full", lambda x: x + torch.full((4, 1), 3, dtype=x.dtype), (f48,), ALL),
    # reductions
    *[Case(n, fn, (("f", (3, 4, 5)),), ALL) for n, fn in [
        ("sum", lambda x: x.sum(-1)), ("sum_all", lambda x: x.sum()),
        ("sum_keepdim", lambda x: x.sum((0, 2), keepdim=True)), ("amax", lambda x: x.amax(1)),
        ("amin", lambda x: x.amin((0, 1))), ("argmax", lambda x: x.argmax(-1)),
        ("argmin", lambda x: x.argmin(0)), ("argmax_all", lambda x: x.argmax()),
        ("max_dim", lambda x: x.max(1)), ("min_dim", lambda x: x.min(-1, keepdim=True)),
        ("any", lambda x: (x > 1).any(-1)), ("all", lambda x: (x > -2).all(1))]],
    *[Case(n, fn, (("f", (3, 4, 5)),)) for n, fn in [
        ("mean", lambda x: x.mean(-1)), ("mean_all", lambda x: x.mean()),
        ("prod", lambda x: (x * 0.5 + 1).prod(1)), ("var", lambda x: x.var(-1)),
        ("var_mean", lambda x: torch.var_mean(x, (0, 2), correction=0)),
        ("std", lambda x: x.std(1, keepdim=True)), ("logsumexp", lambda x: x.logsumexp(-1)),
        ("softmax", lambda x: x.softmax(-1)), ("log_softmax", lambda x: x.log_softmax(1)),
        ("softmax_dim0", lambda x: x.softmax(0))]],
    Case("sum_int_promotes", lambda x: x.sum(0), (f48,), (torch.int64,)),
    Case("sum_bool", lambda x: (x > 0).sum(-1), (f48,), ALL),
    # views
    *[Case(n, fn, (("f", (2, 3, 4)),), ALL) for n, fn in [
        ("view", lambda x: x.view(6, 4) + 1), ("reshape_noncontig", lambda x: x.transpose(0, 2).reshape(4, 6) + 1),
        ("permute", lambda x: x.permute(2, 0, 1) * 2), ("transpose", lambda x: x.transpose(1, 2).contiguous()),
        ("t", lambda x: x[0].t() + 1), ("expand", lambda x: x[:, :1].expand(2, 5, 4) + 0),
        ("slice_step", lambda x: x[:, ::2, 1:3] + 1), ("select", lambda x: x[:, -1] * 2 + x[1, 0]),
        ("unsqueeze_squeeze", lambda x: x.unsqueeze(1).squeeze(1)[..., None] + 1),
        ("split", lambda x: [t * 2 for t in x.split([1, 3], -1)]),
        ("unbind", lambda x: [t + 1 for t in x.unbind(1)]), ("chunk", lambda x: x.chunk(2, -1)[1] * 3),
        ("narrow", lambda x: x.narrow(2, 1, 2) - 1), ("flatten", lambda x: x.flatten(1) * 2),
        ("as_strided", lambda x: torch.as_strided(x + 1, (3, 2), (4, 7), 1)),
        ("cat", lambda x: torch.cat([x, x[:, :1] * 2, x[:, 1:] + 1], 1)),
        ("stack", lambda x: torch.stack([x, -x], 1)),
        ("pad", lambda x: F.pad(x, (1, 2, 0, 1), value=3)), ("pad_negative", lambda x: F.pad(x, (-1, 1)) + 1),
        ("repeat", lambda x: x.repeat(2, 1, 1) + 1), ("flip", lambda x: x.flip(-1) + 0),
        ("roll", lambda x: torch.roll(x, 1, -1) * 1), ("diagonal", lambda x: x[:, :3, :3].diagonal(0, 1, 2) + 1)]],
    # indexing
    Case("embedding", lambda w, i: F.embedding(i, w), (("f", (10, 6)), ("i", ((3, 4), 10)))),
    Case("gather", lambda x, i: torch.gather(x, 1, i), (f48, ("i", ((4, 3), 8))), ALL),
    Case("index_select", lambda x, i: x.index_select(1, i), (f48, ("i", ((5,), 8))), ALL),
    Case("index", lambda x, i: x[i], (f48, ("i", ((2, 3), 4))), ALL),
    Case("index_mid", lambda x, i: x[:, i] * 2, (("f", (3, 5, 2)), ("i", ((4,), 5)))),
    Case("index_two", lambda x, i, j: x[i, :, j], (("f", (3, 5, 2)), ("i", ((4,), 3)), ("i", ((4,), 2)))),
    Case("index_negative", lambda x: x[:, [-1]] + 1, (f48,)),
    Case("scatter_one", lambda x, i: x.scatter(1, i, 2.0), (f48, ("i", ((4, 1), 8)))),
    Case("scatter_src", lambda x, i, s: x.scatter(1, i, s), (f48, ("i", ((4, 1), 8)), ("f", (4, 1)))),
    # externs and norms
    Case("mm", torch.mm, (("f", (4, 6)), ("f", (6, 5)))),
    Case("mm_transposed", lambda a, b: a.t() @ b, (("f", (6, 4)), ("f", (6, 5)))),
    Case("bmm", torch.bmm, (("f", (2, 4, 6)), ("f", (2, 6, 3)))),
    Case("matmul_3d", torch.matmul, (("f", (2, 4, 6)), ("f", (6, 3)))),
    Case("linear", F.linear, (("f", (2, 4, 6)), ("f", (3, 6)), ("f", (3,)))),
    Case("addmm", lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2), (("f", (5,)), ("f", (4, 6)), ("f", (6, 5)))),
    Case("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2), (("f", (2, 3, 7, 7)), ("f", (4, 3, 3, 3)), ("f", (4,)))),
    Case("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         (("f", (2, 2, 5, 8)), ("f", (2, 2, 5, 8)), ("f", (2, 2, 5, 8)))),
    Case("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), (f48, ("f", (8,)), ("f", (8,)))),
    Case("rms_like", lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), (f48,)),
    Case("batch_norm_eval", lambda x, m, v: F.batch_norm(x, m, v.abs() + 0.5, training=False),
         (("f", (2, 3, 4, 4)), ("f", (3,)), ("f", (3,))), F32),
    Case("batch_norm_train", lambda x: F.batch_norm(x, None, None, training=True), (("f", (2, 3, 4, 4)),), F32),
    Case("group_norm", lambda x: F.group_norm(x, 2), (("f", (2, 4, 3, 3)),), F32),
    Case("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1), (("f", (2, 3, 8, 8)),)),
    Case("max_pool2d_ceil", lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), (("f", (1, 2, 7, 7)),), F32),
    Case("max_pool2d_dilated", lambda x: F.max_pool2d(x, 2, 1, 0, dilation=2), (("f", (1, 2, 6, 6)),), F32),
    Case("max_pool2d_backward", lambda x: torch.func.grad(
        lambda t: F.max_pool2d(t, 3, 2, 1).pow(2).sum())(x), (("f", (2, 3, 8, 8)),), F32),
    Case("max_pool2d_indices", lambda x: F.max_pool2d(x, 2, return_indices=True)[1], (("f", (1, 2, 6, 6)),), F32),
    Case("adaptive_avg_pool", lambda x: F.adaptive_avg_pool2d(x, 1), (("f", (2, 3, 4, 4)),), F32),
    Case("cross_entropy", lambda x, t: F.cross_entropy(x, t), (f48, ("i", ((4,), 8))), F32),
]

IDS = [c.name for c in CASES]


def _params():
    for case in CASES:
        for dtype in case.dtypes:
            yield pytest.param(case, dtype, id=f"{case.name}-{str(dtype)[6:]}")


def _check(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert all(a == b for s, a, b in zip(got.shape, got.stride(), expected.stride()) if s > 1), \
        (got.stride(), expected.stride())


@pytest.mark.parametrize("case,dtype", list(_params()))
def test_op(case: Case, dtype: torch.dtype, device: torch.device) -> None:
    seed = zlib.crc32(case.name.encode()) % 1000  # per-process stable
    gen = torch.Generator(device=device).manual_seed(seed)
    inputs = [_make(kind, shape, dtype, gen) for kind, shape in case.inputs]
    expected = torch.utils._pytree.tree_leaves(case.fn(*inputs))
    graph = lower_graph(trace_aten(case.fn, *inputs))
    assert not graph.fallbacks, [str(f.op) for f in graph.fallbacks]
    got = run_ir(graph, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        _check(g, e)
