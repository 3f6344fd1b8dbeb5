"""A `torch.jit.script` function called from compiled code is traced through the Python function
it was made from (as TorchDynamo does), so it does not break the graph."""
from __future__ import annotations

import torch

import kiln
from kiln.config import config


@torch.jit.script
def _scaled_size_sqrt(x: torch.Tensor, scale_factor: int) -> torch.Tensor:
    return torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * scale_factor)


def _attention_scores(q, k):
    scale = _scaled_size_sqrt(q, 2)
    return torch.softmax(q @ k.transpose(-1, -2) / scale.to(q.dtype), -1)


def test_a_scripted_helper_is_traced_not_broken_on():
    report = kiln.explain(_attention_scores)(torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    assert report.graph_count == 1 and report.graph_break_count == 0, report


def test_a_scripted_helper_gives_eagers_answer():
    compiled = kiln.compile(_attention_scores, backend="aot_eager")
    with config.patch(suppress_errors=False):
        for _ in range(2):
            q, k = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
            torch.testing.assert_close(compiled(q, k), _attention_scores(q, k))
