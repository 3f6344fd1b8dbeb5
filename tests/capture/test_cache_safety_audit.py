"""Cache-safety audit: a cached graph must never answer for state it was not captured under.

Each test compiles a function or module, calls it, changes some state the compiled code depends
on, calls again with fresh random inputs and compares with eager. The answer must be eager's:
through a recompile, a guard failure or a fallback; never the stale graph. Every test also checks
that something was captured (a test whose function silently runs eagerly cannot fail).

Where kiln deliberately does not guard a state, as TorchDynamo does not either, the test says so
and pins the behaviour (docs/caching.md, "What a cached graph depends on").
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
import types

import pytest
import torch
import torch.nn as nn

import kiln
from cache_audit_helpers import BACKENDS, Counting, class_closure as _class_closure, randn as _r, \
    same as _same


@pytest.fixture(params=BACKENDS)
def backend(request):
    return Counting(request.param)

# --- closures, defaults, code -------------------------------------------------------------------

def test_nested_function_free_variable_rebound(backend):
    scale = 2.0

    def inner(x):
        return x * scale

    def fn(x):
        return inner(x) + 1

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    scale = 3.0  # noqa: F841 - read by inner through its cell
    _same(c, fn, _r(4))
    scale = "no longer a number"  # noqa: F841
    with pytest.raises(TypeError):
        c(_r(4))
    assert backend.count >= 1


def test_nested_function_cell_holding_a_function_rebound(backend):
    act = torch.relu

    def fn(x):
        return act(x) * 2

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(8))
    act = torch.tanh  # noqa: F841
    _same(c, fn, _r(8))
    assert backend.count == 2


def _scaled(factor):
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args):
            return f(*args) * factor
        return wrapper
    return deco


def test_decorator_closure(backend):
    @_scaled(2.0)
    def fn(x):
        return x.sin()

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    fn.__closure__[fn.__code__.co_freevars.index("factor")].cell_contents = 5.0
    _same(c, fn, _r(4))
    assert backend.count == 2


class _Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @_scaled(2.0)
    def forward(self, x):
        return self.lin(x)


def test_closure_of_a_function_read_off_a_class_rebound(backend):
    # the decorator's wrapper lives on the class: its cells were guarded as module guards,
    # re-checked only when an nn.Module changes; a cell rebound alone moves no module version
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _Decorated()

        def forward(self, x):
            return self.inner(x) + 1

    m = Outer()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(2, 4))
    cell = _class_closure(_Decorated, "forward", "factor")
    saved = cell.cell_contents
    try:
        cell.cell_contents = 7.0
        _same(c, m, _r(2, 4))
    finally:
        cell.cell_contents = saved
    _same(c, m, _r(2, 4))
    assert backend.count >= 1


def _method_wrapper(fn):
    state = {"scale": 2.0}

    @functools.wraps(fn)
    def wrapper(self, x):
        return fn(self, x) * state["scale"]
    wrapper.state = state
    return wrapper


def test_closure_of_a_class_function_holding_a_dict_mutated(backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        @_method_wrapper
        def forward(self, x):
            return self.lin(x)

    m = M()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(2, 4))
    M.forward.state["scale"] = -3.0
    _same(c, m, _r(2, 4))
    assert backend.count >= 1


def test_defaults_changed(backend):
    def fn(x, scale=2.0, *, shift=1.0):
        return x * scale + shift

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    fn.__defaults__ = (5.0,)
    _same(c, fn, _r(4))
    fn.__kwdefaults__ = {"shift": -4.0}
    _same(c, fn, _r(4))
    assert backend.count >= 1


def test_defaults_of_an_inlined_callee_changed(backend):
    def helper(x, scale=2.0):
        return x * scale

    def fn(x):
        return helper(x) + 1

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    helper.__defaults__ = (-3.0,)
    _same(c, fn, _r(4))
    assert backend.count == 2


def test_kwdefaults_of_an_inlined_callee_mutated_in_place(backend):
    def helper(x, *, shift=1.0):
        return x + shift

    def fn(x):
        return helper(x)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    helper.__kwdefaults__["shift"] = 5.0
    _same(c, fn, _r(4))
    del helper.__kwdefaults__["shift"]
    with pytest.raises(TypeError):
        fn(_r(4))
    with pytest.raises(TypeError):
        c(_r(4))
    assert backend.count == 2


def test_code_swapped(backend):
    def fn(x):
        return x + 1

    def other(x):
        return x * 10

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    fn.__code__ = other.__code__
    _same(c, fn, _r(4))


def test_code_of_an_inlined_callee_swapped(backend):
    def helper(x):
        return x + 1

    def fn(x):
        return helper(x) * 2

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    helper.__code__ = (lambda x: x - 100).__code__
    _same(c, fn, _r(4))
    assert backend.count == 2


# --- globals and Python modules ------------------------------------------------------------------

G_SCALE = 2.0


def g_act(x):
    return x.relu()


def _uses_globals(x):
    return g_act(x) * G_SCALE


def test_global_constant_and_function_rebound(backend):
    global G_SCALE, g_act
    saved = G_SCALE, g_act
    c = kiln.compile(_uses_globals, backend=backend)
    try:
        _same(c, _uses_globals, _r(4))
        G_SCALE = 3.5
        _same(c, _uses_globals, _r(4))
        g_act = torch.sigmoid
        _same(c, _uses_globals, _r(4))
    finally:
        G_SCALE, g_act = saved
    _same(c, _uses_globals, _r(4))
    assert backend.count == 3


def test_deleted_global_raises_the_users_error(backend):
    ns = {"K": 2.0}
    exec("def fn(x):\n    return x * K\n", ns)
    fn = ns["fn"]
    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    del ns["K"]  # the guard `__G['K']` cannot even be read: a miss, and eager's NameError
    with pytest.raises(NameError):
        c(_r(4))
    ns["K"] = 3.0
    _same(c, fn, _r(4))


def _make_module_tree():
    mod = types.ModuleType("kiln_audit_cfg")
    mod.SCALE = 2.0
    sub = types.ModuleType("kiln_audit_cfg.sub")
    sub.SHIFT = 1.0
    sub.act = torch.relu
    mod.sub = sub
    return mod


AUDIT_CFG = _make_module_tree()


def _uses_module_attrs(x):
    return AUDIT_CFG.sub.act(x) * AUDIT_CFG.SCALE + AUDIT_CFG.sub.SHIFT


def test_module_and_submodule_attributes_changed(backend):
    global AUDIT_CFG
    AUDIT_CFG = _make_module_tree()
    c = kiln.compile(_uses_module_attrs, backend=backend)
    _same(c, _uses_module_attrs, _r(4))
    AUDIT_CFG.SCALE = 3
    _same(c, _uses_module_attrs, _r(4))
    AUDIT_CFG.sub.SHIFT = -2.0
    _same(c, _uses_module_attrs, _r(4))
    AUDIT_CFG.sub.act = torch.tanh
    _same(c, _uses_module_attrs, _r(4))
    AUDIT_CFG.sub = types.SimpleNamespace(act=torch.sin, SHIFT=0.5)
    _same(c, _uses_module_attrs, _r(4))
    assert backend.count >= 4


def test_real_module_attribute_through_sys_modules(backend):
    mod = types.ModuleType("kiln_audit_real")
    mod.FACTOR = 2
    sys.modules["kiln_audit_real"] = mod
    try:
        ns = {}
        exec("import kiln_audit_real\n"
             "def fn(x):\n"
             "    return x * kiln_audit_real.FACTOR\n", ns)
        fn = ns["fn"]
        c = kiln.compile(fn, backend=backend)
        _same(c, fn, _r(4))
        mod.FACTOR = 3
        _same(c, fn, _r(4))
    finally:
        del sys.modules["kiln_audit_real"]
    assert backend.count == 2


# --- classes and objects ----------------------------------------------------------------------

class Scaler:
    factor = 2.0

    def __init__(self):
        self.flag = True
        self._k = 1.5

    def apply(self, x):
        return x * self.factor if self.flag else x - self.factor

    @property
    def k(self):
        return self._k * Scaler.factor


def test_class_attribute_changed(backend):
    s = Scaler()

    def fn(x):
        return s.apply(x)

    c = kiln.compile(fn, backend=backend)
    saved = Scaler.factor
    try:
        _same(c, fn, _r(4))
        Scaler.factor = 4.0
        _same(c, fn, _r(4))
    finally:
        Scaler.factor = saved
    _same(c, fn, _r(4))
    assert backend.count == 2


def test_class_counter_read_through_the_class(backend):
    class C:
        step = 1

    def fn(x):
        return x * C.step

    c = kiln.compile(fn, backend=backend)
    for step in (1, 2, 3, 4, 5):
        C.step = step
        _same(c, fn, _r(4))
    assert backend.count == 2  # the second value makes it a graph input (automatic dynamic)


def test_instance_attribute_changed(backend):
    s = Scaler()

    def fn(x):
        return s.apply(x)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    s.flag = False
    _same(c, fn, _r(4))
    s.factor = 9.0  # now shadows the class attribute
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_method_monkeypatched_on_instance_and_class(backend):
    s = Scaler()

    def fn(x):
        return s.apply(x) + 1

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    s.apply = lambda x: x * 100
    _same(c, fn, _r(4))
    del s.apply
    _same(c, fn, _r(4))
    saved = Scaler.apply
    try:
        Scaler.apply = lambda self, x: x - 100
        _same(c, fn, _r(4))
    finally:
        Scaler.apply = saved
    _same(c, fn, _r(4))
    assert backend.count >= 3


def test_property_getter_reads_changing_state(backend):
    s = Scaler()

    def fn(x):
        return x * s.k

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    s._k = -1.0
    _same(c, fn, _r(4))
    saved = Scaler.factor
    try:
        Scaler.factor = 10.0
        _same(c, fn, _r(4))
    finally:
        Scaler.factor = saved
    assert backend.count == 3


def test_property_replaced_on_the_class(backend):
    class P:
        @property
        def k(self):
            return 2.0

    p = P()

    def fn(x):
        return x * p.k

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    P.k = property(lambda self: -5.0)
    _same(c, fn, _r(4))
    assert backend.count == 2


def test_class_method_monkeypatched_on_module_class(backend):
    class Act(nn.Module):
        def forward(self, x):
            return self.act(x)

        def act(self, x):
            return x.relu()

    m = Act()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(4))
    Act.act = lambda self, x: x.sigmoid()
    _same(c, m, _r(4))
    assert backend.count == 2


def test_partial_args_changed(backend):
    def scaled(x, a, b=1.0):
        return x * a + b

    p = functools.partial(scaled, a=2.0, b=3.0)
    q = functools.partial(scaled, 2.0)  # noqa: F841 - positional, cannot be rebound (immutable)

    def fn(x):
        return p(x)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    p.keywords["a"] = -1.0  # a partial's keywords dict is mutable
    _same(c, fn, _r(4))
    p.keywords["c"] = 1.0  # an extra keyword: eager raises
    with pytest.raises(TypeError):
        c(_r(4))
    del p.keywords["c"]
    _same(c, fn, _r(4))
    assert backend.count == 2


def test_partial_rebound_in_a_cell(backend):
    p = functools.partial(torch.add, alpha=2.0)

    def fn(x, y):
        return p(x, y)

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4), _r(4))
    p = functools.partial(torch.add, alpha=-1.0)  # noqa: F841
    _same(c, fn, _r(4), _r(4))
    assert backend.count == 2


# --- containers read by the code ------------------------------------------------------------------

def test_dict_mutated_in_place(backend):
    cfg = {"act": "relu", "scale": 2.0}

    def fn(x):
        y = x.relu() if cfg["act"] == "relu" else torch.nn.functional.gelu(x)
        return y * cfg["scale"]

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    cfg["act"] = "gelu"
    _same(c, fn, _r(4))
    cfg["scale"] = 0.5
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_list_of_layers_appended(backend):
    layers = [torch.sin]

    def fn(x):
        for f in layers:
            x = f(x)
        return x

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    layers.append(torch.cos)
    _same(c, fn, _r(4))
    layers[0] = torch.exp
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_module_list_attribute_appended(backend):
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    m = Stack()
    c = kiln.compile(m, backend=backend)
    _same(c, m, _r(2, 4))
    m.layers.append(nn.Linear(4, 4))
    _same(c, m, _r(2, 4))
    assert backend.count == 2


class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


@dataclasses.dataclass
class Cfg:
    act: Act = Act.RELU
    scale: float = 2.0


def test_enum_and_dataclass_field_values(backend):
    cfg = Cfg()

    def fn(x):
        y = x.relu() if cfg.act is Act.RELU else x.tanh()
        return y * cfg.scale

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    cfg.act = Act.TANH
    _same(c, fn, _r(4))
    cfg.scale = -1.0
    _same(c, fn, _r(4))
    assert backend.count == 3


def test_frozen_config_rebound(backend):
    features = frozenset({"a"})
    sizes = (1, 2)

    def fn(x):
        y = x * 2 if "b" in features else x
        return y + sizes[1]

    c = kiln.compile(fn, backend=backend)
    _same(c, fn, _r(4))
    features = frozenset({"a", "b"})  # noqa: F841
    _same(c, fn, _r(4))
    sizes = (1, 5)  # noqa: F841
    _same(c, fn, _r(4))
    assert backend.count == 3
