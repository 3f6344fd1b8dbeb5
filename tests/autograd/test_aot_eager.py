"""End to end: kiln.compile(..., backend="aot_eager") (capture + autograd stage, graphs run as torch
code) against eager PyTorch. Outputs, every parameter gradient, input gradients, parameters and
buffers are compared after every SGD step (fp32, rtol 1e-4, atol 1e-5) on fresh random inputs."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
import kiln.logs
import kiln.backends.aot_eager as aot_eager_module
from kiln.autograd import DoubleBackwardError, aot_compile
from kiln.autograd.compiled_graph import EagerVariant, InferenceVariant, TrainingVariant
from kiln.tools.seed_model import TransformerBlock, seed_sizes

RTOL, ATOL = 1e-4, 1e-5


def close(actual, expected, what):
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")
from models import GPT, TinyResNet


# -- models ------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


class InPlace(nn.Module):
    """In-place ops on intermediates and mutation through slice/select views and t_()."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h.add_(1.0)
        h[:, :3].mul_(2.0)                 # through a slice view
        h.select(1, 4).sub_(x[:, 0])       # through a select view
        g = torch.sigmoid(h).clone()
        g.t_()                             # metadata mutation of an intermediate
        y = g.t() * h
        y += x                             # augmented assignment
        return y.relu_()


