"""Cache-safety audit, second part: nn.Module state, torch's global state, input tensors,
Python values, more class-level state, the kiln backend, and what is deliberately not
guarded. Same method as test_cache_safety_audit.py (docs/caching.md, "What a cached graph
depends on")."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn

import kiln
from cache_audit_helpers import BACKENDS, Counting, class_closure as _class_closure, randn as _r, \
    same as _same
from helpers import assert_same_structure_and_values as assert_same


@pytest.fixture(params=BACKENDS)
def backend(request):
    return Counting(request.param)

# --- nn.Module state ----------------------------------------------------------------------------

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.register_buffer("shift", torch.randn(4))
        self.flag = True

    def forward(self, x):
        y = self.act(self.lin(x)) + self.shift
        if self.flag:
            y = y * 2
        if self.training:
            y = y - 1
        return y


def test_parameter_replaced_by_another_shape_dtype_requires_grad(backend):
    m = _Net()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(3, 4))
    m.lin.weight = nn.Parameter(_r(4, 4), requires_grad=False)
    _same(c, m, _r(3, 4))
    m.lin.bias = nn.Parameter(_r(1))  # another shape, broadcast
    _same(c, m, _r(3, 4))
    m.lin.weight.data = _r(4, 4, dtype=torch.float64)  # dtype changed in place through .data
    m.lin.bias.data = _r(4, dtype=torch.float64)
    _same(c, m, _r(3, 4, dtype=torch.float64).float().double())
    assert backend.count >= 3


def test_parameter_requires_grad_toggled_in_place(backend):
    # `p.requires_grad_()` and `p.data = t` change a parameter in place: the module version
    # does not move, so its guards are not re-checked (TorchDynamo skips them too while the
    # module's dict tags match: `skip_tensor_guards_with_matching_dict_tags`). The eager and
    # aot_eager graphs still answer as eager: autograd decides at run time.
    m = nn.Linear(4, 4)
    for p in m.parameters():
        p.requires_grad_(False)

    def fn(x):
        return m(x).sum()

    c = kiln.compile(fn, backend=backend)
    x = _r(2, 4)
    _same(c, fn, x)
    m.weight.requires_grad_(True)  # unfrozen: the graph must now give grads
    out = c(x)
    assert out.requires_grad
    out.backward()
    expected = torch.autograd.grad(fn(x), m.weight)[0]
    assert_same(expected, m.weight.grad)
    m.weight.grad = None
    m.bias.requires_grad_(True)
    m.weight.requires_grad_(False)
    _same(c, fn, x)
    assert backend.count >= 1


def test_training_buffer_submodule_hook(backend):
    m = _Net()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(3, 4))
    m.eval()
    _same(c, m, _r(3, 4))
    m.flag = False
    _same(c, m, _r(3, 4))
    m.register_buffer("shift", _r(1, 4))
    _same(c, m, _r(3, 4))
    m.act = nn.GELU()
    _same(c, m, _r(3, 4))
    handle = m.lin.register_forward_hook(lambda mod, args, out: out * -3)
    _same(c, m, _r(3, 4))
    handle.remove()
    _same(c, m, _r(3, 4))
    pre = m.register_forward_pre_hook(lambda mod, args: (args[0] + 10,))
    _same(c, m, _r(3, 4))
    pre.remove()
    assert backend.count >= 6


def test_buffer_mutated_in_place_uses_new_values(backend):
    m = _Net()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(3, 4))
    m.shift.mul_(-5)
    _same(c, m, _r(3, 4))
    assert backend.count == 1


def test_submodule_forward_written_into_its_dict(backend):
    # Not guarded on every call (TorchDynamo: open issue #197859): a write straight into a
    # module's `__dict__` bypasses `nn.Module.__setattr__`, so the module version does not move
    # and the "not shadowed" guard is not re-checked until some module changes. Any change
    # through the module API (here `m.flag = ...`) makes the next call see the shadowing forward.
    m = _Net()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(3, 4))
    m.lin.__dict__["forward"] = lambda x: x * 0 + 7
    m.flag = m.flag
    _same(c, m, _r(3, 4))
    assert backend.count == 2


def test_module_forward_replaced_on_instance(backend):
    m = _Net()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(3, 4))
    m.lin.forward = lambda x: x + 100
    _same(c, m, _r(3, 4))
    assert backend.count == 2


def test_global_hook_added_after_compile(backend):
    m = _Net()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(3, 4))
    handle = nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out + 1 if isinstance(mod, nn.Linear) else out)
    try:
        _same(c, m, _r(3, 4))
    finally:
        handle.remove()
    _same(c, m, _r(3, 4))


# --- torch global state --------------------------------------------------------------------------

def _makes_tensors(x):
    return x + torch.ones(4) * 0.5 + torch.arange(4).float()


def test_default_dtype(backend):
    c = kiln.compile(_makes_tensors, backend=backend)
    _same(c, _makes_tensors, _r(4))
    saved = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        _same(c, _makes_tensors, _r(4))
    finally:
        torch.set_default_dtype(saved)
    _same(c, _makes_tensors, _r(4))
    assert backend.count == 2


def test_default_device(backend):
    # an ATen graph (aot_eager, kiln) has the device of `torch.ones` baked in: a
    # `torch.device(...)` context or `torch.set_default_device` (torch function modes) must
    # not reuse a graph captured without it
    def fn(x):
        return torch.ones(4) * x.sum()

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    x = _r(4)
    torch.set_default_device("meta")
    try:
        assert c(x).device == fn(x).device == torch.device("meta")
    finally:
        torch.set_default_device(None)
    with torch.device("meta"):
        assert c(x).device == torch.device("meta")
    _same(c, fn, _r(4))
    assert backend.count >= 1


def _lin(x, w):
    return (x @ w).relu().sum(0)


def test_grad_mode_and_inference_mode(backend):
    c = kiln.compile(_lin, backend=backend)
    w = _r(4, 4, requires_grad=True)
    _same(c, _lin, _r(2, 4), w)
    with torch.no_grad():
        _same(c, _lin, _r(2, 4), w)
    with torch.inference_mode():
        out = c(_r(2, 4), w)
        assert out.is_inference() == _lin(_r(2, 4), w).is_inference()
        _same(c, _lin, _r(2, 4), w)
    with torch.inference_mode():
        x = _r(2, 4)
    _same(c, _lin, x, w.detach())  # an inference tensor as input, outside inference mode
    assert backend.count >= 2


def test_autocast_enabled_and_dtype(backend):
    c = kiln.compile(_lin, backend=backend)
    x, w = _r(2, 4), _r(4, 4)
    _same(c, _lin, x, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _same(c, _lin, _r(2, 4), w)
    with torch.autocast("cpu", dtype=torch.float16):
        _same(c, _lin, _r(2, 4), w)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        _same(c, _lin, _r(2, 4), w)
    assert backend.count == 3


def test_deterministic_algorithms_toggled(backend):
    # index_add_ on CPU is deterministic either way; what matters is that a graph captured with
    # the flag off is not run with it on when an op's behaviour depends on it (TorchDynamo guards
    # `torch.are_deterministic_algorithms_enabled()`: DETERMINISTIC_ALGORITHMS)
    def fn(x):
        return x * 2 if torch.are_deterministic_algorithms_enabled() else x - 2

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    saved = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(not saved)
        _same(c, fn, _r(4))
    finally:
        torch.use_deterministic_algorithms(saved)
    _same(c, fn, _r(4))
    assert backend.count >= 1


def test_cudnn_flags_read_by_code(backend):
    def fn(x):
        return x * 2 if torch.backends.cudnn.deterministic else x - 2

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    saved = torch.backends.cudnn.deterministic
    try:
        torch.backends.cudnn.deterministic = not saved
        _same(c, fn, _r(4))
    finally:
        torch.backends.cudnn.deterministic = saved
    assert backend.count >= 1


def test_printoptions_do_not_recompile(backend):
    c = kiln.compile(_lin, backend=backend)
    _same(c, _lin, _r(2, 4), _r(4, 4))
    torch.set_printoptions(precision=2)
    try:
        _same(c, _lin, _r(2, 4), _r(4, 4))
    finally:
        torch.set_printoptions(profile="default")
    assert backend.count == 1


# --- input tensors -------------------------------------------------------------------------------

def _pointwise(x, y):
    return x * 2 + y.sin()


def test_input_dtype_requires_grad_contiguity(backend):
    c = kiln.compile(_pointwise, backend=backend)
    _same(c, _pointwise, _r(4, 4), _r(4, 4))
    _same(c, _pointwise, _r(4, 4, dtype=torch.float64), _r(4, 4, dtype=torch.float64))
    _same(c, _pointwise, _r(4, 4, requires_grad=True), _r(4, 4))
    _same(c, _pointwise, _r(4, 4).t(), _r(4, 4))
    _same(c, _pointwise, _r(4, 8)[:, ::2], _r(4, 4))
    assert backend.count >= 4


def test_storage_offset(backend):
    def fn(x):
        return x.view(-1)[:4] * 2 + x.as_strided((2,), (1,)).sum()

    c = kiln.compile(fn, backend=backend)
    base = _r(20)
    _same(c, fn, base[:16].view(4, 4))
    _same(c, fn, base[4:].view(4, 4))  # same shape and strides, another storage offset


def test_aliasing_between_inputs(backend):
    def fn(x, y):
        x.add_(1)
        return y * 2

    c = kiln.compile(fn, backend=backend)
    a, b = _r(4), _r(4)
    a2, b2 = a.clone(), b.clone()
    assert_same(fn(a2, b2), c(a, b))
    base = _r(8)
    base2 = base.clone()
    assert_same(fn(base2[:4], base2[2:6]), c(base[:4], base[2:6]))  # overlapping views
    assert_same(base2, base)
    t = _r(4)
    t2 = t.clone()
    assert_same(fn(t2, t2), c(t, t))
    assert_same(t2, t)


def test_zero_dim_vs_one_element(backend):
    def fn(x, y):
        return x + y

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(()), _r(()))
    _same(c, fn, _r(1), _r(()))
    _same(c, fn, _r(()), _r(1))
    assert backend.count == 3


class MyTensor(torch.Tensor):
    pass


def test_parameter_and_subclass_inputs(backend):
    def fn(x):
        return x * 2

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    p = nn.Parameter(_r(4))
    _same(c, fn, p)
    s = _r(4).as_subclass(MyTensor)
    _same(c, fn, s)
    _same(c, fn, _r(4))


# --- Python values -------------------------------------------------------------------------------

def test_scalar_type_and_value(backend):
    def fn(x, n):
        return x * n + (1 if isinstance(n, bool) else 0)

    c = kiln.compile(fn, backend=backend)
    for n in (2, 2.0, True, 3, 3.5, False, 1, 1.0):
        _same(c, fn, _r(4), n)
    assert backend.count >= 3


def test_scalar_type_under_int_division(backend):
    def fn(x, n):
        return x + n // 2 + n / 3

    c = kiln.compile(fn, backend=backend)
    for n in (3, 3.0, 5, 7.5, True):
        _same(c, fn, _r(4), n)


def test_optional_argument_none_vs_tensor(backend):
    def fn(x, bias=None):
        if bias is not None:
            x = x + bias
        return x * 2

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    _same(c, fn, _r(4), _r(4))
    _same(c, fn, _r(4), None)
    _same(c, fn, _r(4), bias=_r(4))
    assert backend.count == 2


def test_list_of_tensors_changes_length(backend):
    def fn(xs):
        return sum(x * i for i, x in enumerate(xs))

    c = kiln.compile(fn, backend=backend)
    for n in (2, 3, 1, 2):
        _same(c, fn, [_r(4) for _ in range(n)])
    assert backend.count == 3


def test_kwargs_order(backend):
    def fn(x, **kw):
        out = x
        for i, (k, v) in enumerate(kw.items()):
            out = out * (i + 1) + v
        return out, list(kw)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4), a=_r(4), b=_r(4))
    _same(c, fn, _r(4), b=_r(4), a=_r(4))
    assert backend.count == 2


def test_varargs_length(backend):
    def fn(*xs):
        return torch.stack(xs).sum(0)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4), _r(4))
    _same(c, fn, _r(4), _r(4), _r(4))
    assert backend.count == 2


# --- more class-level state ----------------------------------------------------------------------

def test_root_module_class_forward_patched(backend):
    class N(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * 2

    m = N()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(2, 4))
    N.forward = lambda self, x: self.lin(x) - 100
    _same(c, m, _r(2, 4))
    assert backend.count == 2


def _use_kernel(kernel):
    """Like the `kernels` package: the class's forward replaced by a wrapper holding a module."""
    def deco(cls):
        orig = cls.forward

        @functools.wraps(orig)
        def forward(self, x):
            return kernel(x) + orig(self, x)
        cls.forward = forward
        return cls
    return deco


