"""Regional compilation: each layer of a stack compiled on its own (`kiln.compile(layer)`), one
capture and one backend compile shared by every layer of the same class and shapes.

The layers' parameters are graph inputs read from the called instance, and module identity is
guarded through a rebindable slot (`guards.InstanceSlot`): another instance whose other guards
hold reuses the entry. A layer of other shapes or dtype must still capture again. The same under
FSDP2 on 2 processes: `tests/distributed/fsdp_cases.py` (`fsdp2-gpt2-*`).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln

pytestmark = pytest.mark.explicit_device

N = 4


def _seed_blocks(d_model: int = 64, nhead: int = 4) -> nn.ModuleList:
    from kiln.tools.seed_model import TransformerBlock
    return nn.ModuleList(TransformerBlock(d_model, nhead) for _ in range(N))


def _encoder_layers() -> nn.ModuleList:
    return nn.ModuleList(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
                         for _ in range(N))


def _train_step(layers, x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    x.square().mean().backward()
    return x.detach()


def _check_per_layer(layers: nn.ModuleList, backend, shape=(2, 16, 64),
                     first_needs_grad: bool = True) -> None:
    """Two training steps of `layers`, each compiled on its own, equal eager's."""
    ref = copy.deepcopy(layers)
    compiled = [kiln.compile(layer, backend=backend) for layer in layers]
    for _ in range(2):
        x = torch.randn(shape, dtype=next(layers.parameters()).dtype)
        torch.testing.assert_close(_train_step(compiled, x.requires_grad_(first_needs_grad)),
                                   _train_step(ref, x.detach().requires_grad_(first_needs_grad)))
    for p, q in zip(layers.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("make", [_seed_blocks, _encoder_layers], ids=["seed_block", "encoder"])
def test_identical_layers_share_one_capture(make, counting_backend, recorder):
    _check_per_layer(make(), counting_backend)
    assert counting_backend.count == 1  # one backend compile for the 4 layers and 2 steps
    assert len(recorder.graphs) == 1 and recorder.recompiles == []
    gm = counting_backend.gms[0]  # the layer's weights are inputs, not constants of the graph
    assert not list(gm.named_parameters()) and not list(gm.named_buffers())


def test_first_layer_without_grad_input_is_its_own_capture(counting_backend, recorder):
    """The first layer's input needs no gradient, the others' do: two graphs (as in
    torch.compile, which guards on requires_grad too), and the recompile names that guard, not
    the module instance (another instance never causes a recompile)."""
    _check_per_layer(_seed_blocks(), counting_backend, first_needs_grad=False)
    assert counting_backend.count == 2
    (reason,) = recorder.recompiles
    assert [f.expr for f in reason.failures] == ["x.requires_grad"], reason.render()


def test_layers_of_other_shapes_or_dtype_capture_again(counting_backend):
    _check_per_layer(_seed_blocks(), counting_backend)
    assert counting_backend.count == 1
    _check_per_layer(_seed_blocks(d_model=32), counting_backend, shape=(2, 16, 32))
    assert counting_backend.count == 2  # other weight shapes: a graph of their own
    _check_per_layer(_seed_blocks().double(), counting_backend)
    assert counting_backend.count == 3  # float64 weights and input
    _check_per_layer(_seed_blocks(), counting_backend)
    assert counting_backend.count == 3  # the first graph is still there for new float32 layers


def test_suite_model_layers_share_one_capture(counting_backend):
    """The suite's GPT-2 (small, 2 blocks) with each block compiled: one graph for the blocks."""
    from kiln.tools.suite import gpt2
    model = gpt2.make_model("small")
    ref = copy.deepcopy(model)
    for i, block in enumerate(model.h):
        model.h[i] = kiln.compile(block, backend=counting_backend)
    batch = gpt2.make_batch("small")
    for m in (model, ref):
        gpt2.loss(m(*batch.inputs), batch.target).backward()
    assert counting_backend.count == 1
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)



class _Tied(nn.Module):
    """An embedding and an output projection sharing one weight (GPT-2's wte / lm_head)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.out = nn.Linear(16, 32, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids).tanh())


def test_tied_weights_are_guarded_as_a_tie_not_as_that_weight(counting_backend, recorder):
    """Instances tied the same way share the graph (the guard is `self.out.weight is
    self.embed.weight`, not the weight object); an untied instance captures again."""
    ids = torch.randint(0, 32, (2, 8))
    models = [_Tied() for _ in range(3)]
    for m in models:
        torch.testing.assert_close(kiln.compile(m, backend=counting_backend)(ids), m(ids))
    assert counting_backend.count == 1
    models[0].out.weight = nn.Parameter(torch.randn(32, 16))
    torch.testing.assert_close(kiln.compile(models[0], backend=counting_backend)(ids),
                               models[0](ids))
    assert counting_backend.count == 2
    assert "self.out.weight: expected the same object as self.embed.weight" in \
        recorder.recompiles[0].render()
