"""A graph compiled with the kiln backend for inputs at one storage offset gives eager's answer
when called with inputs at another (`x[1]` after `x[0]`), with the same compiled kernels: they
address each input from its first element (`InputBuffer`), so no recompile and no eager run.
Graphs that name storage positions themselves (`as_strided` with a storage offset) still run as
torch ops at another offset, with a warning; code that reads `x.storage_offset()` is guarded."""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton")

import kiln  # noqa: E402


pytestmark = pytest.mark.usefixtures("generated_kernels")


def test_rows_of_one_base_at_other_offsets(device):
    def fn(x, y):
        return x * 3 + y.sum()

    compiled = kiln.compile(fn, backend="kiln")
    base, other = torch.randn(4, 5, device=device), torch.randn(3, 5, device=device)
    for row in (0, 1, 3, 0):
        torch.testing.assert_close(compiled(base[row], other[row % 3]),
                                   fn(base[row], other[row % 3]))


def test_training_graph_at_another_offset(device):
    lin = torch.nn.Linear(5, 2).to(device)

    def fn(x):
        return lin(x).relu().sum()

    compiled = kiln.compile(fn, backend="kiln")
    base = torch.randn(3, 4, 5, device=device)
    for i in (0, 2):
        lin.zero_grad()
        compiled(base[i]).backward()
        ours = lin.weight.grad.clone()
        lin.zero_grad()
        fn(base[i]).backward()
        torch.testing.assert_close(ours, lin.weight.grad)


def test_library_call_views_of_an_input_at_an_offset(device, tmp_path, monkeypatch):
    """A library kernel's argument views of inputs sitting inside a larger base (a transposed
    slice feeding mm, a 3-D row block feeding bmm), compiled at that offset."""
    def fn(a, w, q):
        return (a.t() @ w).relu(), torch.bmm(q, q.transpose(1, 2)) * 2

    base = torch.randn(64, 9, device=device)
    qbase = torch.randn(7, 4, 6, device=device)
    monkeypatch.setattr(kiln.config.config, "debug_dir", str(tmp_path))
    compiled = kiln.compile(fn, backend="kiln")
    for _ in range(2):
        a, w, q = base[3:11], torch.randn(8, 5, device=device), qbase[2:5]
        assert a.storage_offset() == 27 and q.storage_offset() == 48
        for got, want in zip(compiled(a, w, q), fn(a, w, q)):
            torch.testing.assert_close(got, want)
    source = "\n".join(p.read_text() for p in tmp_path.glob("*/wrapper.py"))
    assert "aten.mm" in source or "aten.bmm" in source  # the kiln pipeline compiled it


@pytest.mark.parametrize("requires_grad", [False, True])
def test_two_in_place_writes_through_a_view_of_an_offset_input_after_a_graph_break(
        device, requires_grad):
    """Fuzz seed 708022: the resumed graph scatters twice into the input's base, which starts
    3 elements into its storage. FakeTensor gave the second `as_strided_scatter` storage offset
    0, the copy to that layout dropped the storage before the base, and the library call reading
    the view at offset 5 raised (`setStorage ... out of bounds`) where eager returns."""
    linear = torch.nn.Linear(2, 3, device=device).requires_grad_(requires_grad)

    def fn(x):
        v = x[1:]
        if x.sum() > 0:  # a graph break
            x = x * 2
        v.mul_(0.5)
        v.mul_(0.5)
        return linear(v), v

    def offset_input():
        return torch.randn(9, generator=torch.Generator().manual_seed(7), device="cpu").to(device)[3:].view(3, 2)

    compiled = kiln.compile(fn, backend="kiln")
    for _ in range(2):
        ours, theirs = offset_input(), offset_input()
        torch.testing.assert_close(compiled(ours), fn(theirs))
        torch.testing.assert_close(ours, theirs)  # the writes reached the caller's tensor


def _no_offset_warnings(caplog) -> None:
    assert not [r for r in caplog.records if "storage offset" in r.getMessage()]


