"""A graph compiled with the kiln backend for inputs at one storage offset gives eager's answer
when called with inputs at another (`x[1]` after `x[0]`): the kernels bake the offset, so such a
call runs the graph as torch ops (issue 11: never a wrong answer)."""
from __future__ import annotations

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
        return torch.randn(9, generator=torch.Generator().manual_seed(7)).to(device)[3:].view(3, 2)

    compiled = kiln.compile(fn, backend="kiln")
    for _ in range(2):
        ours, theirs = offset_input(), offset_input()
        torch.testing.assert_close(compiled(ours), fn(theirs))
        torch.testing.assert_close(ours, theirs)  # the writes reached the caller's tensor
