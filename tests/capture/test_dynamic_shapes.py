"""Dynamic shapes in capture (issue 15, stage A): symbolic sizes, automatic dynamic, dynamic=True
and False, mark_dynamic / maybe_mark_dynamic / mark_static, guards on symbolic relations, and the
eager and aot_eager backends running one captured graph for every size.

Every test compares with eager on fresh random inputs per call, and counts captures (graphs
handed to the backend), which is what dynamic shapes must keep small."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln
import models
from models import ExplicitCausalAttention
from helpers import CountingAot, CountingBackend, assert_grads_equal, eager_copy


class MLP(torch.nn.Module):
    def __init__(self, d_in: int = 12, hidden: int = 24, d_out: int = 5) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make_backend", [CountingBackend, CountingAot], ids=["eager", "aot_eager"])
def test_mlp_batch_sweep_compiles_at_most_twice(make_backend):
    backend = make_backend()
    model = MLP().eval()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for batch in range(1, 17):
            x = torch.randn(batch, 12)
            _close(compiled(x), model(x))
    assert backend.count == 2, f"{backend.count} captures for batch 1..16"


@pytest.mark.parametrize("make_backend", [CountingBackend, CountingAot], ids=["eager", "aot_eager"])
def test_causal_attention_sequence_sweep_compiles_at_most_twice(make_backend):
    backend = make_backend()
    block = ExplicitCausalAttention().eval()
    compiled = kiln.compile(block, backend=backend)
    lengths = range(1, 65) if make_backend is CountingBackend else (1, 2, 3, 7, 16, 33, 64)
    with torch.no_grad():
        for length in lengths:
            x = torch.randn(2, length, 16)
            _close(compiled(x), block(x))
    assert backend.count <= 2, f"{backend.count} captures for {len(lengths)} sequence lengths"


def test_second_capture_has_a_symbolic_batch_and_guards_only_static_dims(recorder):
    backend = CountingBackend()
    compiled = kiln.compile(MLP().eval(), backend=backend)
    compiled(torch.randn(1, 12))
    compiled(torch.randn(3, 12))
    symbolic = backend.gms[1]
    x_val = next(n for n in symbolic.graph.nodes if n.op == "placeholder").meta["val"]
    assert isinstance(x_val.shape[0], torch.SymInt) and x_val.shape[1] == 12
    guards = [g.expr for g in recorder.graphs[1].guards if g.kind in ("shape", "stride")]
    assert "x.shape[0] >= 2" in guards
    assert "x.shape[1] == 12" in guards
    assert not any(g.startswith("x.shape ==") for g in guards), guards
    # the first (static) entry still serves batch 1, the symbolic one every batch >= 2
    for batch in (1, 2, 9, 1):
        compiled(torch.randn(batch, 12))
    assert backend.count == 2


def test_recompile_reason_says_which_dim_became_dynamic(recorder):
    compiled = kiln.compile(lambda x: x.sin() * 2, backend="eager")
    compiled(torch.randn(3, 4))
    compiled(torch.randn(5, 4))
    (reason,) = recorder.recompiles
    text = reason.render()
    assert "x.shape[0]: expected 3, got 5" in text
    assert "now dynamic" in text and "x.shape[0] changed from 3 to 5" in text


def test_dynamic_true_compiles_once_from_the_first_call():
    backend = CountingBackend()

    def f(x, y):
        return (x @ y).relu().sum(-1)

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in range(2, 10):
        x, y = torch.randn(n, n + 1), torch.randn(n + 1, 3)
        _close(compiled(x, y), f(x, y))
    assert backend.count == 1


def test_dynamic_false_specializes_every_size():
    backend = CountingBackend()

    def f(x):
        return x.cos() + 1

    compiled = kiln.compile(f, backend=backend, dynamic=False)
    for n in range(2, 7):
        x = torch.randn(n, 4)
        _close(compiled(x), f(x))
    assert backend.count == 5
    placeholder = next(n for n in backend.gms[-1].graph.nodes if n.op == "placeholder")
    assert all(isinstance(d, int) for d in placeholder.meta["val"].shape)


def test_dynamic_false_ignores_mark_dynamic():
    backend = CountingBackend()
    compiled = kiln.compile(lambda x: x * 3, backend=backend, dynamic=False)
    for n in (2, 3):
        x = torch.randn(n, 4)
        kiln.mark_dynamic(x, 0)
        _close(compiled(x), x * 3)
    assert backend.count == 2


@pytest.mark.parametrize("mark", [kiln.mark_dynamic, kiln.maybe_mark_dynamic])
def test_mark_dynamic_compiles_once(mark):
    backend = CountingBackend()

    def f(x):
        return torch.softmax(x, dim=-1) * x.shape[-1]

    compiled = kiln.compile(f, backend=backend)
    for n in (5, 2, 7, 11):
        x = torch.randn(3, n)
        mark(x, -1)
        _close(compiled(x), f(x))
    assert backend.count == 1


def test_mark_static_keeps_a_dim_specialized_under_dynamic_true():
    backend = CountingBackend()
    compiled = kiln.compile(lambda x: x.sum(0), backend=backend, dynamic=True)
    for n in (2, 3, 4):
        x = torch.randn(n, 6)
        kiln.mark_static(x, 0)
        _close(compiled(x), x.sum(0))
    assert backend.count == 3


def test_branch_on_a_symbolic_size_is_a_guard_that_recompiles_when_crossed(recorder):
    backend = CountingBackend()

    def f(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (2, 3, 4, 5, 8, 3, 6):
        x = torch.randn(n, 3)
        _close(compiled(x), f(x))
    assert backend.count == 2  # one graph per side of the relation
    guards = {g.expr for record in recorder.graphs for g in record.guards}
    assert "x.shape[0] <= 4" in guards and "x.shape[0] > 4" in guards


def test_divisibility_guard_on_a_symbolic_size():
    backend = CountingBackend()

    def f(x):
        if x.shape[0] % 2 == 0:
            return x.view(x.shape[0] // 2, -1).sum(-1)
        return x.sum(-1)

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (4, 6, 5, 8, 7):
        x = torch.randn(n, 3)
        _close(compiled(x), f(x))
    assert backend.count == 2


def test_equal_sizes_of_two_inputs_become_a_guard():
    backend = CountingBackend()

    def f(x, y):
        return x + y  # broadcasting needs x.shape[0] == y.shape[0] when both are >= 2

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (3, 4, 5):
        x, y = torch.randn(n, 2), torch.randn(n, 2)
        _close(compiled(x, y), f(x, y))
    assert backend.count == 1
    x, y = torch.randn(4, 2), torch.randn(1, 2)  # y broadcasts: a new graph, still right
    _close(compiled(x, y), f(x, y))
    assert backend.count == 2


def test_size_one_after_a_dynamic_capture_specializes():
    backend = CountingBackend()
    compiled = kiln.compile(lambda x, y: x * y, backend=backend, dynamic=True)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    _close(compiled(x, y), x * y)
    x, y = torch.randn(1, 3), torch.randn(1, 3)
    _close(compiled(x, y), x * y)
    assert backend.count == 2  # a size-1 dim is never symbolic: it may broadcast


def test_strides_are_guarded_for_symbolic_tensors():
    backend = CountingBackend()

    def f(x):
        return x.view(-1) * 2 if x.is_contiguous() else x.reshape(-1)

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for x in (torch.randn(3, 4), torch.randn(5, 4), torch.randn(4, 5).t(), torch.randn(4, 7).t()):
        _close(compiled(x), f(x))
    assert backend.count == 2  # contiguous and transposed: one graph each


def test_a_slice_of_a_wider_buffer_keeps_its_stride_and_one_graph():
    """`big[:, :n]` has stride (40, 1): not a product of its sizes, so torch gives the stride a
    symbol of its own, which capture's guards could not print (the capture failed and the
    frame ran eagerly). It is specialized: one graph for every n, another buffer width
    recompiles."""
    backend = CountingBackend()

    def f(x):
        return (x * 2).sum(-1) + x[:, 0]

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (8, 12, 16, 5):
        x = torch.randn(3, 40)[:, :n]
        _close(compiled(x), f(x))
    assert backend.count == 1
    x = torch.randn(3, 50)[:, :9]
    _close(compiled(x), f(x))
    assert backend.count == 2
    report = kiln.explain(f, dynamic=True)(x)
    assert report.graph_count == 1 and not report.break_reasons
    assert "x.stride() == (50, 1)" in report.render(verbose=True)


@pytest.mark.parametrize("rnn", [torch.nn.GRU, torch.nn.LSTM])
def test_a_recurrent_layer_runs_natively_and_the_rest_stays_dynamic(rnn):
    """nn.GRU / nn.LSTM run natively between graphs, as under torch.compile: captured, their
    fused op needed concrete sizes and the code after their weight bookkeeping's break
    recompiled for every sequence length until the recompile limit. Now: the layers around
    them compile at most twice (automatic dynamic), whatever the lengths; gradients as eager."""
    torch.manual_seed(0)

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(6, 16)
            self.rnn = rnn(16, 8, batch_first=True)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            out = self.rnn(torch.tanh(self.embed(x)))[0]
            return self.head(out).softmax(-1)

    model = Tagger()
    twin = eager_copy(model)
    backend = CountingBackend()
    compiled = kiln.compile(twin, backend=backend)
    for n in (3, 5, 4, 7, 9, 6):
        x = torch.randn(2, n, 6)
        weight = torch.randn(2, n, 3)
        ours, theirs = compiled(x), model(x)
        _close(ours, theirs)
        (ours * weight).sum().backward()
        (theirs * weight).sum().backward()
    assert_grads_equal(twin, model)
    assert backend.count <= 4, backend.count  # two graphs, each static then symbolic
    assert kiln.explain(model.rnn)(torch.randn(2, 5, 16)).graph_count == 0


def test_math_sqrt_of_a_size_keeps_it_symbolic():
    """`x / math.sqrt(x.shape[1])` is `torch._sym_sqrt` of the size in the graph (as under
    torch.compile), not a guard that specializes it: one capture for every length; a constant
    argument still folds."""
    import math

    backend = CountingAot()

    def f(x):
        return (x / math.sqrt(x.shape[1])).softmax(-1) * math.sqrt(4)

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (3, 5, 4, 7):
        x = torch.randn(2, n)
        _close(compiled(x), f(x))
    assert backend.count == 1
    targets = [n.target for n in backend.gms[0].graph.nodes if n.op == "call_function"]
    assert torch._sym_sqrt in targets and math.sqrt not in targets


def test_size_read_in_the_graph_is_returned_as_an_int():
    def f(x):
        return x.shape[0] * 2 + x.size(1), x.numel(), x.flatten()

    compiled = kiln.compile(f, backend="eager", dynamic=True)
    for n in (2, 6):
        x = torch.randn(n, n + 1)
        got, want = compiled(x), f(x)
        assert got[:2] == want[:2] and type(got[0]) is int
        _close(got[2], want[2])


def test_symbolic_size_live_across_a_graph_break():
    def f(x):
        n = x.shape[0]
        y = x * n
        print(end="")  # a graph break: n and y live on into the resume function
        return y + n

    compiled = kiln.compile(f, backend="eager")
    for n in range(1, 7):
        x = torch.randn(n, 2)
        _close(compiled(x), f(x))


def test_torch_dynamo_mark_dynamic_is_read_too():
    backend = CountingBackend()
    compiled = kiln.compile(lambda x: x.exp(), backend=backend)
    for n in (3, 4, 5):
        x = torch.randn(n)
        torch._dynamo.mark_dynamic(x, 0)
        _close(compiled(x), x.exp())
    assert backend.count == 1


@pytest.mark.parametrize("model_cls", [MLP, ExplicitCausalAttention])
def test_training_on_a_dynamic_graph_with_aot_eager_matches_eager_grads(model_cls):
    backend = CountingAot()
    torch.manual_seed(1)
    model = model_cls()
    reference = eager_copy(model)
    compiled = kiln.compile(model, backend=backend)
    shapes = [(1, 12), (3, 12), (6, 12)] if model_cls is MLP else [(2, 1, 16), (2, 5, 16),
                                                                   (2, 9, 16)]
    for shape in shapes:
        x = torch.randn(*shape)
        x_ref = x.clone().requires_grad_()
        x = x.requires_grad_()
        model.zero_grad()
        reference.zero_grad()
        out, want = compiled(x), reference(x_ref)
        _close(out, want)
        weight = torch.randn_like(want)
        (out * weight).sum().backward()
        (want * weight).sum().backward()
        assert_grads_equal(reference, model, rtol=1e-5, atol=1e-5)
        _close(x.grad, x_ref.grad)
    assert backend.count == 2


def test_explain_lists_dynamic_dims_and_why():
    def f(x, y):
        return x.view(x.shape[0], 2, -1).sum(1) + y

    x, y = torch.randn(4, 6), torch.randn(3)
    kiln.mark_dynamic(x, 0)
    report = kiln.explain(f)(x, y)
    assert report.dynamic_dims == [("x.shape[0] (mark_dynamic)",)]
    text = str(report)
    assert "graph 1: x.shape[0] (mark_dynamic)" in text
    everything = kiln.explain(f, dynamic=True)(x, torch.randn(3))
    assert everything.dynamic_dims == [("x.shape[0] (mark_dynamic)", "x.shape[1] (dynamic=True)",
                                        "y.shape[0] (dynamic=True)")]
    # the sum's broadcast needs y's size to equal half of x's second: a relation, in user terms
    assert "(x.shape[1] // 2) == y.shape[0]" in {g.expr for g in everything.out_guards}


def test_explain_says_when_the_code_specialized_a_dynamic_dim():
    report = kiln.explain(lambda x: x.view(x.shape[0], 2, 3), dynamic=True)(torch.randn(5, 6))
    assert report.dynamic_dims == [("x.shape[0] (dynamic=True)", "x.shape[1] (dynamic=True; "
                                    "specialized: the code needs x.shape[1] == 6)")]
    assert "x.shape[1] == 6" in {g.expr for g in report.out_guards}


@pytest.mark.parametrize("make_backend", [CountingBackend, CountingAot], ids=["eager", "aot_eager"])
def test_nanogpt_sequence_sweep_compiles_at_most_twice(make_backend):
    """The suite's nanoGPT: `assert t <= block_size`, a position `arange(t)` and the causal
    mask buffer sliced `[:, :, :T, :T]` all take the symbolic length."""
    backend = make_backend()
    model = models.GPT().eval()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for length in range(1, 17):
            idx = torch.randint(0, 64, (2, length))
            _close(compiled(idx)[0], model(idx)[0])
    assert backend.count == 2


def test_seed_block_sequence_sweep_compiles_at_most_twice():
    backend = CountingAot()
    block = models.TransformerBlock(64, 4).eval()
    compiled = kiln.compile(block, backend=backend)
    with torch.no_grad():
        for length in (1, 2, 3, 5, 8, 13, 21):
            x = torch.randn(2, length, 64)
            _close(compiled(x), block(x))
    assert backend.count == 2


def test_nanogpt_training_over_lengths_matches_eager_grads():
    backend = CountingAot()
    model = models.GPT()
    reference = eager_copy(model)
    compiled = kiln.compile(model, backend=backend)
    for length in (1, 4, 9, 16):
        idx, targets = torch.randint(0, 64, (2, length)), torch.randint(0, 64, (2, length))
        model.zero_grad()
        reference.zero_grad()
        loss, want = compiled(idx, targets)[1], reference(idx, targets)[1]
        _close(loss, want)
        loss.backward()
        want.backward()
        assert_grads_equal(reference, model, rtol=1e-4, atol=1e-5)
    assert backend.count == 2


@pytest.mark.parametrize("fn", [
    lambda x: (x.shape, x * 2),
    lambda x: (x.new_zeros(x.shape) + x, list(x.shape), math.prod(x.shape)),
    lambda x: (x.reshape(x.shape[0], -1) * len(x), x[: x.shape[0] // 2]),
    lambda x: (torch.arange(x.shape[0]) + x.size(0), x.expand(3, *x.shape)),
    lambda x: torch.zeros(x.size(0), 2 * x.size(1)).narrow(1, 0, x.size(1)) + x,
    lambda x: (F.pad(x, (0, x.shape[-1] % 3)), float(x.shape[-1]) ** 0.5),
], ids=["shape-out", "size-in-python", "len-and-slice", "arange-expand", "narrow", "pad"])
def test_size_idioms_match_eager_for_every_size(fn):
    """Sizes returned, fed to factories and views, used by Python (which specializes them) and
    by a composite kernel (F.pad) all give eager's result at every size, without a break."""
    compiled = kiln.compile(fn, backend="eager", dynamic=True, fullgraph=True)
    for n in (3, 4, 7):
        x = torch.randn(n, n + 2)
        got, want = compiled(x), fn(x)
        for g, w in zip(got, want) if isinstance(want, tuple) else [(got, want)]:
            if isinstance(w, torch.Tensor):
                _close(g, w)
            else:
                assert g == w and type(g) is type(w), (g, w)


