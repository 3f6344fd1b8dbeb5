"""Joint forward+backward graphs for partitioner tests, built without kiln's tracer, and the
partition checker every partitioner test runs.

A fixture traces `joint(primals, tangents)` (the forward, then `torch.autograd.grad` of the
outputs that need grad w.r.t. the primals that require grad) with `make_fx` in fake mode and
`core_aten_decompositions()`, then puts the graph in the autograd stage's contract: flat
placeholders `primals_*` then `tangents_*`, one output tuple `(*forward_outputs, *input_grads)`
(None for a primal that needs no grad), and `meta["phase"]` on every node.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.tools.seed_model import TransformerBlock

__all__ = [
    "FIXTURES",
    "FixtureJoint",
    "check_partition",
    "make_joint",
    "sample_inputs",
]


@dataclass
class FixtureJoint:
    """The duck-typed joint graph the partitioner accepts, plus what tests need to run it."""

    gm: fx.GraphModule
    num_fw_outputs: int
    num_primals: int
    num_tangents: int
    static_input_indices: tuple[int, ...] = ()
    name: str = ""
    has_random: bool = False
    example_primals: list[torch.Tensor] = field(default_factory=list, repr=False)


def make_joint(fn: Callable[..., tuple[torch.Tensor, ...]], primals: Sequence[torch.Tensor], *,
               static: Sequence[int] = (), name: str = "") -> FixtureJoint:
    """Trace the joint graph of `fn(*primals) -> tuple of outputs`."""
    with torch.enable_grad():
        outs = fn(*primals)
    tangents = [torch.randn_like(o) for o in outs if o.requires_grad]

    def joint(primals, tangents):
        outs = fn(*primals)
        diff = [p for p in primals if p.requires_grad]
        needs = [o for o in outs if o.requires_grad]
        grads = iter(torch.autograd.grad(needs, diff, tangents, allow_unused=True))
        return (*outs, *[next(grads) if p.requires_grad else None for p in primals])

    decomps = core_aten_decompositions()
    raw = make_fx(joint, decomposition_table=decomps, tracing_mode="fake")(list(primals), tangents)
    raw.graph._codegen = fx.graph.CodeGen()  # flat arguments
    raw.recompile()
    # Second trace: functionalize (autograd.grad cannot run inside torch.func.functionalize).
    gm = make_fx(torch.func.functionalize(raw, remove="mutations"), decomposition_table=decomps,
                 tracing_mode="fake")(*primals, *tangents)
    _to_contract(gm, [n.name for n in raw.graph.nodes if n.op == "placeholder"])
    has_random = any(n.op == "call_function"
                     and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                     for n in gm.graph.nodes)
    return FixtureJoint(gm, len(outs), len(primals), len(tangents), tuple(static), name,
                        has_random, list(primals))


def _to_contract(gm: fx.GraphModule, names: list[str]) -> None:
    """Contract placeholder names, flat output tuple, dead code removed, phase tags."""
    graph = gm.graph
    for n, name in zip([n for n in graph.nodes if n.op == "placeholder"], names, strict=True):
        n.name = n.target = name
    graph._codegen = fx.graph.CodeGen()
    out = next(n for n in graph.nodes if n.op == "output")
    out.args = (tuple(out.args[0]),)
    graph.eliminate_dead_code()
    backward: set[fx.Node] = set()
    for n in graph.nodes:
        is_bw = (n.op == "placeholder" and n.name.startswith("tangents_")) or any(
            a in backward for a in n.all_input_nodes)
        if is_bw:
            backward.add(n)
        n.meta["phase"] = "backward" if is_bw else "forward"
        schema = getattr(n.target, "_schema", None)
        assert schema is None or not schema.is_mutable, f"not functional: {n.format_node()}"
    gm.recompile()


def sample_inputs(joint: FixtureJoint, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Fresh random primals and tangents shaped like the joint's placeholders (never zeros)."""
    vals = [n.meta["val"] for n in joint.gm.graph.nodes if n.op == "placeholder"]
    gen = torch.Generator(device=vals[0].device if vals else "cpu").manual_seed(seed)
    values = [torch.randn(val.shape, generator=gen, dtype=val.dtype, device=val.device)
              for val in vals]
    return values[:joint.num_primals], values[joint.num_primals:]