@_use_kernel(nn.Tanh())
class _Kernelized(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


def test_module_in_a_class_function_closure_rebound(backend):
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _Kernelized()

        def forward(self, x):
            return self.inner(x) + 1

    m = Outer()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(2, 4))
    cell = _class_closure(_Kernelized, "forward", "kernel")
    saved = cell.cell_contents
    try:
        cell.cell_contents = nn.Sigmoid()
        _same(c, m, _r(2, 4))
    finally:
        cell.cell_contents = saved
    _same(c, m, _r(2, 4))
    assert backend.count == 2


def test_static_and_class_methods_patched(backend):
    class S:
        K = 3.0

        @staticmethod
        def f(x):
            return x * 2

        @classmethod
        def g(cls, x):
            return x * cls.K

    def fn(x):
        return S.f(x) + S.g(x)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    S.K = 10.0
    _same(c, fn, _r(4))
    S.f = staticmethod(lambda x: x * -1)
    _same(c, fn, _r(4))
    S.g = classmethod(lambda cls, x: x * 0)
    _same(c, fn, _r(4))
    assert backend.count == 4


def test_object_in_a_registry_changed(backend):
    class Obj:
        def __init__(self):
            self.k = 2.0

        def go(self, x):
            return x * self.k

    reg = {"o": Obj()}

    def fn(x):
        return reg["o"].go(x)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    reg["o"].k = 7.0
    _same(c, fn, _r(4))
    reg["o"] = Obj()
    _same(c, fn, _r(4))
    Obj.go = lambda self, x: x - self.k
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_nested_containers_mutated(backend):
    cfg = {"sub": {"s": 2.0}}
    extra = [_r(4)]

    def fn(x):
        return x * cfg["sub"]["s"] + sum(extra)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    cfg["sub"]["s"] = 5.0
    _same(c, fn, _r(4))
    extra.append(_r(4))
    _same(c, fn, _r(4))
    extra[0] = _r(4)  # a new tensor in the same slot: read as an input, no recompile needed
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_mutable_default_mutated_and_tensor_default(backend):
    def helper(x, scales=[2.0], bias=_r(4)):  # noqa: B006 - the point of the test
        return x * scales[0] + bias

    def fn(x):
        return helper(x)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    helper.__defaults__[0][0] = -1.0
    _same(c, fn, _r(4))
    helper.__defaults__[1].mul_(3)  # in place: the graph reads the tensor as an input
    _same(c, fn, _r(4))
    helper.__kwdefaults__ = None
    helper.__defaults__ = ([4.0], _r(1))
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_torch_flags_read_by_code(backend):
    def fn(x):
        y = x * 2 if torch.backends.cuda.matmul.allow_tf32 else x * 3
        return y + 1 if torch.is_inference_mode_enabled() else y - 1

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not saved
        _same(c, fn, _r(4))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    with torch.inference_mode():
        _same(c, fn, _r(4))
    assert backend.count == 3


