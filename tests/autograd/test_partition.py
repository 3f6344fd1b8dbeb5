"""kiln.autograd.partition: the default and min-cut partitioners on joint graphs traced by
`joint_fixtures` (make_fx, no kiln tracer) and on one hand-built joint graph.

Every case runs `check_partition`: the forward graph holds no backward node, the backward graph
reads no unsaved primal and every used tangent, no random or compute-heavy forward op is
recomputed, and fw_gm then bw_gm reproduce the joint graph's outputs bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from types import SimpleNamespace

import pytest
import torch
import torch.fx as fx

from joint_fixtures import FIXTURES, check_partition
from kiln.autograd import partition as partition_mod
from kiln.autograd.partition import VIEW_OPS, partition_joint
from kiln.autograd.saved_report import (
    SavedValue,
    format_bytes,
    format_comparison,
    format_saved_report,
)
from kiln.errors import InternalError, InvalidArgument

aten = torch.ops.aten


@functools.cache
def joint(name: str):
    return FIXTURES[name]()


def _names(gm: fx.GraphModule, op: str = "call_function") -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == op]


def _targets(gm: fx.GraphModule) -> set[str]:
    return {getattr(getattr(n.target, "overloadpacket", None), "__name__", str(n.target))
            for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("policy", ["default", "min_cut"])
@pytest.mark.parametrize("name", list(FIXTURES))
def test_partition_invariants_and_exact_replay(name, policy):
    j = joint(name)
    result = partition_joint(j, policy=policy)
    for seed in (0, 1):
        check_partition(j, result, seed=seed)
    assert result.policy == policy and result.num_fw_outputs == j.num_fw_outputs


@pytest.mark.parametrize("name", list(FIXTURES))
def test_min_cut_saves_no_more_than_default(name):
    j = joint(name)
    default = partition_joint(j, policy="default")
    min_cut = partition_joint(j, policy="min_cut")
    print(f"{name}: default {default.saved_bytes} B "
          f"({default.saved_activation_bytes} B activations), min-cut {min_cut.saved_bytes} B "
          f"({min_cut.saved_activation_bytes} B activations)")
    assert min_cut.saved_bytes <= default.saved_bytes
    assert min_cut.saved_activation_bytes <= default.saved_activation_bytes


def test_matmul_and_five_pointwise_ops_min_cut_saves_at_most_a_quarter():
    j = joint("mm_pointwise_chain")
    default = partition_joint(j, policy="default")
    min_cut = partition_joint(j, policy="min_cut")
    print(f"\nmm + 5 pointwise: default saves {default.saved_bytes} B, "
          f"min-cut saves {min_cut.saved_bytes} B "
          f"(activations {default.saved_activation_bytes} B vs "
          f"{min_cut.saved_activation_bytes} B)")
    assert 4 * min_cut.saved_bytes <= default.saved_bytes
    assert 5 * min_cut.saved_activation_bytes == default.saved_activation_bytes
    # Only the matmul output (plus the inputs) is kept; the whole chain is recomputed.
    assert min_cut.saved == ["primals_1", "primals_2", "mm"]
    assert {"sin", "cos", "exp", "tanh", "sigmoid"} <= set(min_cut.recomputed)
    assert default.saved == ["primals_1", "primals_2", "mm", "sin", "exp", "tanh", "sigmoid"]


def _random_ops(gm: fx.GraphModule) -> set[str]:
    return {n.name for n in gm.graph.nodes
            if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())}


def test_random_values_are_saved_never_redrawn():
    for name in ("dropout_mlp", "random_scale"):
        j = joint(name)
        for policy in ("default", "min_cut"):
            result = partition_joint(j, policy=policy)
            # by tag: CPU traces bernoulli, CUDA rand_like or native_dropout
            assert _random_ops(result.fw_gm), f"{name}: the random op must stay in the forward"
            assert not _random_ops(result.bw_gm)
    result = partition_joint(joint("random_scale"), policy="min_cut")
    assert ("rand_like", "random") in {(v.name, v.reason) for v in result.saved_values}


def test_dropout_mask_really_is_random():
    # Without this, the exact-replay check could pass on a graph with no randomness.
    j = joint("dropout_mlp")
    result = partition_joint(j, policy="min_cut")
    x, w = (torch.randn(32, 16), torch.randn(16, 64))
    torch.manual_seed(0)
    first = result.fw_gm(x, w)[0]
    torch.manual_seed(1)
    second = result.fw_gm(x, w)[0]
    assert not torch.equal(first, second)


def test_shrinking_reduction_is_saved_not_recomputed():
    j = joint("reduction_chain")
    for policy in ("default", "min_cut"):
        result = partition_joint(j, policy=policy)
        reasons = {v.name: v.reason for v in result.saved_values}
        assert reasons.get("sum_1") == "reduction"
        assert "sum_1" not in result.recomputed


def test_min_cut_saves_bases_not_views_and_parameters_are_free():
    for name in ("mlp_layernorm_gelu", "softmax_attention", "transformer_block"):
        result = partition_joint(joint(name), policy="min_cut")
        assert all(v.op not in VIEW_OPS for v in result.saved_values), name
        # The transposed weights the backward matmuls read are recomputed from the parameters.
        assert all(v.op == "placeholder" for v in result.saved_values
                   if v.reason == "parameter"), name
    default = partition_joint(joint("mlp_layernorm_gelu"), policy="default")
    assert {"permute", "permute_1"} <= set(default.saved)  # eager-like: saves weight views


def test_compute_heavy_forward_ops_stay_in_the_forward():
    result = partition_joint(joint("transformer_block"), policy="min_cut")
    heavy = {"mm", "addmm", "bmm"}
    fw_heavy = [n.name for n in result.fw_gm.graph.nodes
                if n.op == "call_function" and n.target is not operator.getitem
                and n.target.overloadpacket.__name__ in heavy]
    assert fw_heavy and not set(fw_heavy) & set(result.recomputed)


def test_frozen_parameters_get_no_gradient():
    j = joint("mlp_layernorm_gelu_frozen")
    result = partition_joint(j, policy="min_cut")
    out = next(n for n in result.bw_gm.graph.nodes if n.op == "output")
    assert out.args[0][1] is None and out.args[0][2] is None  # the frozen LayerNorm
    assert all(isinstance(a, fx.Node) for i, a in enumerate(out.args[0]) if i not in (1, 2))


def test_checker_catches_a_recomputed_matmul(monkeypatch):
    # With the ban table switched off, min-cut recomputes the matmul from the cheap inputs.
    j = joint("mm_pointwise_chain")
    monkeypatch.setattr(partition_mod, "recompute_ban", lambda node: None)
    unbanned = partition_joint(j, policy="min_cut")
    assert "mm" in unbanned.recomputed
    with pytest.raises(AssertionError, match="compute-heavy forward op mm recomputed"):
        check_partition(j, unbanned)


def test_checker_catches_reordered_saved_values():
    j = joint("mlp_layernorm_gelu")
    result = partition_joint(j, policy="min_cut")
    broken = dataclasses.replace(result, saved=list(reversed(result.saved)))
    with pytest.raises(AssertionError, match="bw reads a primal that was not saved"):
        check_partition(j, broken)


# ---------------------------------------------------------------------------------------------
# A hand-built joint graph of y = sin(x @ w): stable names, so its printed IR is a golden test.

def _hand_joint(*, with_phase: bool = True) -> SimpleNamespace:
    g = fx.Graph()
    x = g.placeholder("primals_1")
    w = g.placeholder("primals_2")
    t = g.placeholder("tangents_1")
    def op(name, target, *args):
        return g.create_node("call_function", target, args, name=name)

    mm = op("mm", aten.mm.default, x, w)
    sin = op("sin", aten.sin.default, mm)
    cos = op("cos", aten.cos.default, mm)
    mul = op("mul", aten.mul.Tensor, t, cos)
    gw = op("mm_1", aten.mm.default, op("permute", aten.permute.default, x, [1, 0]), mul)
    gx = op("mm_2", aten.mm.default, mul, op("permute_1", aten.permute.default, w, [1, 0]))
    g.output((sin, gx, gw))
    shapes = {"primals_1": (4, 3), "primals_2": (3, 5), "tangents_1": (4, 5), "mm": (4, 5),
              "sin": (4, 5), "cos": (4, 5), "mul": (4, 5), "permute": (3, 4), "mm_1": (3, 5),
              "permute_1": (5, 3), "mm_2": (4, 3)}
    for n in g.nodes:
        if n.op != "output":
            n.meta["val"] = torch.empty(shapes[n.name], device="meta")
            if with_phase:
                n.meta["phase"] = "backward" if n.name in {"tangents_1", "mul", "mm_1",
                                                           "mm_2"} else "forward"
    return SimpleNamespace(gm=fx.GraphModule(torch.nn.Module(), g), num_fw_outputs=1,
                           num_primals=2, num_tangents=1)


def _run_hand(result):
    x, w, t = torch.randn(4, 3), torch.randn(3, 5), torch.randn(4, 5)
    j = _hand_joint()
    expected = j.gm(x, w, t)
    fw = result.fw_gm(x, w)
    grads = result.bw_gm(*fw[1:], t)
    assert all(torch.equal(a, b) for a, b in zip([fw[0], *grads], expected))


def test_golden_min_cut_graphs():
    # mm and cos cost the same bytes; the tie goes to cos, nearer the backward, so the
    # backward recomputes only the weight transposes.
    result = partition_joint(_hand_joint(), policy="min_cut")
    assert result.fw_gm.code.strip() == """\
