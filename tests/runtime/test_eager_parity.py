"""Issue 11's generated-code classes: each pattern compiled with the kiln backend gives eager's
answer (or eager's exception) on the test device (KILN_TEST_DEVICE; CPU runs the generated
kernels in Triton's interpreter, CUDA runs real binaries). Fresh random inputs every call."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import kiln  # noqa: E402


pytestmark = pytest.mark.usefixtures("generated_kernels")


def _compiled(fn):
    return kiln.compile(fn, backend="kiln")


def _assert_same_call(fn, make_args):
    """Compiled and eager on equal fresh inputs: outputs and every input's final value."""
    compiled = _compiled(fn)
    for _ in range(2):
        args = make_args()
        ours = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        torch.testing.assert_close(compiled(*ours), fn(*args))
        for mine, theirs in zip(ours, args):
            if isinstance(theirs, torch.Tensor):
                torch.testing.assert_close(mine, theirs)


# -- in-place patterns (illegal memory accesses on CUDA) ----------------------------------------

def test_write_through_a_slice_of_an_input(device):
    def fn(x):
        x[:, 1:] = 2.5  # lifts a 0-dim CPU tensor constant even for a CUDA x
        return x * 3

    _assert_same_call(fn, lambda: [torch.randn(3, 5, device=device)])


def test_view_then_in_place(device):
    def fn(x):
        v = x.view(-1)
        v.add_(1)
        return x.sin()

    _assert_same_call(fn, lambda: [torch.randn(4, 6, device=device)])


def test_copy_into_a_callers_buffer(device):
    def fn(x, out):
        out.copy_(x.cos() * 2)
        return out

    _assert_same_call(fn, lambda: [torch.randn(4, 6, device=device),
                                   torch.randn(4, 6, device=device)])


def test_returning_an_input_unchanged(device):
    def fn(x, y):
        return x, y.exp()

    compiled = _compiled(fn)
    x, y = torch.randn(3, 4, device=device), torch.randn(3, 4, device=device)
    a, b = compiled(x, y)
    assert a is x
    torch.testing.assert_close(b, y.exp())


def test_cpu_scalar_tensor_input_mixes_with_the_graphs_device(device):
    def fn(x, s):
        return x * s + 1

    _assert_same_call(fn, lambda: [torch.randn(3, 4, device=device), torch.randn(())])


# -- outputs that alias each other --------------------------------------------------------------

@pytest.mark.parametrize("order", ["view_first", "base_first"])
def test_outputs_aliasing_each_other_share_storage(device, order):
    def fn(x):
        y = x + 1
        return (y.view(-1), y) if order == "view_first" else (y, y[1:])

    x = torch.randn(3, 4, device=device)
    ours, theirs = _compiled(fn)(x.clone()), fn(x.clone())
    torch.testing.assert_close(ours, theirs)
    ours[1].mul_(2)  # an in-place op on one output shows through the other, as in eager
    theirs[1].mul_(2)
    torch.testing.assert_close(ours[0], theirs[0])


def test_outputs_that_are_strided_slices_of_one_intermediate_share_its_storage(device):
    # Neither output is dense (fuzz seed 70133): both are placed in the intermediate they view,
    # laid out as eager lays it out, so strides, offsets and shared elements all match.
    def fn(x):
        t = x * x
        v = t[:, :, 1:]
        return v.unsqueeze(0), v, t[:, :, ::2]

    x = torch.randn(3, 2, 2, device=device).transpose(-1, -2)
    ours, theirs = _compiled(fn)(x), fn(x)
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(ours, theirs):
        assert (a.stride(), a.storage_offset()) == (b.stride(), b.storage_offset())
    assert ours[0].untyped_storage().data_ptr() == ours[2].untyped_storage().data_ptr()
    ours[1].add_(5)  # seen through the other views, as in eager
    theirs[1].add_(5)
    torch.testing.assert_close(ours, theirs)


