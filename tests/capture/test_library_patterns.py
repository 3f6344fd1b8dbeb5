"""Patterns real libraries (transformers, timm) use around their models, each captured into graphs
with outputs equal to eager: function reflection attributes, star-args calls, mapping registries.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools

import torch

import kiln


def _explain(fn, *args, **kwargs):
    kiln.reset()
    return kiln.explain(fn)(*args, **kwargs)


def _reasons(out) -> list[str]:
    return [str(r).splitlines()[0] for r in out.break_reasons]


def _config_defaults(func):
    """Like transformers' `merge_with_config_defaults`: reads the wrapped function's code."""
    @functools.wraps(func)
    def wrapper(x, *args, **kwargs):
        if "scale" in func.__code__.co_varnames and func.__defaults__ == (2.0,):
            kwargs.setdefault("scale", 3.0)
        return func(x, *args, **kwargs)
    return wrapper


@_config_defaults
def _scaled(x, scale=2.0):
    return torch.sin(x) * scale


def test_function_attributes_are_guarded_constants():
    x = torch.randn(4, 5)
    out = _explain(_scaled, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    kiln.reset()
    compiled = kiln.compile(_scaled)
    torch.testing.assert_close(compiled(x), _scaled(x), rtol=0, atol=0)


def test_function_defaults_change_recompiles():
    def f(x, k=2.0):
        return x * k

    def g(x):
        return f(x) + f.__defaults__[0]

    kiln.reset()
    compiled = kiln.compile(g)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), g(x))
    f.__defaults__ = (5.0,)
    torch.testing.assert_close(compiled(x), g(x))


class _Registry(collections.abc.MutableMapping):
    """Like transformers' AttentionInterface: class-wide mapping plus local overrides."""
    _global = {"sin": torch.sin, "cos": torch.cos}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())

    def pick(self, key, default):
        if key not in self:
            return default
        return super().get(key, default)


class _DictRegistry(dict):
    def get(self, key):
        return super().get(str(key)) or torch.tanh


REGISTRY = _Registry()
DICT_REGISTRY = _DictRegistry(mul="unused")


def _use_registries(x, name):
    fn = REGISTRY[name] if name in REGISTRY else torch.relu
    other = REGISTRY.pick("cos", torch.exp)
    return fn(x) + other(x) * len(REGISTRY) + DICT_REGISTRY.get("absent")(x)


def test_mapping_registries_traced_and_guarded():
    x = torch.randn(6)
    out = _explain(_use_registries, x, "sin")
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    kiln.reset()
    compiled = kiln.compile(_use_registries)
    torch.testing.assert_close(compiled(x, "sin"), _use_registries(x, "sin"))
    REGISTRY["sin"] = torch.sigmoid  # a local override must recompile, not reuse torch.sin
    try:
        torch.testing.assert_close(compiled(x, "sin"), _use_registries(x, "sin"))
    finally:
        del REGISTRY["sin"]
    torch.testing.assert_close(compiled(x, "sin"), _use_registries(x, "sin"))


@dataclasses.dataclass
class _Output(collections.OrderedDict):
    """The protocol of transformers' ModelOutput: non-None fields are items, in field order."""
    last: torch.Tensor = None
    pooled: torch.Tensor | None = None
    extra: torch.Tensor | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                self[field.name] = value

    def __getitem__(self, k):
        return dict(self.items())[k] if isinstance(k, str) else tuple(self.values())[k]

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def _make_output(x):
    out = _Output(last=x.sin(), extra=x * 2)
    first = out[0] + out["extra"] + out.last
    out.pooled = first.mean(0)
    return out, out.to_tuple()[1], len(out), "pooled" in out


def test_output_dict_built_indexed_and_returned():
    x = torch.randn(3, 4)
    out = _explain(_make_output, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    kiln.reset()
    got, want = kiln.compile(_make_output)(x), _make_output(x)
    assert type(got[0]) is _Output and list(got[0].keys()) == list(want[0].keys())
    for a, b in zip(got[0].to_tuple(), want[0].to_tuple()):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[1], want[1])
    assert got[2:] == want[2:]


