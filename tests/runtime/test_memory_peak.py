"""Peak memory of compiled calls against eager's, measured by `kiln.tools.memory_meter` (live
tensor storage over the call; `collect_cycles` because Triton's interpreter holds each launch's
arguments in a reference cycle, which a GPU run has not). Conv-net and transformer models from
`tests/memory_models.py`, inference and training (forward, loss, backward, with what autograd
saves between them), on fresh random inputs after a warm-up call that compiles; outputs, losses
and gradients equal eager's. Also: the backward frees each saved activation after its last
reader (a boxed call), and retain_graph still keeps them for a second backward."""
from __future__ import annotations

import copy
import weakref

import pytest
import torch

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.runtime import compile_graph  # noqa: E402
from kiln.tools.memory_meter import Peak, measure_peak  # noqa: E402
from memory_models import CASES  # noqa: E402

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _step(model, x, loss_of, train: bool):
    """One inference call (its output) or one training step (loss and gradients)."""
    if not train:
        with torch.no_grad():
            return [model(x)]
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(1)  # the same labels / targets for eager and kiln
    loss = loss_of(model(x))
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


def _measure(model, x, loss_of, train: bool) -> Peak:
    return measure_peak(lambda: _step(model, x, loss_of, train), collect_cycles=True)


def _slack(model, x, train: bool) -> int:
    """Bytes kiln may hold beyond eager, training only, each for a reason: the autograd engine
    hands the incoming gradient (the tangent, the size of the output) to the one Function node
    that runs the whole compiled backward and holds it until the node returns, where eager
    frees it after the first node; and kiln's schedule runs the per-channel kernels of each
    BatchNorm (weight gradients, running-stat updates) after the main chain, so about one
    float [C] vector per BatchNorm lives longer than in eager."""
    if not train:
        return 0
    with torch.no_grad():
        out = model.eval()(x)
    model.train()
    channels = sum(m.num_features for m in model.modules()
                   if isinstance(m, torch.nn.BatchNorm2d))
    return out.numel() * out.element_size() + 4 * channels


def _blame(peak: Peak) -> str:
    return ", ".join(f"{op.replace('aten.', '')} {n}" for op, n in peak.at_peak)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_peak_at_most_eager(name, train):
    torch.manual_seed(0)
    model, make_input, loss_of = CASES[name]()
    model.train(train)
    compiled = kiln.compile(copy.deepcopy(model), backend="kiln")
    _step(compiled, make_input(), loss_of, train)  # compiles
    x = make_input()
    eager = _measure(model, x, loss_of, train)
    got = _measure(compiled, x, loss_of, train)
    for g, e in zip(got.result, eager.result, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    slack = _slack(model, x, train)
    assert got.peak_bytes <= eager.peak_bytes + slack, (
        f"kiln's peak {got.peak_bytes} B > eager's {eager.peak_bytes} B + {slack} B\n"
        f"kiln at peak: {_blame(got)}\neager at peak: {_blame(eager)}")


def _chain(x, w):
    return torch.cos(torch.sin(x) @ w)


def test_boxed_call_frees_inputs_after_their_last_reader(device):
    n = 64
    w = torch.randn(n, n, device=device)
    artifact = compile_graph(trace_aten(_chain, torch.randn(n, n, device=device), w),
                             [torch.randn(n, n, device=device), w])
    assert "args.clear()" in artifact.wrapper.source
    held = measure_peak(lambda: artifact(torch.randn(n, n, device=device), w),
                        keep_result=False, collect_cycles=True)
    args = [torch.randn(n, n, device=device), w]
    freed = []
    weakref.finalize(args[0].untyped_storage(), freed.append, True)
    boxed = measure_peak(lambda: artifact.call_boxed(args), keep_result=False,
                         collect_cycles=True)
    assert args == [] and freed == [True]
    assert boxed.peak_bytes == held.peak_bytes - n * n * 4  # x died after sin read it
    torch.testing.assert_close(artifact(args_x := torch.randn(n, n, device=device), w)[0],
                               _chain(args_x, w))


def test_retain_graph_keeps_saved_activations_for_a_second_backward():
    torch.manual_seed(0)
    model, make_input, loss_of = CASES["vit_block"]()
    compiled = kiln.compile(copy.deepcopy(model), backend="kiln")
    x = make_input()
    loss = loss_of(compiled(x))
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in compiled.parameters()]
    loss.backward()
    for p, g in zip(compiled.parameters(), first):
        torch.testing.assert_close(p.grad, 2 * g)


def _bump_and_pass_through(x, y, z):
    x.mul_(2)
    return x + y.sin(), z, z.t()


def test_boxed_call_keeps_mutated_and_returned_inputs(device):
    """Inputs dropped after their last reader are only those the graph neither mutates nor
    returns: the copy into a mutated input and a returned input (or a view of it) still work
    after the caller's list was emptied."""
    x, y, z = (torch.randn(5, 3, device=device) for _ in range(3))
    artifact = compile_graph(trace_aten(_bump_and_pass_through, x.clone(), y, z),
                             [x.clone(), y, z])
    deleted = {name.strip() for line in artifact.wrapper.source.splitlines()
               if line.strip().startswith("del ") for name in line.strip()[4:].split(",")}
    assert "y_1" in deleted and not {"x_1", "z_1"} & deleted
    mine, theirs = x.clone(), x.clone()
    args = [mine, y, z]
    out = artifact.call_boxed(args)
    assert args == []
    expected = _bump_and_pass_through(theirs, y, z)
    for got, want in zip(out, expected, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(mine, theirs)
    assert out[1].data_ptr() == z.data_ptr() and out[2].data_ptr() == z.data_ptr()
