"""The epilogue: built from a traced JointGraph, it finishes the compiled graph's outputs as the
captured graph returns them, and survives a trip through plain data (`output_structure`,
`from_structure`), which is what the kiln backend's warm start stores."""
from __future__ import annotations

import pytest
import torch

from kiln.autograd import aot_compile, trace_inference
from kiln.autograd.epilogue import Epilogue, OutputRule


def _graph(x, y):
    s = torch.sin(x) * y
    return (s, x), (x[1:], 3, s), (y.t(), None)


def _traced(fn):
    gm = torch.fx.symbolic_trace(fn)
    return gm, trace_inference(gm, [torch.randn(4, 6), torch.randn(4, 6)])


def test_the_epilogue_finishes_what_the_compiled_graph_returns():
    gm, joint = _traced(_graph)
    epilogue = Epilogue.of(joint)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    got = epilogue([x, y], tuple(joint.gm(x, y)))
    want = _graph(x, y)
    assert [type(part) for part in got] == [tuple] * 3 and not epilogue.passes_outputs_through
    torch.testing.assert_close(got[0][0], want[0][0])
    assert got[0][1] is x and got[1][2] is got[0][0] and got[1][1] == 3 and got[2][1] is None
    assert got[1][0].data_ptr() == x[1:].data_ptr() and got[1][0].shape == (3, 6)
    assert got[2][0].data_ptr() == y.data_ptr() and got[2][0].stride() == (1, 6)


def test_the_epilogue_survives_plain_data():
    _, joint = _traced(_graph)
    epilogue = Epilogue.of(joint)
    structure = epilogue.output_structure()
    assert structure[:2] == ((0, 1), (2, 3, 4))
    again = Epilogue.from_structure(list(epilogue.outputs), structure)
    assert again == epilogue
    with pytest.raises(ValueError, match="each output once, in order"):
        Epilogue.from_structure(list(epilogue.outputs), ((1, 0), *structure[1:]))


def test_a_plain_tuple_of_computed_tensors_passes_through():
    _, joint = _traced(lambda x, y: (x * y, x + y))
    epilogue = Epilogue.of(joint)
    assert epilogue.passes_outputs_through
    outs = (torch.ones(1), torch.zeros(1))
    assert epilogue([], outs) is outs
    assert Epilogue.from_structure([OutputRule("tensor")] * 2, (0, 1)).passes_outputs_through
    assert not Epilogue.from_structure([OutputRule("tensor")] * 2, [0, 1]).passes_outputs_through


def test_a_compiled_graph_hands_out_its_inference_epilogue_only_when_self_contained():
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    fn, epilogue = aot_compile(torch.fx.symbolic_trace(_graph), [x, y]).compiled_inference()
    assert isinstance(fn, torch.fx.GraphModule) and epilogue.output_structure()[1] == (2, 3, 4)

    def writes(x, y):
        x.add_(1)
        return x * y

    assert aot_compile(torch.fx.symbolic_trace(writes), [x, y]).compiled_inference() is None


def _dtype_views(x, z):
    return (torch.view_as_complex(x), torch.view_as_real(z), x.view(torch.int32),
            torch.view_as_complex(x[1:]), torch.view_as_real(z)[:, 1], z.view(torch.float64))


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_outputs_viewing_an_input_as_another_dtype_keep_dtype_and_alias(backend, generated_kernels):
    """view_as_complex of an input came back as a float32 tensor of the complex shape (the
    epilogue regenerated the view in the input's dtype)."""
    import kiln
    compiled = kiln.compile(_dtype_views, backend=backend)
    for rows in (5, 7):
        x = torch.randn(rows, 2)
        z = torch.randn(rows, 3, dtype=torch.complex64)
        got, want = compiled(x, z), _dtype_views(x, z)
        for g, w in zip(got, want):
            assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
            assert g.data_ptr() == w.data_ptr() and torch.equal(g, w)
        got[0].mul_(2)  # an alias, as in eager: the input sees the write
        assert torch.equal(torch.view_as_real(got[0]), x)


def test_gradients_flow_through_an_output_viewing_an_input_as_complex():
    import kiln
    fn = lambda x: torch.view_as_complex(x)  # noqa: E731
    x = torch.randn(6, 2, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out = kiln.compile(fn, backend="aot_eager")(x)
    want = fn(x2)
    assert out.dtype == torch.complex64 and torch.equal(out.detach(), want.detach())
    weights = torch.randn(6, dtype=torch.complex64)
    (out * weights).real.sum().backward()
    (want * weights).real.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_an_output_that_is_a_conjugate_view_keeps_its_conjugation_in_training():
    """fft.ifft returns a conjugate view of an intermediate (`_conj`); the training path made it
    again from its base with as_strided, which drops the conjugate bit: the output came back
    conjugated (wrong imaginary parts) whenever an input required grad."""
    import kiln
    fn = lambda a: torch.fft.ifft(a)  # noqa: E731
    x = torch.randn(6, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out, want = kiln.compile(fn, backend="aot_eager")(x), fn(x2)
    torch.testing.assert_close(out, want)
    weights = torch.randn(6, dtype=torch.complex64)
    (out * weights).real.sum().backward()
    (want * weights).real.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