def test_an_expanded_intermediate_is_returned_as_a_view_of_it(device):
    # fuzz seed 20261861 (H200): the expand was copied out dense, (4, 2, 1) where eager has
    # (0, 1, 0), and no longer shared its elements with the other view of the softmax
    def fn(x):
        t = torch.softmax(x[0], dim=1)
        return t[1], t.expand(2, 2, 2), (x * 2).sum(0).expand(64, 2, 1)

    x = torch.randn(1, 2, 1, device=device)
    ours, theirs = _compiled(fn)(x), fn(x)
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(ours, theirs):
        assert (a.stride(), a.storage_offset()) == (b.stride(), b.storage_offset())
    assert ours[0].untyped_storage().data_ptr() == ours[1].untyped_storage().data_ptr()
    assert ours[2].untyped_storage().nbytes() == theirs[2].untyped_storage().nbytes()


# -- out-of-range indices raise instead of reading other memory ---------------------------------
# On CUDA an out-of-range gather is a device-side assert, in eager (ATen's kernels) as in kiln
# (`tl.device_assert`): it poisons the process, so there each case runs in a child process.

_CHILD = """
import sys, torch, torch.nn.functional as F, kiln
from kiln.config import config
config.suppress_errors = False
import test_eager_parity  # this file (its folder is on the child's path): the same functions
fn = getattr(test_eager_parity, sys.argv[1])
args = [torch.tensor(a, device="cuda") for a in eval(sys.argv[2])]
try:
    kiln.compile(fn, backend="kiln")(*args)
    torch.cuda.synchronize()
except Exception as exc:
    print("RAISED", type(exc).__name__, exc)
    sys.exit(0)
print("NO ERROR")
sys.exit(1)
"""


def index(x, i):
    return x[i] * 2


def embedding(ids, w):
    return F.embedding(ids, w) + 1


def _raises_like_eager(fn, *args):
    if args[0].is_cuda:
        _raises_in_child(fn.__name__, args)
        return
    with pytest.raises(IndexError):
        fn(*args)
    with pytest.raises(IndexError, match="out of (bounds|range)"):
        _compiled(fn)(*args)


def _raises_in_child(name, args):
    import os
    import subprocess
    import sys

    values = repr([a.tolist() for a in args])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", _CHILD, name, values], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "RAISED" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "assert" in done.stdout.lower() or "out of" in done.stdout.lower(), done.stdout


@pytest.mark.parametrize("bad", [7, -6, 10 ** 9, 2 ** 32 + 1])
def test_index_with_an_out_of_range_tensor_raises(device, bad):
    x = torch.randn(5, 3, device=device)
    _assert_in_range_works(index, x, torch.tensor([1, -5, 4], device=device))
    _raises_like_eager(index, x, torch.tensor([1, bad], device=device))


@pytest.mark.parametrize("bad", [7, 10 ** 9])
def test_index_with_an_out_of_range_int_raises(device, bad):
    x = torch.randn(5, 3, device=device)
    with pytest.raises(IndexError):
        index(x, bad)
    with pytest.raises(IndexError, match="out of (bounds|range)"):
        _compiled(index)(x, bad)


def test_embedding_with_an_id_past_the_table_raises(device):
    w = torch.randn(5, 4, device=device)
    _assert_in_range_works(embedding, torch.tensor([[0, 4, 2]], device=device), w)
    _raises_like_eager(embedding, torch.tensor([[0, 1, 9]], device=device), w)


def gather(x, i):
    return x.gather(1, i) * 2


def index_select(x, i):
    return x.index_select(0, i) + 1


def scatter(x, i):
    return x.scatter(1, i, 2.5) * 2


def _raises_as_eager(fn, *args):
    """Compiled raises an instance of eager's exception type (gather's is a RuntimeError)."""
    if args[0].is_cuda:
        _raises_in_child(fn.__name__, args)
        return
    with pytest.raises(Exception) as eager:
        fn(*args)
    with pytest.raises(type(eager.value), match="out of (bounds|range)"):
        _compiled(fn)(*args)


