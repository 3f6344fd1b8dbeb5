"""Kernels with sizes as arguments (issue 15, stage C): a graph traced with symbolic sizes
compiles once (`compile_graph`), and that one artifact, with the same kernel objects, runs
every size equal to eager: an MLP over batch 1..16, a causal attention block over sequence
lengths up to 64, a reduction over a symbolic dim, a size-1 dim broadcast next to a symbolic
one. The kiln backend compiles such a graph once (`config.symbolic_kernels`) and per size when
the symbolic path cannot compile it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from launch_fakes import FakeCompiledKernel

import kiln.runtime.launcher as launcher_module
from kiln.backends.per_size import SizeCache, SymbolicCompiled, symbolic_or_per_size
from kiln.lower import _compat
from kiln.lower.decomposition_tables import trace_table
from kiln.lower.symbolic import SymbolicShapeError
from kiln.runtime import compile_graph

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _symbolic(fn, example, dynamic=None):
    """The ATen graph of fn with the `dynamic` dims symbolic (input -> dims; None: all)."""
    return _compat.make_symbolic_aten_graph(fn, example, trace_table(), dynamic)


def _launched(artifact) -> list:
    """The kernel objects a call of the artifact launches (its wrapper's globals)."""
    return [artifact.call.__globals__[name] for name in artifact.wrapper.kernels]


def _mlp(x, w1, b1, w2):
    return torch.relu(x @ w1 + b1) @ w2 + x.sum(-1, keepdim=True)


def test_mlp_over_batch_compiles_once(device, kernel_compiles):
    params = (torch.randn(8, 16, device=device), torch.randn(16, device=device),
              torch.randn(16, 4, device=device))
    artifact = compile_graph(_symbolic(_mlp, (torch.randn(6, 8, device=device), *params),
                                       {0: {0}}), [])
    assert artifact.graph.symbolic and all(spec.size_args for spec in artifact.specs)
    kernels, compiled = _launched(artifact), len(kernel_compiles)
    for batch in range(1, 17):
        x = torch.randn(batch, 8, device=device)
        (out,) = artifact(x, *params)
        torch.testing.assert_close(out, _mlp(x, *params), rtol=1e-4, atol=1e-4)
        assert out.abs().sum() > 0
    assert len(kernel_compiles) == compiled  # no kernel compiled after the one compile
    assert _launched(artifact) == kernels


def _attention_block(x, ids, wqkv, wo, g, b, emb):
    batch, length, dim = x.shape
    x = x + F.embedding(ids, emb)
    h = F.layer_norm(x, (dim,), g, b)
    q, k, v = (h @ wqkv).split(dim, dim=-1)
    q, k, v = (t.view(batch, length, 2, dim // 2).transpose(1, 2) for t in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return x + a.transpose(1, 2).reshape(batch, length, dim) @ wo


def _block_params(device, dtype):
    dim = 16
    return tuple(torch.randn(*shape, device=device, dtype=dtype)
                 for shape in ((dim, 3 * dim), (dim, dim), (dim,), (dim,), (50, dim)))


def test_attention_block_over_sequence_compiles_once(device, kernel_compiles):
    """float64 throughout: the kernels' answer against eager's at every length, tightly."""
    params = _block_params(device, torch.float64)

    def inputs(length):
        return (torch.randn(2, length, 16, device=device, dtype=torch.float64),
                torch.randint(0, 50, (2, length), device=device), *params)

    artifact = compile_graph(_symbolic(_attention_block, inputs(7), {0: {1}, 1: {1}}), [])
    compiled = len(kernel_compiles)
    assert artifact.graph.symbolic and artifact.specs
    for length in (1, 2, 3, 5, 17, 63, 64):
        args = inputs(length)
        (out,) = artifact(*args)
        torch.testing.assert_close(out, _attention_block(*args), rtol=1e-9, atol=1e-9)
    assert len(kernel_compiles) == compiled


def _softmax_rows(x, bias):
    h = torch.relu(x + bias)
    return torch.softmax(h, -1), h * 2 - h.sum(-1, keepdim=True)


def test_reduction_over_a_symbolic_dim_is_looped(device, kernel_compiles):
    example = (torch.randn(3, 10, device=device), torch.randn(10, device=device))
    artifact = compile_graph(_symbolic(_softmax_rows, example), [])
    assert {spec.kind for spec in artifact.specs} == {"looped_reduction"}
    for rows, cols in ((3, 5), (5, 17), (4, 63), (2, 1500)):
        args = (torch.randn(rows, cols, device=device), torch.randn(cols, device=device))
        for out, ref in zip(artifact(*args), _softmax_rows(*args)):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _broadcast(x, y):
    return x * y + y.exp(), (x - y).amax(0)


def test_size_one_dim_broadcast_next_to_a_symbolic_dim(device, kernel_compiles):
    example = (torch.randn(4, 6, device=device), torch.randn(4, 1, device=device))
    artifact = compile_graph(_symbolic(_broadcast, example), [])
    for rows, cols in ((3, 5), (17, 2), (2, 33)):
        args = (torch.randn(rows, cols, device=device), torch.randn(rows, 1, device=device))
        for out, ref in zip(artifact(*args), _broadcast(*args)):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _integer_power_of_a_size(x, i):
    return x * x.shape[-1] ** 2 + i.sum()  # an integer power: not in the symbolic lowering yet


def test_unsupported_graph_compiles_per_size(device):
    """An integer power of a size is outside the symbolic path (a float power, `n ** 0.5`, is
    a size scalar since 2026-12-05): per size, right answers."""
    x, i = torch.randn(2, 3, 8, device=device), torch.tensor([0, 2, 5], device=device)
    gm = torch.fx.symbolic_trace(_integer_power_of_a_size)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = None

    def compile_symbolic(graph, inputs):
        return compile_graph(_symbolic(_integer_power_of_a_size, tuple(inputs)), [])

    def compile_static(graph, inputs):
        return lambda *args: (_integer_power_of_a_size(*args),)

    with pytest.raises(SymbolicShapeError):
        compile_symbolic(gm, [x, i])
    gm.graph.find_nodes(op="placeholder")[0].meta["val"] = _symbolic_meta(x)
    compiled = symbolic_or_per_size(compile_symbolic, compile_static, gm, [x, i])
    assert isinstance(compiled, SizeCache)
    torch.testing.assert_close(compiled(x, i)[0], _integer_power_of_a_size(x, i))


def _symbolic_meta(x):
    gm = _symbolic(lambda t: t + 1, (x,))
    return gm.graph.find_nodes(op="placeholder")[0].meta["val"]


def test_symbolic_or_per_size_compiles_once(device, kernel_compiles):
    """The backend's switch: one symbolic compile serves every batch (per size, the count
    of compiles would grow with the sizes)."""
    params = (torch.randn(8, 16, device=device), torch.randn(16, device=device),
              torch.randn(16, 4, device=device))
    gm = _symbolic(_mlp, (torch.randn(6, 8, device=device), *params), {0: {0}})
    compiles: list = []

    def compile_symbolic(graph, inputs):
        compiles.append("symbolic")
        return compile_graph(graph, [])

    def compile_static(graph, inputs):
        compiles.append("static")
        return compile_graph(_compat.make_aten_graph(_mlp, inputs, trace_table(), True), inputs)

    compiled = symbolic_or_per_size(compile_symbolic, compile_static, gm,
                                    [torch.randn(6, 8, device=device), *params])
    assert isinstance(compiled, SymbolicCompiled)
    for batch in (2, 3, 5, 9):
        x = torch.randn(batch, 8, device=device)
        torch.testing.assert_close(compiled(x, *params)[0], _mlp(x, *params),
                                   rtol=1e-4, atol=1e-4)
    assert compiles == ["symbolic"]


def test_kiln_backend_with_symbolic_kernels_answers_like_eager(device):
    """Through kiln.compile (dynamic=True): one capture; until the autograd stage keeps the
    sizes symbolic the backend compiles per size; either way, eager's answers."""
    import kiln

    compiled = kiln.compile(_mlp, dynamic=True)
    params = (torch.randn(8, 16, device=device), torch.randn(16, device=device),
              torch.randn(16, 4, device=device))
    for batch in (2, 5, 3):
        x = torch.randn(batch, 8, device=device)
        torch.testing.assert_close(compiled(x, *params), _mlp(x, *params), rtol=1e-4,
                                   atol=1e-4)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(12, 24), torch.nn.Linear(24, 5)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))).softmax(-1)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_kiln_compile_end_to_end_compiles_kernels_for_two_sizes_only(device, kernel_compiles,
                                                                     train):
    """capture (automatic dynamic) -> autograd (stage B) -> kernels with size arguments
    (stage C): the first batch compiles static kernels, the second the symbolic ones, and
    every later batch launches those: no kernel is compiled after the second call."""
    import copy

    import kiln

    model = _MLP().to(device).train(train)
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin, backend="kiln")
    counts = []
    for batch in (1, 2, 3, 5, 9, 16):
        x = torch.randn(batch, 12, device=device)
        with torch.set_grad_enabled(train):
            got, want = compiled(x), model(x)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            if train:
                (got * torch.arange(5.0, device=device)).sum().backward()
                (want * torch.arange(5.0, device=device)).sum().backward()
        counts.append(len(kernel_compiles))
    for p, q in zip(twin.parameters(), model.parameters()):
        if train:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert counts[1] > counts[0] > 0 and counts[-1] == counts[1], counts


