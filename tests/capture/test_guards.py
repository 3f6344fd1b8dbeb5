"""Guards and recompiles: every guarded fact both ways.

A change the captured graph depends on must recompile (the counting backend's count grows) and give
the new eager result; a change it does not depend on must hit the existing entry (count unchanged).
Old entries stay valid: calling with the first inputs again compiles nothing. Above all, a call must
never hit a stale entry, so several tests only demand the eager result whatever kiln decides.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.config import config
from helpers import assert_same_structure_and_values as assert_same

G_SCALE = 2.0                  # module globals that tests rebind (each test restores them)
G_TENSOR = torch.randn(4)


def _compile(fn, backend, **kwargs):
    kwargs.setdefault("fullgraph", True)
    return kiln.compile(fn, backend=backend, **kwargs)


def _run(compiled, fn, *args, **kwargs):
    """Call compiled and eager `fn` on the same arguments and assert equal outputs."""
    expected = fn(*args, **kwargs)
    actual = compiled(*args, **kwargs)
    assert_same(expected, actual)
    return actual


def _linear_fn(x):
    return (x * 2).sin() + x.sum(0)


# --- tensor metadata -----------------------------------------------------------------------------

def test_dtype_change_recompiles_same_dtype_does_not(counting_backend):
    c = _compile(_linear_fn, counting_backend)
    _run(c, _linear_fn, torch.randn(3, 4))
    _run(c, _linear_fn, torch.randn(3, 4))
    assert counting_backend.count == 1
    _run(c, _linear_fn, torch.randn(3, 4, dtype=torch.float64))
    assert counting_backend.count == 2
    _run(c, _linear_fn, torch.randn(3, 4))  # the first entry is still hit
    _run(c, _linear_fn, torch.randn(3, 4, dtype=torch.float64))
    assert counting_backend.count == 2


@pytest.mark.parametrize("new_shape", [(5, 4), (3, 7), (3, 4, 1), (12,)],
                         ids=["dim0", "dim1", "rank_up", "rank_down"])
def test_shape_change_recompiles_same_shape_does_not(counting_backend, new_shape):
    def fn(x):
        return x * 2 + x.shape[-1], x.shape

    c = _compile(fn, counting_backend)
    _run(c, fn, torch.randn(3, 4))
    _run(c, fn, torch.randn(3, 4))
    assert counting_backend.count == 1
    _run(c, fn, torch.randn(*new_shape))
    assert counting_backend.count == 2
    _run(c, fn, torch.randn(3, 4))
    assert counting_backend.count == 2


def test_each_dim_guarded_in_sequence(counting_backend):
    def fn(x):
        return x.reshape(x.shape[0] * x.shape[1]) + x.shape[1]

    c = _compile(fn, counting_backend)
    for shape in [(2, 3), (5, 3), (2, 7), (2, 3), (5, 3), (2, 7)]:
        _run(c, fn, torch.randn(*shape))
    assert counting_backend.count == 3


def test_requires_grad_change_recompiles(counting_backend):
    c = _compile(_linear_fn, counting_backend)
    _run(c, _linear_fn, torch.randn(3, 4))
    _run(c, _linear_fn, torch.randn(3, 4))
    assert counting_backend.count == 1
    x = torch.randn(3, 4, requires_grad=True)
    out = _run(c, _linear_fn, x)
    assert out.requires_grad
    assert counting_backend.count == 2
    out.sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    _linear_fn(x_ref).sum().backward()
    assert_same(x_ref.grad, x.grad)
    out = _run(c, _linear_fn, torch.randn(3, 4))
    assert not out.requires_grad
    assert counting_backend.count == 2


@pytest.mark.gpu
def test_device_change_recompiles(counting_backend):
    c = _compile(_linear_fn, counting_backend)
    _run(c, _linear_fn, torch.randn(3, 4))
    _run(c, _linear_fn, torch.randn(3, 4))
    assert counting_backend.count == 1
    out = _run(c, _linear_fn, torch.randn(3, 4, device="cuda"))
    assert out.device.type == "cuda"
    assert counting_backend.count == 2
    _run(c, _linear_fn, torch.randn(3, 4))
    assert counting_backend.count == 2


def test_strides_non_contiguous_input_is_correct(counting_backend):
    def fn(x):
        return x.reshape(-1)[:5] * 2, x.is_contiguous(), x.stride(), x + 1

    c = _compile(fn, counting_backend)
    base = torch.randn(4, 6)
    _run(c, fn, base)
    assert counting_backend.count == 1
    _run(c, fn, torch.randn(6, 4).t())  # same shape (4, 6), transposed strides
    _run(c, fn, torch.randn(4, 12)[:, ::2])  # same shape, strided slice
    count = counting_backend.count
    _run(c, fn, base)
    assert counting_backend.count == count


# --- Python values ------------------------------------------------------------------------------

@pytest.mark.parametrize("first,same,other", [
    (2, 2, 3),
    (2.0, 2.0, 3.5),
    (True, True, False),
    ("relu", "".join(["re", "lu"]), "tanh"),
], ids=["int", "float", "bool", "str"])
def test_python_constant_argument(counting_backend, first, same, other):
    def fn(x, v):
        if isinstance(v, str):
            return x.relu() if v == "relu" else x.tanh()
        if isinstance(v, bool):
            return x + 1 if v else x - 1
        return x * v + v

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x, first)
    _run(c, fn, torch.randn(4), same)
    assert counting_backend.count == 1
    _run(c, fn, x, other)
    assert counting_backend.count == 2
    _run(c, fn, x, first)
    assert counting_backend.count == 2


def test_none_argument_then_tensor(counting_backend):
    def fn(x, bias=None):
        return x * 2 if bias is None else x * 2 + bias

    c = _compile(fn, counting_backend)
    _run(c, fn, torch.randn(4))
    _run(c, fn, torch.randn(4), None)
    assert counting_backend.count == 1
    _run(c, fn, torch.randn(4), torch.randn(4))
    assert counting_backend.count == 2
    _run(c, fn, torch.randn(4))
    _run(c, fn, torch.randn(4), torch.randn(4))
    assert counting_backend.count == 2


def test_tuple_length_change(counting_backend):
    def fn(xs):
        out = xs[0]
        for t in xs[1:]:
            out = out * t
        return out, len(xs)

    c = _compile(fn, counting_backend)
    _run(c, fn, (torch.randn(3), torch.randn(3)))
    _run(c, fn, (torch.randn(3), torch.randn(3)))
    assert counting_backend.count == 1
    _run(c, fn, (torch.randn(3), torch.randn(3), torch.randn(3)))
    assert counting_backend.count == 2
    _run(c, fn, (torch.randn(3), torch.randn(3)))
    assert counting_backend.count == 2


def test_dict_keys_change(counting_backend):
    def fn(d):
        out = d["a"] * 1
        for k, v in d.items():
            out = out + v * len(k)
        return out, sorted(d)

    c = _compile(fn, counting_backend)
    _run(c, fn, {"a": torch.randn(3), "b": torch.randn(3)})
    _run(c, fn, {"a": torch.randn(3), "b": torch.randn(3)})
    assert counting_backend.count == 1
    _run(c, fn, {"a": torch.randn(3), "ccc": torch.randn(3)})
    assert counting_backend.count == 2
    _run(c, fn, {"a": torch.randn(3), "b": torch.randn(3), "dd": torch.randn(3)})
    assert counting_backend.count == 3
    _run(c, fn, {"a": torch.randn(3), "b": torch.randn(3)})
    assert counting_backend.count == 3


# --- globals and closures ---------------------------------------------------------------------------

def _uses_global_scale(x):
    return x * G_SCALE


def _uses_global_tensor(x):
    return x + G_TENSOR


def test_global_scalar_change_recompiles(counting_backend):
    global G_SCALE
    c = _compile(_uses_global_scale, counting_backend)
    x = torch.randn(4)
    try:
        _run(c, _uses_global_scale, x)
        _run(c, _uses_global_scale, torch.randn(4))
        assert counting_backend.count == 1
        G_SCALE = 3.0
        _run(c, _uses_global_scale, x)
        assert counting_backend.count == 2
        G_SCALE = 2.0
        _run(c, _uses_global_scale, x)
        assert counting_backend.count == 2
    finally:
        G_SCALE = 2.0


def test_global_tensor_replaced_never_stale(counting_backend):
    global G_TENSOR
    saved = G_TENSOR
    c = _compile(_uses_global_tensor, counting_backend)
    x = torch.randn(4)
    try:
        _run(c, _uses_global_tensor, x)
        assert counting_backend.count == 1
        G_TENSOR = torch.randn(4)          # same metadata, new values
        _run(c, _uses_global_tensor, x)
        G_TENSOR = torch.randn(1)          # new shape
        _run(c, _uses_global_tensor, x)
        G_TENSOR = 0.5                     # not a tensor any more
        _run(c, _uses_global_tensor, x)
        G_TENSOR = saved
        _run(c, _uses_global_tensor, x)
    finally:
        G_TENSOR = saved


def test_closure_cell_change(counting_backend):
    scale = 2.0
    w = torch.randn(4)

    def fn(x):
        return x * scale + w

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x)
    _run(c, fn, torch.randn(4))
    assert counting_backend.count == 1
    scale = 5.0
    _run(c, fn, x)
    assert counting_backend.count == 2
    w = torch.randn(4)  # a new tensor in the cell: the new values must be used
    _run(c, fn, x)
    scale = 2.0
    _run(c, fn, x)


# --- nn.Module state ------------------------------------------------------------------------------

class _Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.use_relu = True

    def forward(self, x):
        y = self.lin(x)
        if self.use_relu:
            y = self.act(y)
        if self.training:
            y = y * 2
        return y


def test_module_attribute_flag_change(counting_backend):
    m = _Flagged()
    c = _compile(m, counting_backend)
    x = torch.randn(3, 4)
    _run(c, m, x)
    _run(c, m, torch.randn(3, 4))
    assert counting_backend.count == 1
    m.use_relu = False
    _run(c, m, x)
    assert counting_backend.count == 2
    m.use_relu = True
    _run(c, m, x)
    assert counting_backend.count == 2


class _HoldsContainers(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = [1.5, 2.0]
        self.opts = {"shift": 3.0, "pair": [0.5, 4.0]}

    def forward(self, x):
        return x * self.scales[0] + self.opts["shift"] - self.opts["pair"][1]


def test_list_and_dict_held_by_a_module_changed_in_place(counting_backend):
    """`m.scales[0] = 5` changes no module attribute (the module version does not move), so
    guards on a module's list or dict items are checked on every call (was a silent wrong
    answer: the old constants stayed baked into the graph)."""
    m = _HoldsContainers()
    c = _compile(m, counting_backend)
    _run(c, m, torch.randn(3, 4))
    m.scales[0] = -5.0
    _run(c, m, torch.randn(3, 4))
    m.opts["shift"] = 0.25
    _run(c, m, torch.randn(3, 4))
    m.opts["pair"][1] = -7.0
    _run(c, m, torch.randn(3, 4))
    m.scales.append(9.0)
    _run(c, m, torch.randn(3, 4))
    assert counting_backend.count == 5


def test_train_eval_toggle(counting_backend):
    m = _Flagged()
    c = _compile(m, counting_backend)
    x = torch.randn(3, 4)
    _run(c, m, x)
    m.eval()
    _run(c, m, x)
    assert counting_backend.count == 2
    m.train()
    _run(c, m, x)
    m.eval()
    _run(c, m, x)
    assert counting_backend.count == 2


def test_train_eval_toggle_batchnorm(counting_backend):
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ref.load_state_dict(m.state_dict())
    c = _compile(m, counting_backend)
    for mode in ["train", "train", "eval", "train", "eval"]:
        getattr(m, mode)()
        getattr(ref, mode)()
        x = torch.randn(8, 4)
        assert_same(ref(x), c(x))
        assert_same(ref[1].running_mean, m[1].running_mean)
        assert_same(ref[1].running_var, m[1].running_var)
        assert m[1].num_batches_tracked.item() == ref[1].num_batches_tracked.item()
    assert counting_backend.count == 2


@pytest.mark.parametrize("where", ["root", "submodule"])
def test_hook_added_after_compile(counting_backend, where):
    m = _Flagged()
    target = m if where == "root" else m.lin
    c = _compile(m, counting_backend, fullgraph=False)
    x = torch.randn(3, 4)
    _run(c, m, x)
    assert counting_backend.count >= 1
    handle = target.register_forward_hook(lambda mod, inp, out: out * 10)
    _run(c, m, x)
    pre = target.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,))
    _run(c, m, x)
    handle.remove()
    _run(c, m, x)
    pre.remove()
    _run(c, m, x)


def test_parameter_replaced_different_shape(counting_backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x):
            return x * self.w

    m = M()
    c = _compile(m, counting_backend)
    _run(c, m, torch.randn(3, 4))
    m.w = nn.Parameter(torch.randn(1))
    _run(c, m, torch.randn(3, 4))
    assert counting_backend.count == 2


def test_parameter_replaced_same_shape_uses_new_values(counting_backend):
    m = _Flagged()
    c = _compile(m, counting_backend)
    x = torch.randn(3, 4)
    _run(c, m, x)
    assert counting_backend.count == 1
    m.lin.weight = nn.Parameter(torch.randn(4, 4))
    _run(c, m, x)
    with torch.no_grad():
        m.lin.bias.copy_(torch.randn(4))   # in-place update of a parameter's values
    _run(c, m, x)
    m.lin.bias.data = torch.randn(4)       # .data swap
    _run(c, m, x)


def test_instance_attribute_shadows_class_attribute_on_module(counting_backend):
    class M(nn.Module):
        scale = 2.0

        def forward(self, x):
            return x * self.scale

    m = M()
    c = _compile(m, counting_backend)
    x = torch.randn(4)
    _run(c, m, x)
    m.scale = 5.0             # instance __dict__ now shadows the class attribute
    _run(c, m, x)
    assert counting_backend.count == 2
    del m.scale               # the class attribute is visible again
    _run(c, m, x)
    M.scale = 7.0             # the class attribute itself changes
    _run(c, m, x)


def test_instance_attribute_shadows_class_attribute_on_plain_object(counting_backend):
    class Cfg:
        scale = 2.0

    def fn(x, cfg):
        return x * cfg.scale

    cfg = Cfg()
    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x, cfg)
    cfg.scale = 5.0
    _run(c, fn, x, cfg)
    assert counting_backend.count == 2
    del cfg.scale
    _run(c, fn, x, cfg)
    Cfg.scale = 7.0
    _run(c, fn, x, cfg)


def test_two_instances_of_one_module_class(counting_backend):
    # Instances whose guarded state matches share one graph (each call reads its own parameters);
    # an instance whose state differs gets its own entry. Results always match eager.
    m1, m2 = _Flagged(), _Flagged()
    c1, c2 = _compile(m1, counting_backend), _compile(m2, counting_backend)
    x = torch.randn(3, 4)
    _run(c1, m1, x)
    _run(c2, m2, x)
    assert counting_backend.count == 1
    _run(c1, m1, x)
    _run(c2, m2, x)
    assert counting_backend.count == 1
    m3 = _Flagged()
    m3.use_relu = not m3.use_relu
    c3 = _compile(m3, counting_backend)
    _run(c3, m3, x)
    _run(c1, m1, x)
    assert counting_backend.count == 2


def test_module_passed_as_argument_never_stale(counting_backend):
    def fn(model, x):
        return model(x) + 1

    m1, m2 = _Flagged(), _Flagged()
    c = _compile(fn, counting_backend)
    x = torch.randn(3, 4)
    _run(c, fn, m1, x)
    assert counting_backend.count == 1
    _run(c, fn, m2, x)
    _run(c, fn, m1, x)


# --- ambient state ----------------------------------------------------------------------------------

def test_ambient_grad_mode(counting_backend):
    w = torch.randn(4, requires_grad=True)

    def fn(x):
        return x * w + 1

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    assert _run(c, fn, x).requires_grad
    with torch.no_grad():
        out = _run(c, fn, x)
    assert not out.requires_grad
    assert counting_backend.count == 2
    assert _run(c, fn, x).requires_grad
    with torch.no_grad():
        _run(c, fn, x)
    assert counting_backend.count == 2


def test_ambient_autocast(counting_backend):
    def fn(x, w):
        return x @ w + 1

    c = _compile(fn, counting_backend)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    assert _run(c, fn, x, w).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _run(c, fn, x, w).dtype == torch.bfloat16
    assert counting_backend.count == 2
    assert _run(c, fn, x, w).dtype == torch.float32
    assert counting_backend.count == 2


def test_default_dtype_change(counting_backend):
    def fn(x):
        return torch.ones(x.shape[0]) + x, torch.tensor([1.5]) * 2

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    saved = torch.get_default_dtype()
    try:
        assert _run(c, fn, x)[0].dtype == torch.float32
        torch.set_default_dtype(torch.float64)
        out = _run(c, fn, x)
        assert out[0].dtype == torch.float64 and out[1].dtype == torch.float64
        assert counting_backend.count == 2
    finally:
        torch.set_default_dtype(saved)
    _run(c, fn, x)
    assert counting_backend.count == 2


# --- recompile limit ------------------------------------------------------------------------------

def test_recompile_limit_warns_once_and_stays_correct(counting_backend, caplog):
    def fn(x, n):
        for _ in range(n):       # the loop length pins n: each value needs its own graph
            x = x * 2 + 1
        return x

    caplog.set_level(logging.WARNING, logger="kiln")
    with config.patch(recompile_limit=2):
        c = kiln.compile(fn, backend=counting_backend)
        x = torch.randn(4)
        for n in [1, 2, 3, 4, 5, 3, 1, 2]:
            _run(c, fn, x, n)
    assert counting_backend.count == 2
    warnings = [r for r in caplog.records
                if r.name.startswith("kiln") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "limit" in warnings[0].getMessage().lower()


def test_recompile_limit_default_is_8():
    assert config.recompile_limit == 8


# --- recompile reasons ----------------------------------------------------------------------------

def _recompile_messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith("kiln")]


def test_recompile_reason_names_shape_expression(counting_backend, caplog):
    def fn(x):
        return x * 2

    caplog.set_level(logging.INFO, logger="kiln")
    kiln.logs.set_logs("recompiles")
    try:
        c = _compile(fn, counting_backend)
        c(torch.randn(8, 3))
        c(torch.randn(16, 3))
    finally:
        kiln.logs.set_logs()
    text = "\n".join(_recompile_messages(caplog))
    assert "x.shape[0]" in text and "expected" in text, text
    assert re.search(r"expected\D*8\D.*got\D*16", text), text


def test_recompile_reason_names_int_argument(counting_backend, caplog):
    def fn(x, n):
        return x * n

    caplog.set_level(logging.INFO, logger="kiln")
    kiln.logs.set_logs("recompiles")
    try:
        c = _compile(fn, counting_backend)
        c(torch.randn(3), 2)
        c(torch.randn(3), 3)
    finally:
        kiln.logs.set_logs()
    text = "\n".join(_recompile_messages(caplog))
    assert re.search(r"\bn\b", text) and "expected" in text, text
    assert "2" in text and "3" in text, text


def test_explain_reports_one_graph_and_guards():
    def fn(x, n):
        return x.relu() * n

    out = kiln.explain(fn)(torch.randn(4, 5), 3)
    assert out.graph_count == 1
    assert len(out.break_reasons) == 0
    guards = [str(g) for g in out.out_guards]
    assert guards, "explain reported no guards"
    assert any("x" in g for g in guards), guards
    assert any(re.search(r"\bn\b", g) for g in guards), guards


# --- adversarial: never a stale hit ---------------------------------------------------------------

def test_list_argument_mutated_in_place(counting_backend):
    def fn(xs):
        out = xs[0] * 1
        for t in xs[1:]:
            out = out + t
        return out

    xs = [torch.randn(3), torch.randn(3)]
    c = _compile(fn, counting_backend)
    _run(c, fn, xs)
    assert counting_backend.count == 1
    xs.append(torch.randn(3))
    _run(c, fn, xs)
    xs.pop(0)
    xs.pop(0)
    _run(c, fn, xs)
    xs[0] = torch.randn(3)
    _run(c, fn, xs)


def test_tensor_attribute_on_plain_object_changed(counting_backend):
    class Holder:
        def __init__(self):
            self.t = torch.randn(4)
            self.k = 2

    def fn(x, h):
        return x * h.t + h.k

    h = Holder()
    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x, h)
    assert counting_backend.count == 1
    h.t = torch.randn(4)        # same metadata, new values
    _run(c, fn, x, h)
    h.t = torch.randn(1, 4)     # new shape
    _run(c, fn, x, h)
    h.k = 3
    _run(c, fn, x, h)
    h.t.mul_(5)                 # in-place change of the held tensor
    _run(c, fn, x, h)


def test_submodule_replaced(counting_backend):
    m = _Flagged()
    c = _compile(m, counting_backend)
    x = torch.randn(3, 4)
    _run(c, m, x)
    assert counting_backend.count == 1
    m.act = nn.Tanh()
    out = _run(c, m, x)
    assert (out.abs() <= 2).all()   # tanh, then * 2 in training mode
    m.lin = nn.Linear(4, 4)
    _run(c, m, x)
    m.act = nn.Sequential()
    _run(c, m, x)


def test_input_mutated_between_calls_uses_new_values(counting_backend):
    c = _compile(_linear_fn, counting_backend)
    x = torch.randn(3, 4)
    _run(c, _linear_fn, x)
    x.mul_(3)
    _run(c, _linear_fn, x)
    assert counting_backend.count == 1


# --- more adversarial cases -------------------------------------------------------------------------

G_ACT = torch.relu


class _GlobalCfg:
    flag = True


G_CFG = _GlobalCfg()


def _uses_global_fn(x):
    return G_ACT(x) * 2


def _uses_global_cfg(x):
    return x * 2 if G_CFG.flag else x - 2


def test_global_torch_function_replaced(counting_backend):
    global G_ACT
    c = _compile(_uses_global_fn, counting_backend)
    x = torch.randn(4)
    try:
        _run(c, _uses_global_fn, x)
        assert counting_backend.count == 1
        G_ACT = torch.tanh
        _run(c, _uses_global_fn, x)
        G_ACT = torch.relu
        _run(c, _uses_global_fn, x)
    finally:
        G_ACT = torch.relu


def test_global_object_attribute_changed(counting_backend):
    c = _compile(_uses_global_cfg, counting_backend)
    x = torch.randn(4)
    try:
        _run(c, _uses_global_cfg, x)
        assert counting_backend.count == 1
        G_CFG.flag = False
        _run(c, _uses_global_cfg, x)
        G_CFG.flag = True
        _run(c, _uses_global_cfg, x)
    finally:
        G_CFG.flag = True


def test_torch_function_module_attribute_replaced(counting_backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act_fn = torch.relu

        def forward(self, x):
            return self.act_fn(x) + 1

    m = M()
    c = _compile(m, counting_backend)
    x = torch.randn(4)
    _run(c, m, x)
    assert counting_backend.count == 1
    m.act_fn = torch.tanh
    _run(c, m, x)


def test_aliased_inputs(counting_backend):
    def fn(x, y):
        x.add_(1)
        return y * 2

    c = _compile(fn, counting_backend)
    a, b = torch.randn(3), torch.randn(3)
    a_ref, b_ref = a.clone(), b.clone()
    assert_same(fn(a_ref, b_ref), c(a, b))
    t = torch.randn(3)
    t_ref = t.clone()
    assert_same(fn(t_ref, t_ref), c(t, t))   # the same tensor twice: y sees x's update
    assert_same(t_ref, t)


def test_closure_over_mutable_list_contents(counting_backend):
    scales = [2.0]
    layers = [torch.relu]

    def fn(x):
        return layers[0](x) * scales[0]

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x)
    assert counting_backend.count == 1
    scales[0] = 3.0
    _run(c, fn, x)
    layers[0] = torch.sigmoid
    _run(c, fn, x)


def test_function_defaults_changed(counting_backend):
    def fn(x, scale=2.0):
        return x * scale

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x)
    assert counting_backend.count == 1
    fn.__defaults__ = (5.0,)
    _run(c, fn, x)


def test_nested_plain_object_attribute_changed(counting_backend):
    class Inner:
        flag = True

    class Outer:
        def __init__(self):
            self.inner = Inner()
            self.inner.k = 2

    def fn(x, o):
        y = x * o.inner.k
        return y + 1 if o.inner.flag else y - 1

    o = Outer()
    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x, o)
    assert counting_backend.count == 1
    o.inner.flag = False
    _run(c, fn, x, o)
    o.inner.k = 7
    _run(c, fn, x, o)
    o.inner = Inner()
    o.inner.k = 1
    _run(c, fn, x, o)


def test_python_values_inside_containers_change(counting_backend):
    def fn(x, cfg, dims):
        return x * cfg["k"] + dims[1]

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x, {"k": 2}, (1, 2))
    assert counting_backend.count == 1
    _run(c, fn, x, {"k": 3}, (1, 2))
    _run(c, fn, x, {"k": 2}, (1, 5))
    _run(c, fn, x, {"k": 2.5}, (1, 2))


def test_tensor_metadata_inside_list_changes(counting_backend):
    def fn(xs):
        return [t * 2 for t in xs]

    c = _compile(fn, counting_backend)
    _run(c, fn, [torch.randn(3), torch.randn(3)])
    assert counting_backend.count == 1
    _run(c, fn, [torch.randn(3), torch.randn(3, dtype=torch.float64)])
    _run(c, fn, [torch.randn(3), torch.randn(5)])
    out = _run(c, fn, [torch.randn(3), torch.randn(3, requires_grad=True)])
    assert out[1].requires_grad


def test_grad_mode_read_as_python_value(counting_backend):
    def fn(x):
        return x * 2 if torch.is_grad_enabled() else x * 3

    c = _compile(fn, counting_backend)
    x = torch.randn(4)
    _run(c, fn, x)
    with torch.no_grad():
        _run(c, fn, x)
    assert counting_backend.count == 2


def test_parameter_requires_grad_toggled(counting_backend):
    m = nn.Linear(4, 4)
    c = _compile(m, counting_backend)
    x = torch.randn(2, 4)
    assert _run(c, m, x).requires_grad
    for p in m.parameters():
        p.requires_grad_(False)
    assert not _run(c, m, x).requires_grad
    for p in m.parameters():
        p.requires_grad_(True)
    assert _run(c, m, x).requires_grad


def test_buffer_replaced(counting_backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.randn(4))

        def forward(self, x):
            return x * self.scale

    m = M()
    c = _compile(m, counting_backend)
    x = torch.randn(4)
    _run(c, m, x)
    assert counting_backend.count == 1
    m.scale = torch.randn(4)
    _run(c, m, x)
    m.register_buffer("scale", torch.randn(1))
    _run(c, m, x)


# --- layers of one class sharing an entry (InstanceSlot) and the watched-module version -------

class _Layer(nn.Module):
    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale


class _Stack(nn.Module):
    """transformers' decoder loop when capture gives up on the stack's frame (a break inside
    the loop): it runs route-only, its layers are compiled one by one, and its
    `self.layers[:n]` slice builds a new ModuleList on every call."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer() for _ in range(n))

    def forward(self, x):
        for layer in self.layers[: len(self.layers)]:
            kiln.graph_break()
            x = layer(x)
        return x