# ---------------------------------------------------------------------------------------------
# The checker

_HEAVY = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward",
          "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_efficient_attention"}


def _op_name(n: fx.Node) -> str:
    if n.target is operator.getitem:
        return "getitem"
    return getattr(getattr(n.target, "overloadpacket", None), "__name__", str(n.target))


def _is_random(n: fx.Node) -> bool:
    return (n.op == "call_function"
            and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()))


def _forward_required(joint: FixtureJoint) -> set[str]:
    """Names of joint nodes the forward outputs depend on (independent of kiln's code)."""
    out = next(n for n in joint.gm.graph.nodes if n.op == "output")
    stack = [a for a in out.args[0][:joint.num_fw_outputs] if isinstance(a, fx.Node)]
    stack += [n for n in joint.gm.graph.nodes if _is_random(n)]
    seen: set[fx.Node] = set()
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return {n.name for n in seen}


def check_partition(joint: FixtureJoint, result, *, seed: int = 0) -> None:
    """Assert the partition invariants, then that fw+bw reproduce the joint graph exactly."""
    jnodes = {n.name: n for n in joint.gm.graph.nodes}
    jph = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
    primal_names = [n.name for n in jph[:joint.num_primals]]
    tangent_names = [n.name for n in jph[joint.num_primals:]]
    fw_ph = [n.name for n in result.fw_gm.graph.nodes if n.op == "placeholder"]
    bw_ph = [n.name for n in result.bw_gm.graph.nodes if n.op == "placeholder"]
    assert fw_ph == primal_names
    assert bw_ph == [*result.saved, *tangent_names], "bw reads a primal that was not saved"
    assert result.num_saved == len(result.saved) == len(set(result.saved))

    for n in result.fw_gm.graph.nodes:
        if n.op != "output":
            assert jnodes[n.name].meta["phase"] == "forward", f"backward node {n.name} in fw_gm"
    for n in result.bw_gm.graph.nodes:
        if n.op == "placeholder" and n.name in tangent_names and jnodes[n.name].users:
            assert n.users, f"tangent {n.name} unused in bw_gm"
    required = _forward_required(joint)
    for n in result.bw_gm.graph.nodes:
        if n.op != "call_function":
            continue
        assert not (_is_random(n) and jnodes[n.name].meta["phase"] == "forward"), \
            f"random forward op {n.name} recomputed in bw_gm"
        assert not (_op_name(n) in _HEAVY and n.name in required), \
            f"compute-heavy forward op {n.name} recomputed in bw_gm"

    primals, tangents = sample_inputs(joint, seed)
    torch.manual_seed(seed)
    expected = joint.gm(*primals, *tangents)
    torch.manual_seed(seed)
    fw_out = result.fw_gm(*primals)
    k = joint.num_fw_outputs
    outs, saved = fw_out[:k], fw_out[k:]
    assert len(saved) == result.num_saved
    assert sum(t.numel() * t.element_size() for t in saved) == result.saved_bytes
    grads = result.bw_gm(*saved, *tangents)
    assert len(outs) + len(grads) == len(expected)
    for i, (got, want) in enumerate(zip([*outs, *grads], expected)):
        if want is None:
            assert got is None, f"output {i}: expected None"
        else:
            assert torch.equal(got, want), f"output {i} differs from the joint graph"


# ---------------------------------------------------------------------------------------------
# The cases. Each builder returns a FixtureJoint; sizes are small so the whole suite runs fast.