class NoGradInside(nn.Module):
    """no_grad blocks inside forward, mutating buffers under no_grad."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            self.calls.add_(1)
            self.ema.mul_(0.9).add_(0.1 * h.mean(0))
            scale = h.abs().amax() + 1.0
        return h / scale + self.ema


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 12, bias=False)
        self.dec = nn.Linear(12, 8, bias=False)
        self.mid = nn.Linear(12, 12)

    def forward(self, x):
        h = torch.tanh(self.mid(x @ self.enc.weight.t()))
        return h @ self.enc.weight + self.dec(h)   # the encoder weight is used twice


class ManyOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h.sin(), h.cos(), h.argmax(-1), (h > 0).sum()


class Dropper(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 256)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.fc(x))


# -- the models of the issue ---------------------------------------------------------------------

def test_mlp_layernorm_gelu_with_frozen_subset(train_check):
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    model.norm.bias.requires_grad_(False)
    result = train_check(model, lambda: (torch.randn(5, 16, requires_grad=True),))
    assert result.model.fc1.weight.grad is None and result.model.norm.bias.grad is None


def test_mlp_all_parameters_and_input_grad(train_check):
    train_check(MLP(), lambda: (torch.randn(5, 16, requires_grad=True),))


def test_seed_block_trains_like_eager_through_backend_name(monkeypatch, train_check):
    """The seed TransformerBlock, kiln.compile(backend="aot_eager"), 3 SGD steps."""
    made = []
    real = aot_eager_module.aot_compile
    monkeypatch.setattr(aot_eager_module, "aot_compile",
                        lambda gm, inputs, **kw: made.append(real(gm, inputs, **kw)) or made[-1])
    d_model, nhead, shape = seed_sizes("cpu")
    train_check(TransformerBlock(d_model, nhead), lambda: (torch.randn(*shape),), steps=3,
                backend="aot_eager")
    variants = [v for compiled in made for v in compiled.variants.values()]
    assert variants and all(isinstance(v, TrainingVariant) for v in variants)


def test_seed_block_input_grad(train_check):
    train_check(TransformerBlock(32, 4), lambda: (torch.randn(2, 6, 32, requires_grad=True),))


def test_seed_block_inference_eval_no_grad(aot_backend):
    d_model, nhead, shape = seed_sizes("cpu")
    block = TransformerBlock(d_model, nhead).eval()
    compiled = kiln.compile(block, backend=aot_backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(*shape)
        with torch.no_grad():
            out, expected = compiled(x), block(x)
        close(out, expected, "eval + no_grad output")
        assert out.grad_fn is None
    aot_backend.assert_compiled(training=False)
    [variant] = aot_backend.variants()
    assert isinstance(variant, InferenceVariant)
    targets = {str(n.target) for n in variant.joint.gm.graph.nodes}
    assert "aten._native_multi_head_attention.default" not in targets


def test_gpt_trains_like_eager(train_check):
    model = GPT()

    def inputs():
        idx = torch.randint(0, 64, (2, 16))
        return idx, torch.randint(0, 64, (2, 16))

    train_check(model, inputs, loss_of=lambda out: out[1])
    assert model.transformer.wte.weight is model.lm_head.weight


def test_gpt_inference_last_position(aot_backend):
    model = GPT().eval()
    compiled = kiln.compile(model, backend=aot_backend, fullgraph=True)
    idx = torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        (logits, loss), (expected, _) = compiled(idx), model(idx)
    assert loss is None
    close(logits, expected, "logits")
    aot_backend.assert_compiled(training=False)


# -- BatchNorm, dropout ------------------------------------------------------------------------

def test_batchnorm1d_train_running_stats(train_check):
    result = train_check(BatchNormNet(), lambda: (torch.randn(16, 6, requires_grad=True),))
    assert int(result.model.bn.num_batches_tracked) == 3


def test_batchnorm_train_mutations_are_forward_outputs(aot_backend):
    model = BatchNormNet()
    compiled = kiln.compile(model, backend=aot_backend, fullgraph=True)
    compiled(torch.randn(16, 6, requires_grad=True))
    [variant] = aot_backend.variants()
    sources = [variant.joint.input_sources[i] for i in variant.joint.mutated_inputs]
    assert sorted(sources) == ["self.bn.num_batches_tracked", "self.bn.running_mean",
                               "self.bn.running_var"]


def test_batchnorm1d_eval(train_check):
    model = BatchNormNet()
    model.bn.running_mean.normal_()
    model.bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    result = train_check(model, lambda: (torch.randn(16, 6, requires_grad=True),))
    assert int(result.model.bn.num_batches_tracked) == 0


def test_batchnorm2d_resnet_train_and_eval(train_check):
    model = TinyResNet()
    train_check(model, lambda: (torch.randn(4, 3, 16, 16),))
    model.eval()
    kiln.reset()
    train_check(model, lambda: (torch.randn(4, 3, 16, 16),), steps=1)


def test_dropout_p0_is_exact(train_check):
    result = train_check(Dropper(0.0), lambda: (torch.randn(32, 64, requires_grad=True),))
    for got, expected in zip(result.compiled_outputs, result.eager_outputs):
        assert torch.equal(got, expected)


def test_dropout_half_mask_statistics_and_gradient(aot_backend):
    model = Dropper(0.5)
    compiled = kiln.compile(model, backend=aot_backend, fullgraph=True)
    x = torch.randn(32, 64, requires_grad=True)
    out = compiled(x)
    mask = out != 0
    fraction = 1.0 - mask.float().mean().item()
    sigma = (0.25 / mask.numel()) ** 0.5
    assert abs(fraction - 0.5) < 4 * sigma, f"dropped {fraction:.4f}"
    t = torch.randn_like(out)
    out.backward(t)
    pre = model.fc(x.detach()).detach()
    close(out, pre * mask / 0.5, "dropout output = input * mask / (1 - p)")
    close(model.fc.bias.grad, (t * mask / 0.5).sum(0), "bias grad = sum(t * mask / (1 - p))")
    aot_backend.assert_compiled(training=True)


def test_dropout_reproducible_under_manual_seed(aot_backend):
    compiled = kiln.compile(Dropper(0.5), backend=aot_backend, fullgraph=True)
    x = torch.randn(8, 64)
    torch.manual_seed(7)
    first, second = compiled(x), compiled(x)
    torch.manual_seed(7)
    again = compiled(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, second), "consecutive calls must draw new masks"


def test_eager_rng_consumes_the_generator_like_eager(set_eager_rng, aot_backend):
    """KILN_EAGER_RNG=1: random ops are not decomposed and unused ones are kept, so the
    generator advances exactly as in eager (masks bit-identical)."""
    set_eager_rng(True)

    def fn(x):
        unused = F.dropout(x, 0.3)  # noqa: F841  eager draws for it anyway
        return F.dropout(x.sin(), 0.5), torch.rand(3)

    compiled = kiln.compile(fn, backend=aot_backend, fullgraph=True)
    x = torch.randn(16, 16)
    torch.manual_seed(3)
    got, got_rand = compiled(x)
    after = torch.rand(4)
    torch.manual_seed(3)
    expected, expected_rand = fn(x)
    assert torch.equal(got, expected) and torch.equal(got_rand, expected_rand)
    assert torch.equal(after, torch.rand(4))
    aot_backend.assert_compiled()


# -- mutation, aliasing, grad modes ----------------------------------------------------------------

def test_inplace_ops_and_mutation_through_views(train_check):
    train_check(InPlace(), lambda: (torch.randn(6, 8, requires_grad=True),))


def test_no_grad_blocks_and_buffer_counters(train_check):
    model = NoGradInside()
    versions = model.calls._version
    result = train_check(model, lambda: (torch.randn(5, 8, requires_grad=True),))
    assert int(result.model.calls) == 3 and int(result.eager_model.calls) == 3
    assert result.model.calls._version > versions


def test_tied_weights(train_check):
    train_check(Tied(), lambda: (torch.randn(4, 8, requires_grad=True),))


def test_unused_outputs_and_integer_outputs(train_check):
    result = train_check(ManyOutputs(), lambda: (torch.randn(4, 8, requires_grad=True),),
                         loss_of=lambda out: (out[0] * 3).sum())
    for got, expected in zip(result.compiled_outputs, result.eager_outputs):
        assert torch.equal(got[2], expected[2]) and got[2].dtype == torch.long
        assert torch.equal(got[3], expected[3])
        assert not got[2].requires_grad and got[1].requires_grad


def test_inputs_reached_only_through_ignored_outputs_get_no_gradient(aot_backend):
    """Eager never reaches an input through outputs the loss ignores, so its .grad stays None
    (zeros would differ: an optimizer with weight decay moves a parameter whose grad is zero)."""
    def fn(x, y):
        return x * x, y * 3

    compiled = kiln.compile(fn, backend=aot_backend, fullgraph=True)
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    a, b = compiled(x, y)
    a.sum().backward(retain_graph=True)
    assert y.grad is None
    close(x.grad, 2 * x.detach(), "x.grad")
    b.sum().backward()
    close(y.grad, torch.full((3,), 3.0), "y.grad")
    aot_backend.assert_compiled(training=True)


def test_user_input_mutation_is_written_back(aot_backend):
    def fn(x, y):
        x.mul_(2).add_(y.detach())
        return x * y

    compiled = kiln.compile(fn, backend=aot_backend, fullgraph=True)
    for _ in range(2):
        x, y = torch.randn(5), torch.randn(5, requires_grad=True)
        x_eager, y_eager = x.clone(), y.detach().clone().requires_grad_()
        out, expected = compiled(x, y), fn(x_eager, y_eager)
        close(out, expected, "output")
        close(x, x_eager, "mutated input")
        out.sum().backward()
        expected.sum().backward()
        close(y.grad, y_eager.grad, "y.grad")
    aot_backend.assert_compiled(training=True)


def test_leaf_requiring_grad_written_under_no_grad(aot_backend):
    """Eager allows writing a leaf that requires grad under no_grad: compiled, written back."""
    def fn(w, x):
        with torch.no_grad():
            w.mul_(0.5)
        return (w * x).sum()

    w, x = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    w_eager, x_eager = (t.detach().clone().requires_grad_() for t in (w, x))
    compiled = kiln.compile(fn, backend=aot_backend, fullgraph=True)
    out = compiled(w, x)
    expected = fn(w_eager, x_eager)
    out.backward()
    expected.backward()
    close(out, expected, "output")
    close(w, w_eager, "w")
    assert w.is_leaf and w.requires_grad
    close(w.grad, w_eager.grad, "w.grad")
    close(x.grad, x_eager.grad, "x.grad")
    aot_backend.assert_compiled(training=True)


def test_mutated_inputs_sharing_memory(caplog):
    """Traced apart, called aliased: eager (with a warning). Traced aliased: compiled through a
    synthetic base; called apart later: eager again."""
    def fn(a, b):
        a.add_(1)
        return a * b

    gm = torch.fx.symbolic_trace(fn)
    base = torch.randn(6)
    compiled = aot_compile(gm, [base.clone(), base.clone()])
    assert all(isinstance(v, InferenceVariant) for v in compiled.variants.values())
    with caplog.at_level(logging.WARNING, logger="kiln"):
        shared = base.clone()
        out = compiled(shared, shared[:6])  # b aliases the mutated a at this call
    expected_base = base.clone()
    expected = fn(expected_base, expected_base[:6])
    close(out, expected, "output")
    close(shared, expected_base, "mutated input")
    assert "shares memory with another input" in caplog.text
    aliased = aot_compile(gm, [shared, shared])  # the same tensor twice
    assert all(isinstance(v, InferenceVariant) for v in aliased.variants.values())
    x = torch.randn(6)
    x_eager = x.clone()
    close(aliased(x, x), fn(x_eager, x_eager), "output through the synthetic base")
    close(x, x_eager, "mutated input")
    y, z = torch.randn(6), torch.randn(6)
    y_eager, z_eager = y.clone(), z.clone()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        close(aliased(y, z), fn(y_eager, z_eager), "output")
    close(y, y_eager, "mutated input")
    assert "do not at this call" in caplog.text


def test_duplicate_and_overlapping_inputs():
    """The same tensor passed twice, and a tensor with its own transpose: each position gets its
    own gradient and autograd sums them, as in eager."""
    def fn(a, b):
        return (a @ b.sin()).sum()

    gm = torch.fx.symbolic_trace(fn)
    x = torch.randn(4, 4, requires_grad=True)
    for second in (lambda t: t, lambda t: t.t()):
        compiled = aot_compile(gm, [x, second(x)])
        x.grad = None
        compiled(x, second(x)).backward()
        xe = x.detach().clone().requires_grad_()
        fn(xe, second(xe)).backward()
        close(x.grad, xe.grad, "x.grad")
        assert all(isinstance(v, TrainingVariant) for v in compiled.variants.values())


def test_output_aliasing_an_input_is_a_view_of_it(aot_backend):
    def fn(x, y):
        return x, x.t(), x[1:] * y

    compiled = kiln.compile(fn, backend=aot_backend, fullgraph=True)
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    same, view, prod = compiled(x, y)
    assert same is x
    assert view._base is x and view.data_ptr() == x.data_ptr() and view.shape == (4, 3)
    (view * torch.arange(12.0).view(4, 3)).sum().backward(retain_graph=True)
    close(x.grad, torch.arange(12.0).view(4, 3).t(), "grad through the aliased view")
    prod.sum().backward()
    close(y.grad, x[1:].detach().sum(0), "y.grad")


def test_retain_graph_and_double_backward(aot_backend):
    model = MLP()
    compiled = kiln.compile(model, backend=aot_backend, fullgraph=True)
    x = torch.randn(3, 16, requires_grad=True)
    out = compiled(x).square().sum()
    out.backward(retain_graph=True)
    first = x.grad.clone()
    out.backward()
    close(x.grad, 2 * first, "second backward with retain_graph")
    y = compiled(torch.randn(3, 16, requires_grad=True)).sum()
    with pytest.raises(DoubleBackwardError, match=r"^\[kiln.autograd\] double backward"):
        torch.autograd.grad(y, list(model.parameters()), create_graph=True)


def test_noncontiguous_and_expanded_tangents(aot_backend):
    def fn(x, w):
        h = x @ w
        return h.t(), h.sum(0)

    compiled = kiln.compile(fn, backend=aot_backend, fullgraph=True)
    x, w = torch.randn(5, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    xe, we = (t.detach().clone().requires_grad_() for t in (x, w))
    transposed, summed = compiled(x, w)
    et, es = fn(xe, we)
    grad_t = torch.randn(5, 6).t()            # non-contiguous tangent
    grad_s = torch.randn(1).expand(6)         # expanded (0-stride) tangent
    torch.autograd.backward([transposed, summed], [grad_t, grad_s])
    torch.autograd.backward([et, es], [grad_t, grad_s])
    close(x.grad, xe.grad, "x.grad")
    close(w.grad, we.grad, "w.grad")


def test_whole_call_under_no_grad_builds_no_function(aot_backend):
    model = MLP()
    compiled = kiln.compile(model, backend=aot_backend, fullgraph=True)
    x = torch.randn(3, 16)
    with torch.no_grad():
        out = compiled(x)
    assert out.grad_fn is None
    close(out, model(x), "output")
    aot_backend.assert_compiled(training=False)


# -- custom ops, direct backend calls, hooks ------------------------------------------------------

@torch.library.custom_op("kiln_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_tanh_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _scaled_tanh_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


class CustomOpNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.ops.kiln_test.scaled_tanh(self.fc(x), 1.5).sum(-1)


def test_custom_op_is_one_node_with_its_gradient(train_check, aot_backend):
    train_check(CustomOpNet(), lambda: (torch.randn(4, 8, requires_grad=True),))
    [variant] = aot_backend.variants()
    targets = [str(n.target) for n in variant.joint.gm.graph.nodes]
    assert targets.count("kiln_test.scaled_tanh.default") == 1


def test_symbolic_trace_module_lifts_parameters_and_buffers():
    model = BatchNormNet()
    eager = BatchNormNet()
    eager.load_state_dict(model.state_dict())
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(8, 6, requires_grad=True)
    compiled = aot_compile(gm, [x])
    for _ in range(2):
        x = torch.randn(8, 6, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        out, expected = compiled(x), eager(xe)
        close(out, expected, "output")
        out.square().sum().backward()
        expected.square().sum().backward()
        close(x.grad, xe.grad, "x.grad")
    for (name, p), (_, q) in zip(gm.named_parameters(), eager.named_parameters()):
        close(p.grad, q.grad, f"{name}.grad")
    for (name, b), (_, c) in zip(gm.named_buffers(), eager.named_buffers()):
        close(b, c, name)


def test_joint_passes_run_before_partitioning():
    seen = []

    def count_nodes(joint):
        seen.append((joint.training, len(joint.gm.graph.nodes)))
        return joint

    gm = torch.fx.symbolic_trace(lambda x: (x.sin() * 2).sum())
    compiled = aot_compile(gm, [torch.randn(3, requires_grad=True)], joint_passes=[count_nodes])
    compiled(torch.randn(3, requires_grad=True)).backward()
    assert len(seen) == 1 and seen[0][0] is True


def test_aot_graphs_log_shows_graphs_and_saved_values(capsys):
    kiln.logs.set_logs("aot_graphs")
    compiled = kiln.compile(MLP(), backend="aot_eager", fullgraph=True)
    compiled(torch.randn(2, 16, requires_grad=True)).sum().backward()
    err = capsys.readouterr().err
    for section in ("joint graph:", "forward graph:", "saved for backward:", "backward graph:"):
        assert f"[kiln:aot_graphs] {section}" in err, section


# -- CUDA (the GPU machine): device-specific traces -----------------------------------------------

@pytest.mark.gpu
def test_cuda_seed_block_and_resnet_train_like_eager(train_check):
    d_model, nhead, shape = seed_sizes("cpu")
    train_check(TransformerBlock(d_model, nhead).cuda(),
                lambda: (torch.randn(*shape, device="cuda", requires_grad=True),))
    kiln.reset()
    model = TinyResNet().cuda()   # cudnn_batch_norm: its running-stat writes are found
    result = train_check(model, lambda: (torch.randn(4, 3, 16, 16, device="cuda"),))
    assert int(result.model.bn1.num_batches_tracked) == 3


@pytest.mark.gpu
def test_cuda_dropout_saves_a_mask_and_never_recomputes_it(aot_backend):
    model = Dropper(0.5).cuda()
    compiled = kiln.compile(model, backend=aot_backend, fullgraph=True)
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    out = compiled(x)
    t = torch.randn_like(out)
    out.backward(t)
    mask = out != 0
    close(model.fc.bias.grad, (t * mask / 0.5).sum(0), "bias grad = sum(t * mask / (1 - p))")
    [variant] = aot_backend.variants()
    targets = {str(n.target) for n in variant.joint.gm.graph.nodes}
    assert "aten.native_dropout.default" in targets
    aot_backend.assert_compiled(training=True)  # includes: no random op in the backward


@pytest.mark.parametrize("requires_grad", [False, True])
def test_tensor_keyword_arguments_are_graph_inputs_not_constants(requires_grad):
    """SDPA's `attn_mask=` reaches the ATen graph as a keyword argument: it must be a graph input
    (issue 11: it was printed as a tensor constant, `NameError: name 'float32' is not defined`)."""
    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=requires_grad) for _ in range(3))
    compiled = kiln.compile(attend, backend="aot_eager")
    for _ in range(2):
        mask = torch.randn(1, 1, 6, 6)
        expected = attend(q, k, v, mask)
        actual = compiled(q, k, v, mask)
        close(actual, expected, "output")
        if requires_grad:
            grads = torch.autograd.grad(actual.sum(), (q, k, v))
            expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
            for name, got, want in zip("qkv", grads, expected_grads):
                close(got, want, f"grad {name}")


@pytest.mark.parametrize("batch", [1, 2])
def test_lstm_final_states_keep_eagers_shape_under_torchs_squeeze_bug(monkeypatch, batch):
    """torch 2.11's traced LSTM layer ends with `hx.squeeze(1)` on a [1, batch, hidden] state, so
    h_n / c_n came out [layers, 1, batch, hidden] on CUDA (issue 11). Reproduced on any torch by
    patching the layer to return that shape (mkldnn off, the path CUDA graphs take)."""
    import torch._decomp.decompositions as torch_decomps

    layer = torch_decomps.one_layer_lstm

    def squeezes_dim_1(inp, hidden, *args, **kwargs):
        out, (h, c) = layer(inp, hidden, *args, **kwargs)
        return out, (h.unsqueeze(0).squeeze(1) if batch == 1 else h.unsqueeze(0),
                     c.unsqueeze(0).squeeze(1) if batch == 1 else c.unsqueeze(0))

    monkeypatch.setattr(torch_decomps, "one_layer_lstm", squeezes_dim_1)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    lstm = nn.LSTM(4, 8, num_layers=2)
    x = torch.randn(3, batch, 4)
    state = (torch.randn(2, batch, 8), torch.randn(2, batch, 8))

    def run(x, state):  # the fused op itself: nn.LSTM runs natively between graphs
        out, h, c = torch.lstm(x, state, lstm._flat_weights, True, 2, 0.0, False, False, False)
        return out, (h, c)

    with torch.no_grad():
        ours = kiln.compile(run, backend="aot_eager")(x, state)
        theirs = run(x, state)
    assert [t.shape for t in (ours[0], *ours[1])] == [t.shape for t in (theirs[0], *theirs[1])]
    # on CUDA eager's LSTM is cuDNN's (TF32 by default): values are checked against fp64 in
    # tests/runtime/test_eager_parity.py; here the shapes are the point
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=2e-4)


# -- torch decompositions that differ from eager (benchmarks/sweep_foreign.py) ---------------------

@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_ignores_targets_after_the_first_minus_one(reduction):
    """torch's decomposition of multilabel_margin_loss_forward gathers position 0 for every
    target after a row's -1 and still adds those hinge terms; kiln traces F.multilabel_margin_loss
    as its own composite (`decompositions.FUNCTION_FIXES`), equal to eager with grads."""
    loss = nn.MultiLabelMarginLoss(reduction=reduction)
    compiled = kiln.compile(loss, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(5, 6, requires_grad=True)
        target = torch.randint(0, 6, (5, 6))
        target[torch.rand(5, 6) < 0.3] = -1  # rows end early, at random places
        x2 = x.detach().clone().requires_grad_(True)
        ours, theirs = compiled(x2, target), loss(x, target)
        close(ours, theirs, "loss")
        weight = torch.randn(theirs.shape)
        (ours * weight).sum().backward()
        (theirs * weight).sum().backward()
        close(x2.grad, x.grad, "grad")
    x1 = torch.randn(6)  # unbatched, through torch._C._nn directly
    t1 = torch.tensor([2, 5, -1, 0, 1, 3])
    fn = lambda a, b: torch._C._nn.multilabel_margin_loss(a, b, 2)  # noqa: E731
    close(kiln.compile(fn, backend="aot_eager")(x1, t1), fn(x1, t1), "unbatched sum")


@pytest.mark.explicit_device
@pytest.mark.parametrize("requires_grad", [False, True])
def test_one_hot_range_checks_survive_tracing(requires_grad):
    """one_hot's decomposition checks its classes with `_assert_async.msg` (no users, no tensor
    out): the tracer records it, dead-code removal and the partitioner keep it, so a class out
    of range raises eager's RuntimeError, in inference and in a training graph's forward. CPU
    only: on CUDA eager's check is a device-side assert, which ends the process."""
    def fn(labels, w):
        return F.one_hot(labels, 4).to(w.dtype) @ w

    compiled = kiln.compile(fn, backend="aot_eager")
    w = torch.randn(4, 3, requires_grad=requires_grad)
    labels = torch.randint(0, 4, (5,))
    close(compiled(labels, w), fn(labels, w), "in range")
    for bad in (4, -1):
        labels[2] = bad
        with pytest.raises(RuntimeError, match="one_hot: Class values"):
            compiled(labels, w)
