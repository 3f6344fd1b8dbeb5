"""`model.generate()` of Hugging Face decoders with kiln compiling the model's forward.

Generation is the dynamic-shape workload users hit first (issue 15): a prefill at the prompt's
length, then one decode step per token with a growing KV cache and `input_ids[:, -1:]` sliced
out of a growing tensor. Greedy decoding makes the comparison exact: a wrong logit anywhere
shows as a different token. The compiled forward must capture (no silent eager), stop
recompiling once the cache length is dynamic (prefill, first decode step, dynamic decode), and
never run a graph eagerly. On the GPU machine the kiln backend runs generated kernels.
"""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln import records

transformers = pytest.importorskip("transformers")
from kiln.tools.suite import hf  # noqa: E402

NEW_TOKENS = 6


def _prompt(device: torch.device, batch: int, length: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * batch + length)
    return torch.randint(1, 96, (batch, length), generator=gen, device="cpu").to(device)


def _greedy(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              pad_token_id=0)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generate_equals_eager_and_stops_recompiling(name, device, caplog):
    model = hf.build(hf.get(name)).to(device)
    prompts = [_prompt(device, 2, 5), _prompt(device, 2, 9)]
    want = [_greedy(model, ids) for ids in prompts]

    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    eager_forward = model.forward
    model.forward = kiln.compile(eager_forward, backend="kiln")
    try:
        with caplog.at_level(logging.WARNING, logger="kiln"):
            got = [_greedy(model, ids) for ids in prompts]
    finally:
        records.active_recorders().remove(recorder)
        model.forward = eager_forward
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)
    captures = sum(1 for g in recorder.graphs if g.graph is not None)
    # prefill static, first decode static, then the cache length symbolic; the second prompt's
    # prefill makes the prompt length symbolic: no capture per token
    assert 1 <= captures <= 4, f"{captures} captures for {2 * (NEW_TOKENS + 1)} forward calls"
    fallbacks = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not fallbacks, fallbacks