def test_matmul_padding_leaves_symbolic_sizes_alone(device, kernel_compiles, monkeypatch):
    """On CUDA the padding pass (lower/padding.py) asked whether a weight gradient's K (the
    batch) was aligned: a `s0 % 4 == 0` fact, so batch 16 compiled another variant (H200,
    2026-12-02: kernel compiles [5, 11, 11, 11, 11, 18]). Symbolic matmuls are not padded."""
    from kiln.lower import padding

    monkeypatch.setattr(padding, "DEVICES", (torch.device(device).type,))
    monkeypatch.setattr(padding, "MIN_FLOPS", 0)
    test_kiln_compile_end_to_end_compiles_kernels_for_two_sizes_only(device, kernel_compiles,
                                                                     train=True)


def _slices_and_index(x, mask, i):
    length = x.shape[-1]
    head, tail = x[:, 1:], x[..., -3:]
    return (x + mask[:length, :length], head * 2, tail.sum(-1), x[:, :-1] - 1, x[i],
            torch.cat([x, x[i] * 2]), torch.cat([x[:, :1], head], 1))


def test_slices_index_and_cat_with_symbolic_bounds_compile_once(device, kernel_compiles):
    """`mask[:L, :L]` of a fixed buffer, slices from either end of a symbolic dim, an index
    tensor of symbolic length, cat along a symbolic dim: one symbolic compile for every size."""
    mask = torch.randn(64, 64, device=device)

    def inputs(length, picks):
        return (torch.randn(length, length, device=device), mask,
                torch.randint(0, length, (picks,), device=device))

    artifact = compile_graph(_symbolic(_slices_and_index, inputs(7, 5), {0: {0, 1}, 2: {0}}),
                             [])
    assert artifact.graph.symbolic and all(spec.size_args for spec in artifact.specs)
    compiled = len(kernel_compiles)
    for length, picks in ((3, 2), (5, 9), (17, 4), (64, 33)):
        args = inputs(length, picks)
        for out, ref in zip(artifact(*args), _slices_and_index(*args)):
            torch.testing.assert_close(out, ref)
    assert len(kernel_compiles) == compiled