def forward(self, primals_1, primals_2):
    mm = torch.ops.aten.mm.default(primals_1, primals_2)
    sin = torch.ops.aten.sin.default(mm)
    cos = torch.ops.aten.cos.default(mm);  mm = None
    return (sin, primals_1, primals_2, cos)"""
    assert result.bw_gm.code.strip() == """\
def forward(self, primals_1, primals_2, cos, tangents_1):
    mul = torch.ops.aten.mul.Tensor(tangents_1, cos);  tangents_1 = cos = None
    permute = torch.ops.aten.permute.default(primals_1, [1, 0]);  primals_1 = None
    mm_1 = torch.ops.aten.mm.default(permute, mul);  permute = None
    permute_1 = torch.ops.aten.permute.default(primals_2, [1, 0]);  primals_2 = None
    mm_2 = torch.ops.aten.mm.default(mul, permute_1);  mul = permute_1 = None
    return (mm_2, mm_1)"""
    assert result.recomputed == ("permute", "permute_1")
    _run_hand(result)


def test_golden_default_graphs():
    # Eager-like: what the forward outputs need is computed in the forward; `cos` and the
    # weight transposes, which only the backward needs, are computed in the backward.
    result = partition_joint(_hand_joint(), policy="default")
    assert result.fw_gm.code.strip() == """\
