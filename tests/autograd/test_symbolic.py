"""The autograd stage traces graphs captured with symbolic sizes once (issue 15, stage B).

With `backend="aot_eager"`, size sweeps (an MLP over batch 1..16, causal attention over sequence
1..64, the suite's GPT-2 and Llama over several sequence lengths), inference and training, make
at most 2 captures (the first call static, the second symbolic) and at most 2 autograd traces
(`recorder.autograd_traces`), with outputs and gradients equal to eager's on fresh random
inputs. Also: in-place writes into inputs, dropout, views returned from a symbolic graph, sizes
returned as values, sizes saved for the backward as ints, the graphs a backend's compilers
receive, and the per-size fallback (a failed symbolic trace, a size that breaks a fact the
trace assumed)."""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import aot_compile, is_symbolic_graph
from kiln.autograd.compiled_graph import CompiledGraph, TrainingVariant
from kiln.autograd.size_variants import SymbolicVariant
from kiln.autograd import trace as trace_module
from kiln.autograd.symbolic import SymbolicUnsupported
from kiln.tools.suite import model_registry
from models import ExplicitCausalAttention

# aot_eager graphs (no generated kernels): CPU tensors, also in the CUDA suite, whose default
# device would otherwise put inputs on the GPU beside CPU weights
pytestmark = pytest.mark.explicit_device

RTOL, ATOL = 1e-4, 1e-5


def close(actual: Any, expected: Any, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL,
                               msg=lambda m: f"{what}: {m}")


def assert_compiled_once(aot_backend: Any, recorder: Any) -> None:
    """At most 2 captures and 2 autograd traces, the last of them symbolic; every variant the
    stage made is symbolic and none fell back to eager."""
    traces = recorder.autograd_traces
    assert len(aot_backend.compiled) <= 2, f"{len(aot_backend.compiled)} captures"
    assert len(traces) <= 2, f"{len(traces)} autograd traces: {traces}"
    assert traces and traces[-1].symbolic, f"no symbolic trace: {traces}"
    symbolic = [v for c in aot_backend.compiled for v in c.variants.values()
                if isinstance(v, SymbolicVariant)]
    assert symbolic and all(v.conditions is None for v in symbolic)
    aot_backend.assert_compiled()


def assert_same_grads(model: torch.nn.Module, eager: torch.nn.Module, what: str) -> None:
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, f"{what}: {name}.grad is None"
        assert q.grad.abs().sum() > 0, f"{what}: {name}.grad is zero in eager"
        close(p.grad, q.grad, f"{what}: {name}.grad")


def sweep_inference(model: torch.nn.Module, make_input: Callable[[int], tuple], sizes: Any,
                    backend: Any) -> None:
    model.eval()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for size in sizes:
            inputs = make_input(size)
            close(compiled(*inputs), model(*inputs), f"size {size}")


def sweep_training(model: torch.nn.Module, make_input: Callable[[int], tuple], sizes: Any,
                   backend: Any, loss: Callable[[Any], torch.Tensor] | None = None) -> None:
    """Train-mode forward and backward of a compiled model and an eager copy: outputs, every
    parameter gradient and the input gradients equal for each size."""
    loss = loss or (lambda out: (out * torch.randn_like(out)).sum())
    model.train()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend)
    for size in sizes:
        inputs = make_input(size)
        twins = tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)
        state = torch.random.get_rng_state()
        out = compiled(*inputs)
        torch.random.set_rng_state(state)  # the same random tangents for both
        expected = eager(*twins)
        close(out, expected, f"size {size}: output")
        torch.manual_seed(size)
        loss(out).backward()
        torch.manual_seed(size)
        loss(expected).backward()
        assert_same_grads(model, eager, f"size {size}")
        for x, twin in zip(inputs, twins):
            if x.requires_grad:
                close(x.grad, twin.grad, f"size {size}: input grad")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)


class MLP(torch.nn.Module):
    def __init__(self, d_in: int = 12, hidden: int = 24, d_out: int = 5) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, d_out)
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


# -- size sweeps ------------------------------------------------------------------------------

def test_mlp_batch_sweep_inference(aot_backend, recorder):
    sweep_inference(MLP(), lambda b: (torch.randn(b, 12),), range(1, 17), aot_backend)
    assert_compiled_once(aot_backend, recorder)