def _counting(backend_calls: list):
    from kiln.backends.registry import lookup_backend

    kiln_backend = lookup_backend("kiln")

    def counting(gm, inputs):
        backend_calls.append(gm)
        return kiln_backend(gm, inputs)
    return counting


def test_a_step_function_over_the_rows_of_a_sequence_compiles_once(device, caplog):
    """An RNN-style loop calling a compiled cell on `xs[t]`: every step's input sits at another
    storage offset (7 floats a row: the later rows are not 16-byte aligned either)."""
    w = torch.randn(7, 7, device=device) * 0.3

    def cell(x, h):
        return torch.tanh(x @ w + h * 0.5 + x.sum())

    calls: list = []
    compiled = kiln.compile(cell, backend=_counting(calls))
    xs = torch.randn(6, 7, device=device)
    h_ours = h_eager = torch.zeros(7, device=device)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for t in range(xs.shape[0]):
            h_ours, h_eager = compiled(xs[t], h_ours), cell(xs[t], h_eager)
            torch.testing.assert_close(h_ours, h_eager)
    assert len(calls) == 1
    _no_offset_warnings(caplog)


def test_an_output_viewing_an_input_at_an_offset_is_a_view_of_the_callers_tensor(device, caplog):
    def fn(x):
        return x[1:], x * 2

    compiled = kiln.compile(fn, backend="kiln")
    base = torch.randn(5, 4, 3, device=device)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for i in (0, 3, 1):
            view, doubled = compiled(base[i])
            torch.testing.assert_close(view, base[i][1:])
            torch.testing.assert_close(doubled, base[i] * 2)
            assert view.data_ptr() == base[i][1:].data_ptr()  # aliases, as in eager
    _no_offset_warnings(caplog)


def test_in_place_updates_of_inputs_at_offsets_reach_the_callers_tensor(device, caplog):
    def fn(x, y):
        x.mul_(2).add_(y)
        return x.sum(dim=0)

    compiled = kiln.compile(fn, backend="kiln")
    ours, theirs = (torch.randn(4, 3, 5, device=device) for _ in range(2))
    theirs.copy_(ours)
    y = torch.randn(3, 5, device=device)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for i in (0, 2, 3):
            torch.testing.assert_close(compiled(ours[i], y), fn(theirs[i], y))
    torch.testing.assert_close(ours, theirs)
    _no_offset_warnings(caplog)


def test_training_through_inputs_at_offsets(device, caplog):
    lin = torch.nn.Linear(6, 3).to(device)

    def fn(x):
        return torch.nn.functional.gelu(lin(x)).square().mean()

    compiled = kiln.compile(fn, backend="kiln")
    leaf = torch.randn(4, 5, 6, device=device, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for i in (0, 1, 3):
            grads = []
            for run in (compiled, fn):
                lin.zero_grad()
                leaf.grad = None
                run(leaf[i]).backward()
                grads.append((lin.weight.grad.clone(), leaf.grad.clone()))
            for ours, want in zip(*grads):
                torch.testing.assert_close(ours, want)
    _no_offset_warnings(caplog)


def test_an_explicit_storage_position_keeps_eagers_meaning(device):
    """`as_strided(..., storage_offset=2)` names element 2 of the storage, wherever `x` starts:
    such a graph runs as torch ops at another offset (the warning), never another answer."""
    def fn(x):
        return torch.as_strided(x, (2, 2), (1, 2), 2) * 3 + x[0, 0]

    compiled = kiln.compile(fn, backend="kiln")
    base = torch.randn(4, 3, 4, device=device)
    for i in (0, 2, 1):
        torch.testing.assert_close(compiled(base[i]), fn(base[i]))


def test_code_reading_the_storage_offset_is_guarded_on_it(device):
    def fn(x):
        return x * x.storage_offset()

    compiled = kiln.compile(fn, backend="kiln")
    base = torch.randn(4, 6, device=device)
    for i in (0, 2, 3, 2):
        torch.testing.assert_close(compiled(base[i]), fn(base[i]))