@pytest.mark.parametrize("op", ["gather", "index_select", "embedding"])
def test_negative_index_raises_where_eager_does_not_wrap_it(device, op):
    """`x[i]` counts a negative index from the end; gather, index_select and embedding raise on
    one in eager, so their indirect loads do not wrap it (it used to read row size - 1)."""
    x = torch.randn(4, 3, device=device)
    fn, good, bad = {
        "gather": (gather, torch.tensor([[0, 2], [1, 1], [2, 0], [0, 0]]),
                   torch.tensor([[0, 2], [1, -1], [2, 0], [0, 0]])),
        "index_select": (index_select, torch.tensor([0, 3, 1]), torch.tensor([0, -1, 1])),
        "embedding": (embedding, torch.tensor([[0, 3, 1]]), torch.tensor([[0, -1, 1]])),
    }[op]
    args = (lambda i: (i.to(device), x)) if op == "embedding" else (lambda i: (x, i.to(device)))
    _assert_in_range_works(fn, *args(good))
    _raises_as_eager(fn, *args(bad))


@pytest.mark.parametrize("bad", [4, -1])
def test_scatter_of_one_index_per_row_out_of_range_raises(device, bad):
    """scatter with one index per row lowers to `where(position == index, value, self)`; the
    index goes through a bounds-checked indirect index, where the compare alone dropped an
    out-of-range write silently."""
    x = torch.randn(3, 4, device=device)
    _assert_in_range_works(scatter, x, torch.randint(0, 4, (3, 1), device=device))
    _raises_as_eager(scatter, x, torch.tensor([[0], [bad], [1]], device=device))


def test_argmax_of_bool_raises_where_eager_does(device):
    def fn(x):
        return x.argmax(1), x.float().argmin(0)

    x = torch.rand(3, 5, device=device) > 0.5
    try:
        want = fn(x)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="bool"):
            _compiled(fn)(x)
        return
    torch.testing.assert_close(_compiled(fn)(x), want)


def test_integer_to_a_negative_scalar_power_raises_like_eager(device):
    """Eager refuses `int_tensor ** -k`; the pow rule refuses it too, so the ATen op raises."""
    def fn(x):
        return (x + 1) ** -2

    x = torch.randint(1, 5, (6,), device=device)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        fn(x)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        _compiled(fn)(x)
    y = torch.randn(6, device=device)  # floats still lower
    torch.testing.assert_close(_compiled(fn)(y), fn(y))


@pytest.mark.explicit_device
def test_one_hot_class_out_of_range_raises_like_eager():
    """one_hot's `_assert_async.msg` range checks run (an extern call) in the kiln backend's
    wrapper. CPU only: CUDA's eager one_hot and the assert are device-side asserts."""
    def fn(labels):
        return F.one_hot(labels, 4) * 3

    labels = torch.randint(0, 4, (6,))
    _assert_in_range_works(fn, labels)
    labels[1] = 4
    with pytest.raises(RuntimeError, match="Class values must be smaller"):
        _compiled(fn)(labels)


def _assert_in_range_works(fn, *args):
    torch.testing.assert_close(_compiled(fn)(*args), fn(*args))
    kiln.reset()


# -- attention and RNNs -------------------------------------------------------------------------

@pytest.mark.parametrize("keys", [6, 8])
def test_sdpa_with_an_additive_mask_of_any_length(device, keys):
    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    _assert_same_call(fn, lambda: [torch.randn(2, 2, 3, 8, device=device),
                                   torch.randn(2, 2, keys, 8, device=device),
                                   torch.randn(2, 2, keys, 8, device=device),
                                   torch.randn(2, 1, 3, keys, device=device)])