def test_mlp_batch_sweep_training(aot_backend, recorder):
    sweep_training(MLP(), lambda b: (torch.randn(b, 12, requires_grad=True),), range(1, 17),
                   aot_backend)
    assert_compiled_once(aot_backend, recorder)
    assert all(r.training for r in recorder.autograd_traces)


def test_causal_attention_sequence_sweep_inference(aot_backend, recorder):
    sweep_inference(ExplicitCausalAttention(), lambda n: (torch.randn(2, n, 16),), range(1, 65),
                    aot_backend)
    assert_compiled_once(aot_backend, recorder)


def test_causal_attention_sequence_sweep_training(aot_backend, recorder):
    sweep_training(ExplicitCausalAttention(),
                   lambda n: (torch.randn(2, n, 16, requires_grad=True),),
                   range(1, 65), aot_backend)
    assert_compiled_once(aot_backend, recorder)


SEQ_LENGTHS = (4, 9, 16, 5, 33, 64)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_suite_model_sequence_sweep_inference(name, aot_backend, recorder):
    spec = model_registry.get(name)
    model, batch = spec.build("small")
    vocab = int(batch.inputs[0].max()) + 1
    sweep_inference(model, lambda n: (torch.randint(0, vocab, (2, n)),), SEQ_LENGTHS,
                    aot_backend)
    assert_compiled_once(aot_backend, recorder)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_suite_model_sequence_sweep_training(name, aot_backend, recorder):
    spec = model_registry.get(name)
    model, batch = spec.build("small")
    vocab = int(batch.inputs[0].max()) + 1
    targets = {}

    def loss(logits: torch.Tensor) -> torch.Tensor:
        shape = tuple(logits.shape[:2])
        target = targets.setdefault(shape, torch.randint(0, vocab, shape))
        return spec.loss(logits, target)

    sweep_training(model, lambda n: (torch.randint(0, vocab, (2, n)),), SEQ_LENGTHS,
                   aot_backend, loss)
    assert_compiled_once(aot_backend, recorder)


def test_forcing_per_size_traces_is_caught(monkeypatch, aot_backend, recorder):
    """The sweeps' trace count fails when the stage traces per size (the check can fail)."""
    monkeypatch.setattr(CompiledGraph, "_compile_symbolic", lambda self, args, training: None)
    sweep_inference(MLP(), lambda b: (torch.randn(b, 12),), range(1, 7), aot_backend)
    assert len(recorder.autograd_traces) == 6
    with pytest.raises(AssertionError, match="autograd traces"):
        assert_compiled_once(aot_backend, recorder)


# -- mutations, randomness, views, sizes as values -------------------------------------------

def _sizes(fn: Callable, sizes: Any, make: Callable[[int], tuple], check: Callable) -> None:
    compiled = kiln.compile(fn, backend="aot_eager")
    for size in sizes:
        inputs = make(size)
        twins = tuple(x.clone() for x in inputs)
        check(size, compiled(*inputs), fn(*twins), inputs, twins)


def test_in_place_writes_into_inputs(recorder):
    def step(x, buf, counter):
        buf.mul_(0.5).add_(x.sum(0))  # a running statistic, as BatchNorm's
        counter.add_(1)
        x.clamp_(min=-1.0)  # the input itself
        return (x * buf).sum(1)

    def check(size, out, expected, inputs, twins):
        close(out, expected, f"batch {size}: output")
        for k, (a, b) in enumerate(zip(inputs, twins)):
            close(a, b, f"batch {size}: input {k} after the call")

    _sizes(step, range(2, 9), lambda b: (torch.randn(b, 6), torch.randn(6), torch.randn(())),
           check)
    assert len(recorder.autograd_traces) <= 2 and recorder.autograd_traces[-1].symbolic


def backward_both(out: torch.Tensor, expected: torch.Tensor) -> None:
    """The same random tangent back through the compiled and the eager output."""
    tangent = torch.randn_like(out)
    (out * tangent).sum().backward()
    (expected * tangent).sum().backward()