def _slow_path_calls(monkeypatch):
    from kiln.capture import convert
    calls = [0]
    original = convert.CompiledFunction._choose

    def counting(self, values):
        calls[0] += 1
        return original(self, values)
    monkeypatch.setattr(convert.CompiledFunction, "_choose", counting)
    return calls


def test_layers_of_one_class_alternate_on_the_fast_path(counting_backend, monkeypatch):
    """One entry serves every layer; after each layer was verified once, alternating layers and
    the per-call ModuleList slice take no slow path (was 2 per layer call: Llama 1.34x eager)."""
    from kiln.capture.module_version import MODULE_VERSION
    model = _Stack()
    c = _compile(model, counting_backend, fullgraph=False)
    for _ in range(2):
        _run(c, model, torch.randn(2, 4))
    slow, version = _slow_path_calls(monkeypatch), MODULE_VERSION[0]
    for _ in range(3):
        _run(c, model, torch.randn(2, 4))
    assert slow[0] == 0 and MODULE_VERSION[0] == version
    # two entries shared by the three layers: the first layer's input needs no grad, the
    # others' (outputs of a Linear) do; a layer whose entry is not the last one hit checks
    # the other entries inline, not through the slow path
    assert counting_backend.count == 2
    with torch.no_grad():
        for _ in range(3):
            _run(c, model, torch.randn(2, 4))
    assert counting_backend.count == 3 and slow[0] <= 3  # verifying each layer for the entry