def _passthrough(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


@_passthrough
def _breaks_inside(x, scale=1.0):
    y = x.sin() * scale
    kiln.graph_break()
    return y.cos()


def _star_call_then_more(x):
    a = x.exp()
    b = _breaks_inside(*(a,), **{"scale": 2.0})  # the break is inside a star-args call
    return b + a


def test_star_args_call_is_a_resumable_break():
    x = torch.randn(5)
    out = _explain(_star_call_then_more, x)
    # graphs: exp before the call, sin*scale and cos inside it, + after it
    assert out.graph_count == 4 and out.graph_break_count == 1, _reasons(out)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_star_call_then_more)(x), _star_call_then_more(x))


def test_route_only_frame_routes_star_args_calls():
    counter = CountingBackendLike()

    @_passthrough
    def layer(x):
        return x.tanh() * 3

    def stack(x, n):
        for _ in range(n):
            x = layer(*(x,))
            kiln.graph_break()  # a break in a loop: the frame runs route-only
        return x

    kiln.reset()
    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(stack, backend=counter)(x, 3), stack(x, 3))
    assert counter.count >= 1  # the layers reached through f(*args) were compiled


class CountingBackendLike:
    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


class _Config:
    def __init__(self):
        self.encoder_layers, self.decoder_layers, self.scale = 1, 2, 0.5

    def text_config(self):
        """Like transformers' get_text_config on a flat encoder-decoder config."""
        copied = copy.deepcopy(self)
        for key in list(vars(copied)):
            if key.startswith("decoder_"):
                value = getattr(copied, key)
                delattr(copied, key)
                setattr(copied, "num_" + key[len("decoder_"):], value)
        return copied


CONFIG = _Config()


def _with_private_copy(x):
    config = CONFIG.text_config()
    for _ in range(config.num_layers):
        x = x.sin() * config.scale
    return x


def test_deepcopy_of_a_config_is_folded():
    x = torch.randn(4)
    out = _explain(_with_private_copy, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    assert not hasattr(CONFIG, "num_layers")  # the copy, not the original, was changed
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_with_private_copy)(x), _with_private_copy(x))


class _SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s))


def _custom_function(x):
    return _SiLU.apply(x.cos()).sum()


def test_autograd_function_apply_is_one_node_with_its_backward():
    x = torch.randn(6, requires_grad=True)
    out = _explain(_custom_function, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    _custom_function(x).backward()
    want = x.grad.clone()
    for backend in ("eager", "aot_eager"):
        kiln.reset()
        x.grad = None
        kiln.compile(_custom_function, backend=backend)(x).backward()
        torch.testing.assert_close(x.grad, want)


class _Stages(torch.nn.Module):
    """Like timm's RegNet: forward walks named_children (nn.Module dedupes them with a set)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(4, 4)
        self.shared = torch.nn.Linear(4, 4)
        self.again = self.shared  # the same module twice: visited once
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        for name, child in self.named_children():
            x = child(x).relu() if name != "head" else child(x)
        return x + sum(1 for _ in self.children())


def test_named_children_loop_is_one_graph():
    torch.manual_seed(0)
    model, x = _Stages(), torch.randn(3, 4)
    out = _explain(model, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(model)(x), model(x))


_LRU_CALLS = []


@functools.lru_cache
def _backend_available(name):
    _LRU_CALLS.append(name)
    return name == "torch"


def _uses_lru_helper(x):
    if _backend_available("torch"):
        return x.sin()
    return x.cos()


def test_lru_cache_helper_folded_at_compile_time():
    x = torch.randn(4)
    out = _explain(_uses_lru_helper, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), _reasons(out)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_uses_lru_helper)(x), x.sin())
    assert _LRU_CALLS == ["torch"]  # called once, as in eager


def _subscript_break(x, table):
    a = x.exp()
    b = table["scale"]  # a read capture cannot trace: break at BINARY_SUBSCR, then resume
    return (a * b).sum() + a.mean()


def test_break_at_subscript_resumes_after_it():
    class Weird:
        def __getitem__(self, key):
            import sys
            sys.getrefcount(key)  # C code capture does not interpret: the read breaks
            return 3.0
    x = torch.randn(5)
    out = _explain(_subscript_break, x, Weird())
    assert out.graph_count == 2 and out.graph_break_count == 1, _reasons(out)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(_subscript_break)(x, Weird()),
                               _subscript_break(x, Weird()))