def test_kwargs_order_of_named_parameters_reuses_the_entry(backend):
    def fn(x, a, b):
        return x * a + b

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4), a=_r(4), b=_r(4))
    _same(c, fn, _r(4), b=_r(4), a=_r(4))
    _same(c, fn, _r(4), _r(4), b=_r(4))
    assert backend.count == 1


# --- the kiln backend: generated kernels index storage, so layout is part of the graph -----------

@pytest.fixture
def kiln_backend(generated_kernels):
    return Counting("kiln")


def test_kiln_backend_layout_offset_and_aliasing(kiln_backend):
    def fn(x, y):
        return (x * 2 + y).relu()

    c = kiln.compile(fn, backend=kiln_backend)
    base = _r(40)
    _same(c, fn, base[:16].view(4, 4), _r(4, 4))
    _same(c, fn, base[3:19].view(4, 4), _r(4, 4))  # another storage offset
    _same(c, fn, _r(4, 4).t(), _r(4, 4))  # other strides
    _same(c, fn, base[:32].view(4, 8)[:, ::2], _r(4, 4))
    t = _r(4, 4)
    _same(c, fn, t, t)  # aliased inputs
    assert kiln_backend.count >= 3


def test_kiln_backend_parameter_replaced(kiln_backend):
    m = nn.Linear(4, 4)
    c = kiln.compile(m, backend=kiln_backend)
    with torch.no_grad():
        _same(c, m, _r(2, 4))
        m.bias = nn.Parameter(_r(1))  # another shape (broadcast)
        _same(c, m, _r(2, 4))
        m.weight = nn.Parameter(_r(4, 4).t())  # other strides
        _same(c, m, _r(2, 4))
    assert kiln_backend.count == 3


# --- deliberately not guarded (docs/caching.md) ---------------------------------------------------

def test_torch_function_patched_after_compile_needs_a_reset(backend, monkeypatch):
    # Functions of torch modules are constants: guarding each torch function a model calls
    # would cost a comparison per function per call (TorchDynamo guards them by identity, in
    # C++). Patch before compiling, or reset.
    def fn(x):
        return torch.nn.functional.gelu(x) + 1

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    monkeypatch.setattr(torch.nn.functional, "gelu", lambda t, approximate="none": t * 100)
    kiln.reset()
    _same(c, fn, _r(4))
    assert backend.count == 2


def test_module_attribute_set_behind_set_attr_is_seen_at_the_next_module_change(backend):
    # object.__setattr__ bypasses nn.Module.__setattr__: the module version does not move
    # (TorchDynamo: its dict tags do, but `__dict__` writes are open issue #197859)
    class N(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2.0

        def forward(self, x):
            return x * self.k

    m = N()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(4))
    object.__setattr__(m, "k", 5.0)
    m.train()  # any change through the module API re-checks the module guards
    _same(c, m, _r(4))
    assert backend.count == 2
