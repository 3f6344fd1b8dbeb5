"""Loop nests that would iterate over nothing, and loads at a constant offset under a mask.

Issue 11's H200 fuzz campaign fell back to eager with `CodegenError: groupN: empty loop nest`
(a graph resumed after `x[x > 0].sum()` broke it, when the mask selected nothing),
`groupN: reduction members but no r_ranges` (`t.sum()` of a 0-dim `t`), and GPU-only kernel
compile errors (`tl.load(ptr + (0), mask)`: a block mask on a scalar pointer). The lower stage
now allocates zero-element buffers instead of computing them, gives every reduction a non-empty
r loop (a 0-dim input reduces over `(1,)`, an empty reduced dim reduces the identity once), and
the Triton printer broadcasts a masked load's constant offset to the block.

The first tests check the IR; the others compare the kiln backend with eager on fresh random
inputs on the test device (the Triton interpreter on the CPU, real kernels on CUDA), with
`suppress_errors=False` so that an eager fallback fails the test.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower import lower_graph
from kiln.lower.decomposition_tables import trace_table
from kiln.lower.evaluate import run_ir
from kiln.lower.ir import ComputedBuffer, Extern

# -- the IR ---------------------------------------------------------------------------------------


def _lower(fn, *inputs):
    gm = make_fx(fn, decomposition_table=trace_table())(*[t.clone() for t in inputs])
    return lower_graph(gm, list(inputs))


def _loops(graph) -> list[tuple[int, int]]:
    """(numel, rnumel) of every computed buffer's loop nest (rnumel 1 for a pointwise)."""
    out = []
    for node in graph.computed:
        data = node.data
        rr = data.reduction_ranges if node.is_reduction else (1,)
        out.append((math.prod(data.ranges), math.prod(rr) if rr else 0))
    return out


@pytest.mark.parametrize("fn, shape", [
    (lambda x: x.sum() * 2, ()),
    (lambda x: x.sum(0) * 2, ()),
    (lambda x: x.argmax() + 1, ()),
    (lambda x: x.softmax(0) * 2, ()),
    (lambda x: x.sum(1) + 1, (3, 0)),
    (lambda x: x.prod(0) + 1, (0, 3)),
    (lambda x: x.mean(), (0,)),
    (lambda x: x * 2 + 1, (0, 3)),
    (lambda x: x.sum(1) + 1, (0, 3)),
], ids=["sum_0dim", "sum_dim0_0dim", "argmax_0dim", "softmax_0dim", "sum_empty_dim",
        "prod_empty_dim", "mean_empty", "pointwise_empty", "sum_no_rows"])
def test_no_loop_nest_is_empty_and_the_ir_equals_eager(fn, shape):
    x = torch.randn(shape)
    graph = _lower(fn, x)
    for numel, rnumel in _loops(graph):
        assert numel > 0 and rnumel > 0, f"an empty loop nest in\n{graph}"
    (got,) = run_ir(graph, [x])
    torch.testing.assert_close(got, fn(x), equal_nan=True)


def test_a_zero_element_buffer_is_allocated_not_computed():
    x = torch.randn(0, 4)
    graph = _lower(lambda x: (x * 2).sum(1), x)
    assert not graph.computed and graph.nodes
    for node in graph.nodes:
        assert isinstance(node, Extern) and node.kind == "empty"
        assert node.op is torch.ops.aten.empty_strided.default
    namespace: dict = {}
    exec(str(graph), namespace)  # the printed IR stays runnable Python
    (got,) = namespace["call"](x, constants=graph.constants)
    assert got.shape == (0,) and got.dtype == torch.float32


def test_a_reduction_over_an_empty_dim_reduces_the_identity_once():
    graph = _lower(lambda x: (x.sum(1), x.prod(1), (x > 0).any(1)), torch.randn(2, 0))
    reductions = [n for n in graph.nodes if isinstance(n, ComputedBuffer) and n.is_reduction]
    assert [n.data.reduction_ranges for n in reductions] == [(1,), (1,), (1,)]
    x = torch.randn(2, 0)
    for got, want in zip(run_ir(graph, [x]), (x.sum(1), x.prod(1), (x > 0).any(1))):
        torch.testing.assert_close(got, want)


# -- compiled vs eager ----------------------------------------------------------------------------

def _assert_same_call(fn, make_args):
    """Compiled and eager on equal fresh inputs, twice (compile, then a cache hit)."""
    import kiln

    compiled = kiln.compile(fn, backend="kiln")
    for _ in range(2):
        args = make_args()
        ours = [a.clone() for a in args]
        torch.testing.assert_close(compiled(*ours), fn(*args), equal_nan=True)
        for mine, theirs in zip(ours, args):
            torch.testing.assert_close(mine, theirs)


def _negative(*shape, device):
    return -torch.rand(*shape, device=device) - 0.5


def test_a_resumed_graph_whose_mask_selected_nothing(generated_kernels, device):
    """Fuzz seed 145: the boolean mask breaks the graph; the resumed graph sums an empty
    tensor (a reduction over nothing) and broadcasts it against x."""
    def fn(x):
        t = x[x > 0].sum()
        return t * 1.5 - x, t

    _assert_same_call(fn, lambda: [_negative(3, device=device)])


def test_a_resumed_graph_with_an_empty_intermediate(generated_kernels, device):
    def fn(x):
        sel = x[x > 0]
        return sel * 2 + 1, sel.mean(), x.sum(0, keepdim=True) + sel.sum()

    _assert_same_call(fn, lambda: [_negative(2, 3, device=device)])


