"""In-place writes in training graphs (issue 11): writes into graph inputs that take part in
autograd or share memory with other inputs, and writes into tensors autograd saved for the
backward.

Each pattern runs compiled (aot_eager, and kiln with its generated kernels) and in eager on the
same fresh random inputs, twice: outputs, requires_grad, inputs after the call, and every
gradient, also against an fp64 eager run (compiled error at most 1.5x eager's plus 1e-5). Errors
are not suppressed and any kiln warning fails the test, so a fallback to eager cannot pass. Where
eager raises, in the forward or in the backward, kiln raises the same error.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.autograd.compiled_graph import EagerVariant, TrainingVariant
from kiln.config import config

SAVED_TENSOR_WRITTEN = "modified by an inplace operation"


@pytest.fixture(params=["aot_eager", "kiln"])
def backend(request, tmp_path, monkeypatch, caplog):
    config.suppress_errors = False  # a backend failure raises instead of running eagerly
    if request.param == "kiln":
        pytest.importorskip("triton")
        monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
        config.cpu_codegen = "triton_interpret"
    caplog.set_level(logging.WARNING, logger="kiln")
    yield request.param
    warnings = [r.getMessage() for r in caplog.get_records("call")
                if r.name.startswith("kiln") and r.levelno >= logging.WARNING]
    assert not warnings, f"kiln fell back or warned: {warnings}"


def _twin(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A leaf with t's values (in `dtype`) and requires_grad."""
    return t.detach().to(dtype or t.dtype).clone().requires_grad_(t.requires_grad)


