"""attention: rewrite explicit attention into a fused scaled-dot-product-attention call.

`rewrite_attention(gm)` is a graph pass on ATen FX graphs (inference and joint fwd+bwd). It finds

    S = bmm(A, Bt) [views, * or / by constants]      P = _softmax(S, -1)      O = bmm(P, V)

(the softmax may also be in its decomposed form `exp(S - amax(S)) / sum(exp(...))`, and a 4-D
`matmul` may put views between the bmms and the softmax) — the form `nn.MultiheadAttention`
produces with `need_weights=True`. It rewrites only when P has no other use; in a joint graph
those other uses must be exactly P's backward: `dV = bmm(Pᵀ, dO)`, the softmax backward
(`_softmax_backward_data`, or its decomposition `P*dP - P*sum(P*dP)`), and
`dA = bmm(dS, Btᵀ)`, `dBt = bmm(Aᵀ, dS)`. Then O becomes the SDPA forward and dA, dBt, dV
its backward's outputs, with q = A, k = Btᵀ, v = V and `scale` = the constant factor on S; a
constant pre-scale of A (`A = q * c`) is folded into `scale` when nothing else reads A.

SDPA variant by device and dtype: CPU `_scaled_dot_product_flash_attention_for_cpu`; CUDA
`_scaled_dot_product_flash_attention` for fp16/bf16 (head dim ≤ 256, multiple of 8), else
`_scaled_dot_product_efficient_attention`. Inference graphs on Hopper-class GPUs (sm90+, head
dim ≤ 128) take cuDNN's forward instead (`config.inference_attention`): 95 vs 138 µs on the
seed block's [32·16, 512, 64] bf16 attention on the H200. Results equal the explicit form up
to rounding (the fused kernels normalize the probabilities differently).

Inference graphs also take `softmax(S·c + mask)` (BERT's additive padding mask, any tensor of
the scores' dtype that broadcasts to them): q, k, v are viewed with the scores' batch dims and
the mask, expanded, becomes the kernel's bias (cuDNN or the efficient kernel; flash has none).
A mask added before the scaling, or in a joint graph, is left as it is.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
import torch.fx

from kiln.lower.graph_emit import NodeEmitter

__all__ = ["AttentionMatch", "match_attention", "rewrite_attention"]

log = logging.getLogger("kiln.lower")
aten = torch.ops.aten

ALIASES = (aten.alias.default, aten.detach.default)
RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
            aten.clone.default)


@dataclasses.dataclass
class AttentionMatch:
    """One explicit attention found in a graph (FX nodes). `q`/`bt`/`v`: the operands
    (`bt` is kᵀ); `scale`: the factor on q·kᵀ; `out`: the PV bmm; `scores`: the q·kᵀ bmm;
    `mask`: a tensor added to the scaled scores just before the softmax; for a joint graph `d_o`,
    `dv`, `dq`, `dbt`: the gradient nodes the SDPA backward replaces (`dq` may be the
    gradient of an un-scaled q when the pre-scale was folded)."""

    softmax: torch.fx.Node
    q: torch.fx.Node
    bt: torch.fx.Node
    v: torch.fx.Node
    scale: float
    out: torch.fx.Node
    scores: torch.fx.Node
    d_o: torch.fx.Node | None = None
    dv: torch.fx.Node | None = None
    dq: torch.fx.Node | None = None
    dbt: torch.fx.Node | None = None
    mask: torch.fx.Node | None = None  # an additive mask on the scaled scores (inference)
    mask_shape: tuple[int, ...] = ()  # the scores' shape where the mask is added


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _is_transpose12(node: Any, of: torch.fx.Node) -> bool:
    return _is(node, aten.permute.default) and node.args[0] is of and \
        list(node.args[1]) == [0, 2, 1]


def _aliases(node: torch.fx.Node) -> set[torch.fx.Node]:
    found, stack = {node}, [node]
    while stack:
        for user in stack.pop().users:
            if _is(user, *ALIASES) and user not in found:
                found.add(user)
                stack.append(user)
    return found


def _softmax_input(p: torch.fx.Node) -> torch.fx.Node | None:
    """S when p is softmax(S, -1) in `_softmax` or decomposed form."""
    if _is(p, aten._softmax.default):
        s, dim, half = p.args[:3]
        return s if not half and dim in (-1, _val(s).dim() - 1) else None
    if not _is(p, aten.div.Tensor):
        return None
    e, total = p.args[:2]
    if not (_is(e, aten.exp.default) and _is(total, aten.sum.dim_IntList)
            and total.args[0] is e and _last_dim_keep(total, e)):
        return None
    sub = e.args[0]
    if not _is(sub, aten.sub.Tensor):
        return None
    s, mx = sub.args[:2]
    if _is(mx, aten.amax.default) and mx.args[0] is s and _last_dim_keep(mx, s) and \
            set(s.users) == {mx, sub} and len(e.users) == 2 and len(sub.users) == 1:
        return s
    return None


def _last_dim_keep(red: torch.fx.Node, x: torch.fx.Node) -> bool:
    dims = list(red.args[1]) if len(red.args) > 1 else []
    keep = red.args[2] if len(red.args) > 2 else red.kwargs.get("keepdim", False)
    return keep and len(dims) == 1 and dims[0] in (-1, _val(x).dim() - 1)


def _scores(s: torch.fx.Node) -> tuple[torch.fx.Node, float, list[torch.fx.Node]] | None:
    """(the bmm computing S, the constant factor applied after it, the nodes in between)."""
    scale, between, first = 1.0, [], s
    while not _is(s, aten.bmm.default):
        between.append(s)
        if _is(s, aten.mul.Tensor, aten.mul.Scalar) and isinstance(s.args[1], (int, float)):
            scale *= s.args[1]
        elif _is(s, aten.div.Tensor, aten.div.Scalar) and isinstance(s.args[1], (int, float)):
            scale /= s.args[1]
        elif not (_is(s, *RESHAPES) and _val(s).shape[-1] == _val(s.args[0]).shape[-1]):
            return None
        if s is not first and len(s.users) != 1:
            return None
        s = s.args[0]
    if s is not first and len(s.users) != 1:
        return None
    return s, scale, between


def _masked_scores(s: torch.fx.Node) -> tuple[tuple, torch.fx.Node | None]:
    """`_scores` of S, or of S' when S = S' + mask with a mask tensor that broadcasts to S
    (BERT's additive padding mask), as ((bmm, scale, between), mask)."""
    plain = _scores(s)
    if plain is not None or not _is(s, aten.add.Tensor) or len(s.args) != 2 or s.kwargs:
        return plain, None
    shape = tuple(_val(s).shape)
    for x, mask in (s.args, s.args[::-1]):
        vm = _val(mask)
        if not (isinstance(x, torch.fx.Node) and isinstance(vm, torch.Tensor)) or \
                len(x.users) != 1 or vm.dtype != _val(s).dtype or vm.dim() > len(shape) or \
                torch.broadcast_shapes(tuple(vm.shape), shape) != shape or \
                tuple(_val(x).shape) != shape:
            continue
        inner = _scores(x)
        if inner is not None:
            bmm, scale, between = inner
            return (bmm, scale, [s, *between]), mask
    return None, None


def _pv_bmm(p_set: set[torch.fx.Node], shape: torch.Size) -> torch.fx.Node | None:
    """The forward bmm(P, V), looking through reshapes and no-op expands of P."""
    found = []
    for p in p_set:
        for user in p.users:
            prev, node = p, user
            while _passes(node) and len(node.users) == 1:
                prev, node = node, next(iter(node.users))
            if _is(node, aten.bmm.default) and node.args[0] is prev and \
                    _val(prev).shape == shape:
                found.append(node)
    return found[0] if len(found) == 1 else None


def _passes(node: Any) -> bool:
    if _is(node, aten.expand.default):
        return _val(node).shape == _val(node.args[0]).shape
    return _is(node, *RESHAPES)


def match_attention(p: torch.fx.Node) -> AttentionMatch | None:
    s = _softmax_input(p)
    scores, mask = _masked_scores(s) if s is not None else (None, None)
    if scores is None:
        return None
    s3, scale, between = scores
    a, bt = s3.args
    p_set = _aliases(p)
    out = _pv_bmm(p_set, _val(s3).shape)
    if out is None or len(_val(a).shape) != 3:
        return None
    match = AttentionMatch(p, a, bt, out.args[1], scale, out, s3)
    if mask is not None:
        match.mask, match.mask_shape = mask, tuple(_val(s).shape)
        if not _mask_fits(match):
            return None
    others = {u for q in p_set for u in q.users} - p_set
    others -= {u for u in others if _reaches(u, out)}
    if others and (mask is not None or not _match_backward(match, p_set, others, between)):
        return None  # a masked attention is rewritten in inference graphs only
    _fold_prescale(match)
    return match


def _mask_fits(m: AttentionMatch) -> bool:
    """The masked scores [*batch, L, S] split the bmm's [N, L, S] batch (N = prod(batch)), and
    on CUDA the key length keeps the bias rows 16-byte aligned (the efficient kernel's rule)."""
    *batch, length, keys = m.mask_shape
    n, rows, cols = _val(m.scores).shape
    if (rows, cols) != (length, keys) or int(torch.Size(batch).numel()) != n or not batch:
        return False
    return _val(m.q).device.type != "cuda" or keys % 16 == 0


def _reaches(node: torch.fx.Node, target: torch.fx.Node) -> bool:
    while node is not target:
        if len(node.users) != 1 or not _passes(node):
            return False
        node = next(iter(node.users))
    return True


def _match_backward(m: AttentionMatch, p_set: set, users: set,
                    between: list[torch.fx.Node]) -> bool:
    if not _is(m.softmax, aten._softmax.default) or any(_is(b, *RESHAPES) for b in between):
        return False  # joint graphs: `_softmax` of a 3-D bmm, optionally scaled
    dv = [u for u in users if _is(u, aten.permute.default) and _is_transpose12(u, u.args[0])]
    if len(dv) != 1 or len(dv[0].users) != 1:
        return False
    dv_bmm = next(iter(dv[0].users))
    if not _is(dv_bmm, aten.bmm.default) or dv_bmm.args[0] is not dv[0]:
        return False
    d_o = dv_bmm.args[1]
    ds = _softmax_backward(p_set, users - {dv[0]}, d_o, m.v)
    for scale_node in reversed(between):  # d(S*c) = dS*c, d(S/c) = dS/c
        if ds is None or len(ds.users) != 1:
            return False
        (user,) = ds.users
        if not (_is(user, scale_node.target) and user.args[0] is ds
                and user.args[1] == scale_node.args[1]):
            return False
        ds = user
    if ds is None:
        return False
    grads = {u for u in ds.users}
    dq = [g for g in grads if _is(g, aten.bmm.default) and g.args[0] is ds
          and _is_transpose12(g.args[1], m.bt)]
    dbt = [g for g in grads if _is(g, aten.bmm.default) and g.args[1] is ds
           and _is_transpose12(g.args[0], m.q)]
    if len(dq) != 1 or len(dbt) != 1 or len(grads) != 2:
        return False
    m.d_o, m.dv, m.dq, m.dbt = d_o, dv_bmm, dq[0], dbt[0]
    return True


def _is_upcast(node: Any, of: Any = None) -> bool:
    """`_to_copy(x, dtype=float32)` of a low-precision x (what bf16 softmax backward does)."""
    return (_is(node, aten._to_copy.default) and set(node.kwargs) == {"dtype"}
            and node.kwargs["dtype"] == torch.float32 and (of is None or node.args[0] is of))


def _softmax_backward(p_set: set, users: set, d_o: torch.fx.Node,
                      v: torch.fx.Node) -> torch.fx.Node | None:
    """dS from the softmax-backward nodes among `users` (all of them must be used), also in the
    float32-upcast form low-precision graphs have."""
    def is_dp(node: Any) -> bool:
        if _is_upcast(node):
            node = node.args[0]
        return _is(node, aten.bmm.default) and node.args[0] is d_o and \
            _is_transpose12(node.args[1], v)

    ups = {u for u in users if _is_upcast(u)}
    p_like = p_set | ups
    users = (users - ups) | {w for u in ups for w in u.users}
    if len(users) == 1:
        (u,) = users
        if _is(u, aten._softmax_backward_data.default) and is_dp(u.args[0]) and \
                u.args[1] in p_like and u.args[2] in (-1, _val(u).dim() - 1):
            return u
        return None
    if len(users) != 2:
        return None
    t = next((u for u in users if _is(u, aten.mul.Tensor) and any(is_dp(a) for a in u.args)
              and any(a in p_like for a in u.args)), None)
    if t is None or len(t.users) != 2:
        return None
    total = next((u for u in t.users if _is(u, aten.sum.dim_IntList)
                  and _last_dim_keep(u, t)), None)
    sub = next((u for u in t.users if _is(u, aten.sub.Tensor) and u.args[0] is t), None)
    mul2 = (users - {t}).pop()
    if total is None or sub is None or not _is(mul2, aten.mul.Tensor) or \
            total not in mul2.args or not any(a in p_like for a in mul2.args) or \
            sub.args[1] is not mul2:
        return None
    if ups:  # the result is cast back to the graph's dtype
        if len(sub.users) != 1 or not _is(next(iter(sub.users)), aten._to_copy.default):
            return None
        sub = next(iter(sub.users))
    return sub


def _fold_prescale(m: AttentionMatch) -> None:
    a = m.q
    if not (_is(a, aten.mul.Tensor, aten.div.Tensor) and isinstance(a.args[1], (int, float))):
        return
    c = a.args[1] if a.target is aten.mul.Tensor else 1.0 / a.args[1]
    allowed = {m.scores}
    if m.dbt is not None:
        if len(m.dbt.args[0].users) != 1:
            return
        allowed.add(m.dbt.args[0])
    if set(a.users) - allowed:
        return
    if m.dq is not None:
        if len(m.dq.users) != 1:
            return
        (g,) = m.dq.users
        if not (_is(g, a.target) and g.args[0] is m.dq and g.args[1] == a.args[1]):
            return
        m.dq = g
    m.q, m.scale = a.args[0], m.scale * c


# -- the rewrite -----------------------------------------------------------------------------------

def _variant(q: Any, training: bool) -> str:
    if q.device.type != "cuda":
        return "cpu"
    if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256:
        if not training and q.shape[-1] <= 128 and _cudnn_usable(q.device):
            return "cudnn"
        return "flash"
    return "efficient"


def _cudnn_usable(device: torch.device) -> bool:
    """cuDNN's fused attention forward, where configured and present on an sm90+ GPU."""
    from kiln.config import config

    if config.inference_attention != "cudnn" or not torch.cuda.is_available():
        return False
    if not hasattr(aten, "_scaled_dot_product_cudnn_attention") or \
            not torch.backends.cudnn.is_available() or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def _forward(e: NodeEmitter, kind: str, q: Any, k: Any, v: Any, scale: float) -> tuple:
    if kind == "cpu":
        fwd = e.call(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v,
                     scale=scale)
    elif kind == "flash":
        fwd = e.call(aten._scaled_dot_product_flash_attention.default, q, k, v, scale=scale)
    elif kind == "cudnn":
        fwd = e.call(aten._scaled_dot_product_cudnn_attention.default, q, k, v, None, False,
                     scale=scale)
    else:
        fwd = e.call(aten._scaled_dot_product_efficient_attention.default, q, k, v, None, True,
                     scale=scale)
    return fwd, e.item(fwd, 0)


def _backward(e: NodeEmitter, kind: str, fwd: Any, d_o: Any, q: Any, k: Any, v: Any,
              out: Any, scale: float) -> list:
    lse = e.item(fwd, 1)
    if kind == "cpu":
        bwd = e.call(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, d_o, q, k,
                     v, out, lse, 0.0, False, scale=scale)
    elif kind == "flash":
        items = [_forward_item(e, fwd, i) for i in (2, 3, 4, 5, 6, 7)]
        bwd = e.call(aten._scaled_dot_product_flash_attention_backward.default, d_o, q, k, v,
                     out, lse, items[0], items[1], items[2], items[3], 0.0, False, items[4],
                     items[5], scale=scale)
    else:
        seed, offset = _forward_item(e, fwd, 2), _forward_item(e, fwd, 3)
        bwd = e.call(aten._scaled_dot_product_efficient_attention_backward.default, d_o, q, k,
                     v, None, out, lse, seed, offset, 0.0, [True, True, True, False],
                     scale=scale)
    return [e.item(bwd, i) for i in range(3)]


def _forward_item(e: NodeEmitter, fwd: Any, i: int) -> Any:
    """Forward output `i` as the backward call's argument: a tensor as a getitem node; an
    undefined tensor (None: the varlen offsets of a dense call) or a static int (max_q) as the
    constant itself, so the joint graph's partitioner never has to save a value without a
    size (it found no finite cut on CUDA flash attention before)."""
    val = e.fakes[fwd][i]
    if isinstance(val, torch.Tensor):
        return e.item(fwd, i)
    return int(val) if isinstance(val, (int, torch.SymInt)) else val


def _rewrite_masked(graph: torch.fx.Graph, m: AttentionMatch) -> None:
    """q, k, v viewed with the scores' batch dims [*batch, L, D]; the mask expanded (a view) to
    the scores' shape as the fused kernel's additive bias (cuDNN's or the efficient kernel's
    on CUDA: flash takes none)."""
    e = NodeEmitter(graph, m.softmax.meta.get("user_location"))
    batch = _two_batch_dims(m.mask_shape[:-2])

    def operand(x: torch.fx.Node) -> torch.fx.Node:
        """`x` [N, L, D] as [*batch, L, D] with a unit stride on D (the fused kernels read a
        strided head dim wrongly; the lower stage copies such views anyway)."""
        y = e.call(aten.reshape.default, x, batch + list(_val(x).shape[-2:]))
        if _val(y).stride(-1) != 1:
            y = e.call(aten.clone.default, y, memory_format=torch.contiguous_format)
        return y

    with graph.inserting_before(m.out):
        q, v = operand(m.q), operand(m.v)
        k = operand(e.call(aten.permute.default, m.bt, [0, 2, 1]))
        bias = e.call(aten.expand.default, m.mask, list(m.mask_shape))
        if len(m.mask_shape) != 4:
            bias = e.call(aten.reshape.default, bias, batch + list(m.mask_shape[-2:]))
        kind = _variant(_val(m.q), training=False)
        if kind == "cpu":
            fwd = e.call(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v,
                         attn_mask=bias, scale=m.scale)
        elif kind == "cudnn":
            fwd = e.call(aten._scaled_dot_product_cudnn_attention.default, q, k, v, bias, False,
                         scale=m.scale)
        else:  # flash takes no bias
            fwd = e.call(aten._scaled_dot_product_efficient_attention.default, q, k, v, bias,
                         False, scale=m.scale)
        out = e.call(aten.reshape.default, e.item(fwd, 0), list(_val(m.out).shape))
    m.out.replace_all_uses_with(out)


def _two_batch_dims(batch: tuple[int, ...]) -> list[int]:
    """The scores' batch dims as the fused kernels' [B, H]: they take 4-D q, k, v and bias
    only (a `baddbmm(mask, q, kt)` over [N, L, S] has one batch dim; more merge into B)."""
    batch = list(batch)
    if len(batch) < 2:
        return [1] * (2 - len(batch)) + batch
    return [int(torch.Size(batch[:-1]).numel()), batch[-1]]


def _rewrite(graph: torch.fx.Graph, m: AttentionMatch) -> None:
    if m.mask is not None:
        _rewrite_masked(graph, m)
        return
    e = NodeEmitter(graph, m.softmax.meta.get("user_location"))
    kind = _variant(_val(m.q), training=m.dv is not None)
    with graph.inserting_before(m.out):
        q = e.call(aten.unsqueeze.default, m.q, 0)
        k = e.call(aten.unsqueeze.default, e.call(aten.permute.default, m.bt, [0, 2, 1]), 0)
        v = e.call(aten.unsqueeze.default, m.v, 0)
        fwd, out4 = _forward(e, kind, q, k, v, m.scale)
        out = e.call(aten.squeeze.dims, out4, [0])
    m.out.replace_all_uses_with(out)
    if m.dv is None:
        return
    first = min((m.dv, m.dq, m.dbt), key=_position(graph))
    first = min(first, *[u for u in m.d_o.users if _is(u, aten.bmm.default)], key=_position(graph))
    with graph.inserting_before(first):
        d_o = e.call(aten.unsqueeze.default, m.d_o, 0)
        dq4, dk4, dv4 = _backward(e, kind, fwd, d_o, q, k, v, out4, m.scale)
        dq = e.call(aten.squeeze.dims, dq4, [0])
        dbt = e.call(aten.permute.default, e.call(aten.squeeze.dims, dk4, [0]), [0, 2, 1])
        dv = e.call(aten.squeeze.dims, dv4, [0])
    for old, new in ((m.dq, dq), (m.dbt, dbt), (m.dv, dv)):
        old.replace_all_uses_with(new)


def _position(graph: torch.fx.Graph) -> Any:
    order = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: order[n]


def rewrite_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite every explicit attention in `gm` (in place) into SDPA; returns how many."""
    graph = gm.graph
    graph.eliminate_dead_code()
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.graph is not graph:
            continue
        if not (_is(node, aten._softmax.default) or _is(node, aten.div.Tensor)):
            continue
        match = match_attention(node)
        if match is None:
            continue
        _rewrite(graph, match)
        graph.eliminate_dead_code()
        count += 1
    if count:
        gm.recompile()
        log.debug("attention rewrite: %d explicit attention(s) -> SDPA", count)
    return count
