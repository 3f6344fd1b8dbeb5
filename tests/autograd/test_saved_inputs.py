"""A compiled graph is one autograd node; eager's graph is many, each checking only what it saved.
Found by the fuzzer's gradient check (`kiln fuzz --grad`, seeds 3501465 and 3502200): a graph
input the backward saves and the program writes in place afterwards must make a backward refuse
only when that backward reads it, and an input no output depends on must not tie the graph to
its history. Each case is compared with eager's gradients, or eager's error."""
from __future__ import annotations

import pytest
import torch

import kiln

# the kiln backend through its pipeline (Triton's interpreter on the CPU): on the CPU by default
# it runs captured graphs as torch ops, with no compiled autograd node to test
pytestmark = pytest.mark.usefixtures("generated_kernels")

def _square_and_negate(x):
    return x * x, -x  # x * x saves x for its backward; -x saves nothing


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_an_input_written_after_the_call_refuses_only_the_backward_that_reads_it(backend):
    compiled = kiln.compile(_square_and_negate, backend=backend)
    for fn, name in ((_square_and_negate, "eager"), (compiled, "kiln")):
        leaf = torch.randn(4, 3, requires_grad=True)
        x = leaf * 1
        square, negated = fn(x)
        x.add_(1)  # the program writes the input in place after the call
        (grad,) = torch.autograd.grad(negated.sum(), leaf, retain_graph=True)
        torch.testing.assert_close(grad, -torch.ones_like(leaf), msg=name)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(square.sum(), leaf)


def _normalize_then_clamp(x, norm):
    y = -x
    t = norm(x)  # saves x; its output is not used
    print("break", file=open("/dev/null", "w"))  # a graph break: t reaches the next graph
    x.clamp_(-1, 1)
    return y + 0 * x.detach(), t.shape[0]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_value_no_output_depends_on_does_not_run_its_history_backward(backend):
    norm = torch.nn.LayerNorm(3)
    compiled = kiln.compile(_normalize_then_clamp, backend=backend)
    for _ in range(2):
        leaf = torch.randn(2, 3, requires_grad=True)
        got = compiled(leaf * 1, norm)[0]
        want = _normalize_then_clamp(leaf * 1, norm)[0]
        wrt = [leaf, *norm.parameters()]
        got_grads = torch.autograd.grad(got.sum(), wrt, allow_unused=True)
        want_grads = torch.autograd.grad(want.sum(), wrt, allow_unused=True)
        assert [g is None for g in got_grads] == [g is None for g in want_grads]
        torch.testing.assert_close(got_grads[0], want_grads[0])


def _write_a_row(x, unused, number):
    x[0] = 1
    return (x,)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_written_input_the_backward_reads_sizes_from_is_saved_as_a_copy(backend):
    """Fuzz --grad seed 3600659: the symbolic backward reads the written input's size, the kiln
    wrapper hands the input back as an as_strided view made under no_grad, and the epilogue's
    write into the input then made unpacking it raise "a view was created in no_grad mode"."""
    compiled = kiln.compile(_write_a_row, backend=backend)
    for n, number in ((2, -2), (3, -4), (4, -6), (5, -8)):
        leaf = torch.randn(1, n, dtype=torch.bfloat16, requires_grad=True)
        other = torch.randn(1, 1, requires_grad=True)
        got = compiled(leaf * 1, other * 1, number)[0]
        want = _write_a_row(leaf * 1, other * 1, number)[0]
        torch.testing.assert_close(got, want)
        weight = torch.randn(1, n)
        (got_grad,) = torch.autograd.grad((got.float() * weight).sum(), leaf)
        (want_grad,) = torch.autograd.grad((want.float() * weight).sum(), leaf)
        torch.testing.assert_close(got_grad, want_grad)


def _scale_then_variance(x):
    x.mul_(0.5)
    return x.var(dim=0, correction=0)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_the_saved_copy_of_a_written_strided_input_keeps_its_strides(backend):
    """Fuzz --grad seed 3602079: the forward saves a copy of a written input for the backward,
    which was compiled for the input's strides; `clone()` of `x[:, ::2]` is dense, so the
    backward read it at stride 2, past its end (garbage gradients on the CPU, a fault on
    CUDA)."""
    compiled = kiln.compile(_scale_then_variance, backend=backend)
    for n in (2, 3, 4, 3):
        leaf = torch.randn(n, 2, requires_grad=True)
        got = compiled((leaf * 1)[:, ::2])
        want = _scale_then_variance((leaf * 1)[:, ::2])
        torch.testing.assert_close(got, want)
        (got_grad,) = torch.autograd.grad(got.sum(), leaf)
        (want_grad,) = torch.autograd.grad(want.sum(), leaf)
        torch.testing.assert_close(got_grad, want_grad)


def _shift_zero_square(x):
    t = x - 0.25
    x[x > 0] = 0
    return t * t


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_written_strided_input_gets_eagers_gradients(backend):
    """Fuzz --grad seed 3701256: a trace stand-in laid out like `x[:, ::2]` (gaps) was saved for
    the backward, which the kiln backend stored dense and read at the gaps' strides (garbage
    gradients). Stand-ins are dense clones."""
    compiled = kiln.compile(_shift_zero_square, backend=backend)
    for n in (3, 3, 4):
        leaf = torch.randn(n, 6, requires_grad=True)
        got = compiled((leaf * 1)[:, ::2])
        want = _shift_zero_square((leaf * 1)[:, ::2])
        torch.testing.assert_close(got, want)
        (got_grad,) = torch.autograd.grad(got.sum(), leaf)
        (want_grad,) = torch.autograd.grad(want.sum(), leaf)
        torch.testing.assert_close(got_grad, want_grad)


def _max_then_clamp_it(x0, x2):
    t2 = torch.amax(x2 * x0, dim=2)  # amax saves its own output for its backward
    s = x2.float().sum().item()  # a graph break: t2 is an output of the first graph
    t4 = x2 * s
    t2.clamp_(-1, 1)  # writes the saved output; no loss uses t2
    return t4


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_graph_no_gradient_reaches_does_not_check_its_saved_outputs(backend):
    """Fuzz seed 4102250 (--grad): the second graph returned None for t2, yet autograd called
    the first graph's node with only None gradients, and reading its saved tensors raised
    "modified by an inplace operation" for the clamped t2, where eager never reaches amax."""
    compiled = kiln.compile(_max_then_clamp_it, backend=backend)
    for n in (5, 5):
        leaves = torch.randn(1, n, 2, requires_grad=True), \
            torch.randn(n, n).half().requires_grad_(True)
        results = []
        for fn in (_max_then_clamp_it, compiled):
            out = fn((leaves[0] * 1)[..., ::2], leaves[1] * 1)
            results.append(torch.autograd.grad((out.float() * 2).sum(), leaves, allow_unused=True))
        (want0, want1), (got0, got1) = results
        assert want0 is None and got0 is None
        torch.testing.assert_close(got1, want1)
