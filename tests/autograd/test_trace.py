"""The tracer and the JointGraph contract: placeholders, output layout, node meta, functional
graphs, the decomposition policy, input mutations, output kinds, refusals, RNG policy."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.autograd import AutogradUnsupported, JointGraph, trace_inference, trace_joint
from kiln.autograd.decompositions import AUTOGRAD_EXTRAS, decomposition_table, keeps
from kiln.autograd.mutation import mutated_arg_positions
from kiln.autograd.rng import eager_rng, is_random
from kiln.tools.seed_model import TransformerBlock

aten = torch.ops.aten


class _Capture:
    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return gm.forward


def captured(fn, *args, grad=True):
    """The torch-level graph kiln's capture stage builds for `fn(*args)`, and its inputs."""
    capture = _Capture()
    with torch.set_grad_enabled(grad):
        kiln.compile(fn, backend=capture, fullgraph=True)(*args)
    assert len(capture.graphs) == 1
    return capture.graphs[0]


def placeholders(joint: JointGraph) -> list[str]:
    return [n.name for n in joint.gm.graph.nodes if n.op == "placeholder"]


def outputs(joint: JointGraph) -> tuple:
    return next(n for n in joint.gm.graph.nodes if n.op == "output").args[0]


def call_targets(joint: JointGraph) -> list:
    return [n.target for n in joint.gm.graph.nodes if n.op == "call_function"]


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)

    def forward(self, x):
        h = F.gelu(self.norm(self.fc(x)))
        return h.sum(-1), h.argmax(-1)


GELU_LINE = Small.forward.__code__.co_firstlineno + 1


# -- the contract ----------------------------------------------------------------------------------

def test_placeholders_and_output_layout():
    model = Small()
    model.norm.bias.requires_grad_(False)
    gm, inputs = captured(model, torch.randn(3, 6, requires_grad=True))
    joint = trace_joint(gm, inputs)
    n = len(inputs)
    assert joint.training and joint.num_primals == n and joint.num_tangents == 1
    assert placeholders(joint) == [f"primals_{i}" for i in range(n)] + ["tangents_0"]
    assert joint.primals_requiring_grad == [t.requires_grad for t in inputs]
    outs = outputs(joint)
    assert len(outs) == joint.num_fw_outputs + n and joint.num_fw_outputs == 2
    grads = outs[joint.num_fw_outputs:]
    for primal, grad in zip(inputs, grads):
        assert (grad is None) == (not primal.requires_grad)
    assert [o.kind for o in joint.outputs] == ["tensor", "tensor"]
    assert joint.outputs[0].tangent == 0 and joint.outputs[1].tangent is None


def test_every_node_has_val_phase_and_user_location():
    block = TransformerBlock(32, 4)
    gm, inputs = captured(block, torch.randn(2, 5, 32, requires_grad=True))
    _check_meta(trace_joint(gm, inputs))


def test_backward_nodes_carry_the_forward_user_line():
    gm, inputs = captured(Small(), torch.randn(3, 6, requires_grad=True))
    joint = trace_joint(gm, inputs)
    gelu_line = f"{__file__}:{GELU_LINE}"
    derivative = [n for n in joint.gm.graph.nodes if n.meta.get("user_location") == gelu_line
                  and n.target is not aten.gelu.default]
    assert len(derivative) >= 5  # gelu's decomposed derivative: erf, exp, mul, ...
    assert any(n.meta["phase"] == "backward" for n in derivative)


def _check_meta(joint: JointGraph) -> None:
    backward = set()
    for node in joint.gm.graph.nodes:
        if node.op != "output":
            assert "val" in node.meta, node.name
        depends = node.name.startswith("tangents_") or any(a in backward
                                                         for a in node.all_input_nodes)
        if depends:
            backward.add(node)
        assert node.meta["phase"] == ("backward" if depends else "forward"), node.name
    calls = [n for n in joint.gm.graph.nodes if n.op == "call_function"]
    located = [n for n in calls if "user_location" in n.meta]
    assert len(located) >= 0.95 * len(calls)
    files = {n.meta["user_location"].rsplit("/", 1)[-1].split(":")[0] for n in located
             if n.meta["phase"] == "backward"}
    assert {"normalization.py", "linear.py", "activation.py"} <= files


