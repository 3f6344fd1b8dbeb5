"""Data-dependent sizes (issue 15, stage D): `nonzero`, `masked_select`, `x[bool_mask]`,
`unique` and `item()` / `tolist()` behind kiln.config's `capture_dynamic_output_shape_ops` /
`capture_scalar_outputs`, as torch.compile's flags of the same names.

Off (the default): the graph breaks there, the break names the flag, the answer is eager's. On:
one graph, no break, sizes are unbacked symbols (`u0`), and calls whose count of selected
elements differs reuse it (no recompile). Every call compares with eager on fresh random inputs
whose counts differ between calls."""
from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
import torch

import kiln
import kiln.runtime
from kiln.backends.aot_eager import aot_eager
from kiln.backends.kiln_backend import kiln_backend
from kiln.config import config
from helpers import CountingBackend, assert_same_structure_and_values

CALLS = 5


class CountingAot(CountingBackend):
    """aot_eager, counting the graphs capture hands it."""

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        super().__call__(gm, example_inputs)
        return aot_eager(gm, example_inputs)


@pytest.fixture
def capture_flags():
    with config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        yield


def _nonzero_method(x):
    idx = x.nonzero()
    return idx.sum() + idx.shape[0], idx.float().mean(0)


def _torch_nonzero(x):
    rows = torch.nonzero(x > 0.3)[:, 0]
    return x[rows].sum(-1) * 2  # the result indexes on: its size is u0 too


def _masked_select(x):
    picked = torch.masked_select(x, x < 0.2)
    return picked.cos().sum(), picked.numel() * 1.5


def _bool_index(x):
    kept = x[x > 0]
    return (kept * 3 - 1).sum(), kept.shape[0]


def _unique(x):
    values = torch.unique((x * 2).round())
    return values.sum(), values.shape[0] + 1


CASES = [_nonzero_method, _torch_nonzero, _masked_select, _bool_index, _unique]


def _inputs(seed: int) -> torch.Tensor:
    return torch.randn(6, 5, generator=torch.Generator().manual_seed(seed))


def _counts_differ() -> None:
    counts = {int((_inputs(seed) > 0).sum()) for seed in range(CALLS)}
    assert len(counts) > 1, "the inputs must select different numbers of elements"


def _check_calls(compiled: Callable, fn: Callable) -> None:
    _counts_differ()
    for seed in range(CALLS):
        x = _inputs(seed)
        assert_same_structure_and_values(fn(x.clone()), compiled(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.strip("_"))
def test_flag_off_breaks_with_a_hint_naming_the_flag(fn, recorder):
    compiled = kiln.compile(fn, backend="eager")
    _check_calls(compiled, fn)
    breaks = [b for b in recorder.breaks if b.code == "data-dependent"]
    assert breaks, [b.code for b in recorder.breaks]
    assert "capture_dynamic_output_shape_ops" in " ".join(breaks[0].hints)


@pytest.mark.parametrize("make_backend", [CountingBackend, CountingAot], ids=["eager", "aot_eager"])
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.strip("_"))
def test_flag_on_one_graph_for_every_count(fn, make_backend, recorder, capture_flags):
    backend = make_backend()
    _check_calls(kiln.compile(fn, backend=backend), fn)
    assert backend.count == 1, f"{backend.count} captures for {CALLS} calls"
    assert not recorder.breaks, [b.render() for b in recorder.breaks]
    assert not recorder.recompiles
    bound = [n for n in backend.gm.graph.nodes if n.meta.get("unbacked_bindings")]
    assert bound, "no node carries a data-dependent size"


def test_fullgraph_captures_nonzero_only_with_the_flag():
    x = _inputs(0)
    with pytest.raises(Exception, match="capture_dynamic_output_shape_ops"):
        kiln.compile(_nonzero_method, backend="eager", fullgraph=True)(x)
    with config.patch(capture_dynamic_output_shape_ops=True):
        got = kiln.compile(_nonzero_method, backend="eager", fullgraph=True)(x)
    assert_same_structure_and_values(_nonzero_method(x), got)


def _scalars(x):
    scale = x.abs().max().item()
    first = x[0, :3].tolist()
    return x / scale + first[1], scale * 2


@pytest.mark.parametrize("make_backend", [CountingBackend, CountingAot], ids=["eager", "aot_eager"])
def test_item_and_tolist_with_capture_scalar_outputs(make_backend, recorder):
    with config.patch(capture_scalar_outputs=True):
        backend = make_backend()
        _check_calls(kiln.compile(_scalars, backend=backend), _scalars)
    assert backend.count == 1 and not recorder.breaks
    items = [n for n in backend.gm.graph.nodes if n.target == "item"]
    assert len(items) == 4  # max().item() and one item() per element of the list