def test_shape_tuples_concatenated_keep_their_symbols():
    """GPT-2's `(-1,) + input_shape[1:] + (h.size(-1),)`: `+` on tuples holding symbolic sizes
    builds a new tuple of them (it recursed without end before, breaking the graph)."""
    def fn(x, h):
        input_shape = x.size()
        x = x.view(-1, input_shape[-1])
        output_shape = (-1,) + input_shape[1:] + (h.size(-1),)
        return h.view(output_shape) * 2, x.sum(0)

    backend = CountingAot()
    compiled = kiln.compile(fn, backend=backend)
    for length in (3, 5, 8, 13):
        x, h = torch.randn(2, length), torch.randn(2, length, 4)
        for a, b in zip(compiled(x, h), fn(x, h)):
            _close(a, b)
    assert backend.count == 2
    explained = kiln.explain(fn, dynamic=True)(torch.randn(2, 7), torch.randn(2, 7, 4))
    assert explained.graph_break_count == 0, explained.break_reasons


def test_ordering_shape_tuples_specializes_and_stays_correct():
    def fn(x):
        return x * (2 if tuple(x.shape) < (2, 6) else 3)

    compiled = kiln.compile(fn, backend="eager", dynamic=True)
    for length in (3, 5, 8, 13):
        x = torch.randn(2, length)
        _close(compiled(x), fn(x))


def _guarding_div_rtn(x, y):
    """torch 2.11's meta `div_rtn`: `r != 0` asks the ShapeEnv about a symbolic remainder."""
    q, r = x // y, x % y
    if r != 0 and (bool(r < 0) != bool(y < 0)):
        q -= 1
    return q


def test_max_pool_over_image_sizes_records_no_parity_guard(monkeypatch):
    """Found on the H100 (torch 2.11): the pooled extent's `div_rtn` guarded `(H - 1) % 2`, so
    a conv net over image sizes 8, 11, 14 recompiled at 14 (H - 1 even, then odd). Capture's
    fake mode replaces it with floor division (the same value): 2 captures, not 3."""
    from torch import _meta_registrations as metas

    monkeypatch.setattr(metas, "div_rtn", _guarding_div_rtn)
    backend = CountingBackend()
    pool = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.MaxPool2d(3, 2, 1))
    compiled = kiln.compile(pool, backend=backend)
    with torch.no_grad():
        for side in (8, 11, 14, 9, 16):
            x = torch.randn(2, 3, side, side + 1)
            _close(compiled(x), pool(x))
    assert backend.count == 2, f"{backend.count} captures for 5 image sizes"