def _as_list(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _loss(outs: list, inputs: list, weights: list, loss_on: list[int] | None) -> torch.Tensor:
    """sum(w * t) over the chosen outputs that require grad and the inputs the call turned into
    non-leaves (written with a value that carries a gradient)."""
    chosen = [o for k, o in enumerate(outs) if loss_on is None or k in loss_on]
    terms = [o for o in chosen if o.requires_grad]
    terms += [x for x in inputs if x.requires_grad and not x.is_leaf]
    return sum((t * w.to(t.dtype)).sum() for t, w in zip(terms, weights))


def _grads(model: nn.Module, inputs: list) -> list:
    return [p.grad for p in model.parameters()] + \
        [x.grad for x in inputs if x.is_leaf and x.requires_grad]


def _run(fn: Callable, model: nn.Module, inputs: list, weights: list | None,
         loss_on: list[int] | None) -> tuple[list, list | None, Exception | None]:
    outs = _as_list(fn(model, *inputs))
    if weights is None:
        weights = [torch.randn_like(t) for t in
                   [o for k, o in enumerate(outs) if loss_on is None or k in loss_on]
                   + [x for x in inputs if not x.is_leaf] if t.requires_grad]
    if not weights:
        return outs, weights, None  # nothing requires grad
    try:
        _loss(outs, inputs, weights, loss_on).backward()
    except RuntimeError as err:
        return outs, weights, err
    return outs, weights, None


def check(fn: Callable, make_inputs: Callable[[], list], backend: str, *,
          loss_on: list[int] | None = None, backward_raises: str | None = None,
          calls: int = 2) -> None:
    """fn(model, *inputs) compiled vs eager (see the module docstring)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(calls):
        inputs = make_inputs()
        eager_model, eager_inputs = copy.deepcopy(model), [_twin(x) for x in inputs]
        ref_model = copy.deepcopy(model).double()
        ref_inputs = [_twin(x, torch.float64) for x in inputs]
        model.zero_grad(set_to_none=True)
        expected, weights, eager_error = _run(fn, eager_model, eager_inputs, None, loss_on)
        got, _, error = _run(compiled, model, inputs, weights, loss_on)
        assert len(got) == len(expected)
        for k, (a, b) in enumerate(zip(got, expected)):
            torch.testing.assert_close(a, b, msg=lambda m: f"output {k}: {m}")
            assert a.requires_grad == b.requires_grad, f"output {k} requires_grad"
        for k, (x, y) in enumerate(zip(inputs, eager_inputs)):
            torch.testing.assert_close(x, y, msg=lambda m: f"input {k} after the call: {m}")
            assert (x.requires_grad, x.is_leaf) == (y.requires_grad, y.is_leaf), f"input {k}"
        if backward_raises is not None:
            assert eager_error is not None and backward_raises in str(eager_error)
            assert error is not None and backward_raises in str(error), error
            continue
        assert eager_error is None and error is None, (eager_error, error)
        if not weights:
            assert all(not p.requires_grad for p in got if isinstance(p, torch.Tensor))
            continue
        _run(fn, ref_model, ref_inputs, weights, loss_on)
        _assert_grads(_grads(model, inputs), _grads(eager_model, eager_inputs),
                      _grads(ref_model, ref_inputs))


def _assert_grads(got: list, expected: list, reference: list) -> None:
    assert any(g is not None for g in expected), "the test differentiates nothing"
    for k, (a, b, ref) in enumerate(zip(got, expected, reference)):
        if b is None:
            assert a is None, f"gradient {k} should be None"
            continue
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"grad {k}: {m}")
        eager_error = (b.double() - ref).abs().max()
        error = (a.double() - ref).abs().max()
        assert error <= 1.5 * eager_error + 1e-5, f"grad {k}: {error} vs eager's {eager_error}"


def _randn(*shape: int, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=requires_grad)


# -- writes into inputs that take part in autograd ---------------------------------------------

def write_into_a_non_leaf(model, x, u):
    t = model(x)
    kiln.graph_break()  # the second graph gets t: a non-leaf that requires grad
    t.add_(u)
    t[1::2] = u[1::2] * 2
    return t.tanh(), t


def write_into_a_view_of_a_non_leaf(model, x, u):
    row = model(x)[1]
    kiln.graph_break()
    row.mul_(u)  # autograd moves the write onto row's base, as in eager
    return row * 3


def write_a_gradient_into_a_plain_input(model, buf, x):
    buf[1:].add_(model(x)[1:])  # buf does not require grad; after the call it does
    return buf * 2


def write_a_non_leaf_under_no_grad(model, x):
    t = model(x)
    kiln.graph_break()
    with torch.no_grad():
        t.mul_(2)  # the value changes, the autograd history does not
    return t * t


def write_a_non_leaf_nothing_reads(model, x, y):
    t = model(x)
    kiln.graph_break()
    t[1] = 1.0  # no loss reaches t: the model's gradients stay None, as in eager
    return y * 2


@pytest.mark.parametrize("fn, make_inputs", [
    (write_into_a_non_leaf, lambda: [_randn(4, 4, requires_grad=True), _randn(4, 4)]),
    (write_into_a_non_leaf, lambda: [_randn(4, 4), _randn(4, 4, requires_grad=True)]),
    (write_into_a_view_of_a_non_leaf, lambda: [_randn(3, 4, requires_grad=True), _randn(4)]),
    (write_a_gradient_into_a_plain_input, lambda: [_randn(3, 4), _randn(3, 4)]),
    (write_a_non_leaf_under_no_grad, lambda: [_randn(2, 4, requires_grad=True)]),
    (write_a_non_leaf_nothing_reads, lambda: [_randn(2, 4), _randn(3, requires_grad=True)]),
])
def test_write_into_an_input_that_takes_part_in_autograd(fn, make_inputs, backend):
    check(fn, make_inputs, backend)


def test_write_into_a_leaf_that_requires_grad_raises_like_eager(backend):
    def fn(w, x):
        w.add_(x)
        return w * 2

    compiled = kiln.compile(fn, backend=backend)
    for _ in range(2):
        w, x = _randn(3, requires_grad=True), _randn(3)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being "
                                               "used in an in-place operation"):
            fn(_twin(w), x)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being "
                                               "used in an in-place operation") as raised:
            compiled(w, x)
        assert raised.type is RuntimeError  # eager's own error, not a compiler failure


# -- writes into inputs that share memory -----------------------------------------------------

def write_a_view_read_through_its_base(model, x, u):
    v = x[1:]
    kiln.graph_break()  # the resume graph gets x and v: two inputs, one storage
    v.mul_(2)
    return x * 3 + model(u).sum(), v


def write_a_gradient_through_a_view(model, x, u):
    v = x[1:]
    kiln.graph_break()
    v.add_(model(u)[1:])  # x does not require grad; after the write it does, through v
    return x * 2


def write_the_base_read_the_view(model, x):
    v = x.t()
    kiln.graph_break()
    x.add_(1)
    return v * 2  # no gradient anywhere: an inference graph


def write_bools_through_a_same_size_expand(model, x):
    v = x.expand(3, 3)  # an alias: eager writes through it (functionalization's expand inverse
    v[:, 0::2] = True   # subtracts, which bool tensors refuse)
    return v.narrow(1, 0, 2), x


@pytest.mark.parametrize("fn, make_inputs", [
    (write_bools_through_a_same_size_expand, lambda: [_randn(3, 3) > 0]),
    (write_a_view_read_through_its_base, lambda: [_randn(4, 4), _randn(2, 4)]),
    (write_a_gradient_through_a_view, lambda: [_randn(4, 4), _randn(4, 4)]),
    (write_the_base_read_the_view, lambda: [_randn(3, 4)]),
])
def test_write_into_inputs_that_share_memory(fn, make_inputs, backend):
    check(fn, make_inputs, backend)


# -- writes into tensors autograd saved ----------------------------------------------------------

def overwrite_a_saved_intermediate(model, x, u):
    t = model(x)
    s = t.sin()  # sin saves t ...
    t[1::2] = u[1::2]  # ... so eager's backward through s raises; through t it does not
    return t * 2, s


def overwrite_a_saved_product(model, x):
    t = model(x)
    s = t * t
    t.clamp_(-0.5, 0.5)
    return s, t.exp()


def overwrite_a_saved_input(model, x):
    t = model(x)  # linear saves x for the weight's gradient
    x.clamp_(-0.5, 0.5)
    return t, x * 2


@pytest.mark.parametrize("fn, make_inputs, healthy, poisoned", [
    (overwrite_a_saved_intermediate, lambda: [_randn(4, 4, requires_grad=True), _randn(4, 4)],
     [0], [1]),
    (overwrite_a_saved_product, lambda: [_randn(4, 4)], [1], [0]),
    (overwrite_a_saved_input, lambda: [_randn(3, 4)], None, [0]),
])
def test_overwritten_saved_tensor(fn, make_inputs, healthy, poisoned, backend):
    """Eager's forward runs; eager's backward raises exactly through the outputs that read the
    overwritten tensor. kiln compiles the forward, trains through the other outputs and raises
    eager's error through those."""
    if healthy is not None:
        check(fn, make_inputs, backend, loss_on=healthy)
    check(fn, make_inputs, backend, loss_on=poisoned, backward_raises=SAVED_TENSOR_WRITTEN)


def test_overwritten_saved_tensor_compiles_a_training_graph():
    gm = torch.fx.symbolic_trace(lambda x, w: ((x * w).sin(), x.mul_(2))[0])
    compiled = kiln.autograd.aot_compile(gm, [_randn(3), _randn(3, requires_grad=True)])
    (variant,) = compiled.variants.values()
    assert isinstance(variant, TrainingVariant) and not isinstance(variant, EagerVariant)
    out = compiled(_randn(3), _randn(3, requires_grad=True))
    assert out.requires_grad
    with pytest.raises(RuntimeError, match=SAVED_TENSOR_WRITTEN):
        out.sum().backward()

