"""Side effects of captured code: after each call the caller sees exactly what eager leaves behind.

Attribute writes on modules and plain objects, list and dict mutation, global writes, in-place
tensor updates of inputs (also through views), their order, and the identity of returned objects.
Each test runs eager on one copy of the state and the compiled function on another, then compares.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from helpers import assert_same_structure_and_values as assert_same

STEP = 0            # rebound by compiled code through `global`
LAST = None


def _compile(fn, backend):
    return kiln.compile(fn, backend=backend, fullgraph=True)


# --- attribute writes -----------------------------------------------------------------------------

class _Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.counter = 0

    def forward(self, x):
        self.counter += 1
        self.last = x.detach() * 2
        return self.lin(x) * self.counter


def test_module_int_counter_attribute(counting_backend):
    m = _Counter()
    ref = copy.deepcopy(m)
    c = _compile(m, counting_backend)
    for _ in range(3):
        x = torch.randn(2, 3)
        assert_same(ref(x), c(x))
        assert m.counter == ref.counter and type(m.counter) is int
        assert_same(ref.last, m.last)
    assert m.counter == 3
    assert counting_backend.count >= 1


class _Plain:
    def __init__(self):
        self.n = 0
        self.history = []


def test_plain_object_attribute_writes(counting_backend):
    def fn(x, obj):
        obj.n += 1
        obj.out = x * 2
        obj.history.append(obj.n)
        obj.new_attr = "set"
        return x + obj.n

    obj, ref = _Plain(), _Plain()
    c = _compile(fn, counting_backend)
    for _ in range(2):
        x = torch.randn(3)
        assert_same(fn(x, ref), c(x, obj))
        assert (obj.n, obj.history, obj.new_attr) == (ref.n, ref.history, ref.new_attr)
        assert_same(ref.out, obj.out)
    assert counting_backend.count >= 1


class _Holder:
    def __init__(self):
        self.buf, self.other, self.scale = torch.ones(3), torch.zeros(3), 0.5


def test_a_value_read_before_its_attribute_is_rebound_is_the_old_one(counting_backend):
    """The entry replays side effects after the graph call, then builds the return value; an
    attribute read before the program rebound it must give the old object (and a swap must
    swap), not what the replayed write put there. Floats that change make the number path
    (`s`, `s * 3`: rebuilt by Python from `self.scale`) read it too."""
    def fn(x, obj, k):
        old, s = obj.buf, obj.scale
        obj.buf = x * 2
        obj.other, obj.buf2 = obj.buf, obj.other  # the new buf, and the old other
        obj.scale = k
        return old, x * s, s, s * 3

    obj, ref = _Holder(), _Holder()
    c = kiln.compile(fn, backend=counting_backend)
    for k in (1.5, 2.5, 3.5, 4.5):
        x = torch.randn(3)
        assert_same(fn(x, ref, k), c(x, obj, k))
        for name in ("buf", "other", "buf2", "scale"):
            assert_same(getattr(ref, name), getattr(obj, name))


# --- list and dict mutation ---------------------------------------------------------------------

def test_list_and_dict_arguments_mutated(counting_backend):
    def fn(x, out, d):
        out.append(x * 2)
        out.insert(0, x + 1)
        out.extend([x - 1])
        d["k"] = x * 3
        d.update({"j": x.sin()})
        del d["old"]
        return x.cos()

    x = torch.randn(4)
    out, d = [], {"old": torch.randn(4)}
    out_ref, d_ref = [], {"old": torch.randn(4)}
    expected = fn(x, out_ref, d_ref)
    actual = _compile(fn, counting_backend)(x, out, d)
    assert_same(expected, actual)
    assert_same(out_ref, out, path="out")
    assert_same(d_ref, d, path="d")
    assert counting_backend.count == 1


def test_list_element_replaced_and_popped(counting_backend):
    def fn(xs):
        first = xs.pop(0)
        xs[0] = xs[0] * first
        xs.reverse()
        return first + 1

    xs = [torch.randn(3) for _ in range(3)]
    xs_ref = [t.clone() for t in xs]
    assert_same(fn(xs_ref), _compile(fn, counting_backend)(xs))
    assert_same(xs_ref, xs)
    assert counting_backend.count == 1


# --- global writes ------------------------------------------------------------------------------

def _step(x):
    global STEP, LAST
    STEP += 1
    LAST = x * STEP
    return x + STEP


def test_global_writes(counting_backend):
    global STEP, LAST
    c = _compile(_step, counting_backend)
    try:
        for i in range(1, 4):
            x = torch.randn(3)
            assert_same(x + i, c(x))
            assert STEP == i and type(STEP) is int
            assert_same(x * i, LAST)
        assert counting_backend.count >= 1
    finally:
        STEP, LAST = 0, None


# --- in-place tensor ops on inputs ----------------------------------------------------------------

def _check_input_mutation(backend, fn, *inputs):
    """Run `fn` eagerly on clones and compiled on `inputs`; compare outputs and mutated inputs."""
    refs = [t.clone() for t in inputs]
    expected = fn(*refs)
    actual = _compile(fn, backend)(*inputs)
    assert_same(expected, actual)
    assert_same(refs, list(inputs), path="inputs")
    assert backend.count == 1
    return actual


def test_add_inplace_on_input(counting_backend):
    def fn(x):
        x.add_(1)
        return x * 2

    _check_input_mutation(counting_backend, fn, torch.randn(3, 4))


def test_setitem_on_input(counting_backend):
    def fn(x, v):
        x[0] = 5.0
        x[:, 1] = v
        x[x > 1.0] = -1.0
        return x.sum(0)

    _check_input_mutation(counting_backend, fn, torch.randn(3, 4), torch.randn(3))


def test_copy_into_input(counting_backend):
    def fn(x, y):
        x.copy_(y * 2)
        return x + y

    _check_input_mutation(counting_backend, fn, torch.randn(3, 4), torch.randn(3, 4))


def test_inplace_through_view_of_input(counting_backend):
    def fn(x):
        x.view(-1)[0].fill_(5.0)
        x.t()[1].mul_(3)
        x[1:, ::2].add_(1)
        return x.clone()

    _check_input_mutation(counting_backend, fn, torch.randn(3, 4))


def test_input_that_is_a_view_of_a_base(counting_backend):
    def fn(x):
        x.mul_(2)
        return x + 1

    base, base_ref = torch.randn(4, 5), None
    base_ref = base.clone()
    expected = fn(base_ref[1])
    actual = _compile(fn, counting_backend)(base[1])
    assert_same(expected, actual)
    assert_same(base_ref, base)
    assert counting_backend.count == 1


def test_augmented_assign_on_input_alias(counting_backend):
    def fn(x):
        y = x
        y += 1           # in-place on the input
        y = y * 2        # rebinding: no longer the input
        return y, x

    x = torch.randn(3)
    x_ref = x.clone()
    expected = fn(x_ref)
    actual = _compile(fn, counting_backend)(x)
    assert_same(expected, actual)
    assert_same(x_ref, x)
    assert actual[1] is x
    assert counting_backend.count == 1


def test_mutation_then_read_order(counting_backend):
    def fn(x, out):
        out.append(x.clone())
        x.mul_(2)
        out.append(x.clone())
        x.add_(1)
        out.append(x * 1)
        return x.sum()

    x = torch.randn(3)
    x_ref = x.clone()
    out, out_ref = [], []
    assert_same(fn(x_ref, out_ref), _compile(fn, counting_backend)(x, out))
    assert_same(out_ref, out)
    assert_same(x_ref, x)
    assert counting_backend.count == 1


# --- order of side effects ------------------------------------------------------------------------

def test_order_of_multiple_side_effects(counting_backend):
    def fn(x, events, d, obj):
        events.append("start")
        d["b"] = x * 2
        obj.first = len(events)
        events.append("middle")
        d["a"] = x + 1
        d["b"] = d["b"] + 1
        obj.second = len(events)
        events.append(len(d))
        return x.sum()

    x = torch.randn(3)
    events, d, obj = [], {}, _Plain()
    events_ref, d_ref, obj_ref = [], {}, _Plain()
    assert_same(fn(x, events_ref, d_ref, obj_ref), _compile(fn, counting_backend)(x, events, d, obj))
    assert events == events_ref
    assert_same(d_ref, d)     # also checks key order
    assert (obj.first, obj.second) == (obj_ref.first, obj_ref.second)
    assert counting_backend.count == 1


# --- identity of returned objects -----------------------------------------------------------------

def test_returned_input_is_the_same_object(counting_backend):
    def fn(x, y):
        return x, y * 2

    x = torch.randn(3)
    out = _compile(fn, counting_backend)(x, torch.randn(3))
    assert out[0] is x
    assert counting_backend.count == 1


def test_returned_mutated_input_is_the_same_object(counting_backend):
    def fn(x):
        return x.add_(1)

    x = torch.randn(3)
    x_ref = x.clone()
    out = _compile(fn, counting_backend)(x)
    assert out is x
    assert_same(fn(x_ref), x)
    assert counting_backend.count == 1


def test_returned_input_inside_container(counting_backend):
    def fn(x, xs):
        return [xs[1], x * 2], {"x": x}

    x, xs = torch.randn(3), [torch.randn(3), torch.randn(3)]
    out = _compile(fn, counting_backend)(x, xs)
    assert out[0][0] is xs[1] and out[1]["x"] is x
    assert counting_backend.count == 1


def test_same_tensor_returned_twice(counting_backend):
    def fn(x):
        y = x * 2
        return y, y, [y]

    a, b, c = _compile(fn, counting_backend)(torch.randn(3))
    assert a is b and c[0] is a
    assert counting_backend.count == 1


def test_returned_view_of_input_aliases_input(counting_backend):
    def fn(x):
        return x.view(-1), x[0]

    x = torch.randn(2, 3)
    flat, row = _compile(fn, counting_backend)(x)
    assert counting_backend.count == 1
    x.add_(1)   # the outputs are views, as in eager: they see the update
    assert_same(x.view(-1), flat)
    assert_same(x[0], row)


# --- more side effects ----------------------------------------------------------------------------

LOG: list = []


def test_global_list_append_and_closure_list(counting_backend):
    acc = []

    def fn(x):
        LOG.append(x.sum())
        acc.append(x * 2)
        return x + len(LOG)

    c = _compile(fn, counting_backend)
    LOG.clear()
    try:
        x1, x2 = torch.randn(3), torch.randn(3)
        assert_same(x1 + 1, c(x1))
        assert_same(x2 + 2, c(x2))
        assert_same([x1.sum(), x2.sum()], LOG)
        assert_same([x1 * 2, x2 * 2], acc)
    finally:
        LOG.clear()


def test_returned_argument_list_and_dict_keep_identity(counting_backend):
    def fn(x, xs, d):
        xs.append(x * 2)
        d["y"] = x + 1
        return xs, d

    x, xs, d = torch.randn(3), [], {}
    out_xs, out_d = _compile(fn, counting_backend)(x, xs, d)
    assert out_xs is xs and out_d is d
    assert_same([x * 2], xs)
    assert_same({"y": x + 1}, d)


def test_module_tensor_attribute_and_buffer_update(counting_backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))
            self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

        def forward(self, x):
            self.steps += 1
            self.cache = x * self.w
            with torch.no_grad():
                self.w.mul_(0.5)
            return self.cache.sum()

    m = M()
    ref = copy.deepcopy(m)
    c = _compile(m, counting_backend)
    for _ in range(2):
        x = torch.randn(3)
        assert_same(ref(x), c(x))
        assert_same(ref.steps, m.steps)
        assert_same(ref.cache, m.cache)
        assert_same(ref.w, m.w)
    assert counting_backend.count >= 1


def test_returned_input_inside_dataclass_and_namedtuple(counting_backend):
    import collections
    import dataclasses

    @dataclasses.dataclass
    class Out:
        a: torch.Tensor
        b: torch.Tensor

    P = collections.namedtuple("P", "a b")

    def fn(x):
        return Out(x, x * 2), P(x * 3, x)

    x = torch.randn(3)
    out, p = _compile(fn, counting_backend)(x)
    assert type(out) is Out and type(p) is P
    assert out.a is x and p.b is x
    assert_same(x * 2, out.b)
    assert_same(x * 3, p.a)


def test_exception_after_side_effects_matches_eager(counting_backend):
    def fn(x, events):
        events.append("before")
        x.add_(1)
        y = x @ torch.ones(5, 2)    # shape error: x is (3,)
        events.append("after")
        return y

    x = torch.randn(3)
    x_ref = x.clone()
    events, events_ref = [], []
    with pytest.raises(RuntimeError) as eager_err:
        fn(x_ref, events_ref)
    compiled = kiln.compile(fn, backend=counting_backend)
    with pytest.raises(type(eager_err.value)):
        compiled(x, events)
    assert events == events_ref
    assert_same(x_ref, x)