def test_a_changed_layer_is_guarded_again_while_others_share_the_entry(counting_backend):
    model = _Stack()
    c = _compile(model, counting_backend, fullgraph=False)
    _run(c, model, torch.randn(2, 4))
    assert counting_backend.count == 2  # layer 0's input needs no grad, the others' do
    model.layers[1].scale = -3.0  # a watched layer: the version moves, layer 1 recompiles
    _run(c, model, torch.randn(2, 4))
    _run(c, model, torch.randn(2, 4))
    assert counting_backend.count == 3
    model.layers[2] = _Layer(scale=0.5)  # a new module put into a watched list
    _run(c, model, torch.randn(2, 4))
    model.layers[2].scale = 7.0  # the new layer is watched since its guards were checked
    _run(c, model, torch.randn(2, 4))
    model.layers[0].lin = nn.Linear(4, 4)  # a new submodule: same guards, new weights
    _run(c, model, torch.randn(2, 4))


def test_a_module_no_guard_has_seen_does_not_move_the_version():
    from kiln.capture.module_version import MODULE_VERSION, watch
    kiln.compile(nn.Linear(2, 2))  # installs the version counter
    fresh = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    version = MODULE_VERSION[0]
    fresh[:2]
    fresh.append(nn.ReLU())
    fresh[0].weight = nn.Parameter(torch.randn(2, 2))
    assert MODULE_VERSION[0] == version
    watch(fresh[0])
    fresh[0].bias = None
    assert MODULE_VERSION[0] > version