def test_bound_launch_of_a_symbolic_kernel_passes_sizes_and_a_per_call_grid(monkeypatch):
    """config.symbolic_bound_launch (the default): pointers, then the sizes, then the
    constexprs, in the kernel's parameter order; the grid computed from this call's sizes, as
    spec.grid does."""
    monkeypatch.setattr(launcher_module, "_stream_source", lambda: (lambda device: 5, 0))
    x, w = torch.randn(6, 8), torch.randn(8)
    artifact = compile_graph(_symbolic(lambda x, w: (x * w).exp(), (x, w), {0: {0}}), [])
    (lc,) = _launched(artifact)
    (size,) = lc.spec.size_args  # the ShapeEnv's name for x's batch
    assert lc.bindable and f"do_not_specialize=[{size!r}]" in lc.spec.source
    fake = lc.kernel = FakeCompiledKernel()
    lc.bind()
    assert lc.fast, lc.source
    for batch in (3, 1000):
        x, out = torch.randn(batch, 8), torch.empty(batch, 8)
        lc(x, w, out, batch)
        g0, g1, g2, stream, *_, = fake.calls[-1]
        want = lc.spec.grid(lc.meta, {size: batch})
        assert (g0, g1, g2) == (*want, 1, 1) and stream == 5
    params = dict(zip(lc.fn.arg_names, fake.calls[-1][9:]))
    assert params[size] == 1000 and params["XBLOCK"] == lc.meta["XBLOCK"]
    assert len(fake.calls[-1][9:]) == len(lc.fn.arg_names)
    assert params[lc.spec.arg_names[0]] == x.untyped_storage().data_ptr()


