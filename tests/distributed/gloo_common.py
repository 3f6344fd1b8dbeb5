"""What the gloo cases share: the models, their inputs and optimizers, the training loop, and the
comparison with eager (parameters, gradients and optimizer state, gathered from every rank).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn as nn

STEPS = 3


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 16))


def block() -> nn.Module:
    from kiln.tools.suite import seed_block
    return seed_block.make_model("small")  # d_model 64, 4 heads


class Stack(nn.Module):
    """Seed blocks and a head: FSDP2 shards each block and the root (the head)."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([block() for _ in range(layers)])
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x).tanh()


GPT2_LAYERS = 4


def gpt2() -> nn.Module:
    """The suite's GPT-2 at its small size (d 64, 4 heads, vocab 256) with 4 blocks, so that
    regional compilation has 4 layers of one shape to share a graph."""
    from kiln.tools.suite import gpt2 as suite_gpt2
    config = dataclasses.replace(suite_gpt2.SIZES["small"], n_layer=GPT2_LAYERS)
    return suite_gpt2.GPT2(config)


MAKERS = {"mlp": mlp, "block": block, "stack": Stack, "gpt2": gpt2}
INPUTS = {"mlp": (4, 16), "block": (2, 16, 64), "stack": (2, 16, 64)}


def _input(name: str, gen: torch.Generator) -> torch.Tensor:
    if name == "gpt2":  # token ids: batch 2, 32 positions, vocab 256
        return torch.randint(0, 256, (2, 32), generator=gen)
    return torch.randn(INPUTS[name], generator=gen)


def inputs(name: str, rank: int, device: str = "cpu") -> list[torch.Tensor]:
    """Fresh random inputs per rank and step (never zeros: zeros hide wrong weights), drawn on
    the CPU so that every device trains on the same values."""
    gen = torch.Generator().manual_seed(1000 + 17 * rank + len(name))
    return [_input(name, gen).to(device) for _ in range(STEPS)]


def optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "mlp":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    # eps well above rounding noise: a gradient that is zero in exact arithmetic (the key bias
    # of attention: softmax ignores it) is ~1e-9 noise that Adam would scale up to lr-sized
    # steps of random sign, in eager as much as in kiln
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4)


def train(run: Callable, model: nn.Module, name: str, rank: int, device: str = "cpu"
          ) -> torch.optim.Optimizer:
    """STEPS optimizer steps of `run` over `model`'s parameters; the optimizer, for its state."""
    opt = optimizer(name, model.parameters())
    for x in inputs(name, rank, device):
        opt.zero_grad()
        run(x).float().square().mean().backward()
        opt.step()
    return opt


@dataclasses.dataclass
class Trained:
    """A case's eager model and optimizer and kiln's, trained from the same weights and data."""

    ref: nn.Module
    got: nn.Module
    ref_opt: torch.optim.Optimizer
    got_opt: torch.optim.Optimizer


def _full(t: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor (FSDP2's shards, and the optimizer state built on them) gathered whole: a
    collective, so every rank compares the same things in the same order."""
    if t is None:
        return None
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@dataclasses.dataclass(frozen=True)
class Tol:
    """A difference is measured as |kiln - eager| / (atol + rtol * |eager|), largest over the
    elements: with the default, the plain largest difference; with a test's tolerances, at
    most 1 means torch.allclose."""

    rtol: float = 0.0
    atol: float = 1.0


def _max_diff(a: torch.Tensor | None, b: torch.Tensor | None, what: str, tol: Tol) -> float:
    a, b = _full(a), _full(b)
    if (a is None) != (b is None):
        raise AssertionError(f"{what} is None in only one of eager and kiln")
    if a is None:
        return 0.0
    a, b = a.float(), b.float()
    return ((a - b).abs() / (tol.atol + tol.rtol * a.abs())).max().item()


def _state_diff(t: Trained, named: list[tuple[str, nn.Parameter, nn.Parameter]], tol: Tol
                ) -> float:
    """Optimizer state (SGD's momentum, AdamW's exp_avg, exp_avg_sq and step) per parameter."""
    diff = 0.0
    for name, a, b in named:
        sa, sb = t.ref_opt.state[a], t.got_opt.state[b]
        if sorted(sa) != sorted(sb):
            raise AssertionError(f"{name}: optimizer state {sorted(sa)} != {sorted(sb)}")
        for key in sorted(sa):
            if isinstance(sa[key], torch.Tensor):
                diff = max(diff, _max_diff(sa[key], sb[key], f"{name} {key}", tol))
    return diff


def diffs(t: Trained, tol: Tol = Tol()) -> dict[str, float]:
    """The largest difference from eager of parameters, gradients and optimizer state (`Tol`)."""
    named = [(n, a, b) for (n, a), (_, b) in
             zip(t.ref.named_parameters(), t.got.named_parameters(), strict=True)]
    if not named or not t.ref_opt.state:
        raise AssertionError("nothing trained")
    return {"param": max(_max_diff(a.detach(), b.detach(), n, tol) for n, a, b in named),
            "grad": max(_max_diff(a.grad, b.grad, f"{n}.grad", tol) for n, a, b in named),
            "state": _state_diff(t, named, tol)}