def test_in_place_write_into_a_non_leaf_input_that_requires_grad(recorder):
    def fn(x, w):
        x.mul_(w)  # x is computed before the graph: eager allows the write
        return x.sin()

    compiled = kiln.compile(fn, backend="aot_eager")
    for size in range(2, 8):
        base, w = torch.randn(size, 5, requires_grad=True), torch.randn(5, requires_grad=True)
        base2, w2 = base.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        x, x2 = base * 2, base2 * 2
        out, expected = compiled(x, w), fn(x2, w2)
        close(out, expected, f"size {size}: output")
        close(x, x2, f"size {size}: the written input")
        backward_both(out, expected)
        close(base.grad, base2.grad, f"size {size}: grad through the write")
        close(w.grad, w2.grad, f"size {size}: grad of w")
    assert len(recorder.autograd_traces) <= 2 and recorder.autograd_traces[-1].symbolic


def test_dropout_in_train_mode(recorder):
    """Masks differ per call and follow the seed; gradients are eager's through the mask the
    output shows (the mask is saved, never recomputed)."""
    def fn(x, w):
        return F.dropout(x @ w, 0.5, training=True)

    compiled = kiln.compile(fn, backend="aot_eager")
    for size in range(2, 12):
        x = torch.randn(size, 6, requires_grad=True)
        w = torch.randn(6, 8, requires_grad=True)
        torch.manual_seed(size)
        out = compiled(x, w)
        torch.manual_seed(size)
        close(compiled(x, w), out, f"size {size}: the same seed, the same mask")
        kept = (out != 0).float()
        assert 0 < kept.mean() < 1, f"size {size}: mask {kept.mean()}"
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        expected = (x2 @ w2) * kept * 2.0
        close(out, expected, f"size {size}: output")
        backward_both(out, expected)
        close(x.grad, x2.grad, f"size {size}: x.grad")
        close(w.grad, w2.grad, f"size {size}: w.grad")
    traces = [r for r in recorder.autograd_traces if r.training]
    assert len(traces) <= 2 and traces[-1].symbolic


def test_views_returned_from_a_symbolic_graph(recorder):
    """Outputs that view inputs are views of the real inputs at each size; a view of an
    intermediate can be written in place, as in eager; gradients flow through all of them."""
    def fn(x, w):
        h = (x @ w).relu_()
        return (h * 2).view(-1), x.t(), x[1:], h.sum(1)

    compiled = kiln.compile(fn, backend="aot_eager")
    w = torch.randn(6, 4, requires_grad=True)
    for size in range(2, 9):
        x = torch.randn(size, 6, requires_grad=True)
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        outs, expected = compiled(x, w), fn(x2, w2)
        for k, (a, b) in enumerate(zip(outs, expected)):
            assert a.shape == b.shape and a.stride() == b.stride(), f"size {size}: output {k}"
            close(a, b, f"size {size}: output {k}")
        assert outs[1]._base is x and outs[2]._base is x
        assert outs[2].storage_offset() == 6
        outs[0].mul_(3)  # a view of an intermediate, written in place
        expected[0].mul_(3)
        tangents = [torch.randn_like(o) for o in expected]
        sum((o * t).sum() for o, t in zip(outs, tangents)).backward()
        sum((o * t).sum() for o, t in zip(expected, tangents)).backward()
        close(x.grad, x2.grad, f"size {size}: x.grad")
        close(w.grad, w2.grad, f"size {size}: w.grad")
        w.grad = None
    assert len(recorder.autograd_traces) <= 2 and recorder.autograd_traces[-1].symbolic


def test_a_returned_size_follows_the_call(recorder):
    def fn(x):
        return x * 2, x.shape[0] * 3, x.shape[1] / 2

    compiled = kiln.compile(fn, backend="aot_eager")
    for size in (2, 3, 4, 7):
        x = torch.randn(size, size + 1)
        out, rows, half = compiled(x)
        close(out, x * 2, f"size {size}")
        assert (rows, half) == (3 * size, (size + 1) / 2)
        assert type(rows) is int
    assert recorder.autograd_traces[-1].symbolic


# -- the graphs, and the fallback ---------------------------------------------------------------

