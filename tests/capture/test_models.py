"""capture on whole models: the seed TransformerBlock, nanoGPT and a small ResNet, in training
(with gradients) and in inference (eval + no_grad).

Each model must be captured as exactly one graph with no break, its parameters and buffers lifted
as placeholders whose sources name them, and the compiled run (eager backend) must match an
identical deep copy run eagerly: outputs, gradients and BatchNorm running statistics, exactly.
"""

from __future__ import annotations

import copy
import inspect
import os
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import kiln
from helpers import (
    CountingBackend,
    assert_grads_equal,
    assert_graph_provenance,
    assert_params_lifted,
    assert_same_structure_and_values,
    call_nodes,
    normalize_source,
    placeholders,
    target_names,
)
from models import GPT, TinyResNet, TransformerBlock

MODELS_FILE = "models.py"
SEED_FILE = os.path.basename(inspect.getsourcefile(TransformerBlock))  # kiln/tools/seed_model.py


def _pair(make, seed=0):
    """A model and an identical copy to run eagerly."""
    torch.manual_seed(seed)
    model = make()
    return model, copy.deepcopy(model)


def _assert_one_graph_no_breaks(model_or_fn, *args, **kwargs):
    """kiln.explain on (a copy of) the model: one graph, zero breaks."""
    target = copy.deepcopy(model_or_fn) if isinstance(model_or_fn, torch.nn.Module) else model_or_fn
    out = kiln.explain(target)(*args, **kwargs)
    reasons = [r.render() for r in out.break_reasons]
    assert reasons == [], "unexpected graph breaks:\n" + "\n".join(reasons)
    assert out.graph_break_count == 0
    assert out.graph_count == 1
    assert len(out.graphs) == 1
    assert isinstance(out.graphs[0], torch.fx.GraphModule)
    return out


# --- the seed TransformerBlock --------------------------------------------------------------------

SEED_PARAMS = [
    "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight", "attn.out_proj.bias",
    "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
    "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
]


def _seed_block():
    return TransformerBlock(d_model=32, nhead=4)


def test_seed_block_has_the_12_parameters_named_here():
    # guards the test itself: SEED_PARAMS must be the block's parameters
    assert [n for n, _ in _seed_block().named_parameters()] == SEED_PARAMS