def test_symbolic_kernels_launch_through_fn_grid_when_the_bound_route_is_off(monkeypatch):
    monkeypatch.setattr(launcher_module.config, "symbolic_bound_launch", False)
    x, w = torch.randn(6, 8), torch.randn(8)
    artifact = compile_graph(_symbolic(lambda x, w: (x * w).exp(), (x, w), {0: {0}}), [])
    (lc,) = _launched(artifact)
    assert not lc.bindable and lc._launch == lc._generic_launch
    with pytest.raises(TypeError, match=r"takes 3 tensors .* and sizes \('s\d+',\), got 3"):
        lc(x, w, torch.empty(6, 8))


def test_a_printed_grid_that_disagrees_with_the_kernels_keeps_the_fn_grid_route(monkeypatch,
                                                                               caplog):
    """The bound route trusts the grid printed into its launch function only after it agreed
    with spec.grid on sample sizes: a wrong one (here: the size replaced by a constant) would
    launch too few programs at other sizes, so the launcher stays on fn[grid] and says so."""
    x, w = torch.randn(6, 8), torch.randn(8)
    graph = _symbolic(lambda x, w: (x * w).exp(), (x, w), {0: {0}})
    (lc,) = _launched(compile_graph(graph, []))
    assert lc.bindable  # the real printed grid agrees
    (size,) = lc.spec.size_args
    wrong = tuple(part.replace(size, "6") for part in launcher_module.grid_source(lc.spec))
    monkeypatch.setattr(launcher_module, "grid_source", lambda spec: wrong)
    with caplog.at_level("WARNING", logger=launcher_module.log.name):
        again = launcher_module.SymbolicLauncher(lc.spec, lc.fn)
    assert not again.bindable and again._launch == again._generic_launch
    assert "disagrees with the kernel's grid" in caplog.text


# -- conv nets over a symbolic batch (timm-style serving: the batch varies, C/H/W do not) -------

def _conv_block(x, w1, w2, fc_w, fc_b, *bn):
    """conv → bn (eval) → relu → maxpool → conv → bn → residual add → relu → adaptive avgpool
    to 1x1 → linear: the shape of a resnet stage and its head."""
    bn1, bn2 = bn[:4], bn[4:]
    x = F.max_pool2d(F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), *bn1, eps=1e-5)), 3, 2, 1)
    x = F.relu(x + F.batch_norm(F.conv2d(x, w2, padding=1), *bn2, eps=1e-5))
    return F.linear(F.adaptive_avg_pool2d(x, 1).flatten(1), fc_w, fc_b)


def _bn_params(channels, device):
    """running mean, running var, weight, bias"""
    return (torch.randn(channels, device=device), torch.rand(channels, device=device) + 0.5,
            torch.randn(channels, device=device), torch.randn(channels, device=device))


def test_conv_block_over_batch_compiles_once(device, kernel_compiles):
    """Convolutions (library calls whose output layout is written from the batch), batch norm
    in eval, pooling over the static H, W, the residual add and the head: one compile, the
    same kernel objects for every batch, 1 and primes included."""
    params = (torch.randn(8, 3, 3, 3, device=device), torch.randn(8, 8, 3, 3, device=device),
              torch.randn(5, 8, device=device), torch.randn(5, device=device),
              *_bn_params(8, device), *_bn_params(8, device))
    example = (torch.randn(4, 3, 12, 12, device=device), *params)
    artifact = compile_graph(_symbolic(_conv_block, example, {0: {0}}), [])
    assert artifact.graph.symbolic and all(spec.size_args for spec in artifact.specs)
    kernels, compiled = _launched(artifact), len(kernel_compiles)
    for batch in (1, 2, 3, 7, 16):
        x = torch.randn(batch, 3, 12, 12, device=device)
        (out,) = artifact(x, *params)
        torch.testing.assert_close(out, _conv_block(x, *params), rtol=1e-4, atol=1e-4)
    assert len(kernel_compiles) == compiled and _launched(artifact) == kernels