def _module_joint(model: nn.Module, x: torch.Tensor, *, name: str,
                  frozen: Sequence[str] = ()) -> FixtureJoint:
    """Parameters (requires_grad unless frozen) as primals after the input x."""
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().clone().requires_grad_(n not in frozen)
              for n, p in model.named_parameters()]

    def fn(x, *params):
        out = torch.func.functional_call(model, dict(zip(names, params)), (x,))
        return (out,)

    return make_joint(fn, [x, *params], static=range(1, 1 + len(params)), name=name)


def mm_pointwise_chain() -> FixtureJoint:
    """A matmul followed by 5 pointwise ops (the issue's min-cut "Must show" case)."""
    def fn(x, w):
        h = x @ w
        return (h.sin().cos().exp().tanh().sigmoid(),)

    x = torch.randn(1024, 32, requires_grad=True)
    w = torch.randn(32, 256, requires_grad=True)
    return make_joint(fn, [x, w], static=[1], name="mm_pointwise_chain")


def mlp_layernorm_gelu(frozen: Sequence[str] = ()) -> FixtureJoint:
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    x = torch.randn(16, 32, requires_grad=True)
    name = "mlp_layernorm_gelu" + ("_frozen" if frozen else "")
    return _module_joint(model, x, name=name, frozen=frozen)


def softmax_attention() -> FixtureJoint:
    """Single-head softmax attention with q/k/v/out projections."""
    def fn(x, wq, wk, wv, wo):
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return (torch.softmax(scores, dim=-1) @ v @ wo,)

    torch.manual_seed(0)
    x = torch.randn(2, 8, 32, requires_grad=True)
    ws = [(torch.randn(32, 32) / 6).requires_grad_() for _ in range(4)]
    return make_joint(fn, [x, *ws], static=range(1, 5), name="softmax_attention")


def dropout_mlp() -> FixtureJoint:
    def fn(x, w):
        h = F.dropout(torch.relu(x @ w), p=0.5, training=True)
        return ((h * h.sigmoid()).sum(-1),)

    torch.manual_seed(0)
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(16, 64, requires_grad=True)
    return make_joint(fn, [x, w], static=[1], name="dropout_mlp")


def random_scale() -> FixtureJoint:
    """A random tensor the backward reads directly: it must be saved, never drawn again."""
    def fn(x, w):
        h = x @ w
        return ((h * torch.rand_like(h)).sin(),)

    torch.manual_seed(0)
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(8, 32, requires_grad=True)
    return make_joint(fn, [x, w], static=[1], name="random_scale")


def reduction_chain() -> FixtureJoint:
    """A pointwise chain through a shrinking sum reduction (sum over 128 columns)."""
    def fn(x, w):
        y = (x @ w).exp()
        s = y.sum(-1, keepdim=True)
        return ((y / s).tanh() * s.log(),)

    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w = (torch.randn(32, 128) / 8).requires_grad_()
    return make_joint(fn, [x, w], static=[1], name="reduction_chain")


def transformer_block() -> FixtureJoint:
    """The seed TransformerBlock, small (d_model 32, nhead 4, x [2, 8, 32]), training path."""
    torch.manual_seed(0)
    model = TransformerBlock(d_model=32, nhead=4).train()
    x = torch.randn(2, 8, 32, requires_grad=True)
    return _module_joint(model, x, name="transformer_block")


FIXTURES: dict[str, Callable[[], FixtureJoint]] = {
    "mm_pointwise_chain": mm_pointwise_chain,
    "mlp_layernorm_gelu": mlp_layernorm_gelu,
    "mlp_layernorm_gelu_frozen": lambda: mlp_layernorm_gelu(frozen=("0.weight", "0.bias")),
    "softmax_attention": softmax_attention,
    "dropout_mlp": dropout_mlp,
    "random_scale": random_scale,
    "reduction_chain": reduction_chain,
    "transformer_block": transformer_block,
}