def test_seed_block_train_matches_eager_outputs_and_grads():
    model, ref = _pair(_seed_block)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)

    x = torch.randn(2, 8, 32, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, expected = compiled(x), ref(x_ref)
    assert_same_structure_and_values(expected, out)
    assert backend.count == 1

    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
    assert_grads_equal(ref, model)

    # a second call with fresh values hits the cache
    x2 = torch.randn(2, 8, 32, requires_grad=True)
    assert_same_structure_and_values(ref(x2.detach().requires_grad_(True)), compiled(x2))
    assert backend.count == 1


def test_seed_block_train_graph_lifts_the_12_parameters():
    model, _ = _pair(_seed_block)
    backend = CountingBackend()
    kiln.compile(model, backend=backend)(torch.randn(2, 8, 32, requires_grad=True))
    gm = backend.gm
    assert_params_lifted(gm, model, SEED_PARAMS)
    assert len(placeholders(gm)) == 13, [n.meta.get("source") for n in placeholders(gm)]
    sources = [str(n.meta.get("source", "")) for n in placeholders(gm)]
    assert any("attn.in_proj_weight" in s for s in sources), sources
    assert_graph_provenance(gm, SEED_FILE)


def test_seed_block_train_explain_one_graph_no_breaks():
    model, _ = _pair(_seed_block)
    out = _assert_one_graph_no_breaks(model, torch.randn(2, 8, 32, requires_grad=True))
    assert out.op_count >= 5  # attention projections, softmax, 2 layer norms, MLP


def _native_mha_called_eagerly(module, x):
    """Sanity check of the premise: eager eval + no_grad takes MHA's fast path."""
    real = torch._native_multi_head_attention
    with mock.patch.object(torch, "_native_multi_head_attention", side_effect=real) as spy:
        module(x)
    return spy.call_count > 0


def test_seed_block_infer_matches_eager_in_one_graph_with_fast_path():
    model, ref = _pair(_seed_block)
    model.eval()
    ref.eval()
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert _native_mha_called_eagerly(ref, x)
        out, expected = compiled(x), ref(x)
        assert_same_structure_and_values(expected, out)
        assert backend.count == 1
        x2 = torch.randn(2, 8, 32)
        assert_same_structure_and_values(ref(x2), compiled(x2))
    assert backend.count == 1
    gm = backend.gm
    assert any("multi_head_attention" in name for name in target_names(gm)), target_names(gm)
    assert_params_lifted(gm, model, SEED_PARAMS)
    assert len(placeholders(gm)) == 13
    assert_graph_provenance(gm, SEED_FILE)


def test_seed_block_infer_explain_one_graph_no_breaks():
    model, _ = _pair(_seed_block)
    model.eval()
    with torch.no_grad():
        out = _assert_one_graph_no_breaks(model, torch.randn(2, 8, 32))
    names = [getattr(t, "__name__", str(t)) for t in out.ops_per_graph[0]]
    assert any("multi_head_attention" in n for n in names), names


# --- scaled_dot_product_attention alone -----------------------------------------------------------

def _causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0


def test_sdpa_in_one_graph_matches_eager_with_grads():
    backend = CountingBackend()
    compiled = kiln.compile(_causal_attention, backend=backend)
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, expected = compiled(q, k, v), _causal_attention(q2, k2, v2)
    assert_same_structure_and_values(expected, out)
    out.sum().backward()
    expected.sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    assert backend.count == 1
    gm = backend.gm
    sdpa = [n for n in call_nodes(gm) if n.target is F.scaled_dot_product_attention
            or "scaled_dot_product_attention" in str(n.target)]
    assert len(sdpa) == 1, target_names(gm)
    causal = sdpa[0].kwargs.get("is_causal", sdpa[0].args[5] if len(sdpa[0].args) > 5 else False)
    assert causal is True, sdpa[0].format_node()
    assert len(placeholders(gm)) == 3
    assert_graph_provenance(gm, __file__)
    _assert_one_graph_no_breaks(_causal_attention, q.detach(), k.detach(), v.detach())


# --- nanoGPT --------------------------------------------------------------------------------------

def _gpt():
    return GPT(vocab=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _gpt_batch():
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    return idx, targets


def test_gpt_train_matches_eager_loss_and_grads():
    model, ref = _pair(_gpt)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    idx, targets = _gpt_batch()
    out, expected = compiled(idx, targets), ref(idx, targets)
    assert_same_structure_and_values(expected, out)
    out[1].backward()
    expected[1].backward()
    assert_grads_equal(ref, model)
    assert backend.count == 1
    idx, targets = _gpt_batch()
    assert_same_structure_and_values(ref(idx, targets), compiled(idx, targets))
    assert backend.count == 1


def test_gpt_train_graph_lifts_each_parameter_once():
    model, _ = _pair(_gpt)
    backend = CountingBackend()
    kiln.compile(model, backend=backend)(*_gpt_batch())
    gm = backend.gm
    names = [n for n, _ in model.named_parameters()]  # the tied weight is listed once
    untied = [n for n in names if n != "transformer.wte.weight"]
    assert_params_lifted(gm, model, untied)
    sources = [normalize_source(n.meta.get("source", "")) for n in placeholders(gm)]
    tied = [s for s in sources if s.endswith(("transformer.wte.weight", "lm_head.weight"))]
    assert len(tied) == 1, f"tied wte/lm_head weight lifted {len(tied)} times: {sources}"
    assert len(placeholders(gm)) == len(names) + 2, sources  # + idx, targets
    assert_graph_provenance(gm, MODELS_FILE)


def test_gpt_train_explain_one_graph_no_breaks():
    model, _ = _pair(_gpt)
    _assert_one_graph_no_breaks(model, *_gpt_batch())


def test_gpt_infer_matches_eager():
    model, ref = _pair(_gpt)
    model.eval()
    ref.eval()
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            idx = torch.randint(0, 64, (2, 16))
            out, expected = compiled(idx), ref(idx)
            assert out[1] is None
            assert out[0].shape == (2, 1, 64)
            assert_same_structure_and_values(expected, out)
    assert backend.count == 1
    assert_graph_provenance(backend.gm, MODELS_FILE)


def test_gpt_infer_explain_one_graph_no_breaks():
    model, _ = _pair(_gpt)
    model.eval()
    with torch.no_grad():
        _assert_one_graph_no_breaks(model, torch.randint(0, 64, (2, 16)))


# --- TinyResNet -----------------------------------------------------------------------------------

def _assert_buffers_equal(expected, actual):
    exp, act = dict(expected.named_buffers()), dict(actual.named_buffers())
    assert list(exp) == list(act)
    for name in exp:
        assert exp[name].dtype == act[name].dtype, name
        torch.testing.assert_close(act[name], exp[name], rtol=0, atol=0,
                                   msg=lambda m, n=name: f"buffer {n}: {m}")


def test_resnet_train_updates_batchnorm_stats_like_eager():
    model, ref = _pair(TinyResNet)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(4, 3, 16, 16)
        out, expected = compiled(x), ref(x)
        assert_same_structure_and_values(expected, out)
    _assert_buffers_equal(ref, model)
    assert int(model.bn1.num_batches_tracked) == 2
    out.sum().backward()
    expected.sum().backward()
    assert_grads_equal(ref, model)
    assert backend.count == 1


def test_resnet_train_graph_lifts_parameters_and_buffers():
    model, _ = _pair(TinyResNet)
    backend = CountingBackend()
    kiln.compile(model, backend=backend)(torch.randn(4, 3, 16, 16))
    gm = backend.gm
    assert_params_lifted(gm, model)  # every parameter and buffer (running stats, counters)
    n_tensors = len(list(model.parameters())) + len(list(model.buffers()))
    assert len(placeholders(gm)) == n_tensors + 1
    assert_graph_provenance(gm, MODELS_FILE)


def test_resnet_train_explain_one_graph_no_breaks():
    model, _ = _pair(TinyResNet)
    _assert_one_graph_no_breaks(model, torch.randn(4, 3, 16, 16))


def test_resnet_infer_matches_eager_and_leaves_stats_alone():
    torch.manual_seed(0)
    model = TinyResNet()
    with torch.no_grad():  # non-trivial running statistics first
        model(torch.randn(4, 3, 16, 16) * 3 + 1)
    model.eval()
    ref = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 3, 16, 16)
            assert_same_structure_and_values(ref(x), compiled(x))
    assert backend.count == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed in eval mode"
    names = [n for n, _ in model.named_parameters()]
    names += [n for n, _ in model.named_buffers() if not n.endswith("num_batches_tracked")]
    assert_params_lifted(backend.gm, model, names)


def test_resnet_infer_explain_one_graph_no_breaks():
    model, _ = _pair(TinyResNet)
    model.eval()
    with torch.no_grad():
        _assert_one_graph_no_breaks(model, torch.randn(4, 3, 16, 16))



# --- training loops and user errors ---------------------------------------------------------------

def test_gpt_optimizer_steps_match_eager():
    # parameters are graph inputs: in-place optimizer updates must reach the cached graph
    model, ref = _pair(_gpt)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for _ in range(3):
        idx, targets = _gpt_batch()
        _, loss = compiled(idx, targets)
        _, loss_ref = ref(idx, targets)
        assert_same_structure_and_values(loss_ref, loss)
        for o, l in ((opt, loss), (opt_ref, loss_ref)):
            o.zero_grad(set_to_none=True)
            l.backward()
            o.step()
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, p_ref, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert backend.count == 1


def test_seed_block_sgd_steps_match_eager():
    model, ref = _pair(_seed_block)
    compiled = kiln.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(2, 8, 32)
        out, expected = compiled(x), ref(x)
        assert_same_structure_and_values(expected, out)
        for o, y in ((opt, out), (opt_ref, expected)):
            o.zero_grad()
            y.pow(2).mean().backward()
            o.step()
    assert_same_structure_and_values(ref.state_dict(), model.state_dict())


def test_gpt_shorter_sequence_recompiles_and_matches():
    model, ref = _pair(_gpt)
    model.eval()
    ref.eval()
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad():
        for t in (16, 5, 16, 5):
            idx = torch.randint(0, 64, (2, t))
            assert_same_structure_and_values(ref(idx), compiled(idx))


def test_gpt_too_long_sequence_raises_like_eager():
    model, _ = _pair(_gpt)
    compiled = kiln.compile(model, backend="eager")
    idx = torch.randint(0, 64, (2, 20))
    with pytest.raises(AssertionError, match="Cannot forward sequence of length 20"):
        model(idx)
    with pytest.raises(AssertionError, match="Cannot forward sequence of length 20"):
        compiled(idx)
    with torch.no_grad():  # and the compiled model still works afterwards
        idx = torch.randint(0, 64, (2, 16))
        assert_same_structure_and_values(model(idx), compiled(idx))


def test_gpt_train_with_dropout_matches_eager_under_the_same_seed():
    # capture runs on fake tensors and must not draw from the global generator: with the eager
    # backend the graph draws the same random numbers as eager, in the same order
    torch.manual_seed(0)
    model = GPT(vocab=64, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.2)
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="eager")
    for seed in (1, 2):
        idx, targets = _gpt_batch()
        torch.manual_seed(seed)
        out = compiled(idx, targets)
        torch.manual_seed(seed)
        expected = ref(idx, targets)
        assert_same_structure_and_values(expected, out)
    with torch.no_grad():  # and dropout really is active in this mode
        torch.manual_seed(3)
        a = ref(idx, targets)[1]
        b = ref(idx, targets)[1]
        assert not torch.equal(a, b)