def test_item_breaks_without_capture_scalar_outputs(recorder):
    _check_calls(kiln.compile(_scalars, backend="eager"), _scalars)
    (item, *_) = [b for b in recorder.breaks if b.code == "tensor-item"]
    assert "capture_scalar_outputs" in " ".join(item.hints)


def test_branch_on_a_data_dependent_count_breaks_and_stays_right(recorder, capture_flags):
    def f(x):
        kept = x[x > 0]
        if kept.shape[0] > 15:  # Python needs the count: it is known only at run time
            return kept.sum()
        return kept.mean()

    _check_calls(kiln.compile(f, backend="eager"), f)
    (brk, *_) = recorder.breaks
    assert brk.code == "data-dependent" and "data-dependent size" in brk.message


def test_explain_names_the_data_dependent_size(capture_flags):
    report = kiln.explain(_bool_index)(_inputs(0))
    assert report.graph_count == 1 and report.graph_break_count == 0
    (dims,) = report.dynamic_dims
    assert len(dims) == 1 and dims[0].startswith("u") and "data-dependent: indexing at" in dims[0]
    assert "data-dependent: indexing" in str(report)


@pytest.mark.parametrize("fn", [
    lambda x, w: torch.masked_select(x @ w, (x @ w) > 0).pow(2).sum(),
    lambda x, w: (x @ w)[x[:, :4] < 0].exp().sum(),
], ids=["masked_select", "bool_index"])
def test_training_through_data_dependent_sizes_with_aot_eager(fn, capture_flags, recorder):
    backend = CountingAot()
    compiled = kiln.compile(fn, backend=backend)
    _counts_differ()
    for seed in range(CALLS):
        x = _inputs(seed).requires_grad_()
        w = torch.randn(5, 4, requires_grad=True)
        x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, want = compiled(x, w), fn(x_ref, w_ref)
        torch.testing.assert_close(out, want)
        out.backward()
        want.backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        torch.testing.assert_close(w.grad, w_ref.grad)
    assert backend.count == 1 and not recorder.breaks


def _nonzero_rows(x):
    rows = (x > 0).nonzero()[:, 0]
    return (x[rows] * 2 + 1).sum(0), rows.shape[0]


@pytest.mark.usefixtures("generated_kernels")
def test_kiln_backend_runs_data_dependent_graphs_as_torch_ops(monkeypatch, caplog, capture_flags):
    """Same input shape, different counts: a kernel compiled for one call's count would be wrong
    for the next, so the kiln backend must not compile per input size."""
    pytest.importorskip("triton")
    compiles: list = []
    real = kiln.runtime.compile_graph
    monkeypatch.setattr(kiln.runtime, "compile_graph",
                        lambda *a, **k: compiles.append(1) or real(*a, **k))
    returned: list = []
    backend = lambda gm, inputs: returned.append(kiln_backend(gm, inputs)) or returned[-1]  # noqa
    compiled = kiln.compile(_nonzero_rows, backend=backend)
    with caplog.at_level(logging.INFO, logger="kiln"):
        _check_calls(compiled, _nonzero_rows)
    assert len(returned) == 1 and isinstance(returned[0], torch.fx.GraphModule)
    assert not compiles, "the code generator compiled a graph with data-dependent sizes"


@pytest.mark.parametrize("make_backend", [CountingBackend, CountingAot], ids=["eager", "aot_eager"])
def test_data_dependent_size_next_to_a_symbolic_input_size(make_backend, recorder, capture_flags):
    def f(x):
        kept = x[x > 0]
        return kept.sum() + x.shape[0], (x * kept.shape[0]).mean(0), torch.zeros(kept.shape[0])

    backend = make_backend()
    compiled = kiln.compile(f, backend=backend)
    for n in (3, 4, 5, 7):
        x = torch.randn(n, 3)
        assert_same_structure_and_values(f(x.clone()), compiled(x), rtol=1e-5, atol=1e-5)
    assert backend.count == 2  # the first call static, the second with x.shape[0] symbolic
    dims = recorder.graphs[-1].dynamic_dims
    assert dims[0].startswith("x.shape[0]") and "data-dependent: indexing" in dims[1]
    shape_guards = {g.expr for g in recorder.graphs[-1].guards if g.kind == "shape"}
    # no guard on the data-dependent size: it is not an input
    assert shape_guards == {"x.dim() == 2", "x.shape[1] == 3", "x.shape[0] >= 2"}, shape_guards
