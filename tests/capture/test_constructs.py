"""Capture of Python and torch constructs.

Each test compiles one small function with fullgraph=True (a silent eager fallback would raise),
runs it on fresh random inputs, and checks it against eager: same output structure, types and
values, same input mutations, and exactly one captured graph (`check_capture` in conftest.py).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from helpers import assert_same_structure_and_values as assert_same

SCALE = 1.5                 # a module-level float read by a compiled function
BIAS = torch.randn(4)       # a module-level tensor read by a compiled function

Pair = collections.namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    mask: torch.Tensor
    scale: float = 2.0


class Obj:
    """A plain Python object passed into compiled functions."""

    def __init__(self, w: torch.Tensor, scale: float) -> None:
        self.w = w
        self.scale = scale

    def apply(self, x):
        return x * self.w + self.scale


# --- arithmetic and comparisons ----------------------------------------------------------------

def test_binary_ops_tensor_tensor(check_capture):
    def fn(x, y, w):
        return (x + y, x - y, x * y, x / y, x // y, x % y, (x.abs() + 0.5) ** y, x @ w,
                -x, abs(x))

    check_capture(fn, torch.randn(3, 4), torch.randn(3, 4), torch.randn(4, 5))


def test_binary_ops_tensor_number(check_capture):
    def fn(x):
        return (x + 2, 3 - x, x * 2.5, x / 4, 1.0 / x, x // 2, x % 1.5, x ** 2, 2 ** x,
                -x * 3, 7 + x * 0.5)

    check_capture(fn, torch.randn(5))


def test_python_number_arithmetic_feeds_tensor(check_capture):
    def fn(x, n, f):
        k = (n + 3) * 2 - n // 2 + n % 3 + n ** 2
        g = f / 2 - f * 3 + -f
        return x * k + g, k, g

    check_capture(fn, torch.randn(4), 5, 1.25)


def test_inplace_augmented_assign_on_local(check_capture):
    def fn(x):
        y = x * 2
        y += 1
        y *= x
        y -= 0.5
        y /= 3
        return y

    check_capture(fn, torch.randn(3, 4))


def test_comparisons_produce_bool_tensors(check_capture):
    def fn(x, y):
        return x > y, x >= 0.1, x < y, x <= y, x == x, x != y, (x > 0) & (y < 0), ~(x > 0)

    out = check_capture(fn, torch.randn(3, 4), torch.randn(3, 4))
    assert all(t.dtype == torch.bool for t in out)


# --- tensor methods and attributes --------------------------------------------------------------

def test_shape_size_dim_ndim(check_capture):
    def fn(x):
        return x * 2, x.shape, x.size(), x.size(-1), x.shape[0], x.dim(), x.ndim, len(x)

    out = check_capture(fn, torch.randn(2, 3, 4))
    assert type(out[1]) is torch.Size and type(out[3]) is int


def test_dtype_and_device_attributes(check_capture):
    def fn(x):
        return x + 1, x.dtype, x.device, x.dtype == torch.float32, x.is_floating_point()

    out = check_capture(fn, torch.randn(3))
    assert out[1] is torch.float32 and out[2] == torch.device("cpu")


def test_view_reshape_transpose_permute_contiguous_t(check_capture):
    def fn(x):
        a = x.view(6, 4)
        b = x.reshape(2, 12)
        c = x.transpose(0, 1)
        d = x.permute(2, 0, 1).contiguous()
        e = x[0].T
        return a, b, c, d, e, d.is_contiguous(), c.is_contiguous()

    out = check_capture(fn, torch.randn(2, 3, 4))
    assert out[3].is_contiguous()


def test_mean_keepdim_to_dtype_float(check_capture):
    def fn(x):
        m = x.mean(dim=-1, keepdim=True)
        return m, x.to(torch.float64), x.to(torch.int64), x.half().float(), (x > 0).float()

    check_capture(fn, torch.randn(3, 5) * 4)


def test_chunk_split_unbind(check_capture):
    def fn(x):
        return x.chunk(2, dim=-1), x.split([1, 2], dim=0), x.split(2, dim=1), x.unbind(0)

    out = check_capture(fn, torch.randn(3, 4))
    assert type(out[0]) is tuple and type(out[3]) is tuple


def test_indexing(check_capture):
    def fn(x, idx):
        return x[0], x[:, 1:3], x[..., None], x[idx], x[-1, ::2], x[None, :, 0], x[1][2]

    check_capture(fn, torch.randn(4, 5), torch.tensor([2, 0, 3]))


def test_inplace_methods_on_fresh_tensor(check_capture):
    def fn(x):
        y = x.clone()
        r = y.add_(1).mul_(2)
        y.clamp_(-1.0, 1.5)
        z = torch.ones(3, 4)
        z.add_(x)
        return y, z, r

    check_capture(fn, torch.randn(3, 4))


def test_inplace_methods_on_input_are_seen_by_caller(check_capture):
    def fn(x):
        x.add_(1)
        x.mul_(2)
        x.clamp_(-1.5, 1.5)
        return x * 3

    x = torch.randn(3, 4)
    x_eager = x.clone()
    check_capture(fn, x)  # compares the mutated argument with eager's
    fn(x_eager)
    assert_same(x_eager, x)


# --- torch.* and torch.nn.functional.* ---------------------------------------------------------

def test_torch_functions(check_capture):
    def fn(x, y):
        return (torch.cat([x, y], dim=0), torch.stack([x, y], dim=1), torch.where(x > 0, x, y),
                torch.matmul(x, y.T), torch.zeros_like(x), torch.ones(2, 3),
                torch.arange(5), torch.arange(0, 1, 0.25), torch.full((2, 2), 3.5),
                x.new_ones(4), x.new_zeros(2, 2) + 1, torch.ones_like(x) * x)

    check_capture(fn, torch.randn(3, 4), torch.randn(3, 4))


def test_nn_functional(check_capture):
    def fn(x, w, b, q, k, v):
        return (F.relu(x), F.gelu(x), F.softmax(x, dim=-1), F.layer_norm(x, (4,), w, b),
                F.linear(x, torch.outer(w, b), b), F.dropout(x, p=0.5, training=False),
                F.scaled_dot_product_attention(q, k, v), torch.relu(x), torch.tanh(x))

    check_capture(fn, torch.randn(3, 4), torch.randn(4), torch.randn(4),
                  torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8))


def test_operator_module(check_capture):
    def fn(x, xs):
        return operator.add(x, 1), operator.getitem(xs, 1), operator.mul(x, xs[0]), \
            operator.neg(x), operator.getitem(x, 0)

    check_capture(fn, torch.randn(3), [torch.randn(3), torch.randn(3)])


def test_math_on_python_numbers(check_capture):
    def fn(x):
        s = math.sqrt(x.shape[-1])
        return x / s * math.pi + math.exp(0.5), s, math.floor(2.7) + math.ceil(0.2)

    check_capture(fn, torch.randn(2, 16))


# --- builtins -----------------------------------------------------------------------------------

def test_len_isinstance_range_enumerate_zip(check_capture):
    def fn(xs, ws):
        out = xs[0] * 0
        for i in range(len(xs)):
            out = out + xs[i] * i
        for i, (x, w) in enumerate(zip(xs, ws)):
            if isinstance(x, torch.Tensor) and isinstance(i, int):
                out = out + x * w
        return out, len(xs), len({"a": 1, "b": 2}), list(range(1, 7, 2))

    check_capture(fn, [torch.randn(3) for _ in range(3)], [0.5, 1.5, 2.5])


def test_min_max_sum_abs_on_python_values(check_capture):
    def fn(x):
        n = min(x.shape)
        m = max(3, 5, 2)
        s = sum([1, 2, 3]) + sum((0.5, 0.25))
        a = abs(-4) + abs(-1.5)
        return x * (n + m + s + a), n, m, s, a, max(x.shape), min([4.0, 2.0])

    check_capture(fn, torch.randn(3, 5))


def test_sum_of_tensors(check_capture):
    def fn(xs):
        return sum(xs), sum(xs[1:], xs[0])

    check_capture(fn, [torch.randn(3) for _ in range(4)])


def test_getattr_hasattr(check_capture):
    def fn(x, obj):
        w = getattr(obj, "w")
        extra = getattr(obj, "missing", 0.25)
        if hasattr(obj, "scale") and not hasattr(obj, "nope"):
            x = x * obj.scale
        return x * w + extra

    check_capture(fn, torch.randn(4), Obj(torch.randn(4), 3.0))


def test_setattr_on_plain_object_is_visible_after_call(counting_backend):
    def fn(x, obj):
        setattr(obj, "out", x * 2)
        obj.total = obj.scale + 1
        return x + 1

    x = torch.randn(4)
    obj, obj_eager = Obj(torch.randn(4), 3.0), Obj(torch.randn(4), 3.0)
    expected = fn(x, obj_eager)
    actual = kiln.compile(fn, backend=counting_backend, fullgraph=True)(x, obj)
    assert_same(expected, actual)
    assert_same(obj_eager.out, obj.out)
    assert obj.total == 4.0 and type(obj.total) is float
    assert counting_backend.count == 1


def test_container_constructors(check_capture):
    def fn(x, y):
        t = tuple([x, y])
        lst = list((x, y, x + y))
        d = dict(a=x, b=y)
        d2 = dict(zip(["p", "q"], [x * 2, y * 2]))
        s = set([3, 1, 2, 3])
        return t, lst, d, d2, len(s), sorted(s), 2 in s

    check_capture(fn, torch.randn(3), torch.randn(3))


def test_all_any_over_generators(check_capture):
    def fn(tensors, sizes):
        y = tensors[0]
        if all(n > 0 for n in sizes) and not any(n > 100 for n in sizes):
            y = y + 1
        if all(t.dim() == 3 for t in tensors):
            y = y * 2
        if any(t.dim() == 2 for t in tensors):
            y = y - 5
        return y, all([]), any([]), all(sizes), any([0, 0, 3])

    check_capture(fn, [torch.randn(2, 3, 4), torch.randn(1, 3, 4)], [1, 2, 3])


# --- containers in and out -----------------------------------------------------------------------

def test_list_and_tuple_in_and_out(check_capture):
    def fn(xs, pair):
        a, b = pair
        return [x * 2 for x in xs] + [a + b], (a - b, [b, (a,)])

    out = check_capture(fn, [torch.randn(3), torch.randn(3)], (torch.randn(3), torch.randn(3)))
    assert type(out) is tuple and type(out[0]) is list and type(out[1][1]) is list


def test_dict_in_and_out(check_capture):
    def fn(d):
        return {"sum": d["a"] + d["b"], "b": d["b"], "nested": {"k": [d["a"] * 3]}}

    out = check_capture(fn, {"a": torch.randn(3), "b": torch.randn(3)})
    assert list(out) == ["sum", "b", "nested"]


def test_namedtuple_in_and_out(check_capture):
    def fn(p):
        return Pair(p.left + p.right, p.right * 2), p._replace(left=p.left - 1)

    out = check_capture(fn, Pair(torch.randn(3), torch.randn(3)))
    assert type(out[0]) is Pair and type(out[1]) is Pair


def test_dataclass_in_and_out(check_capture):
    def fn(batch):
        y = batch.x * batch.mask * batch.scale
        return Batch(x=y, mask=batch.mask, scale=batch.scale + 1)

    out = check_capture(fn, Batch(torch.randn(3), (torch.randn(3) > 0).float()))
    assert type(out) is Batch and out.scale == 3.0


# --- closures, nested functions, lambdas, nonlocal ---------------------------------------------------

def test_closure_over_tensor_and_float(check_capture):
    w = torch.randn(4)
    alpha = 0.75

    def fn(x):
        return x * w + alpha

    check_capture(fn, torch.randn(4))


def test_nested_function_and_lambda_defined_inside(check_capture):
    def fn(x, y):
        def inner(a, scale=2.0):
            return a * scale + y

        sq = lambda t: t * t  # noqa: E731
        return inner(x), inner(x, scale=3.0), sq(x), (lambda t: t - 1)(y)

    check_capture(fn, torch.randn(3), torch.randn(3))


def test_nonlocal_counter_inside_compiled_function(check_capture):
    def fn(x):
        count = 0

        def bump():
            nonlocal count
            count += 1

        bump()
        bump()
        return x * count, count

    check_capture(fn, torch.randn(3))


def test_nonlocal_counter_outside_compiled_function(counting_backend):
    def make():
        calls = 0

        def fn(x):
            nonlocal calls
            calls += 1
            return x * calls

        return fn, lambda: calls

    fn, calls = make()
    compiled = kiln.compile(fn, backend=counting_backend, fullgraph=True)
    x = torch.randn(3)
    assert_same(x * 1, compiled(x))
    assert calls() == 1
    assert counting_backend.count == 1
    assert_same(x * 2, compiled(x))
    assert calls() == 2


# --- signatures ---------------------------------------------------------------------------------

def test_default_args(check_capture):
    def fn(x, y=None, scale=2.0, flag=True):
        out = x * scale
        if y is not None:
            out = out + y
        return out if flag else -out

    check_capture(fn, torch.randn(3))


def test_keyword_arguments_and_keyword_only(check_capture):
    def fn(x, y, *, scale, shift=0.5):
        return x * scale + y + shift

    check_capture(fn, torch.randn(3), y=torch.randn(3), scale=3.0)


def test_star_args_and_star_kwargs(check_capture):
    def fn(x, *args, **kwargs):
        out = x
        for a in args:
            out = out + a
        for k in sorted(kwargs):
            out = out * kwargs[k]
        return out, len(args), sorted(kwargs)

    check_capture(fn, torch.randn(3), torch.randn(3), torch.randn(3), b=2.0, a=torch.randn(3))


def test_keyword_calls_inside(check_capture):
    def helper(a, b, *, c=1.0, **rest):
        return a * c + b + rest.get("d", 0.0)

    def fn(x, y):
        return helper(x, b=y), helper(b=x, a=y, c=2.0, d=0.5), helper(*[x, y], **{"c": 3.0})

    check_capture(fn, torch.randn(3), torch.randn(3))


def test_decorator_forms(counting_backend):
    @kiln.compile
    def plain(x):
        return x.sin() + 1

    @kiln.compile(backend=counting_backend, fullgraph=True)
    def counted(x):
        return x.cos() * 2

    x = torch.randn(4)
    assert_same(x.sin() + 1, plain(x))
    assert_same(x.cos() * 2, counted(x))
    assert counting_backend.count == 1


# --- inlining: helpers, methods, modules ----------------------------------------------------------

def _helper(a, b):
    return _inner_helper(a) * b


def _inner_helper(a):
    return a.relu() + 1


def test_inline_user_helpers_and_methods(check_capture):
    def fn(x, obj):
        return _helper(x, 2.0) + obj.apply(x)

    check_capture(fn, torch.randn(4), Obj(torch.randn(4), 0.5))


class _Scaled(nn.Module):
    factor = 2.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @property
    def doubled(self):
        return self.factor * 2

    @staticmethod
    def shift(t):
        return t - 1

    @classmethod
    def cls_scale(cls, t):
        return t * cls.factor

    def forward(self, x):
        return self.shift(self.cls_scale(self.lin(x))) * self.doubled


class _Child(_Scaled):
    def forward(self, x):
        return super().forward(x).relu() + _Scaled.forward(self, x)


def test_property_staticmethod_classmethod(check_capture):
    m = _Scaled()
    check_capture(m, torch.randn(2, 4))


def test_super_forward_in_subclass(check_capture):
    m = _Child()
    check_capture(m, torch.randn(2, 4))


def test_submodule_calls_and_sequential(check_capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            h = x
            for layer in self.seq:
                h = layer(h)
            return self.norm(self.seq(x) + h)

    check_capture(M(), torch.randn(3, 4))


def test_modulelist_enumerate_and_moduledict(check_capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x) * (i + 1)
            outs = {name: head(x) for name, head in self.heads.items()}
            total = sum(head(x) for head in self.heads.values())
            return outs, total, len(self.layers), self.layers[-1](x)

    check_capture(M(), torch.randn(3, 4))


def test_comprehensions_over_layers_and_tensors(check_capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

        def forward(self, xs):
            outs = [layer(x) for layer, x in zip(self.layers, xs)]
            sq = [t * t for t in outs if t.dim() == 2]
            by_name = {f"layer{i}": t.sum() for i, t in enumerate(outs)}
            return sq, by_name

    check_capture(M(), [torch.randn(2, 4) for _ in range(3)])


def test_generator_expressions_consumed(check_capture):
    def fn(xs):
        total = sum(t.sum() for t in xs)
        doubled = tuple(t * 2 for t in xs)
        ok = all(t.shape[0] == 3 for t in xs)
        neg = any(t.dim() > 5 for t in xs)
        return total, doubled, ok, neg, sum(i * i for i in range(4))

    check_capture(fn, [torch.randn(3, 2) for _ in range(3)])


# --- grad mode and autocast inside the function --------------------------------------------------

def test_grad_mode_context_managers_inside(check_capture):
    def fn(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
        with torch.set_grad_enabled(False):
            c = x + 1
        d = x * 4
        return a, b, c, d

    x = torch.randn(3, requires_grad=True)
    a, b, c, d = check_capture(fn, x)
    assert [t.requires_grad for t in (a, b, c, d)] == [False, True, False, True]
    assert torch.is_grad_enabled()
    (b.sum() + d.sum()).backward()
    assert_same(torch.full((3,), 7.0), x.grad)


def test_autocast_inside(check_capture):
    def fn(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            z = torch.mm(y.float(), w.T)
        return y, z, y.float() + 1

    y, z, _ = check_capture(fn, torch.randn(4, 8), torch.randn(8, 8))
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


# --- constants, globals, control flow -------------------------------------------------------------

def test_fstring_keys_on_constants(check_capture):
    def fn(x):
        d = {f"layer{i}": x * i for i in range(3)}
        name = f"{'blk'}_{2:02d}"
        return d[f"layer{2}"], d, name

    check_capture(fn, torch.randn(3))


def test_globals_float_and_tensor(check_capture):
    def fn(x):
        return x * SCALE + BIAS

    check_capture(fn, torch.randn(4))


@pytest.mark.parametrize("variant", ["none", "given"])
def test_is_none_and_flag_branches(check_capture, variant):
    def fn(x, y, flag, mask=None):
        if y is None:
            out = x
        else:
            out = x + y
        if flag:
            out = out * 2
        if mask is not None:
            out = out * mask
        return out

    if variant == "none":
        check_capture(fn, torch.randn(3), None, True)
    else:
        check_capture(fn, torch.randn(3), torch.randn(3), False, torch.randn(3))


def test_and_or_on_python_values(check_capture):
    def fn(x, a, b, name):
        k = (a and b) or 7
        label = name or "default"
        c = a or b
        return x * k + c, label, (b and a), (None or a)

    check_capture(fn, torch.randn(3), 0, 4, "")


def test_chained_comparisons_on_ints(check_capture):
    def fn(x, n):
        if 0 < n < 5 <= n * 2:
            x = x + 1
        if 1 < n > 10:
            x = x * 100
        return x, 0 <= n < 3

    check_capture(fn, torch.randn(3), 3)


def test_unpacking_star_unpacking_and_del(check_capture):
    def fn(xs):
        a, b, c = xs
        first, *rest = xs
        *init, last = xs
        (p, q), r = (a, b), c
        tmp = a * 2
        del tmp
        return first + last, rest, len(init), p - q + r

    check_capture(fn, [torch.randn(3) for _ in range(3)])


def test_slices_and_slice_assignment_on_fresh_tensor(check_capture):
    def fn(a, b):
        c = a.clone()
        c[1:2] = b
        c[::2] = c[::2] * 3
        return a[1:2], a[::2], c, a[:-1], a[1:]

    check_capture(fn, torch.randn(5, 3), torch.randn(1, 3))


def test_walrus_ternary_assert(check_capture):
    def fn(x, n):
        assert n > 0, "n must be positive"
        assert isinstance(x, torch.Tensor)
        if (k := n * 2) > 3:
            x = x + k
        y = x * 2 if n % 2 == 0 else x * 3
        return y, k

    check_capture(fn, torch.randn(3), 2)


def test_string_methods_on_constants(check_capture):
    def fn(x, mode):
        if mode.lower().startswith("re") and "LU" in mode:
            x = x.relu()
        if mode.endswith("x") or "lu" in mode:
            x = x * 100
        tag = "-".join(["a", mode.upper()]).replace("A", "b")
        return x, tag, mode.split("l"), f"{mode}!"

    check_capture(fn, torch.randn(4), "ReLU")


def test_torch_size_arithmetic(check_capture):
    def fn(x):
        new_shape = x.shape[:-1] + (2, 3)
        return x.reshape(new_shape), new_shape, x.shape[1:], tuple(x.shape) + (1,)

    out = check_capture(fn, torch.randn(4, 6))
    assert type(out[1]) is torch.Size


def test_isinstance_and_type_checks(check_capture):
    def fn(x, n, p):
        out = x
        if isinstance(x, torch.Tensor) and type(x) is torch.Tensor:
            out = out + 1
        if type(n) is int and not isinstance(n, float):
            out = out * n
        if isinstance(p, nn.Parameter) and isinstance(p, torch.Tensor):
            out = out + p
        return out, type(n) is bool, isinstance(n, (int, float))

    check_capture(fn, torch.randn(3), 4, nn.Parameter(torch.randn(3)))


def test_new_ones_and_full(check_capture):
    def fn(x):
        return x.new_ones(2, 3) * x.sum(), torch.full_like(x, 2.5) + x, \
            torch.full((3,), 7, dtype=torch.int64)

    check_capture(fn, torch.randn(3))


# --- functions without tensors; generators --------------------------------------------------------

@pytest.mark.parametrize("fullgraph", [False, True])
def test_function_without_tensor_ops_returns_constant(counting_backend, fullgraph):
    def fn(n, name="x"):
        return {"n": n * 2, "name": name + "!", "t": (n, 3.5)}

    compiled = kiln.compile(fn, backend=counting_backend, fullgraph=fullgraph)
    assert_same(fn(3), compiled(3))
    assert_same(fn(4, name="y"), compiled(4, name="y"))


def test_generator_function_runs_natively(counting_backend):
    def gen(x, n):
        for i in range(n):
            yield x * i

    x = torch.randn(3)
    compiled = kiln.compile(gen, backend=counting_backend)
    out = compiled(x, 3)
    assert_same(list(gen(x, 3)), list(out))
    assert counting_backend.count == 0


# --- more constructs ----------------------------------------------------------------------------

def _double(t):
    return t * 2


relu_alias = F.relu   # a module-level alias of a torch function


def test_functools_partial_and_global_alias(check_capture):
    import functools

    scale = functools.partial(torch.mul, other=3.0)
    add_k = functools.partial(_helper, b=0.5)

    def fn(x):
        return scale(x), add_k(x), relu_alias(x), _double(x)

    check_capture(fn, torch.randn(4))


def test_no_grad_decorated_helper(check_capture):
    @torch.no_grad()
    def frozen(t):
        return t * 2

    def fn(x):
        return frozen(x), x * 3

    a, b = check_capture(fn, torch.randn(3, requires_grad=True))
    assert not a.requires_grad and b.requires_grad


def test_shape_unpacking_and_python_number_conversions(check_capture):
    def fn(x):
        b, n = x.shape
        half = int(n / 2)
        q, r = divmod(n, 3)
        f = float(b) + round(2.6) + int(True)
        return x[:, :half] * f, half, q, r, f, bool(n), str(b)

    check_capture(fn, torch.randn(3, 8))


def test_iterate_over_tensor_rows_and_reversed(check_capture):
    def fn(x):
        acc = x[0] * 0
        for row in x:
            acc = acc + row
        out = []
        for i in reversed(range(x.shape[0])):
            out.append(x[i] * i)
        return acc, out, sorted([3, 1, 2], reverse=True)

    check_capture(fn, torch.randn(3, 4))


def test_while_loop_on_python_counter(check_capture):
    def fn(x, n):
        i = 0
        while i < n:
            x = x * 1.5 + i
            i += 1
        return x, i

    check_capture(fn, torch.randn(3), 4)


def test_try_except_without_exception(check_capture):
    def fn(x, d):
        try:
            y = x * d["a"]
        except KeyError:
            y = x
        finally:
            z = x + 1
        return y, z

    check_capture(fn, torch.randn(3), {"a": 2.0})


def test_dict_methods_and_membership(check_capture):
    def fn(x, d):
        out = x * d.get("scale", 1.0) + d.get("missing", 0.5)
        if "bias" in d and "nope" not in d:
            out = out + d["bias"]
        keys = list(d.keys())
        vals = [v for v in d.values() if isinstance(v, float)]
        return out, keys, vals, [k for k, _ in d.items()]

    check_capture(fn, torch.randn(3), {"scale": 2.0, "bias": torch.randn(3)})


def test_list_operations_on_python_values(check_capture):
    def fn(xs, ns):
        idx = ns.index(3)
        picked = xs[-1] + xs[idx]
        both = ns + [7] * 2
        return picked, both, ns[1:], 3 in ns, ns.count(1), xs[::-1]

    check_capture(fn, [torch.randn(2) for _ in range(4)], [1, 3, 1, 5])


def test_constant_tensors_and_dtype_device_kwargs(check_capture):
    def fn(x, mask):
        c = torch.tensor([1.0, 2.0, 3.0])
        ones = torch.ones(3, dtype=x.dtype, device=x.device)
        filled = x.masked_fill(mask, float("-inf"))
        eps = torch.finfo(x.dtype).eps
        return x * c + ones, filled.softmax(-1), eps, torch.tensor(5) + x.long()

    check_capture(fn, torch.randn(3), torch.tensor([True, False, False]))


def test_unbound_tensor_method_and_getattr_on_module(check_capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            for i in range(2):
                setattr(self, f"layer{i}", nn.Linear(3, 3))
            self.register_buffer("offset", torch.randn(3))

        def forward(self, x, **kwargs):
            for i in range(2):
                x = getattr(self, f"layer{i}")(x)
            return torch.Tensor.add(x, self.offset) * kwargs.get("scale", 1.0)

    check_capture(M(), torch.randn(2, 3), scale=2.0)


def _recursive_sum(xs, i=0):
    if i == len(xs):
        return 0
    return xs[i] * (i + 1) + _recursive_sum(xs, i + 1)


def test_recursive_helper_is_inlined(check_capture):
    def fn(xs):
        return _recursive_sum(xs)

    check_capture(fn, [torch.randn(3) for _ in range(3)])


def test_user_context_manager_without_break(check_capture):
    class Scale:
        def __init__(self, box):
            self.box = box

        def __enter__(self):
            self.box.append(2.0)
            return self

        def __exit__(self, *exc):
            self.box.pop()
            return False

    def fn(x):
        box = [1.0]
        with Scale(box) as s:
            y = x * box[-1] * len(s.box)
        return y, len(box)

    check_capture(fn, torch.randn(3))