def test_joint_runs_as_torch_code_and_matches_autograd():
    """The joint graph is runnable Python: on real tensors it gives eager's outputs and grads."""
    model = Small()
    x = torch.randn(3, 6, requires_grad=True)
    gm, inputs = captured(model, x)
    joint = trace_joint(gm, inputs)
    real = [torch.randn_like(t).requires_grad_(t.requires_grad) for t in inputs]
    tangent = torch.randn(3)
    result = joint.gm(*[t.detach() for t in real], tangent)
    with torch.enable_grad():
        out, idx = torch.func.functional_call(
            model, dict(zip([s.removeprefix("self.") for s in joint.input_sources[1:]],
                            real[1:])), (real[0],))
        grads = torch.autograd.grad(out, real, tangent)
    torch.testing.assert_close(result[0], out)
    assert torch.equal(result[1], idx)
    for got, expected in zip(result[2:], grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_graphs_are_functional_and_follow_the_policy():
    block = TransformerBlock(32, 4)
    gm, inputs = captured(block, torch.randn(2, 5, 32, requires_grad=True))
    table = decomposition_table()
    for joint in (trace_joint(gm, inputs), trace_inference(gm, inputs)):
        for target in call_targets(joint):
            if isinstance(target, torch._ops.OpOverload):
                assert not mutated_arg_positions(target), target
                assert target not in table, f"{target} should have been decomposed"


def test_keep_list_and_extras():
    for op in (aten.addmm.default, aten.mm.default, aten.bmm.default,
               aten.native_layer_norm.default, aten.convolution.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default,
               aten._scaled_dot_product_flash_attention_for_cpu_backward.default):
        assert keeps(op, "autograd") and op not in decomposition_table(), op
    assert aten._native_multi_head_attention.default in decomposition_table()
    assert aten.native_layer_norm_backward.default in decomposition_table()


@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_native_multi_head_attention_decomposition(need_weights, average):
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    q, k, v = torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    args = (q, k, v, 16, 4, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight,
            mha.out_proj.bias, None, need_weights, average)
    with torch.no_grad():
        expected = aten._native_multi_head_attention.default(*args)
        got = AUTOGRAD_EXTRAS[aten._native_multi_head_attention.default](*args)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-5)
    else:
        assert got[1] is None


# -- mutations and outputs ---------------------------------------------------------------------

def test_batchnorm_mutations_become_forward_outputs():
    bn = nn.BatchNorm1d(4)
    gm, inputs = captured(bn, torch.randn(8, 4, requires_grad=True))
    joint = trace_joint(gm, inputs)
    mutated = sorted(joint.input_sources[i] for i in joint.mutated_inputs)
    assert mutated == ["self.num_batches_tracked", "self.running_mean", "self.running_var"]
    outs = outputs(joint)
    for k, i in enumerate(joint.mutated_inputs):
        value = outs[k]
        assert value.meta["phase"] == "forward"
        assert value.meta["val"].shape == inputs[i].shape
    assert not set(joint.mutated_inputs) & set(joint.static_input_indices)
    assert joint.num_user_outputs == 1


def test_eval_batchnorm_mutates_nothing():
    bn = nn.BatchNorm1d(4).eval()
    gm, inputs = captured(bn, torch.randn(8, 4, requires_grad=True))
    assert trace_joint(gm, inputs).mutated_inputs == ()


def test_output_kinds():
    def fn(x, y):
        z = x.sin()
        return x, x.t(), z, z, 3, y.argmax()

    gm = torch.fx.symbolic_trace(fn)
    joint = trace_joint(gm, [torch.randn(2, 3, requires_grad=True), torch.randn(4)])
    kinds = [(o.kind, o.index) for o in joint.outputs]
    assert kinds == [("input", 0), ("input_view", 0), ("tensor", None), ("duplicate", 2),
                     ("constant", None), ("tensor", None)]
    assert joint.outputs[1].view.shape == (3, 2) and joint.outputs[1].view.stride == (1, 3)
    assert joint.num_tangents == 1 and joint.outputs[2].tangent == 0


def test_tangents_follow_dense_output_strides_and_densify_expanded_ones():
    def fn(x):
        return x.t() * 2, x.sum().expand(4, 5)

    gm = torch.fx.symbolic_trace(fn)
    joint = trace_joint(gm, [torch.randn(5, 4, requires_grad=True)])
    transposed, expanded = joint.tangent_specs
    assert transposed.stride == (1, 4)
    assert expanded.stride == (5, 1)