@pytest.mark.parametrize("mkldnn", [True, False])
def test_lstm_state_shapes_equal_eager(device, mkldnn, monkeypatch):
    """The final states keep eager's [layers, batch, hidden] (issue 11: torch 2.11's LSTM
    decomposition gave [layers, 1, batch, hidden]; CPU without mkldnn takes the same path).
    The fused op is called directly: nn.LSTM itself runs natively between graphs."""
    if not mkldnn:
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    lstm = torch.nn.LSTM(4, 8, batch_first=True).to(device)
    x = torch.randn(2, 3, 4, device=device)
    state = (torch.randn(1, 2, 8, device=device), torch.randn(1, 2, 8, device=device))

    def run(layer, x, state):
        out, h, c = torch.lstm(x, state, layer._flat_weights, True, 1, 0.0, False, False, True)
        return out, (h, c)

    with torch.no_grad():
        out, (h, c) = _compiled(run)(lstm, x, state)
        ref, (rh, rc) = run(lstm, x, state)
    assert (out.shape, h.shape, c.shape) == (ref.shape, rh.shape, rc.shape)
    # Values against an fp64 reference: on CUDA eager runs cuDNN's LSTM (TF32 by default), kiln
    # decomposed fp32 matmuls, so the two differ by more than either differs from the truth.
    with torch.no_grad():
        exact = [t.float() for t in _flat(run(copy.deepcopy(lstm).double().cpu(),
                                              x.double().cpu(),
                                              tuple(s.double().cpu() for s in state)))]
    for got, eager, want in zip(_flat((out, (h, c))), _flat((ref, (rh, rc))), exact):
        eager_err = (eager.cpu() - want).abs().max().item()
        assert (got.cpu() - want).abs().max().item() <= max(1.5 * eager_err, 1e-5)


def _flat(result):
    out, (h, c) = result
    return [out, h, c]


# -- bool arithmetic (fuzz seed 7305: `x.add_(x | x)` on bool zeroed x) ------------------------

def test_bool_add_and_mul_are_or_and_and(device):
    def fn(x, y):
        x.add_(x | y)  # True + True stays True in torch; 1-bit arithmetic wraps to 0
        return x * y, (x + y) * x

    _assert_same_call(fn, lambda: [torch.rand(3, 3, 2, device=device) > 0.5,
                                   torch.rand(3, 3, 2, device=device) > 0.5])


# -- half-precision values leaving their dtype (H200 fuzz seeds 23534, 23979, 3403) ------------

def test_fused_half_values_round_where_they_meet_another_dtype(device):
    def fn(x, b):
        t = x.to(torch.float16)
        t.add_(x[1])  # eager stores t in float16: the sum is rounded
        u = (b * 3.3).long()  # eager rounds b * 3.3 to bfloat16 before truncating
        return t - x, u, (b * 3) > x[:6]  # the comparison sees the bfloat16 value

    _assert_same_call(fn, lambda: [torch.randn(6, device=device) * 3,
                                   (torch.randn(6, device=device) * 4).to(torch.bfloat16)])


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_fused_half_chain_rounds_at_every_op_as_eager(device, half):
    """H200 fuzz seed 92238: `acc = x[0] * 1 + x[1] * 2` (half, returned), `(acc * 3).long()`.
    Rounded once at the end of the chain, the truncation was off by one against eager, which
    rounds `acc` before `* 3` (config.emulate_precision_casts)."""
    def fn(x):
        acc = x[0] * 1 + x[1] * 2
        return acc, (acc * 3).long(), torch.relu(acc * 5 - 1).sum(0)

    def make():
        return [(torch.randn(2, 4096, device=device) * 40).to(half)]

    x, = make()
    acc32 = x[0].float() + x[1].float() * 2
    rounded_once = (acc32 * 3).to(half).long()
    assert (rounded_once != fn(x)[1]).any(), "inputs too easy: one rounding gives eager's answer"
    _assert_same_call(fn, make)


def test_variance_of_a_row_of_equal_values_is_zero_as_eager(device):
    """Fuzz seed 120422: `x.index_select(0, [2, 2, 2]).var(0) > 0` was True in one column:
    the mean as sum / 3 is not the value when 3 * c rounds, eager's Welford mean is. The
    shifted mean (first element + sum of differences / n) is exact on such rows."""
    def fn(x):
        rows = x.index_select(0, torch.tensor([2, 2, 2], device=x.device))
        var, mean = torch.var_mean(rows, dim=0, correction=0)
        return var, var > 0, mean, torch.layer_norm(rows.t(), (3,)), rows.std(0)

    def make():
        c = torch.randn(4000, device=device) * 10
        rounds = c[(c + c + c) / 3 != c]  # values whose mean as sum / 3 is not the value
        return [rounds[:6].reshape(2, 3).repeat(2, 1)]

    assert make()[0].shape == (4, 3)
    _assert_same_call(fn, make)
    assert not fn(*make())[1].any()
