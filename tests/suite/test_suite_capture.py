"""The built-in model suite (`kiln.tools.suite`) at its small size on the CPU, through capture.

For every model: eager runs in both configurations; inference (eval + no_grad) compiled with the
"eager" backend equals eager exactly and is captured as one graph with no break; training compiled
with "aot_eager" gives the same loss and every parameter gradient as an eager deep copy (fp32,
rtol 1e-4, atol 1e-5). Inputs are fresh random draws from the spec, never zeros.
"""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.autograd.compiled_graph import EagerVariant, TrainingVariant
from kiln.backends import lookup_backend
from kiln.tools.suite import SUITE, Batch, ModelSpec, get, infer, train_step

RTOL, ATOL = 1e-4, 1e-5
NAMES = sorted(SUITE)


def _build(name: str, seed: int = 0) -> tuple[ModelSpec, torch.nn.Module, Batch]:
    spec = get(name)
    torch.manual_seed(seed)
    # the test device: CUDA under KILN_TEST_DEVICE=cuda (tests/conftest.py's device context)
    model, batch = spec.build("small", device=torch.get_default_device())
    return spec, model, batch


class RecordingAOT:
    """The registered "aot_eager" backend, keeping the graphs it compiled."""

    def __init__(self) -> None:
        self.backend = lookup_backend("aot_eager")
        self.compiled: list = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        self.compiled.append(self.backend(gm, example_inputs))
        return self.compiled[-1]


def _flat(output) -> list[torch.Tensor]:
    return list(output) if isinstance(output, tuple) else [output]


def test_registry_lists_the_suite():
    assert NAMES == sorted(["seed_block", "gpt2", "bert", "llama", "resnet", "vit", "mlp"])
    with pytest.raises(KeyError, match="no model 'gtp2'"):
        get("gtp2")
    with pytest.raises(ValueError, match="unknown size"):
        get("mlp").build("huge")


@pytest.mark.parametrize("name", NAMES)
def test_eager_runs_both_configs(name):
    spec, model, batch = _build(name)
    assert sum(p.numel() * p.element_size() for p in model.parameters()) < 4e6
    for t in batch.inputs:  # random draws, never constant (bert's attention_mask pads rows)
        assert t.float().std() > 0.1 and t.unique().numel() > 1
    out = _flat(infer(model, batch))
    assert not model.training
    assert all(torch.isfinite(o).all() and o.std() > 0 for o in out)
    loss = train_step(model, batch, spec.loss)
    assert model.training and torch.isfinite(loss)
    grads = {n: p.grad for n, p in model.named_parameters()}
    missing = [n for n, g in grads.items() if g is None or not g.abs().sum() > 0]
    assert missing == [], f"{name}: parameters with no or zero gradient: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_inference_captures_one_graph_and_matches_eager(name):
    _, model, batch = _build(name)
    model.eval()
    eager, for_explain = copy.deepcopy(model), copy.deepcopy(model)
    compiled = kiln.compile(model, backend="eager")
    with torch.no_grad():
        expected = _flat(eager(*batch.inputs))
        got = _flat(compiled(*batch.inputs))
        fresh = get(name).make_batch("small")  # a second fresh draw: same graph, same results
        expected2, got2 = _flat(eager(*fresh.inputs)), _flat(compiled(*fresh.inputs))
        report = kiln.explain(for_explain)(*batch.inputs)
    for a, b in zip(got + got2, expected + expected2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    reasons = [r.render() for r in report.break_reasons]
    assert reasons == [], f"{name}: graph breaks:\n" + "\n".join(reasons)
    assert report.graph_break_count == 0
    assert report.graph_count == 1
    assert report.op_count > 0


@pytest.mark.parametrize("name", NAMES)
def test_training_matches_eager(name):
    spec, model, batch = _build(name)
    eager = copy.deepcopy(model)
    aot = RecordingAOT()
    compiled = kiln.compile(model, backend=aot)
    for step in range(2):
        batch = batch if step == 0 else spec.make_batch("small")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        loss = train_step(compiled, batch, spec.loss)
        expected = train_step(eager, batch, spec.loss)
        torch.testing.assert_close(loss, expected, rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"{name} step {step}: loss: {m}")
        for (pname, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(),
                                      strict=True):
            assert q.grad is not None and p.grad is not None, f"{name}: {pname}.grad is None"
            torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"{name} step {step}: {pname}.grad: {m}")
        for (bname, b), (_, c) in zip(model.named_buffers(), eager.named_buffers(), strict=True):
            torch.testing.assert_close(b, c, rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"{name} step {step}: buffer {bname}: {m}")
    variants = [v for c in aot.compiled for v in c.variants.values()]
    assert len(aot.compiled) == 1, f"{name}: {len(aot.compiled)} graphs in training"
    assert not [v for v in variants if isinstance(v, EagerVariant)], f"{name}: eager fallback"
    assert any(isinstance(v, TrainingVariant) for v in variants), f"{name}: no training variant"