def test_reductions_of_a_0dim_tensor(generated_kernels, device):
    """Fuzz seeds 999, 2474: `t.sum()` of a 0-dim `t` had no r loop."""
    def fn(x, y):
        t = torch.amax(x, dim=0) * 3
        s = y.sum()
        return t.sum() + s.sum(), s.argmax(), s.softmax(0), torch.max(s, 0)[0]

    _assert_same_call(fn, lambda: [torch.randn(3, device=device), torch.randn(4, device=device)])


def test_reductions_over_an_empty_dim(generated_kernels, device):
    def fn(x, i):
        return x.sum(0) + 1, x.prod(0), (x > 0).any(0), x.var(0), i.sum(0), x.mean(0)

    _assert_same_call(fn, lambda: [torch.randn(0, 3, device=device),
                                   torch.randint(0, 5, (0, 3), device=device)])


def test_zero_element_pointwise_views_and_layer_norm(generated_kernels, device):
    def fn(x, y):
        return (x * 2 + 1, torch.full_like(x, 2.0) + x, x.t().contiguous(),
                F.layer_norm(x, (3,)), torch.cat([x, y, x]) * 2)

    _assert_same_call(fn, lambda: [torch.randn(0, 3, device=device),
                                   torch.randn(2, 3, device=device)])


def test_a_masked_load_at_a_constant_offset(generated_kernels, device):
    """Fuzz seed 126 (the H200's `kiln_poi_view_arange...` compile failure): `x[0] = 1` reads
    the 0-dim constant at offset 0 inside a `cat` piece's mask; a block mask on a scalar
    pointer does not compile."""
    def fn(x):
        t = torch.cat([torch.sigmoid(x)] * 2)
        x[0] = 1
        return torch.stack([x, x]), t

    _assert_same_call(fn, lambda: [torch.randn(3, device=device)])


def test_a_masked_gather_with_an_index_from_a_constant_offset(generated_kernels, device):
    """Fuzz seed 2051: the gather index is loaded at a constant offset, so the gathered pointer
    was a scalar under the block's mask."""
    def fn(x, idx):
        g = torch.gather(x, 0, idx.expand(3))
        return torch.cat([g, x]) * 2

    _assert_same_call(fn, lambda: [torch.randn(3, device=device),
                                   torch.randint(0, 3, (1,), device=device)])


def test_cat_reads_each_piece_only_inside_its_range(generated_kernels, device):
    """An empty piece between others was loaded under a mask wider than its range (its null
    pointer: a segfault in the interpreter, an illegal address on CUDA), and a middle piece
    was read before its storage for the elements of the pieces in front of it."""
    def fn(a, b, c):
        return torch.cat([a, b, c, a], 1) * 2, torch.cat([b, c, b, a], 1).sum(0)

    _assert_same_call(fn, lambda: [torch.randn(2, 1, device=device),
                                   torch.randn(2, 0, device=device),
                                   torch.randn(2, 3, device=device)])


def test_cat_of_mixed_dtypes_promotes_every_piece(generated_kernels, device):
    """The pieces were converted to the first piece's dtype: int64 first truncated the floats."""
    def fn(i, x, h, m):
        return torch.cat([i, x, m]), torch.cat([h, x]), torch.cat([m, i])

    _assert_same_call(fn, lambda: [torch.randint(-5, 5, (2,), device=device),
                                   torch.randn(3, device=device),
                                   torch.randn(2, device=device).to(torch.bfloat16),
                                   torch.rand(2, device=device) > 0.5])


# -- torch's OpInfo samples (benchmarks/sweep_opinfo.py) ------------------------------------------

def test_a_reshape_of_a_zero_element_tensor(generated_kernels, device):
    """OpInfo's pixel_shuffle sample [1, 1, 1, 0]: the view's index divided by a 0 extent
    ('index modulo by 0', an eager fallback with a warning)."""
    def fn(x, y):
        return F.pixel_shuffle(x, 1) + 1, y.reshape(2, 2, 0) * 2, x.reshape(0, 3, 5)

    _assert_same_call(fn, lambda: [torch.randn(1, 1, 1, 0, device=device),
                                   torch.randn(1, 1, 4, 0, device=device)])


def test_gather_and_index_select_of_a_0dim_tensor(generated_kernels, device):
    def fn(x, i, j):
        return torch.gather(x, 0, i) * 2, torch.index_select(x, 0, j) + 1

    _assert_same_call(fn, lambda: [torch.randn((), device=device),
                                   torch.zeros((), dtype=torch.long, device=device),
                                   torch.zeros(1, dtype=torch.long, device=device)])


def test_a_library_call_returning_a_list_of_tensors(generated_kernels, device):
    """histogramdd's bin edges come from `_histogramdd_bin_edges` (`-> Tensor[]`): the wrapper
    bound the whole list to its first output."""
    def fn(x):
        hist, edges = torch.histogramdd(x.cpu(), (2, 3), density=False)
        return hist * 2, [e + 1 for e in edges]

    _assert_same_call(fn, lambda: [torch.randn(6, 2, device=device)])


def test_training_through_reductions_with_indices_of_a_0dim_tensor(generated_kernels, device):
    """OpInfo's kthvalue / max(dim) / topk samples of a 0-dim tensor: their backward scatters
    the gradient into a 0-dim tensor, which the scatter rule indexed by a dim it has not."""
    import kiln

    def fn(x):
        return (torch.kthvalue(x, 1, 0, True)[0] * 2 + torch.max(x, 0)[0]
                + torch.topk(x, 1)[0].sum())

    compiled = kiln.compile(fn, backend="kiln")
    for _ in range(2):
        x = torch.randn((), device=device, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        out, want = compiled(x), fn(x2)
        torch.testing.assert_close(out, want)
        out.backward()
        want.backward()
        torch.testing.assert_close(x.grad, x2.grad)