def _unbiased_scale(x):
    """Batch norm's running-variance factor `n / (n - 1)`: a float computed from the sizes."""
    n = x.shape[0] * x.shape[2]
    return x * (n / (n - 1)) - x.shape[0]


def test_float_computed_from_symbolic_sizes(device, kernel_compiles):
    artifact = compile_graph(_symbolic(_unbiased_scale, (torch.randn(4, 3, 5, device=device),),
                                       {0: {0}}), [])
    assert artifact.graph.symbolic
    for batch in (1, 2, 3, 11):
        x = torch.randn(batch, 3, 5, device=device)
        torch.testing.assert_close(artifact(x)[0], _unbiased_scale(x))


class _ConvNet(torch.nn.Module):
    """A resnet-style stem, one basic block and the head, with batch norm modules."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(x + self.bn(self.conv(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _conv_net_traces_symbolically_once(shapes, device, kernel_compiles, recorder, train):
    """kiln.compile(_ConvNet) over inputs of `shapes`: the first compiles static kernels, the
    second the symbolic ones, every later one launches those; outputs (and in training
    gradients and running statistics) equal eager's."""
    import copy

    import kiln

    torch.manual_seed(0)
    model = _ConvNet().to(device).train(train)
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin, backend="kiln")
    counts = []
    for shape in shapes:
        x = torch.randn(shape, device=device)
        with torch.set_grad_enabled(train):
            got, want = compiled(x), model(x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            if train:
                got.square().sum().backward()
                want.square().sum().backward()
        counts.append(len(kernel_compiles))
    symbolic = [t.symbolic for t in recorder.autograd_traces]
    assert symbolic == [False, True], recorder.autograd_traces  # no per-size trace
    assert counts[1] > counts[0] > 0 and counts[-1] == counts[1], counts
    if train:
        for p, q in zip(twin.parameters(), model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        for p, q in zip(twin.buffers(), model.buffers()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_kiln_compile_conv_net_over_batch_traces_symbolically_once(device, kernel_compiles,
                                                                   recorder, train):
    """kiln.compile with automatic dynamic: the first batch compiles static kernels, the second
    the symbolic ones, every later batch launches those. Training: batch norm's running
    variance update (`n / (n - 1)` of the batch) went per size before the sizes' floats were
    lowered; gradients and running statistics equal eager's."""
    shapes = [(batch, 3, 10, 10) for batch in (2, 3, 5, 7)]
    _conv_net_traces_symbolically_once(shapes, device, kernel_compiles, recorder, train)


def _pads_and_roll(x):
    ends = torch.arange(-1, x.shape[-1] + 1, device=x.device) * x.shape[0]
    return (F.pad(x, (1, 2)) * 2 + F.pad(x, (1, 2), mode="reflect"), torch.roll(x, 2, 0),
            ends)


def test_reflect_pad_roll_and_arange_over_symbolic_dims(device, kernel_compiles):
    """The decompositions compute with sizes as tensor operands (`sub.Tensor(s0 - 1, idx)`:
    type promotion saw an `Expr`), and `arange(-1, s0 + 1)` took its start as 0 (its
    arguments were picked by type, and a symbolic end is no int)."""
    artifact = compile_graph(_symbolic(_pads_and_roll, (torch.randn(4, 3, 6, device=device),),
                                       {0: {0, 2}}), [])
    assert artifact.graph.symbolic
    for batch, length in ((2, 3), (3, 7), (5, 4)):
        x = torch.randn(batch, 3, length, device=device)
        for out, ref in zip(artifact(x), _pads_and_roll(x)):
            torch.testing.assert_close(out, ref)


def _pools(x):
    return (F.max_pool2d(x, 3, 2, 1) + 1, F.avg_pool2d(x, 2), F.max_pool1d(x.flatten(2), 2),
            F.adaptive_avg_pool2d(x, 1))


def test_pooling_over_symbolic_height_and_width_compiles_once(device, kernel_compiles):
    """Pooled extents are floor divisions of sizes (`(s1 + 1)//2`), kept as one atom so they
    multiply into strides: one compile, the same kernel objects for every H, W, odd ones and a
    pooled extent of 1 included."""
    artifact = compile_graph(_symbolic(_pools, (torch.randn(2, 3, 9, 10, device=device),),
                                       {0: {2, 3}}), [])
    assert artifact.graph.symbolic and all(spec.size_args for spec in artifact.specs)
    kernels, compiled = _launched(artifact), len(kernel_compiles)
    for h, w in ((9, 10), (12, 7), (2, 5), (17, 16), (3, 2)):
        x = torch.randn(2, 3, h, w, device=device)
        for got, want in zip(artifact(x), _pools(x)):
            torch.testing.assert_close(got, want)
    assert len(kernel_compiles) == compiled and _launched(artifact) == kernels


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_kiln_compile_conv_net_over_image_sizes_traces_symbolically_once(device,
                                                                        kernel_compiles,
                                                                        recorder, train):
    """Varying image sizes: max-pool over a symbolic H, W (and its backward) no longer sends
    the graph per size; outputs, gradients and running statistics equal eager's."""
    shapes = [(3, 3, side, side + 1) for side in (8, 11, 14, 9)]
    _conv_net_traces_symbolically_once(shapes, device, kernel_compiles, recorder, train)


def test_a_backward_that_reads_a_size_only_as_an_int_input(device):
    """The backward of a sum over a symbolic dim is an expand of the static gradient to the
    input's shape: its only symbolic input is the saved size (`sym_size_int`), which the
    wrapper bound from no input dim, so the output view named an undefined `s0`. Size
    inputs now bind their symbol (`IRGraph.size_inputs`), and a symbol an output view needs is
    checked like a buffer's."""
    import kiln

    def fn(x):
        return x.sum((-1, -3), keepdim=True)

    compiled = kiln.compile(fn, backend="kiln")
    for rows in (2, 2, 3, 5):
        x = torch.randn(rows, 3, 4, device=device, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        ours, theirs = compiled(x2), fn(x)
        torch.testing.assert_close(ours, theirs)
        weight = torch.randn(theirs.shape, device=device)
        (ours * weight).sum().backward()
        (theirs * weight).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)


def test_causal_attention_training_over_lengths_traces_once(device, recorder):
    """dynamic=True, causal SDPA, forward and backward through kiln's kernels: one symbolic
    trace for every length. Its lowering asked whether `16*s1*s0 - 16*s1` > 0 (batch s0 >= 2),
    which term-by-term bounds could not answer, and the trace silently went per size."""
    import kiln

    def fn(x):
        q = x.view(x.shape[0], x.shape[1], 4, 4).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q * 0.5, q + 1, is_causal=True)

    compiled = kiln.compile(fn, backend="kiln", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(2, n, 16, device=device, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        weight = torch.randn(2, 4, n, 4, device=device)
        got, want = compiled(x2), fn(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        (got * weight).sum().backward()
        (want * weight).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-4)
    traces = recorder.autograd_traces
    assert len(traces) == 1 and traces[0].symbolic, traces


def test_a_window_sliced_off_the_end_of_a_symbolic_dim_stays_symbolic(device, recorder):
    """`x[:, -4:]` (Mistral's sliding-window mask slices `-4095:`) on a dim of symbolic
    extent n: torch clamps the start at 0 when n < 4, so the start is `n - length` with
    `length` torch's own size of the result. The lowering refused it and the graph went per
    size. A slice that stops short of the end (`-4:-1`) still may, and answers like eager."""
    import kiln

    def window(x):
        return x[:, -4:] * 2 + 1

    def inner(x):
        return x[:, -4:-1].exp()

    for fn in (window, inner):
        compiled = kiln.compile(fn, backend="kiln", dynamic=True)
        for n in (3, 5, 8, 2, 9):
            x = torch.randn(2, n, device=device)
            torch.testing.assert_close(compiled(x), fn(x))
        if fn is window:  # one symbolic variant for n >= 4 and one below: nothing per size
            assert recorder.per_size == [], recorder.per_size
            assert [t.symbolic for t in recorder.autograd_traces] == [True, True]


def test_math_sqrt_of_a_symbolic_size_stays_symbolic(device, recorder):
    """`x / math.sqrt(x.size(-1))` (attention's scale from the head or model dim) under
    dynamic=True: capture makes it `torch._sym_sqrt` (as torch.compile does) instead of a guard
    that specialized the size, the autograd stage reads it from the input's size, and the kernel
    computes it in float64 from its size argument: one trace for every size, forward and
    backward equal to eager."""
    import math

    import kiln

    def fn(x):
        return (x / math.sqrt(x.shape[-1])).softmax(-1) * math.sqrt(x.shape[0] / 2) \
            - x * x.shape[1] ** 0.5

    _one_symbolic_trace_over_sizes(kiln.compile(fn, backend="kiln", dynamic=True), fn, device,
                                   recorder)


def _one_symbolic_trace_over_sizes(compiled, fn, device, recorder) -> None:
    """`compiled` (fn under dynamic=True) over four 2-D sizes: forward and backward equal to
    eager, one symbolic autograd trace, nothing compiled per size."""
    for rows, cols in ((3, 5), (4, 7), (6, 16), (2, 9)):
        x = torch.randn(rows, cols, device=device, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        got, want = compiled(x2), fn(x)
        torch.testing.assert_close(got, want)
        weight = torch.randn(rows, cols, device=device)
        (got * weight).sum().backward()
        (want * weight).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
    assert recorder.per_size == [], recorder.per_size
    assert [t.symbolic for t in recorder.autograd_traces] == [True], recorder.autograd_traces


def test_torch_tensor_of_symbolic_sizes_stays_symbolic(device, recorder):
    """`torch.tensor([x.shape[1], 2.0])` and `torch.as_tensor(x.shape[0])` under dynamic=True:
    the fake `torch.tensor` reads each number's value (a guard per size); capture records one
    `scalar_tensor` per number, stacked, as torch.compile does. Dtypes as eager infers them
    (float32 with a float in the list, int64 for sizes alone); one trace for every size."""
    import kiln

    def fn(x):
        pair = torch.tensor([x.shape[1], 2.0], device=x.device)
        rows = torch.as_tensor(x.shape[0], device=x.device)
        return x * pair[0] + pair[1] + rows

    def rows_of(x):
        return torch.as_tensor(x.shape[0], device=x.device)

    _one_symbolic_trace_over_sizes(kiln.compile(fn, backend="kiln", dynamic=True), fn, device,
                                   recorder)
    x = torch.randn(5, 3, device=device)
    got = kiln.compile(rows_of, backend="kiln", dynamic=True)(x)
    assert got.dtype == rows_of(x).dtype == torch.int64 and got.item() == 5


def test_a_debug_dir_does_not_send_symbolic_kernels_per_size(device, recorder, tmp_path,
                                                             monkeypatch):
    """KILN_DEBUG_DIR records each kernel's numel: `int()` of a symbolic one raised, and the
    symbolic compile fell back to per size only when the debug dir was set. Recorded at the
    example's sizes now."""
    import kiln
    from kiln.config import config

    monkeypatch.setattr(config, "debug_dir", str(tmp_path))
    monkeypatch.setattr(config, "warm_start", False)  # a warm start writes no artifacts

    def fn(x, w):
        return (x @ w).softmax(-1) + x.sum(-1, keepdim=True)

    compiled = kiln.compile(fn, backend="kiln", dynamic=True)
    w = torch.randn(6, 6, device=device)
    for rows in (3, 5, 9):
        x = torch.randn(rows, 6, device=device)
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert recorder.per_size == [], recorder.per_size
    assert list(tmp_path.glob("*/kernels.json")), sorted(p.name for p in tmp_path.iterdir())


def _decode_step(x, cache, table, start):
    """A decode step with an int position: a write into a cache at `start`, attention over the
    first `start + 1` rows, a table row looked up at `start`, and a loop bounded by it only."""
    cache[:, start:start + 1] = x.tanh()
    keys = cache[:, :start + 1]
    q = x + table[torch.arange(start, start + 1, device=x.device)]
    ramp = torch.arange(start, dtype=x.dtype, device=x.device).sum()
    return torch.softmax(q @ keys.transpose(1, 2) * 0.25, -1) @ keys * start + ramp


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_kiln_compile_int_argument_compiles_kernels_for_two_values_only(device, kernel_compiles,
                                                                       recorder, train):
    """An int argument that changes between calls (a decode position) is a symbolic size
    through capture, the autograd stage and the kernels (`s0` a size argument): the first
    value compiles static kernels, the second the symbolic ones, every later one launches
    those. Outputs, the cache written in place and (training) the gradients equal eager's."""
    import kiln

    compiled = kiln.compile(_decode_step, backend="kiln")
    table = torch.randn(40, 16, device=device, requires_grad=train)
    counts = []
    for start in (3, 5, 9, 4, 17, 30):
        # a fresh cache per call: the write gives it the step's autograd history
        cache = torch.randn(2, 40, 16, device=device)
        cache_ref = cache.clone()
        x = torch.randn(2, 1, 16, device=device, requires_grad=train)
        x_ref = x.detach().clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            got = compiled(x, cache, table, start)
            want = _decode_step(x_ref, cache_ref, table, start)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cache, cache_ref)
        if train:
            grad = torch.randn_like(want)
            (g_x, g_t), (r_x, r_t) = (torch.autograd.grad(out, (inp, table), grad)
                                      for out, inp in ((got, x), (want, x_ref)))
            torch.testing.assert_close(g_x, r_x, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(g_t, r_t, rtol=1e-4, atol=1e-5)
        counts.append(len(kernel_compiles))
    symbolic = [t.symbolic for t in recorder.autograd_traces]
    assert symbolic == [False, True], recorder.autograd_traces
    assert counts[1] > counts[0] > 0 and counts[-1] == counts[1], counts


def _broadcasts_a_slice(x):
    return x + x[1::3]  # (s0 + 1)//3 rows: 1 for s0 in 2..4, under the ShapeEnv's guard


def _squeezes_a_slice(x):
    return x[1::3].squeeze(0) * 2


def _copies_a_strided_slice(x):
    v = x[:, 0::3]  # (s1 + 2)//3 columns, broadcast by the copy: pinned to 1 (s1 in 2..3)
    x.copy_(v)
    return v


@pytest.mark.parametrize("fn", [_broadcasts_a_slice, _squeezes_a_slice, _copies_a_strided_slice],
                         ids=["broadcast", "squeeze", "copy_from_slice"])
def test_a_symbolic_size_pinned_to_one_is_broadcast(device, fn):
    """Fuzz seeds 3203575 and 3202608 (--grow): a size the trace proved 1 only through a guard
    (`(s0 + 1)//3 == 1`) broadcast as if it spanned the result, reading past the input (garbage
    on the CPU, a fault on CUDA), and reached the wrapper as `Expr(1)` (NameError)."""
    import kiln

    compiled = kiln.compile(fn)
    for n in (2, 3, 2, 3):
        x = torch.randn(n, n, 5, device=device)
        x_ref = x.clone()
        got, want = compiled(x), fn(x_ref)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, x_ref)


def _scaled_by_an_int(x, n):
    return x * (2 * n - 1)  # the backward takes 2*n - 1, no tensor's size


def test_an_int_arguments_expression_reaches_the_backward_kernels(device):
    """Fuzz --grad seed 3600249: the backward takes the saved number `2*s0 - 1`, and its wrapper
    had no input dim to read `s0` from (NameError in the generated code); it is solved from
    the number itself now."""
    import kiln

    compiled = kiln.compile(_scaled_by_an_int)
    for n in (5, 8, 11, 3):
        leaf = torch.randn(3, device=device, requires_grad=True)
        got = compiled(leaf * 1, n)
        (grad,) = torch.autograd.grad(got.sum(), leaf)
        torch.testing.assert_close(grad, torch.full_like(leaf, 2 * n - 1.0))