def _capture(fn: Callable, *examples: torch.Tensor) -> tuple[torch.fx.GraphModule, list]:
    """The symbolic graph capture hands a backend (the second capture, dim 0 dynamic)."""
    got = []
    compiled = kiln.compile(fn, backend=lambda gm, inputs: got.append((gm, inputs)) or gm)
    for x in examples:
        compiled(x, *_WEIGHTS)
    gm, inputs = got[-1]
    assert is_symbolic_graph(gm)
    return gm, inputs


_WEIGHTS = (torch.randn(6, requires_grad=True),)


def _sum_rows_times_w(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.sum(0) * w).tanh()  # the backward needs x's number of rows, not x


def test_backend_compilers_get_symbolic_graphs_and_sizes_saved_as_ints():
    gm, inputs = _capture(_sum_rows_times_w, torch.randn(3, 6), torch.randn(4, 6))
    seen = {}

    def compiler(kind: str) -> Callable:
        def compile_graph(graph: torch.fx.GraphModule, examples: list) -> Callable:
            seen[kind] = (graph, examples)
            return graph
        return compile_graph

    inputs = [inputs[0].requires_grad_(), *inputs[1:]]
    compiled = aot_compile(gm, inputs, fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                           symbolic=True)
    fw_gm, fw_examples = seen["fw"]
    bw_gm, bw_examples = seen["bw"]  # compiled with the forward: checked with the trace
    assert is_symbolic_graph(fw_gm) and is_symbolic_graph(bw_gm)
    placeholders = [n.meta["val"] for n in fw_gm.graph.nodes if n.op == "placeholder"]
    assert all(a is b for a, b in zip(placeholders, fw_examples, strict=True))
    saved_sizes = [v for v in bw_examples if isinstance(v, torch.SymInt)]
    assert saved_sizes, "the backward reads x's size: saved as an int"
    (variant,) = compiled.traced_variants()
    assert isinstance(variant, TrainingVariant)
    assert "primals_0" not in variant.partition.saved  # x itself is not kept for its size
    for size in (2, 5, 9):
        x = torch.randn(size, 6, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        (out,) = compiled(x, *_WEIGHTS)
        close(out, _sum_rows_times_w(x2, *_WEIGHTS), f"size {size}")
        out.sum().backward()
        _sum_rows_times_w(x2, *_WEIGHTS).sum().backward()
        close(x.grad, x2.grad, f"size {size}: x.grad")


def test_a_fact_the_trace_assumed_sends_other_sizes_per_size(recorder):
    """A joint pass that branches on a size records a fact after capture: calls whose sizes
    break it are traced for their sizes, the others run the symbolic graphs."""
    gm, inputs = _capture(_sum_rows_times_w, torch.randn(3, 6), torch.randn(4, 6))

    def branch_on_rows(joint):
        rows = next(n for n in joint.gm.graph.nodes if n.op == "placeholder").meta["val"]
        bool(rows.shape[0] < 10)  # the example has 4 rows: records s0 < 10
        return joint

    with torch.no_grad():
        compiled = aot_compile(gm, inputs, joint_passes=[branch_on_rows], symbolic=True)
    (variant,) = compiled.variants.values()
    assert isinstance(variant, SymbolicVariant) and variant.conditions is not None
    for size in (2, 9, 10, 17, 5, 17):
        x = torch.randn(size, 6)
        with torch.no_grad():
            close(compiled(x, *_WEIGHTS)[0], _sum_rows_times_w(x, *_WEIGHTS), f"size {size}")
    traces = recorder.autograd_traces[-3:]
    assert [r.symbolic for r in traces] == [True, False, False]
    assert [r.input_shapes[0] for r in traces[1:]] == [(10, 6), (17, 6)]


def test_a_failed_symbolic_trace_traces_per_size(monkeypatch, recorder, caplog):
    def refuse(fake_mode, example):
        raise SymbolicUnsupported("refused for the test")

    monkeypatch.setattr(trace_module, "_symbolic_fake", refuse)
    model = MLP().eval()
    compiled = kiln.compile(model, backend="aot_eager")
    with caplog.at_level(logging.INFO, logger="kiln.autograd"), torch.no_grad():
        for size in (2, 3, 4, 3):
            x = torch.randn(size, 12)
            close(compiled(x), model(x), f"size {size}")
    assert "refused for the test" in caplog.text and "traced per size" in caplog.text
    assert [r.symbolic for r in recorder.autograd_traces] == [False, True, False, False]
    assert recorder.per_size == ["autograd stage: SymbolicUnsupported: [kiln.autograd] "
                                 "refused for the test"]
    report = kiln.explain(model, backend="aot_eager", dynamic=True)(torch.randn(5, 12))
    assert "Compiled per size after all" in report.render()
    assert "autograd stage: SymbolicUnsupported" in report.render()


def test_a_later_variant_is_checked_against_facts_an_earlier_trace_added():
    """The ShapeEnv keeps the facts of every trace: a later trace that branches on one records
    nothing new, so the facts of all traces since capture hold for its variant too."""
    gm, inputs = _capture(_sum_rows_times_w, torch.randn(3, 6), torch.randn(4, 6))
    branches = []

    def branch_on_rows(joint):
        rows = next(n for n in joint.gm.graph.nodes if n.op == "placeholder").meta["val"]
        branches.append((joint.training, bool(rows.shape[0] < 10)))
        return joint

    with torch.no_grad():
        compiled = aot_compile(gm, inputs, joint_passes=[branch_on_rows], symbolic=True)
    x = torch.randn(12, 6, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    (out,) = compiled(x, *_WEIGHTS)  # training, 12 rows: the symbolic trace does not hold
    close(out, _sum_rows_times_w(x2, *_WEIGHTS), "12 rows")
    assert branches == [(False, True), (True, True), (True, False)]
    symbolic = list(compiled.variants.values())
    assert len(symbolic) == 2 and all(isinstance(v, SymbolicVariant) for v in symbolic)
    assert all("10" in str(v.conditions) for v in symbolic)


def test_a_size_the_trace_specializes_is_a_condition(recorder):
    """cumprod's backward (torch's C++ formula) reads a concrete size under the symbolic trace:
    the ShapeEnv guards `Eq(s0, 6)` and replaces s0 by 6, after which the guard simplified to
    true and was dropped, so the graph traced for 6 rows served 7 rows (a [6, 3] gradient for a
    [7, 3] input: the backward raised). Every replacement made after capture is now a fact of
    its own; this one names a symbol the specialized inputs no longer carry, so the graph is
    traced per size."""
    def fn(x):
        return (x * (x > -0.5)).cumprod(0)

    compiled = kiln.compile(fn, backend="aot_eager")
    for rows in (5, 6, 7, 9):
        x = torch.randn(rows, 3, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        ours, theirs = compiled(x2), fn(x)
        close(ours, theirs, f"output, {rows} rows")
        weight = torch.randn(theirs.shape)
        (ours * weight).sum().backward()
        (theirs * weight).sum().backward()
        close(x2.grad, x.grad, f"grad, {rows} rows")


def test_a_dim_specialized_by_the_trace_is_read_from_the_input_it_was_made_for(recorder):
    """`dynamic=True` makes every dim symbolic; nn.MultiheadAttention's embedding dim must equal
    its weights', so the trace specializes it (`s2 -> 16`) after capture. The fact `Eq(s2, 16)`
    is checked per call, read from the input dim the symbol was made for: the input's size no
    longer says `s2` (the ShapeEnv replaced it), and looking the symbol up by that alone failed
    ("a size s2 that no graph input has") and silently traced per size."""
    attention = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()

    def fn(x):
        return attention(x, x, x)[0]

    compiled = kiln.compile(fn, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 4, 7):
            x = torch.randn(2, n, 16)
            close(compiled(x), fn(x), f"{n} tokens")
    traces = recorder.autograd_traces
    assert len(traces) == 1 and traces[0].symbolic, traces


def test_a_symbolic_trace_failing_without_a_message_still_traces_per_size(monkeypatch,
                                                                          recorder):
    """The per-size fallback's one-line reason of an exception with an empty message is its
    type (taking the message's first line raised IndexError inside the fallback itself)."""
    def refuse(fake_mode, example):
        raise RuntimeError()

    monkeypatch.setattr(trace_module, "_symbolic_fake", refuse)
    model = MLP().eval()
    compiled = kiln.compile(model, backend="aot_eager")
    with torch.no_grad():
        for size in (2, 3, 4):
            x = torch.randn(size, 12)
            close(compiled(x), model(x), f"size {size}")
    assert recorder.per_size == ["autograd stage: RuntimeError"]