class _Holder:
    pass


def _optional_bias(obj, x):
    if hasattr(obj, "bias"):
        return x + obj.bias
    return x * 2


def test_an_object_without_a_guarded_attribute_is_a_miss(counting_backend):
    # the attribute's presence is checked before its value's guards, which would raise
    c = _compile(_optional_bias, counting_backend)
    with_bias, without = _Holder(), _Holder()
    with_bias.bias = torch.randn(3)
    for obj in (with_bias, without, with_bias, without):
        _run(c, _optional_bias, obj, torch.randn(3))
    assert counting_backend.count == 2


class _MaybeWarm(nn.Module):
    def forward(self, x):
        if hasattr(self, "warm"):
            return x * self.warm
        return x + 1


def test_an_attribute_a_module_lacks_is_guarded_absent(counting_backend):
    model = _MaybeWarm()
    c = _compile(model, counting_backend)
    _run(c, model, torch.randn(3))
    model.warm = 3.0  # moves the version: the first entry's absence guard fails
    _run(c, model, torch.randn(3))
    del model.warm
    _run(c, model, torch.randn(3))
    assert counting_backend.count == 2


def test_tensor_passed_twice_is_guarded_as_an_alias_not_as_that_tensor(counting_backend, recorder):
    """`f(x, x)`: the guard is `y is x`, so new tensors passed twice reuse the graph, and two
    different tensors capture again (a graph with one input for both would be wrong)."""
    def fn(x, y):
        return x * y + 1

    c = _compile(fn, counting_backend)
    for _ in range(3):
        a = torch.randn(4)
        _run(c, fn, a, a)
    assert counting_backend.count == 1
    _run(c, fn, a, torch.randn(4))
    assert counting_backend.count == 2
    (reason,) = recorder.recompiles
    assert "y: expected the same object as x" in reason.render()
