"""0-dim CPU values computed in a graph on an accelerator (kiln.lower.host_scalars).

Found on the H100 (2026-12-07): the backward of `x[x > 0] = 0` builds `full([], 0,
device=cpu)` for the gradient of the (CPU scalar) values; lowered as written it was a CPU
buffer written by a compiled Triton kernel, refused by the runtime's device check. The
lowering tests trace with fake CUDA tensors, so they run without a GPU; the compiled ones run
on the suite's device (CUDA on the GPU machine, where they exercise the pass)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.lower import lower_graph
from kiln.lower.ir import ExternOutput

aten = torch.ops.aten


def _lowered_on_fake_cuda(fn, *shapes):
    with FakeTensorMode():
        args = [torch.randn(s, device="cuda") for s in shapes]
        gm = make_fx(fn)(*args)
    return lower_graph(gm)


def _devices(graph) -> dict[str, str]:
    return {name: buf.layout.device.type for name, buf in graph.buffers.items()}


@pytest.mark.explicit_device
def test_a_cpu_scalar_feeding_cuda_ops_is_computed_on_cuda():
    def fn(x):
        zero = aten.full.default([], 0.0, dtype=torch.float32, device="cpu")
        return aten.index_put.default(x, [x > 0], aten.alias.default(zero)) * 2

    devices = _devices(_lowered_on_fake_cuda(fn, (3, 4)))
    assert set(devices.values()) == {"cuda"}, devices


@pytest.mark.explicit_device
def test_a_returned_cpu_scalar_stays_on_the_cpu():
    def fn(x):
        s = aten.full.default([], 3.0, dtype=torch.float32, device="cpu")
        return x + s, s

    graph = _lowered_on_fake_cuda(fn, (2, 2))
    returned = graph.outputs[1]
    assert graph.buffers[returned.name].layout.device.type == "cpu"


@pytest.mark.explicit_device
def test_a_returned_cpu_scalar_is_computed_on_cuda_and_copied_to_the_cpu():
    """Found on the H100: `s * 2` returned beside CUDA work was a kernel writing a CPU buffer,
    refused at run time. Only the copy the graph returns lives on the CPU."""
    def fn(x):
        s = aten.full.default([], 3.0, dtype=torch.float32, device="cpu")
        return x * s + aten.exp.default(s), aten.mul.Tensor(s, 2)

    graph = _lowered_on_fake_cuda(fn, (2, 2))
    returned = graph.outputs[1].name
    devices = _devices(graph)
    assert devices.pop(returned) == "cpu"
    assert set(devices.values()) == {"cuda"}, devices
    assert isinstance(graph.buffers[returned], ExternOutput)  # a torch op's, not a kernel's


@pytest.mark.explicit_device
def test_a_cpu_scalar_beside_a_cpu_tensor_stays_on_the_cpu():
    """A 0-dim CUDA tensor cannot meet a CPU tensor in eager: the scalar a CPU op reads stays."""
    with FakeTensorMode():
        x, v = torch.randn(2, 2, device="cuda"), torch.randn(3)
        gm = make_fx(lambda x, v: (x * 2, v * aten.full.default([], 2.0, device="cpu")))(x, v)
    from kiln.lower.host_scalars import move_host_scalars

    moved = move_host_scalars(gm)
    (full,) = [n for n in moved.graph.nodes if n.target is aten.full.default]
    assert full.kwargs["device"] == torch.device("cpu")
    assert full.meta["val"].device.type == "cpu"


def _scaled(x):
    s = torch.full((), 2.5, device="cpu")
    return x * s + s.exp(), s * 2


def _zero_positive_scaled(x):
    t = x * 3.0  # saves nothing of x, which the next line overwrites
    x[x > 0] = 0
    return t + x


@pytest.mark.usefixtures("generated_kernels")
def test_compiled_cpu_scalars_beside_device_tensors_equal_eager(device):
    compiled = kiln.compile(_scaled, backend="kiln")
    x = torch.randn(5, 7, device=device)
    got, want = compiled(x), _scaled(x)
    torch.testing.assert_close(got, want)
    assert got[1].device == want[1].device  # the returned scalar is a CPU tensor in eager


@pytest.mark.usefixtures("generated_kernels")
def test_the_backward_of_a_cpu_scalar_index_put_equals_eager(device):
    compiled = kiln.compile(_zero_positive_scaled, backend="kiln")
    for n in (4, 6):
        leaf = torch.randn(n, 3, device=device, requires_grad=True)
        got = compiled(leaf * 1)
        want = _zero_positive_scaled(leaf * 1)
        torch.testing.assert_close(got, want)
        (got_grad,) = torch.autograd.grad(got.sum(), leaf)
        (want_grad,) = torch.autograd.grad(want.sum(), leaf)
        torch.testing.assert_close(got_grad, want_grad)