def test_inference_trace_has_no_tangents():
    gm, inputs = captured(Small(), torch.randn(3, 6))
    joint = trace_inference(gm, inputs)
    assert not joint.training and joint.num_tangents == 0
    assert len(outputs(joint)) == joint.num_fw_outputs
    assert all(n.meta["phase"] == "forward" for n in joint.gm.graph.nodes)


def test_nothing_needs_grad_gives_an_inference_graph():
    def fn(x, w):
        with torch.no_grad():
            y = x @ w
        return y.relu()

    gm, inputs = captured(fn, torch.randn(3, 4), torch.randn(4, 2, requires_grad=True))
    joint = trace_joint(gm, inputs)
    assert not joint.training and joint.num_tangents == 0


def test_custom_op_is_one_node():
    lib = torch.library.Library("kiln_trace_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    torch.library.register_fake("kiln_trace_test::twice", lambda x: torch.empty_like(x), lib=lib)
    torch.library.register_autograd("kiln_trace_test::twice", lambda ctx, g: g * 2, lib=lib)

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.kiln_trace_test.twice(x.sin()).sum())
    joint = trace_joint(gm, [torch.randn(3, requires_grad=True)])
    targets = [str(t) for t in call_targets(joint)]
    assert targets.count("kiln_trace_test.twice.default") == 1
    x = torch.randn(3)
    out, grad = joint.gm(x, torch.tensor(1.0))
    torch.testing.assert_close(grad, 2 * x.cos())


@pytest.mark.explicit_device  # pins torch.device("cpu") as a constant output
def test_metadata_queries_are_not_recorded():
    def fn(x):
        return x * x.size(0), x.is_contiguous(), x.device, x.stride()

    gm = torch.fx.symbolic_trace(fn)
    joint = trace_inference(gm, [torch.randn(3, 2)])
    assert [str(t) for t in call_targets(joint)] == ["aten.mul.Tensor"]
    assert [o.kind for o in joint.outputs] == ["tensor"] + ["constant"] * 4
    assert [o.value for o in joint.outputs[1:]] == [True, torch.device("cpu"), 2, 1]


# -- refusals ------------------------------------------------------------------------------------

def test_leaf_requiring_grad_written_under_no_grad_is_a_plain_input_mutation():
    def fn(w, x):
        with torch.no_grad():
            w.add_(1)
        return w * x

    gm, inputs = captured(fn, torch.randn(3, requires_grad=True), torch.randn(3))
    joint = trace_joint(gm, inputs)
    assert joint.mutated_inputs == (0,)
    (mutation,) = joint.input_mutations
    assert (mutation.kind, mutation.index, mutation.requires_grad) == ("mutation", 0, False)
    assert mutation.tangent is None and joint.num_tangents == 1


def test_mutation_carrying_gradient_gets_a_tangent():
    def fn(buf, x):
        buf.copy_(x * 2)
        return buf + 1

    gm = torch.fx.symbolic_trace(fn)
    joint = trace_joint(gm, [torch.randn(3), torch.randn(3, requires_grad=True)])
    assert joint.mutated_inputs == (0,)
    (mutation,) = joint.input_mutations
    assert mutation.requires_grad and mutation.tangent == 1  # after the output's tangent 0
    assert placeholders(joint) == ["primals_0", "primals_1", "tangents_0", "tangents_1"]


def test_non_leaf_input_written_in_place_is_cloned_first():
    """A non-leaf input that requires grad is written through a clone: the gradient with respect
    to the input is taken before the write; an input nothing writes is read directly."""
    def fn(a, b):
        a.mul_(b)
        return a + b

    gm = torch.fx.symbolic_trace(fn)
    a, b = torch.randn(3, requires_grad=True) * 1, torch.randn(3, requires_grad=True) * 1
    joint = trace_joint(gm, [a, b])
    assert joint.mutated_inputs == (0,)
    assert joint.input_mutations[0].requires_grad
    clones = [n for n in joint.gm.graph.nodes if n.target is aten.clone.default]
    assert [str(n.args[0]) for n in clones if n.args[0].op == "placeholder"] == ["primals_0"]
    untouched = trace_joint(torch.fx.symbolic_trace(lambda a, b: a * b), [a, b])
    assert aten.clone.default not in call_targets(untouched)