def forward(self, primals_1, primals_2):
    mm = torch.ops.aten.mm.default(primals_1, primals_2)
    sin = torch.ops.aten.sin.default(mm)
    return (sin, primals_1, primals_2, mm)"""
    assert result.bw_gm.code.strip() == """\
def forward(self, primals_1, primals_2, mm, tangents_1):
    cos = torch.ops.aten.cos.default(mm);  mm = None
    mul = torch.ops.aten.mul.Tensor(tangents_1, cos);  tangents_1 = cos = None
    permute = torch.ops.aten.permute.default(primals_1, [1, 0]);  primals_1 = None
    mm_1 = torch.ops.aten.mm.default(permute, mul);  permute = None
    permute_1 = torch.ops.aten.permute.default(primals_2, [1, 0]);  primals_2 = None
    mm_2 = torch.ops.aten.mm.default(mul, permute_1);  mul = permute_1 = None
    return (mm_2, mm_1)"""
    assert result.saved == ["primals_1", "primals_2", "mm"]
    _run_hand(result)


def test_golden_report():
    result = partition_joint(_hand_joint(), policy="default")
    assert result.report() == """\
saved for backward (default partition): 3 values, 188 B
  name       op           shape   dtype    bytes  why saved
  primals_1  placeholder  [4, 3]  float32  48 B   input
  primals_2  placeholder  [3, 5]  float32  60 B   input
  mm         mm           [4, 5]  float32  80 B   compute-heavy
  by reason: input 108 B, compute-heavy 80 B
  activations (excluding graph inputs): 80 B
  recomputed in backward (3): cos, permute, permute_1"""
    assert result.saved_bytes == 188 and result.num_saved == 3


def test_parameters_are_named_when_the_joint_says_so():
    j = _hand_joint()
    j.static_input_indices = (1,)
    reasons = [v.reason for v in partition_joint(j).saved_values]
    assert reasons == ["input", "parameter", "min-cut"]


def test_phase_defaults_to_the_tangent_closure():
    with_tags = partition_joint(_hand_joint())
    without = partition_joint(_hand_joint(with_phase=False))
    assert with_tags.fw_gm.code == without.fw_gm.code
    assert with_tags.bw_gm.code == without.bw_gm.code


def test_the_joint_graph_is_not_modified():
    j = joint("transformer_block")
    before = j.gm.code
    names = [n.name for n in j.gm.graph.nodes]
    partition_joint(j, policy="min_cut")
    partition_joint(j, policy="default")
    assert j.gm.code == before and [n.name for n in j.gm.graph.nodes] == names


def test_unknown_policy_is_refused():
    with pytest.raises(InvalidArgument, match=r"\[kiln.api\] unknown partition policy 'greedy'"
                                              r"(.|\n)*hint: use one of: default, min_cut"):
        partition_joint(_hand_joint(), policy="greedy")


def test_malformed_joint_is_an_internal_error():
    j = _hand_joint()
    j.num_tangents = 2
    with pytest.raises(InternalError, match=r"\[kiln.autograd\] joint graph has 3 placeholders,"
                                            r" expected 2 primals \+ 2 tangents"):
        partition_joint(j)
    j = _hand_joint()
    j.num_fw_outputs = 2
    with pytest.raises(InternalError, match="joint graph returns 3 values, expected 2 forward "
                                            "outputs \\+ 2 input grads"):
        partition_joint(j)


def test_forward_output_depending_on_a_tangent_is_an_internal_error():
    j = _hand_joint()
    out = next(n for n in j.gm.graph.nodes if n.op == "output")
    mul = next(n for n in j.gm.graph.nodes if n.name == "mul")
    out.args = ((mul, *out.args[0][1:]),)
    with pytest.raises(InternalError, match=r"forward outputs depend on tangents through "
                                            r"\['mul', 'tangents_1'\]"):
        partition_joint(j)


def test_getitem_parts_stay_with_their_tuple():
    # native_layer_norm returns a tuple: never saved whole, its getitems are saved instead.
    for policy in ("default", "min_cut"):
        result = partition_joint(joint("transformer_block"), policy=policy)
        for v in result.saved_values:
            assert v.dtype != "tuple" and v.nbytes > 0, (policy, v)
        saved_nodes = [n for n in result.bw_gm.graph.nodes if n.op == "placeholder"]
        assert all(n.target is not operator.getitem for n in saved_nodes)


# ---------------------------------------------------------------------------------------------
# saved_report

def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 3 * 2**20, 5 * 2**30)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "3.00 MiB", "5.00 GiB"]


def test_format_comparison_and_scalars():
    a = [SavedValue("mm", "mm", (2, 2), "float32", 16, "compute-heavy"),
         SavedValue("n", "sym_size", None, "int", 8, "default")]
    b = [SavedValue("mm", "mm", (2, 2), "float32", 16, "compute-heavy")]
    assert format_comparison({"default": a, "min_cut": b}) == (
        "default: 2 values, 24 B (1.000x)\nmin_cut: 1 values, 16 B (0.667x)")
    text = format_saved_report(a, policy="default")
    assert "n     sym_size  scalar  int      8 B    default" in text
