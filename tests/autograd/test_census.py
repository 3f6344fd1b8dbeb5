"""The exact ATen op set the decomposition policy produces for the seed block and the nanoGPT
model (CPU). A torch upgrade that changes it fails here: look at the new ops, decide whether the
backend lowers them (or the policy should decompose them), then pin the new set for that torch
minor version."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.autograd import trace_inference, trace_joint
from kiln.tools.seed_model import TransformerBlock, seed_sizes
from models import GPT

# The pinned sets are the CPU ones (CUDA picks other attention kernels).
pytestmark = pytest.mark.explicit_device

TORCH = ".".join(torch.__version__.split(".")[:2])

_VIEWS = {"aten.view.default", "aten.permute.default", "aten.expand.default",
          "aten.unsqueeze.default", "aten.squeeze.dims", "aten.alias.default"}

SEED_TRAIN = {
    "2.13": _VIEWS | {
        "getitem", "aten._softmax.default", "aten.add.Tensor", "aten.addmm.default",
        "aten.arange.start_step", "aten.bmm.default", "aten.clone.default", "aten.div.Tensor",
        "aten.eq.Scalar", "aten.erf.default", "aten.exp.default", "aten.full.default",
        "aten.gelu.default", "aten.mm.default", "aten.mul.Tensor",
        "aten.native_layer_norm.default", "aten.select.int", "aten.sub.Tensor",
        "aten.sum.dim_IntList", "aten.where.self",
    },
}
SEED_INFERENCE = {
    "2.13": {
        "getitem", "aten._softmax.default", "aten.add.Tensor", "aten.addmm.default",
        "aten.bmm.default", "aten.clone.default", "aten.expand.default", "aten.gelu.default",
        "aten.mul.Tensor", "aten.native_layer_norm.default", "aten.permute.default",
        "aten.split_with_sizes.default", "aten.view.default",
    },
}
GPT_TRAIN = {
    "2.13": _VIEWS - {"aten.expand.default"} | {
        "getitem", "aten._log_softmax.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
        "aten._to_copy.default", "aten.add.Tensor", "aten.addmm.default",
        "aten.arange.start_step", "aten.bitwise_and.Tensor", "aten.bitwise_not.default",
        "aten.cat.default", "aten.clamp.default", "aten.div.Tensor", "aten.embedding.default",
        "aten.erf.default", "aten.exp.default", "aten.full.default", "aten.full_like.default",
        "aten.gather.default", "aten.ge.Scalar", "aten.gelu.default", "aten.index_put.default",
        "aten.lt.Scalar", "aten.mm.default", "aten.mul.Tensor", "aten.native_layer_norm.default",
        "aten.ne.Scalar", "aten.neg.default", "aten.scalar_tensor.default", "aten.scatter.value",
        "aten.split_with_sizes.default", "aten.sub.Tensor", "aten.sum.dim_IntList",
        "aten.where.self",
    },
}


# torch 2.11 (GPU machine, CPU tracing): the seed block is the same; nanoGPT's cross-entropy
# backward decomposes with eq instead of 2.13's bounds checks (ge/lt/bitwise/clamp).
SEED_TRAIN["2.11"] = SEED_TRAIN["2.13"]
SEED_INFERENCE["2.11"] = SEED_INFERENCE["2.13"]
GPT_TRAIN["2.11"] = GPT_TRAIN["2.13"] - {
    "aten.bitwise_and.Tensor", "aten.bitwise_not.default", "aten.clamp.default",
    "aten.ge.Scalar", "aten.lt.Scalar"} | {"aten.eq.Scalar"}


def _pinned(table: dict[str, set[str]]) -> set[str]:
    if TORCH not in table:
        pytest.skip(f"no op census pinned for torch {TORCH}: run this test's graphs and pin it")
    return table[TORCH]


class _Capture:
    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return gm.forward


def _op_set(joint) -> set[str]:
    ops = set()
    for node in joint.gm.graph.nodes:
        if node.op == "call_function":
            ops.add("getitem" if node.target.__name__ == "getitem" else str(node.target))
    return ops


def _captured(model, *args, grad=True):
    capture = _Capture()
    compiled = kiln.compile(model, backend=capture, fullgraph=True)
    with torch.set_grad_enabled(grad):
        compiled(*args)
    assert len(capture.graphs) == 1
    return capture.graphs[0]


def _seed_block():
    d_model, nhead, shape = seed_sizes("cpu")
    return TransformerBlock(d_model, nhead), torch.randn(*shape, requires_grad=True)


def _diff(actual: set[str], expected: set[str]) -> str:
    return f"new ops: {sorted(actual - expected)}; gone: {sorted(expected - actual)}"


def test_seed_block_training_census():
    block, x = _seed_block()
    joint = trace_joint(*_captured(block, x))
    assert joint.training
    ops = _op_set(joint)
    assert ops == _pinned(SEED_TRAIN), _diff(ops, SEED_TRAIN.get(TORCH, set()))


def test_seed_block_inference_census():
    block, x = _seed_block()
    block.eval()
    gm, inputs = _captured(block, x.detach(), grad=False)
    joint = trace_inference(gm, inputs)
    ops = _op_set(joint)
    # the MHA fast path (one fused op with no torch decomposition) is decomposed by kiln's policy
    assert "aten._native_multi_head_attention.default" not in ops
    assert ops == _pinned(SEED_INFERENCE), _diff(ops, SEED_INFERENCE.get(TORCH, set()))


def test_gpt_training_census():
    model = GPT()
    idx = torch.randint(0, 64, (2, 16))
    joint = trace_joint(*_captured(model, idx, idx.roll(1, 1)))
    ops = _op_set(joint)
    assert ops == _pinned(GPT_TRAIN), _diff(ops, GPT_TRAIN.get(TORCH, set()))


def test_census_has_no_prims_and_keeps_backend_ops():
    """The policy's promises, whatever the torch version: no prims, no mutation, matmuls and
    layer norm kept whole, backward ops of kept ops decomposed."""
    block, x = _seed_block()
    ops = _op_set(trace_joint(*_captured(block, x)))
    assert not [op for op in ops if op.startswith("prims.")]
    assert {"aten.addmm.default", "aten.native_layer_norm.default", "aten.bmm.default"} <= ops
    assert "aten.native_layer_norm_backward.default" not in ops
    assert not [op for op in ops if op.endswith("_.Tensor") or op.endswith("_.default")]
