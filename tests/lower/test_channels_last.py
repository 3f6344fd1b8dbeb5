"""The channels-last pass (kiln/lower/channels_last.py): convolution graphs computed in NHWC give
eager's answer, graphs whose outputs would change layout are left alone. On CPU the pass is
switched on by patching its DEVICES (it only runs on CUDA otherwise); the generated kernels run
in the Triton interpreter, on CUDA as real kernels."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.lower import channels_last  # noqa: E402

pytestmark = pytest.mark.usefixtures("generated_kernels")


@pytest.fixture
def applied(monkeypatch, device):
    """The pass on this device; records the copies each graph got (None: not run)."""
    monkeypatch.setattr(channels_last, "DEVICES", (torch.device(device).type,))
    monkeypatch.setattr(channels_last.config, "channels_last", True)
    monkeypatch.setattr(channels_last, "GROUPED_STAY_NCHW", False)  # NHWC for depthwise too
    counts: list[int] = []
    original = channels_last.use_channels_last

    def spy(gm):
        counts.append(original(gm))
        return counts[-1]
    monkeypatch.setattr(channels_last, "use_channels_last", spy)
    return counts


class ConvNet(nn.Module):
    """conv-BN-ReLU twice with a residual, a depthwise conv, global pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Sequential(nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.Hardswish())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.pw(self.dw(x))
        return self.head(x.mean((2, 3)))


class PatchEmbed(nn.Module):
    """A ViT stem: the flatten after the convolutions is a view eager makes of NCHW memory."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 12, 2, stride=2)

    def forward(self, x):
        x = self.conv2(torch.relu(self.conv1(x)))
        return x.flatten(2).transpose(1, 2).softmax(-1)


class ConvNeXtBlock(nn.Module):
    """timm's ConvNeXt block: depthwise conv, LayerNorm over channels through a permute, an MLP,
    a layer scale and the residual; then a squeeze-excite gate as in MobileNetV3."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 2, stride=2)
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)
        self.se_reduce, self.se_expand = nn.Conv2d(dim, 4, 1), nn.Conv2d(4, dim, 1)

    def forward(self, x):
        x = self.stem(x)
        shortcut = x
        y = self.conv_dw(x).permute(0, 2, 3, 1)
        y = self.fc2(nn.functional.gelu(self.fc1(self.norm(y))))
        x = (y * self.gamma).permute(0, 3, 1, 2) + shortcut
        gate = self.se_expand(torch.relu(self.se_reduce(x.mean((2, 3), keepdim=True))))
        return (x * nn.functional.hardsigmoid(gate)).flatten(1)


def _randomize_bn(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.normal_()
            m.bias.data.normal_()
    return model


@pytest.mark.parametrize("make", [ConvNet, PatchEmbed, ConvNeXtBlock])
def test_inference_in_nhwc_equals_eager(applied, device, make):
    model = _randomize_bn(make()).to(device).eval()
    compiled = kiln.compile(model, backend="kiln")
    with torch.no_grad():
        for batch in (2, 2):
            x = torch.randn(batch, 3, 8, 8, device=device)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert applied and applied[0] >= 1  # the input copy (and the flatten's contiguous copy)


def test_by_default_a_graph_with_a_grouped_convolution_keeps_nchw(applied, device, monkeypatch):
    monkeypatch.setattr(channels_last, "GROUPED_STAY_NCHW", True)
    model = _randomize_bn(ConvNet()).to(device).eval()
    with torch.no_grad():
        x = torch.randn(2, 3, 8, 8, device=device)
        torch.testing.assert_close(kiln.compile(model, backend="kiln")(x), model(x),
                                   rtol=1e-4, atol=1e-4)
    assert applied == [0]


def test_a_graph_whose_outputs_would_change_layout_is_left_alone(applied, device):
    """A training forward returns its activations for the backward: they keep eager's strides,
    so the pass does not apply; gradients equal eager's."""
    model = _randomize_bn(ConvNet()).to(device).train()
    reference = _randomize_bn(ConvNet()).to(device).train()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, backend="kiln")
    x = torch.randn(2, 3, 8, 8, device=device)
    compiled(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    assert applied and all(count == 0 for count in applied)


def test_a_pointwise_kernel_walks_its_channels_last_output_in_memory_order():
    """Neighbouring lanes of a pointwise kernel writing an NHWC buffer write neighbouring
    elements (C fastest), not elements C apart."""
    from kiln.codegen.kernel import _define_vars, memory_order
    from kiln.lower import lower_graph
    from kiln.lower.decomposition_tables import trace_aten
    from kiln.schedule import schedule

    x = torch.randn(2, 16, 4, 5).to(memory_format=torch.channels_last)
    graph = lower_graph(trace_aten(lambda t: torch.relu(t * 2 + 1), x))
    (group,) = [s for s in schedule(graph).steps if hasattr(s, "x_ranges")]
    order = memory_order(group)
    assert order is not None and order[-1] == 1  # C innermost
    lines = _define_vars("x", tuple(group.x_ranges), "xindex", order)
    assert "x1 = xindex % 16" in lines
    torch.testing.assert_close(kiln.compile(lambda t: torch.relu(t * 2 + 1), backend="kiln")(x),
                               torch.relu(x * 2 + 1))


def _relayouts_per_call(compiled, x) -> int:
    """Library outputs the wrapper had to copy into the layout the IR recorded, in one call
    after warm-up: a layout the lowering got wrong shows up here (a full copy per call)."""
    from kiln.runtime import wrapper

    with torch.no_grad():
        compiled(x)
        before = wrapper.relayout_copies[0]
        out = compiled(x)
    return out, wrapper.relayout_copies[0] - before


def test_a_depthwise_weight_reaches_the_convolution_in_its_own_layout(device):
    """A (C, 1, k, k) weight's size-1 dim has a stride nothing addresses, but the convolution
    reads it: given stride 1 there, the weight looks channels-last and the library computes in
    NHWC (converting the NCHW input; the output then copied back to NCHW every call, 16 times a
    call in MobileNetV3). The extern gets the weight's own strides."""
    model = _randomize_bn(nn.Sequential(
        nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.Hardswish(),
        nn.Conv2d(16, 16, 5, padding=2, groups=16))).to(device).eval()
    x = torch.randn(2, 3, 12, 12, device=device)
    out, copies = _relayouts_per_call(kiln.compile(model, backend="kiln"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert out.stride() == model(x).stride()
    assert copies == 0


def test_a_max_pool_of_a_channels_last_tensor_stays_channels_last(device):
    """max_pool2d_with_indices returns a pair; its values take eager's (channels-last) layout,
    so the convolution after it reads NHWC as in eager instead of NCHW and a copy back."""
    conv = nn.Conv2d(8, 8, 3, padding=1).to(device).eval()

    def f(x):
        return conv(nn.functional.max_pool2d(torch.relu(x), 3, 2, 1))

    x = torch.randn(2, 8, 12, 12, device=device).to(memory_format=torch.channels_last)
    out, copies = _relayouts_per_call(kiln.compile(f, backend="kiln"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, f(x), rtol=1e-4, atol=1e-4)
        assert out.stride() == f(x).stride()
    assert copies == 0
