"""Opcodes traced instead of breaking (issue 19, item 2): `match` statements (MATCH_SEQUENCE,
MATCH_MAPPING, MATCH_KEYS, MATCH_CLASS, GET_LEN), `{*a, *b}` (SET_UPDATE), `del obj.attr`
(DELETE_ATTR) and `del` of a closure cell (DELETE_DEREF).

Each construct is compiled with fullgraph=True (a break would raise), run on fresh random tensors
and compared with eager, outputs and argument mutations (`check_capture`). Where eager raises or
the answer needs a tensor's value, capture must break (fullgraph raises) and the default compile
must behave exactly as eager.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import dis

import pytest
import torch
import torch.nn as nn

import kiln
from helpers import assert_same_structure_and_values as assert_same
from kiln.capture.bytecode import decode
from kiln.errors import UnsupportedError


def _opnames(fn) -> set[str]:
    """Canonical opnames of `fn` and of the functions defined in it."""
    names, stack = set(), [fn.__code__]
    while stack:
        code = stack.pop()
        names |= {i.opname for i in decode(code)}
        stack += [c for c in code.co_consts if isinstance(c, type(code))]
    return names


def _eager_and_default(fn, *args):
    """Eager's result or exception, and the default (breaking) compile's, on copies of args."""
    results = []
    for run in (fn, kiln.compile(fn, backend="eager")):
        try:
            results.append(("ok", run(*copy.deepcopy(args))))
        except Exception as err:  # noqa: BLE001 - the exception type is the result
            results.append(("raise", type(err)))
    return results


# --- sequence patterns ------------------------------------------------------------------------

def match_sequence(s, t):
    match s:
        case (torch.Tensor() as a, torch.Tensor() as b) if a.shape == b.shape:  # shapes
            return a * b + t
        case [int(n), x] | [x, int(n)]:  # an or-pattern binding the same names
            return x * n + t
        case (a, b):
            return a.sum() + b.sum() + t
        case [first, *middle, last] if len(middle) >= 1:
            return first + last + sum(m.sum() for m in middle) * t
        case []:
            return t - 1
        case _:
            return t * 2


SEQUENCES = {
    "two-same-shape": lambda: (torch.randn(3), torch.randn(3)),
    "two-other-shape": lambda: (torch.randn(3), torch.randn(2)),
    "int-first": lambda: [4, torch.randn(3)],
    "int-last": lambda: [torch.randn(3), 5],
    "star-middle": lambda: [torch.randn(3), torch.randn(2), torch.randn(4), torch.randn(3)],
    "empty-list": lambda: [],
    "tensor-is-not-a-sequence": lambda: torch.randn(3),
    "str-is-not-a-sequence": lambda: "ab",
}


@pytest.mark.parametrize("make", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_match_sequence_patterns(check_capture, make):
    check_capture(match_sequence, make(), torch.randn(3))


def match_size(x):
    match x:
        case torch.Tensor(shape=(n, 4)):  # a class pattern with a nested sequence pattern
            return x.sum(1) * n
        case torch.Tensor(shape=(n,)):
            return x + n
        case _:
            return x.t()


@pytest.mark.parametrize("shape", [(3, 4), (5,), (2, 3)])
def test_match_tensor_shape(check_capture, shape):
    check_capture(match_size, torch.randn(*shape))


# --- mapping patterns -------------------------------------------------------------------------

def match_mapping(d, t):
    match d:
        case {"mode": "scale", "w": w, **rest}:
            return t * w + len(rest), sorted(rest)
        case {"mode": "shift", "w": w}:
            return t + w, None
        case {1: one, 2: two}:
            return t * one * two, None
        case {}:
            return t - 1, None
        case _:
            return t * 0.5, None


MAPPINGS = {
    "scale-with-rest": lambda: {"mode": "scale", "w": torch.randn(3), "a": 1, "b": "x"},
    "scale-no-rest": lambda: {"w": torch.randn(3), "mode": "scale"},
    "shift-extra-keys": lambda: {"mode": "shift", "w": 2.5, "z": torch.randn(3)},
    "mode-mismatch": lambda: {"mode": "other", "w": torch.randn(3)},
    "int-keys": lambda: {1: 3, 2: torch.randn(3)},
    "empty": lambda: {},
    "list-is-not-a-mapping": lambda: [1, 2],
}


@pytest.mark.parametrize("make", MAPPINGS.values(), ids=MAPPINGS.keys())
def test_match_mapping_patterns(check_capture, make):
    check_capture(match_mapping, make(), torch.randn(3))


def test_match_mapping_rest_is_a_new_dict(check_capture):
    def fn(d, t):
        match d:
            case {"w": w, **rest}:
                rest["added"] = 1
                return t * w, rest
        return t, {}

    d = {"w": torch.randn(3), "k": torch.randn(2)}
    check_capture(fn, d, torch.randn(3))
    assert list(d) == ["w", "k"]


# --- class patterns ---------------------------------------------------------------------------

@dataclasses.dataclass
class Point:
    x: object
    y: object


@dataclasses.dataclass
class Point3(Point):
    z: object = 0


class Plain:
    """No __match_args__: keyword patterns only."""

    def __init__(self, weight, bias=None):
        self.weight = weight
        if bias is not None:
            self.bias = bias


Pair = collections.namedtuple("Pair", ["left", "right"])


def match_class(obj, t):
    match obj:
        case Point3(x, y, z=int(k)) if k > 1:  # subclass first, positional + keyword
            return x * y * k + t
        case Point(v, y=int(k)) | Point(int(k), y=v):  # an or-pattern of class patterns
            return v * k - t
        case Point(x=a, y=b) if a.shape == t.shape:
            return a + b * t
        case Plain(weight=w, bias=b):
            return t * w + b
        case Plain(weight=w):  # no `bias` attribute: the previous case did not match
            return t * w
        case Pair(l, r):
            return l * r * t
        case int(n) | float(n):
            return t + n
        case str() | None:
            return t * 1
        case _:
            return -t


CLASSES = {
    "subclass-positional-keyword": lambda: Point3(torch.randn(3), torch.randn(3), 3),
    "subclass-guard-fails": lambda: Point3(torch.randn(3), torch.randn(3), 1),
    "or-pattern-left": lambda: Point(torch.randn(3), 2),
    "or-pattern-right": lambda: Point(3, torch.randn(3)),
    "keyword-capture": lambda: Point(torch.randn(3), torch.randn(3)),
    "keyword-guard-fails": lambda: Point(torch.randn(2), torch.randn(3)),
    "plain-with-bias": lambda: Plain(torch.randn(3), torch.randn(3)),
    "plain-missing-attribute": lambda: Plain(torch.randn(3)),
    "namedtuple": lambda: Pair(torch.randn(3), torch.randn(3)),
    "int-self": lambda: 7,
    "float-self": lambda: 2.5,
    "bool-is-int": lambda: True,
    "str": lambda: "s",
    "none": lambda: None,
    "other": lambda: (1, 2),
}


@pytest.mark.parametrize("make", CLASSES.values(), ids=CLASSES.keys())
def test_match_class_patterns(check_capture, make):
    check_capture(match_class, make(), torch.randn(3))


def test_match_class_on_objects_made_inside(check_capture):
    def fn(x, n):
        obj = Point3(x, x * 2, n) if n > 2 else Point(x + 1, 0)
        match obj:
            case Point3(a, b, z=k):
                return a * b * k
            case Point(a, 0):
                return a

    check_capture(fn, torch.randn(3), 3)
    check_capture(fn, torch.randn(3), 1, graphs=2)  # the same cache: one entry per `n`


def test_one_compiled_match_over_many_inputs(counting_backend):
    """One compiled function, every case in turn: each input structure gets its own entry."""
    compiled = kiln.compile(match_class, backend=counting_backend, fullgraph=True)
    for _ in range(2):
        for make in CLASSES.values():
            obj, t = make(), torch.randn(3)
            assert_same(match_class(copy.deepcopy(obj), t), compiled(obj, t))


class _Sticky(type):
    def __instancecheck__(cls, obj):
        return getattr(obj, "sticky", False)


class Sticky(metaclass=_Sticky):
    pass


def match_sticky(obj, t):
    match obj:
        case Sticky():
            return t + 1
    return t - 1


def test_class_with_custom_instancecheck_breaks():
    obj = Plain(torch.randn(3))
    obj.sticky = True
    with pytest.raises(UnsupportedError, match="isinstance check"):
        kiln.compile(match_sticky, backend="eager", fullgraph=True)(obj, torch.randn(3))
    t = torch.randn(3)
    assert_same(kiln.compile(match_sticky, backend="eager")(obj, t), match_sticky(obj, t))
    assert_same(kiln.compile(match_sticky, backend="eager")(1, t), match_sticky(1, t))


def too_many_positional(obj, t):
    match obj:
        case Point(a, b, c):
            return t * a
    return t


def duplicate_attribute(obj, t):
    match obj:
        case Point(a, x=b):
            return t * a * b
    return t


@pytest.mark.parametrize("fn", [too_many_positional, duplicate_attribute])
def test_class_pattern_errors_raise_like_eager(fn):
    args = (Point(torch.randn(3), torch.randn(3)), torch.randn(3))
    with pytest.raises(TypeError):
        fn(*args)
    with pytest.raises(UnsupportedError, match="TypeError"):
        kiln.compile(fn, backend="eager", fullgraph=True)(*args)
    assert _eager_and_default(fn, *args) == [("raise", TypeError)] * 2


# --- a case that depends on a tensor's value --------------------------------------------------

def match_on_value(x):
    match x.sum() > 0, x:
        case (flag, y) if flag:  # the guard needs the tensor's value
            return y * 2
        case (_, Point(x=0)):
            return x
        case _:
            return x - 1


def match_value_in_class(p):
    match p:
        case Point(x=0):  # compares a tensor with 0: needs its value
            return p.y
        case _:
            return p.y * 3


def test_value_dependent_case_breaks_not_differs():
    with pytest.raises(UnsupportedError):
        kiln.compile(match_on_value, backend="eager", fullgraph=True)(torch.randn(5))
    compiled = kiln.compile(match_on_value, backend="eager")
    for sign in (1, -1, 1, -1):
        x = torch.rand(5) * sign
        assert_same(compiled(x), match_on_value(x))
    p = Point(torch.randn(()), torch.randn(3))
    with pytest.raises(UnsupportedError):
        kiln.compile(match_value_in_class, backend="eager", fullgraph=True)(p)
    compiled = kiln.compile(match_value_in_class, backend="eager")
    for x in (torch.zeros(()), torch.randn(()), torch.zeros(())):  # zero is the case's value
        p = Point(x, torch.randn(3))
        assert_same(compiled(p), match_value_in_class(p))


def test_mapping_pattern_on_other_mappings_breaks():
    def fn(d, t):
        match d:
            case {"w": w}:
                return t * w
        return t

    d = collections.OrderedDict(w=torch.randn(3))
    with pytest.raises(UnsupportedError):
        kiln.compile(fn, backend="eager", fullgraph=True)(d, torch.randn(3))
    t = torch.randn(3)
    assert_same(kiln.compile(fn, backend="eager")(d, t), fn(d, t))


# --- {*a, *b} -----------------------------------------------------------------------------------

def set_unpack(x, a, b, c):
    s = {*a, *b, *c, "z"}
    return x * len(s), sorted(s, key=str), "a" in s, 3 in s


@pytest.mark.parametrize("a, b, c", [
    ([1, 2, 3], (3, 4), frozenset({5})),
    (("a", "b"), ["b", "c", 1], "xy"),
    (range(4), {"k": 1, 2: 3}, ()),
])
def test_set_unpack(check_capture, a, b, c):
    check_capture(set_unpack, torch.randn(3), a, b, c)


def test_returned_set_is_fresh_each_call(check_capture):
    def fn(x, a, b):
        s = {*a, *b}
        return x + len(s), s, s

    out = check_capture(fn, torch.randn(3), [1, 2], ("q",))
    assert out[1] is out[2]  # one set, returned twice
    out[1].add("mutated by the caller")
    again = check_capture(fn, torch.randn(3), [1, 2], ("q",))
    assert again[1] == {1, 2, "q"}


def test_set_of_tensors_breaks():
    def fn(x, y):
        return x * len({*[x, y]})

    with pytest.raises(UnsupportedError, match="set"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(3), torch.randn(3))
    x, y = torch.randn(3), torch.randn(3)
    assert_same(kiln.compile(fn, backend="eager")(x, y), fn(x, y))


# --- del obj.attr -------------------------------------------------------------------------------

class Box:
    kind = "class-level"

    def __eq__(self, other):
        return type(other) is Box and vars(self) == vars(other)


def _box(**attrs):
    box = Box()
    for name, value in attrs.items():
        setattr(box, name, value)
    return box


def delete_attrs(x, box):
    y = x * box.scale
    del box.scale
    box.tmp = y.sum()
    del box.tmp  # set then deleted: absent before and after
    box.kind = "instance-level"
    del box.kind  # reads the class attribute again
    box.after = x + 1
    return y, box.kind, hasattr(box, "scale"), hasattr(box, "tmp")


def test_del_attribute_of_object(check_capture):
    box = _box(scale=2.5, keep=torch.randn(2))
    check_capture(delete_attrs, torch.randn(3), box)
    assert "scale" not in vars(box) and "tmp" not in vars(box) and "kind" not in vars(box)
    assert list(vars(box)) == ["keep", "after"]


def test_del_then_set_again(check_capture):
    def fn(x, box):
        old = box.w
        del box.w
        box.w = old * x
        delattr(box, "extra")
        return box.w + 1

    box = _box(w=torch.randn(3), extra=1)
    check_capture(fn, torch.randn(3), box)
    assert "extra" not in vars(box)


def test_del_attribute_of_object_made_inside():
    def fn(x):
        p = Plain(x, x * 2)
        del p.bias
        return p, hasattr(p, "bias"), p.weight + 1

    x = torch.randn(3)
    expected = fn(x)
    actual = kiln.compile(fn, backend="eager", fullgraph=True)(x)
    assert type(actual[0]) is Plain and list(vars(actual[0])) == ["weight"]
    assert_same(expected[0].weight, actual[0].weight)
    assert_same(expected[1:], actual[1:])


def test_del_missing_attribute_raises_like_eager():
    def fn(x, box):
        del box.missing
        return x

    args = (torch.randn(3), _box(a=1))
    assert _eager_and_default(fn, *args) == [("raise", AttributeError)] * 2
    with pytest.raises(UnsupportedError, match="missing"):
        kiln.compile(fn, backend="eager", fullgraph=True)(*args)


class Guarded:
    def __init__(self):
        self.a = 1
        self.log = []

    def __delattr__(self, name):
        self.log.append(name)
        super().__delattr__(name)


def test_del_with_custom_delattr_breaks():
    def fn(x, obj):
        del obj.a
        return x + 1

    with pytest.raises(UnsupportedError, match="__delattr__"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(3), Guarded())
    obj, ref, x = Guarded(), Guarded(), torch.randn(3)
    assert_same(kiln.compile(fn, backend="eager")(x, obj), fn(x, ref))
    assert obj.log == ref.log == ["a"] and not hasattr(obj, "a")


class Warmup(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.warmup = 2.0

    def forward(self, x):
        if hasattr(self, "warmup"):
            y = self.lin(x) * self.warmup
            del self.warmup
            return y
        return self.lin(x)


def test_del_module_attribute(counting_backend):
    model = Warmup()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=counting_backend, fullgraph=True)
    for step in range(5):
        if step == 3:  # set again from outside: the first entry applies once more
            model.warmup = ref.warmup = 2.0
        x = torch.randn(2, 3)
        assert_same(compiled(x), ref(x))
        assert ("warmup" in vars(model)) == ("warmup" in vars(ref)) is False
    assert counting_backend.count == 2


def test_del_module_parameter_breaks():
    def fn(m, x):
        del m.bias
        return x

    with pytest.raises(UnsupportedError, match="parameter"):
        kiln.compile(fn, backend="eager", fullgraph=True)(nn.Linear(2, 2), torch.randn(2))


# --- del of a closure cell ----------------------------------------------------------------------

def test_del_cellvar(check_capture):
    def fn(x):
        c = x * 2
        def read():
            return c + 1
        r = read()
        del c
        return r

    check_capture(fn, torch.randn(3))


def _stateful():
    state = torch.randn(3)

    def step(x):
        nonlocal state
        y = x + state
        del state
        return y
    return step


def test_del_nonlocal_cell_is_replayed():
    eager, compiled_fn = _stateful(), _stateful()
    compiled_fn.__closure__[0].cell_contents = eager.__closure__[0].cell_contents
    compiled = kiln.compile(compiled_fn, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), eager(x))
    for fn in (eager, compiled_fn):
        with pytest.raises(ValueError):  # the cell is empty
            fn.__closure__[0].cell_contents
    with pytest.raises(NameError):  # a second call reads the deleted variable
        eager(x)
    with pytest.raises(NameError):
        kiln.compile(compiled_fn, backend="eager")(x)


def test_del_nonlocal_of_an_inlined_closure():
    def make():
        step = _stateful()

        def fn(x):
            return step(x) * 2
        return fn, step.__closure__[0]

    (eager, eager_cell), (target, cell) = make(), make()
    cell.cell_contents = eager_cell.cell_contents
    x = torch.randn(3)
    assert_same(kiln.compile(target, backend="eager", fullgraph=True)(x), eager(x))
    for c in (eager_cell, cell):
        with pytest.raises(ValueError):  # the inlined function's cell is empty
            c.cell_contents


# --- the tests above run the opcodes they are about (3.11 and 3.12 compile them alike) ----------

@pytest.mark.parametrize("fn, ops", [
    (match_sequence, {"MATCH_SEQUENCE", "GET_LEN", "MATCH_CLASS"}),
    (match_mapping, {"MATCH_MAPPING", "MATCH_KEYS", "GET_LEN", "DICT_UPDATE", "DELETE_SUBSCR"}),
    (match_class, {"MATCH_CLASS"}),
    (match_size, {"MATCH_CLASS", "MATCH_SEQUENCE", "GET_LEN"}),
    (set_unpack, {"SET_UPDATE"}),
    (delete_attrs, {"DELETE_ATTR"}),
    (test_del_cellvar, {"DELETE_DEREF"}),
    (_stateful, {"DELETE_DEREF"}),
])
def test_constructs_compile_to_the_opcodes(fn, ops):
    assert ops <= _opnames(fn), sorted(ops - _opnames(fn))
    assert {op for op in ops if op in dis.opmap} == ops  # real opcodes on this Python
