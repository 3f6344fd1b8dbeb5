"""What Hugging Face's `kernels` package (used by transformers 5 on every Llama-style layer) does
around a layer, imitated without it, captured as one graph with outputs equal to eager:

- a class whose `forward` was replaced by a `functools.wraps` wrapper whose closure holds a
  module (`use_kernelized_func`): the class function gets a source, so its cells do too;
- `id(obj)` of an object read from the frame (global, closure cell, module): a constant under
  an identity guard, so another object recompiles instead of reusing the folded id;
- a "context variable" that is a plain object attribute while compiling (`is_compiling()` is
  True during capture): the dict built, stored on it, read back with `.get` and the attribute
  writes (replayed after the graph) are traced;
- `forward_func is type(self).forward`: one function read two ways is the same object;
- an int attribute of a module stays specialized across instances (never automatic dynamic),
  and a symbolic int indexing a Python list is specialized, not a break.
"""
from __future__ import annotations

import contextvars
import functools
import types

import torch
from torch import nn

import kiln
from helpers import assert_same_structure_and_values as assert_same


def _explain(fn, *args, **kwargs):
    kiln.reset()
    out = kiln.explain(fn)(*args, **kwargs)
    kiln.reset()
    return out


def _reasons(out) -> list[str]:
    return [str(r).splitlines()[0] for r in out.break_reasons]


# --- the kernels package's pattern ---------------------------------------------------------------

class _ContextVarish:
    """kernels' CompileableContextVar: a ContextVar in eager, a plain attribute when compiling."""

    def __init__(self, name):
        self.context_var = contextvars.ContextVar(name, default=None)
        self.global_var = None
        self.uses_global_var = False

    def get(self):
        import torch
        if self.uses_global_var or torch.compiler.is_compiling():
            return self.global_var
        return self.context_var.get()

    def set(self, value):
        import torch
        if self.uses_global_var or torch.compiler.is_compiling():
            previous = self.global_var
            self.global_var = value
            self.uses_global_var = True
            return previous
        return self.context_var.set(value)

    def reset(self, token):
        if self.uses_global_var:
            self.global_var = token
            self.uses_global_var = token is not None
        else:
            self.context_var.reset(token)


_ACTIVE = _ContextVarish("_ACTIVE")


def _function_module(func):
    """`@use_kernel_forward_from_hub` on a function: an nn.Module instance that calls it."""
    class Func(nn.Module):
        def forward(self, *args, **kwargs):
            if (active := _ACTIVE.get()) is not None:
                if (entry := active.get(id(self))) is not None:
                    kernel_func, forward_func = entry
                    if torch.compiler.is_compiling():
                        if forward_func is not type(self).forward:
                            return forward_func(self, *args, **kwargs)
                    else:
                        return kernel_func(*args, **kwargs)
            return func(*args, **kwargs)
    return Func()


def _kernelized(*fns):
    """`@use_kernelized_func`: per-instance wrappers routed through the context variable."""
    def decorator(cls):
        orig_init, orig_forward = cls.__init__, cls.forward

        def new_init(self, *args, **kwargs):
            orig_init(self, *args, **kwargs)
            hidden = self.__dict__.setdefault("_kernel_funcs", {})
            for fn in fns:
                hidden[fn.kernel_name] = type(fn)()

        @functools.wraps(orig_forward)
        def new_forward(self, *args, **kwargs):
            active = dict(_ACTIVE.get() or {})
            for fn in fns:
                kernel_func = self._kernel_funcs[fn.kernel_name]
                active[id(fn)] = (kernel_func, kernel_func.forward.__func__)
            token = _ACTIVE.set(active)
            try:
                return orig_forward(self, *args, **kwargs)
            finally:
                _ACTIVE.reset(token)

        cls.__init__ = new_init
        cls.forward = new_forward
        return cls
    return decorator


def _rotate(q, k):
    return q * torch.cos(k), k * torch.sin(q)


_rotary = _function_module(_rotate)
_rotary.kernel_name = "rotary"


@_kernelized(_rotary)
class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)

    def forward(self, x):
        q, k = _rotary(self.q(x), self.k(x))
        return x + q * k


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Attention() for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_kernel_hub_pattern_is_one_graph_equal_to_eager():
    model = _Stack()
    out = _explain(model, torch.randn(2, 8))
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    compiled = kiln.compile(model)
    for _ in range(3):
        x = torch.randn(2, 8)
        assert_same(model(x), compiled(x))
        assert (_ACTIVE.global_var, _ACTIVE.uses_global_var) == (None, False)


def test_kernel_hub_pattern_left_set_rebuilds_the_dict():
    """A set without reset: the dict built during capture (a module and a function in it) is
    rebuilt on the object after the graph, as eager leaves it."""
    def f(x):
        token = _ACTIVE.set({id(_rotary): (_rotary, type(_rotary).forward)})
        return x * 2, token

    eager_var = _ContextVarish("eager")
    try:
        out = _explain(f, torch.randn(3))
        assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
        _ACTIVE.global_var, _ACTIVE.uses_global_var = None, False
        compiled = kiln.compile(f)
        x = torch.randn(3)
        y, token = compiled(x)
        assert_same(x * 2, y)
        assert token is None and _ACTIVE.uses_global_var is True
        assert _ACTIVE.global_var == {id(_rotary): (_rotary, type(_rotary).forward)}
        eager_var.global_var = None
    finally:
        _ACTIVE.global_var, _ACTIVE.uses_global_var = None, False


# --- id() ----------------------------------------------------------------------------------------

class _Key:
    pass