def test_overwritten_saved_tensor_keeps_eagers_backward_error():
    """sin saves its input; writing that input afterwards makes eager's backward raise. The
    output whose backward reads it gets the error and no tangent; the other one trains."""
    def fn(x, w):
        t = x * w
        s = t.sin()
        t.add_(1)
        return s, t * 2

    gm = torch.fx.symbolic_trace(fn)
    joint = trace_joint(gm, [torch.randn(3), torch.randn(3, requires_grad=True)])
    poisoned, healthy = joint.outputs
    assert "modified by an inplace operation" in poisoned.backward_error
    assert poisoned.requires_grad and poisoned.tangent is None
    assert healthy.backward_error is None and healthy.tangent == 0
    assert joint.num_tangents == 1


def test_refuses_metadata_mutation_of_an_input():
    gm = torch.fx.symbolic_trace(lambda x: x.t_() * 2)
    with pytest.raises(AutogradUnsupported, match="changes the shape or strides of input"):
        trace_inference(gm, [torch.randn(2, 3)])


def test_written_inputs_sharing_memory_are_read_through_a_synthetic_base():
    def fn(a, b):
        a.mul_(2)
        return a + b

    gm = torch.fx.symbolic_trace(fn)
    base = torch.randn(6)
    joint = trace_inference(gm, [base[:4], base[2:]])
    (synthetic,) = joint.synthetic_bases
    assert (synthetic.index, synthetic.members, synthetic.offset, synthetic.size) == (2, (0, 1),
                                                                                      0, 6)
    assert placeholders(joint) == ["primals_0", "primals_1", "primals_2"]
    assert joint.mutated_inputs == (2,)
    users = {n.name: len(n.users) for n in joint.gm.graph.nodes if n.op == "placeholder"}
    assert users["primals_0"] == users["primals_1"] == 0  # members are read through the base
    assert aten.as_strided.default in call_targets(joint)


def test_refuses_written_inputs_sharing_memory_that_require_grad():
    def fn(a, b):
        a.mul_(2)
        return a + b

    gm = torch.fx.symbolic_trace(fn)
    base = torch.randn(4, requires_grad=True) * 1
    with pytest.raises(AutogradUnsupported, match="shares memory with input primals_1"):
        trace_joint(gm, [base, base[:4]])


def test_refuses_non_tensor_inputs():
    gm = torch.fx.symbolic_trace(lambda x, n: x * n)
    with pytest.raises(AutogradUnsupported, match=r"not tensors \(int\): n;"):
        trace_inference(gm, [torch.randn(2), 3])


# -- RNG -----------------------------------------------------------------------------------------

def test_dropout_stays_a_forward_random_op():
    gm = torch.fx.symbolic_trace(lambda x: F.dropout(x, 0.5, True).sum())
    joint = trace_joint(gm, [torch.randn(8, requires_grad=True)])
    random = [n for n in joint.gm.graph.nodes if is_random(n.target)]
    assert random and all(n.meta["phase"] == "forward" for n in random)


def test_eager_rng_keeps_random_ops_whole(set_eager_rng):
    set_eager_rng(False)
    assert not eager_rng()
    assert aten.bernoulli.default in decomposition_table()
    set_eager_rng(True)
    assert eager_rng()
    table = decomposition_table()
    assert not [op for op in table if is_random(op)]
    gm = torch.fx.symbolic_trace(lambda x: (torch.bernoulli(x), x.sin()))
    joint = trace_inference(gm, [torch.rand(5)])
    assert aten.bernoulli.default in call_targets(joint)


def test_unused_random_op_is_dropped_unless_eager_rng(set_eager_rng):
    def fn(x):
        torch.rand_like(x)
        return x * 2

    gm = torch.fx.symbolic_trace(fn)
    set_eager_rng(False)
    assert not any(is_random(t) for t in call_targets(trace_inference(gm, [torch.randn(3)])))
    set_eager_rng(True)
    assert any(is_random(t) for t in call_targets(trace_inference(gm, [torch.randn(3)])))


def test_mha_training_path_is_decomposed_to_matmuls():
    block = TransformerBlock(32, 4)
    gm, inputs = captured(block, torch.randn(2, 5, 32, requires_grad=True))
    targets = {str(t) for t in call_targets(trace_joint(gm, inputs))}
    assert "aten.bmm.default" in targets and "aten._softmax.default" in targets
