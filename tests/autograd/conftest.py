"""Fixtures for autograd-stage tests.

- `aot_backend`: the registered "aot_eager" backend, wrapped so a test can see what it compiled
  (`.compiled`: the CompiledGraph objects) and assert that no graph fell back to eager.
- `train_check`: trains a model compiled with "aot_eager" and an eager deep copy side by side with
  SGD on fresh random inputs, and compares outputs, every parameter gradient, input gradients,
  parameters and every buffer after each step (1 and 3 steps at least), fp32 rtol 1e-4 atol 1e-5.
- `check_partition`: the partition invariants, asserted on every training graph a test compiles.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import pytest
import torch

import kiln
import kiln.config
from kiln.autograd._compat import tree_flatten
from kiln.autograd.compiled_graph import CompiledGraph, EagerVariant, TrainingVariant
from kiln.backends import lookup_backend

RTOL, ATOL = 1e-4, 1e-5



def close(actual: Any, expected: Any, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL,
                               msg=lambda m: f"{what}: {m}")


def check_partition(variant: TrainingVariant) -> None:
    """Partition invariants: the forward graph holds no backward node, the backward graph reads
    saved values and tangents only, no random op runs in the backward, and min-cut saves no more
    activation bytes (graph inputs aside) than the eager-like partition."""
    from kiln.autograd.partition import partition_joint

    joint, result = variant.joint, variant.partition
    phase = {n.name: n.meta["phase"] for n in joint.gm.graph.nodes}
    for node in result.fw_gm.graph.nodes:
        if node.op != "output":
            assert phase[node.name] == "forward", f"backward node {node.name} in the forward"
    tangents = [n.name for n in joint.gm.graph.nodes
                if n.op == "placeholder" and n.name.startswith("tangents_")]
    bw_inputs = [n.name for n in result.bw_gm.graph.nodes if n.op == "placeholder"]
    assert bw_inputs == [*result.saved, *tangents]
    for node in result.bw_gm.graph.nodes:
        tags = getattr(node.target, "tags", ())
        # CUDA's SDPA backward carries the tag (dropout) but replays the forward's saved
        # philox seed and offset: it draws nothing new
        replays = str(node.target).startswith("aten._scaled_dot_product")
        assert replays or torch.Tag.nondeterministic_seeded not in tags, \
            f"random op {node.name} in bw"
    default = partition_joint(joint, policy="default")
    assert result.saved_activation_bytes <= default.saved_activation_bytes


class RecordingAOT:
    """Calls the registered "aot_eager" backend and keeps what it returned."""

    def __init__(self) -> None:
        self.compiled: list[CompiledGraph] = []
        self.backend = lookup_backend("aot_eager")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        compiled = self.backend(gm, example_inputs)
        self.compiled.append(compiled)
        return compiled

    def variants(self) -> list[Any]:
        return [v for c in self.compiled for v in c.traced_variants()]

    def assert_compiled(self, *, training: bool | None = None) -> None:
        """At least one graph went through the stage, none fell back to eager; with `training`,
        some (True) or no (False) variant is a training variant. Partitions are checked."""
        variants = self.variants()
        assert variants, "aot_eager compiled nothing"
        eager = [v for v in variants if isinstance(v, EagerVariant)]
        assert not eager, "a graph fell back to eager"
        trained = [v for v in variants if isinstance(v, TrainingVariant)]
        if training is not None:
            assert bool(trained) == training, f"training variants: {len(trained)}"
        for variant in trained:
            check_partition(variant)


@pytest.fixture
def set_eager_rng(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """`set_eager_rng(on)`: the KILN_EAGER_RNG environment variable, and the config field
    `eager_rng` once kiln.config has it (it then takes precedence)."""

    def set_(on: bool) -> None:
        if on:
            monkeypatch.setenv("KILN_EAGER_RNG", "1")
        else:
            monkeypatch.delenv("KILN_EAGER_RNG", raising=False)
        if "eager_rng" in kiln.config.config.to_dict():
            monkeypatch.setattr(kiln.config.config, "eager_rng", on)

    return set_


@pytest.fixture
def aot_backend() -> RecordingAOT:
    return RecordingAOT()


def _float_outputs(value: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(value)
    return [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]


def random_loss(outputs: Any, weights: list[torch.Tensor] | None) -> torch.Tensor | None:
    """sum(w * out) over the float outputs that require grad: a loss with random tangents."""
    outs = [o for o in _float_outputs(outputs) if o.requires_grad]
    if not outs:
        return None
    return sum((o * w).sum() for o, w in zip(outs, weights))


@dataclasses.dataclass
class TrainResult:
    compiled_outputs: list[Any]
    eager_outputs: list[Any]
    model: torch.nn.Module
    eager_model: torch.nn.Module


def assert_same_state(model: torch.nn.Module, eager: torch.nn.Module, step: int) -> None:
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        close(p, q, f"step {step}: parameter {name}")
        if q.grad is None:
            assert p.grad is None, f"step {step}: {name}.grad should be None"
        else:
            close(p.grad, q.grad, f"step {step}: {name}.grad")
    for (name, b), (_, c) in zip(model.named_buffers(), eager.named_buffers()):
        close(b, c, f"step {step}: buffer {name}")


def train_steps(model: torch.nn.Module, make_inputs: Callable[[], tuple], *, steps: int = 3,
                backend: Any = "aot_eager", lr: float = 0.05, seed_each_step: bool = False,
                loss_of: Callable[[Any], torch.Tensor] | None = None) -> TrainResult:
    """Train `model` compiled with `backend` and an eager deep copy for `steps` SGD steps on the
    same fresh random inputs; compare everything after every step."""
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    eager_opt = torch.optim.SGD([p for p in eager.parameters() if p.requires_grad], lr=lr)
    result = TrainResult([], [], model, eager)
    for step in range(1, steps + 1):
        inputs = make_inputs()
        eager_inputs = tuple(x.detach().clone().requires_grad_(x.requires_grad)
                             if isinstance(x, torch.Tensor) else x for x in inputs)
        opt.zero_grad(set_to_none=True)
        eager_opt.zero_grad(set_to_none=True)
        torch.manual_seed(1000 + step)
        got = compiled(*inputs)
        torch.manual_seed(1000 + step)
        expected = eager(*eager_inputs)
        result.compiled_outputs.append(got)
        result.eager_outputs.append(expected)
        flat_got, flat_exp = _float_outputs(got), _float_outputs(expected)
        assert len(flat_got) == len(flat_exp)
        for i, (a, b) in enumerate(zip(flat_got, flat_exp)):
            close(a, b, f"step {step}: output {i}")
            assert a.requires_grad == b.requires_grad, f"step {step}: output {i} requires_grad"
        if loss_of is not None:
            loss, eager_loss = loss_of(got), loss_of(expected)
        else:
            # random tangents scaled so SGD steps stay small and training well conditioned
            weights = [torch.randn_like(o) / o.numel() ** 0.5 for o in flat_exp if o.requires_grad]
            loss, eager_loss = random_loss(got, weights), random_loss(expected, weights)
        if loss is not None:
            loss.backward()
            eager_loss.backward()
        for i, (x, y) in enumerate(zip(inputs, eager_inputs)):
            if isinstance(x, torch.Tensor):
                close(x, y, f"step {step}: input {i}")
                if y.grad is not None or x.grad is not None:
                    close(x.grad, y.grad, f"step {step}: input {i}.grad")
        assert_same_state(model, eager, step)
        opt.step()
        eager_opt.step()
    assert_same_state(model, eager, steps + 1)
    return result


@pytest.fixture
def train_check(aot_backend: RecordingAOT) -> Callable[..., TrainResult]:
    """`train_check(model, make_inputs, steps=3, training=True, backend=None)`: train_steps
    through the recording aot_eager backend (or `backend`), then assert the stage compiled every
    graph (no eager fallback) and, with `training`, built a training variant."""

    def check(model: torch.nn.Module, make_inputs: Callable[[], tuple], *, steps: int = 3,
              training: bool | None = True, backend: Any = None, **kwargs: Any) -> TrainResult:
        result = train_steps(model, make_inputs, steps=steps, backend=backend or aot_backend,
                             **kwargs)
        if backend is None:
            aot_backend.assert_compiled(training=training)
        return result

    return check