_KEY_A, _KEY_B = _Key(), _Key()
_KEY = _KEY_A
_SCALES = {id(_KEY_A): 2.0}


def _scaled_by_key(x):
    return x * _SCALES.get(id(_KEY), 1.0)


def test_id_of_global_is_guarded_constant():
    global _KEY
    out = _explain(_scaled_by_key, torch.randn(3))
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    compiled = kiln.compile(_scaled_by_key)
    try:
        for key in (_KEY_A, _KEY_B, _KEY_A):
            _KEY = key  # another object: its id differs, the identity guard recompiles
            x = torch.randn(3)
            assert_same(_scaled_by_key(x), compiled(x))
    finally:
        _KEY = _KEY_A


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, table):
        return self.lin(x) * table.get(id(self), 0.5)


def test_id_of_module_instance_is_not_shared_across_instances():
    """Instances of one class share entries through rebindable identity slots; id(self) must
    pin the entry to its instance, else the second would reuse the first one's id."""
    first, second = _Scaled(), _Scaled()
    table = {id(first): 3.0}
    c1, c2 = kiln.compile(first), kiln.compile(second)
    for _ in range(2):
        x = torch.randn(2, 4)
        assert_same(first(x, table), c1(x, table))
        assert_same(second(x, table), c2(x, table))


def test_id_of_closure_cell_and_function():
    helper = nn.Linear(3, 3)

    def g(x):
        return x

    def f(x):
        marks = {id(helper): 1.0, id(g): 2.0}
        return helper(x) * marks[id(helper)] + g(x) * marks[id(g)]

    out = _explain(f, torch.randn(2, 3))
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    compiled = kiln.compile(f)
    x = torch.randn(2, 3)
    assert_same(f(x), compiled(x))


# --- modules reached through a decorated class function -------------------------------------------

_SHARED = nn.Linear(4, 4)


def _with_helper(helper):
    def decorator(cls):
        orig_forward = cls.forward

        @functools.wraps(orig_forward)
        def forward(self, x):
            return helper(orig_forward(self, x))
        cls.forward = forward
        return cls
    return decorator


@_with_helper(_SHARED)
class _Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_module_in_closure_of_replaced_forward():
    model = _Wrapped()
    out = _explain(model, torch.randn(2, 4))
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    compiled = kiln.compile(model)
    x = torch.randn(2, 4)
    assert_same(model(x), compiled(x))
    with torch.no_grad():  # the helper's parameters are graph inputs, not constants
        _SHARED.weight.add_(1.0)
    x = torch.randn(2, 4)
    assert_same(model(x), compiled(x))


class _Outer(nn.Module):
    """Two inner classes decorated by one factory (one wrapper code object, other cells)."""

    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        return self.first(x) - self.second(x)


def test_module_in_closure_of_instance_forward():
    """`module.forward = MethodType(fn, module)` (kernelize): the method's function, and so
    its cells, have a source."""
    other = nn.Linear(4, 4)

    def make(extra):
        def forward(self, x):
            return extra(self.lin(x)) + 1
        return forward

    inner = _Wrapped()
    inner.forward = types.MethodType(make(other), inner)
    outer = _Outer(inner, _Wrapped())
    for model in (inner, outer):  # compiled itself, and called from a compiled module
        out = _explain(model, torch.randn(2, 4))
        assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
        compiled = kiln.compile(model)
        for _ in range(2):
            x = torch.randn(2, 4)
            assert_same(model(x), compiled(x))


# --- ints of module attributes, ints indexing lists -----------------------------------------------

class _Cache:
    def __init__(self, n):
        self.layers = [torch.randn(4) for _ in range(n)]


class _Layer(nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.layer_idx = idx
        self.lin = nn.Linear(4, 4)

    def forward(self, x, cache):
        return self.lin(x) * cache.layers[self.layer_idx]


def test_module_int_attribute_stays_specialized():
    layers = [_Layer(i) for i in range(3)]
    cache = _Cache(3)
    compiled = [kiln.compile(layer) for layer in layers]
    rec = kiln.records.Recorder()
    kiln.records.active_recorders().append(rec)
    try:
        for _ in range(2):
            for layer, c in zip(layers, compiled):
                x = torch.randn(2, 4)
                assert_same(layer(x, cache), c(x, cache))
    finally:
        kiln.records.active_recorders().remove(rec)
    assert not rec.breaks, [b.message for b in rec.breaks]
    assert not any("dynamic" in str(r) for r in rec.recompiles), [str(r) for r in rec.recompiles]


_TABLE = [torch.randn(3) for _ in range(4)]


def _pick(x, i):
    return x * _TABLE[i] + i


def test_symbolic_int_indexing_a_list_specializes():
    compiled = kiln.compile(_pick)
    rec = kiln.records.Recorder()
    kiln.records.active_recorders().append(rec)
    try:
        for i in (0, 1, 2, 1, 3):  # `i` turns dynamic after the first change, then indexes
            x = torch.randn(3)
            assert_same(_pick(x, i), compiled(x, i))
    finally:
        kiln.records.active_recorders().remove(rec)
    assert not rec.breaks, [b.message for b in rec.breaks]


def test_class_functions_sharing_code_keep_their_own_cells():
    other = nn.Linear(4, 4)

    @_with_helper(other)
    class _Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.tanh(self.lin(x))

    model = _Outer(_Wrapped(), _Other())
    out = _explain(model, torch.randn(2, 4))
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    compiled = kiln.compile(model)
    for _ in range(2):
        x = torch.randn(2, 4)
        assert_same(model(x), compiled(x))
