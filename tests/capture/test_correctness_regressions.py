"""Capture-stage correctness regressions of issue 11 (and issue 13 items 4 and 5): one test (or a
few) per bug class. Each compares the compiled result with eager PyTorch on fresh random inputs;
`config.suppress_errors` is off so a kiln bug cannot hide behind a silent eager fallback."""

from __future__ import annotations

import enum
import functools
import threading

import pytest
import torch
import torch.nn as nn

import kiln
from helpers import CountingBackend
from kiln.config import config


@pytest.fixture(autouse=True)
def _loud_errors():
    config.suppress_errors = False


def _opaque() -> None:
    """A call capture cannot trace (print is a stdlib builtin with I/O): a graph break."""
    print(end="")


# -- 1: comprehensions and generator expressions in frames that break or run route-only -------
class _CountsParams(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = sum(p.numel() for p in self.parameters())
        for _ in range(2):  # a break inside a loop: this frame runs route-only
            _opaque()
        ys = [v * 2 for v in sorted([3, 1, 2], key=lambda v: -v)]
        zs = {v + 1 for v in ys}
        return self.lin(x) * n + len(zs) + ys[0]


class _CountsParamsBreak(_CountsParams):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = sum(p.numel() for p in self.parameters())
        _opaque()  # a resumable break
        ys = [v * 2 for v in sorted([3, 1, 2], key=lambda v: -v)]
        zs = {v + 1 for v in ys}
        return self.lin(x) * n + len(zs) + ys[0]


@pytest.mark.parametrize("cls", [_CountsParams, _CountsParamsBreak])
def test_comprehensions_in_a_frame_that_breaks_or_runs_route_only(cls):
    model = cls()
    compiled = kiln.compile(model, backend="eager")
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


# -- 2: a container module changed after the first call ----------------------------------------
class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4)])
        self.named = nn.ModuleDict({"a": nn.Linear(4, 4)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        for key, layer in self.named.items():
            x = layer(x)
        return x + self.layers[-1](x)


@pytest.mark.parametrize("change", ["append", "extend", "insert", "dict-set", "del", "pop",
                                    "clear"])
def test_container_module_changed_after_the_first_call(change):
    model = _Stack()
    spare = [nn.Linear(4, 4) for _ in range(3)]  # made first: making a module bumps the version
    compiled = kiln.compile(model, backend="eager")
    compiled(torch.randn(2, 4))
    if change == "append":
        model.layers.append(spare[0])
    elif change == "extend":
        model.layers.extend(spare[:2])
    elif change == "insert":
        model.layers.insert(0, spare[0])
    elif change == "dict-set":
        model.named["b"] = spare[0]
    elif change == "del":
        model.layers.append(spare[0])
        compiled(torch.randn(2, 4))
        del model.layers[0]
    elif change == "pop":
        model.named["b"] = spare[0]
        compiled(torch.randn(2, 4))
        model.named.pop("a")
    else:
        model.named.clear()
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


# -- 3: torch.manual_seed inside a compiled function -------------------------------------------
def _reseeds(x: torch.Tensor):
    y = x + torch.rand(4)
    torch.manual_seed(3)
    z = y * torch.rand(4)
    return z, torch.randn(2)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_manual_seed_inside_gives_eager_random_numbers(backend):
    import torch._dynamo  # noqa: F401 - it wraps torch.manual_seed, as in a real program
    x = torch.randn(4)
    compiled = kiln.compile(_reseeds, backend=backend)
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected, after_eager = _reseeds(x), torch.rand(3)
        torch.manual_seed(seed)
        actual, after = compiled(x), torch.rand(3)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        torch.testing.assert_close(after, after_eager, rtol=0, atol=0)  # the generator state too


def _set_default_dtype_inside(x: torch.Tensor) -> torch.Tensor:
    torch.set_default_dtype(torch.float64)
    try:
        return x + torch.ones(3)
    finally:
        torch.set_default_dtype(torch.float32)


def test_set_default_dtype_inside_is_not_dropped():
    import torch._dynamo  # noqa: F401 - it wraps some torch functions, as in a real program
    x = torch.randn(3)
    out = kiln.compile(_set_default_dtype_inside, backend="eager")(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _set_default_dtype_inside(x), rtol=0, atol=0)


# -- 4: attribute names and dict keys rendered into generated code -----------------------------
class _Plain:
    pass


def test_attribute_names_that_are_not_identifiers_are_never_pasted_into_code():
    obj = _Plain()
    obj.weight = torch.randn(3)
    setattr(obj, "weight-2", torch.randn(3))
    setattr(obj, "__import__('os').getpid()", torch.randn(3))

    def f(x, o):
        return x * getattr(o, "weight-2") + getattr(o, "__import__('os').getpid()")

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, obj), f(x, obj), rtol=0, atol=0)
    setattr(obj, "weight-2", torch.randn(3))  # a new tensor under the same name is read again
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, obj), f(x, obj), rtol=0, atol=0)


def test_non_identifier_attribute_set_inside_is_replayed():
    obj = _Plain()
    setattr(obj, "a b", 1.0)

    def f(x, o):
        setattr(o, "a b", 2.5)
        return x * getattr(o, "a b")

    x = torch.randn(3)
    out = kiln.compile(f, backend="eager")(x, obj)
    torch.testing.assert_close(out, x * 2.5, rtol=0, atol=0)
    assert getattr(obj, "a b") == 2.5


class _Key:
    """A hashable dict key whose repr is not Python source."""

    def __repr__(self) -> str:
        return "<key>"


class _Level(enum.IntEnum):
    LOW = 1


class _Sneaky(str):
    def __repr__(self) -> str:
        return "__import__('os').getpid()"


def test_dict_keys_of_any_hashable_type_are_never_pasted_into_code():
    key = _Key()
    sneaky = _Sneaky("s")
    table = {"a-b": torch.randn(3), (1, "x"): torch.randn(3), key: torch.randn(3),
             2.5: torch.randn(3), _Level.LOW: torch.randn(3), sneaky: torch.randn(3)}

    def f(x, d):
        return x * d["a-b"] + d[(1, "x")] - d[key] * d[2.5] + d[_Level.LOW] * d[sneaky]

    compiled = kiln.compile(f, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, table), f(x, table), rtol=0, atol=0)
    table[key] = torch.randn(3)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, table), f(x, table), rtol=0, atol=0)


# -- 5: instances sharing entries must not share per-instance callees ----------------------------
class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        _opaque()
        return x * 2


class _Mid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mid = _Mid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mid(x) - 1


def test_two_instances_with_a_break_two_levels_down_use_their_own_weights():
    first, second = _Outer(), _Outer()
    compiled = [kiln.compile(m, backend="eager") for m in (first, second)]
    for _ in range(2):
        for model, run in zip((first, second), compiled):
            x = torch.randn(2, 4)
            torch.testing.assert_close(run(x), model(x), rtol=0, atol=0)


# -- 6: zero-arg super() ----------------------------------------------------------------------
class _Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + 1


class _SuperInLoop(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):  # route-only
            _opaque()
        return super().forward(x) * 2


class _SuperAfterBreak(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _opaque()
        return super().forward(x) * 2 + super(_SuperAfterBreak, self).forward(x)


class _SuperCallInLoop(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parent = super()  # a plain call of super (3.12 too), not LOAD_SUPER_ATTR
        for _ in range(2):  # route-only
            _opaque()
        return parent.forward(x) - 1


class _SuperAfterBreakNoSelf(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _opaque()  # `self` is read after the break only by super() itself
        return super().forward(x) * 2


@pytest.mark.parametrize("cls", [_SuperInLoop, _SuperAfterBreak, _SuperCallInLoop,
                                 _SuperAfterBreakNoSelf])
def test_zero_arg_super_in_a_frame_that_breaks_or_runs_route_only(cls):
    model = cls()
    compiled = kiln.compile(model, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


class _WithScale(_Base):
    @property
    def scale(self) -> float:
        return 3.0


class _SuperForms(_WithScale):
    @property
    def scale(self) -> float:
        return 5.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = super().forward(x)
        b = super(_SuperForms, self).forward(x)
        fwd = super().forward
        parent = super()
        return a * 2 + b + fwd(x) * super().scale + parent.forward(x) * self.scale


def test_zero_arg_super_is_traced_without_a_break():
    model = _SuperForms()
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    assert backend.count == 1


# -- 7: a break inside a closure ------------------------------------------------------------
def test_break_inside_a_closure_captures_graphs():
    scale = torch.randn(3)

    def f(x):
        y = x * scale
        _opaque()
        return y + scale

    backend = CountingBackend()
    compiled = kiln.compile(f, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)
    assert backend.count == 2


# -- 8: one code object shared by many functions (decorator wrappers) ---------------------------
def _passes_through(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


def _passes_through_after_break(fn):
    def wrapper(self, x):
        _opaque()  # before the cell is read: nothing in the trace guards on it
        return fn(self, x)
    return wrapper


def _passes_through_in_loop(fn):
    def wrapper(self, x):
        for _ in range(2):  # route-only
            _opaque()
        return fn(self, x)
    return wrapper


def _passes_through_traced(fn):
    def wrapper(self, x):
        return fn(self, x)
    return wrapper


def test_functions_wrapped_by_one_decorator_run_their_own_code():
    @_passes_through
    def add(x):
        return x + 1

    @_passes_through
    def scale(x):
        return x * 5

    x = torch.randn(3)
    for fn in (add, scale, add):
        torch.testing.assert_close(kiln.compile(fn, backend="eager")(x), fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("decorator", [_passes_through_after_break, _passes_through_in_loop,
                                       _passes_through_traced])
def test_models_whose_forward_goes_through_one_wrapper_run_their_own_forward(decorator):
    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = nn.Linear(3, 3)

        @decorator
        def forward(self, x):
            return self.transformer(x)

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Linear(3, 3)

        @decorator
        def forward(self, x):
            return self.model(x) * 2

    models = [Gpt(), Llama(), Gpt()]
    for model in models:
        x = torch.randn(3)
        torch.testing.assert_close(kiln.compile(model, backend="eager")(x), model(x),
                                   rtol=0, atol=0)


# -- 9: threads ---------------------------------------------------------------------------------
def test_threads_compiling_new_shapes_at_once():
    def f(x):
        return x.sin() + 1

    compiled = kiln.compile(f, backend="eager")
    errors: list[str] = []
    start = threading.Barrier(16)

    def work(n: int) -> None:
        try:
            start.wait()
            for size in (n + 1, n + 17, n + 1):
                x = torch.randn(size)
                torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- lambdas defined in torch's own files (torch's OpInfo table: `op=lambda x: x.byte()`) ------
def _torch_file_lambda(body: str):
    """A lambda whose module is a torch one, as the lambdas of torch.testing's operator table:
    FX would print it as `torch.<module>.op`, a name that does not lead back to it."""
    namespace = {"__name__": "torch.testing._internal.kiln_fake_opinfo", "torch": torch}
    exec(f"op = lambda x: {body}", namespace)
    return namespace["op"]


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_lambdas_from_torch_files_are_read_not_recorded_by_a_name(backend, generated_kernels):
    """Two such lambdas once became graph nodes printed alike: the eager backend's graph raised
    AttributeError, and the kiln backend's disk cache (keyed on the graph's code) handed the
    first lambda's compiled graph to the second, a silent wrong dtype and value."""
    for body in ("x.byte()", "torch.zero_(x.clone())", "x.double() * 2", "x.sin()"):
        fn = _torch_file_lambda(body)
        wrapper = eval("lambda a, op=fn: op(a)", {"fn": fn})
        x = torch.randn(3, 4) * 5
        kiln.reset()  # the in-memory caches gone: only the disk cache could mix them up
        got = kiln.compile(wrapper, backend=backend)(x.clone())
        want = fn(x.clone())
        assert got.dtype == want.dtype and torch.equal(got, want), body


def test_torch_testing_assert_close_still_checks_inside_a_compiled_function():
    """torch.testing.assert_close returns None: recorded as a graph node it was dropped."""
    @kiln.compile(backend="eager")
    def f(x, y):
        torch.testing.assert_close(x, y)
        return x + y

    x = torch.randn(4)
    assert torch.equal(f(x, x.clone()), x + x)
    with pytest.raises(AssertionError):
        f(x, x + 1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_an_in_place_op_whose_result_cannot_be_cast_back_raises_as_in_eager(backend,
                                                                            generated_kernels):
    """`long_tensor.logit_()`: eager raises (Float can't be cast to Long); the functional form
    traced for it cast silently (torch's OpInfo int64 samples of logit_ and ldexp_)."""
    def fn(x, y):
        z = x * 2
        z.logit_()
        return z + y

    def unbound(x, y):  # the same through torch.Tensor's unbound method
        z = x * 2
        torch.Tensor.logit_(z)
        return z + y

    x, y = torch.randint(1, 5, (4,)), torch.randn(4)
    for f in (fn, unbound):
        with pytest.raises(RuntimeError, match="can't be cast"):
            f(x.clone(), y)
        kiln.reset()
        with pytest.raises(RuntimeError, match="can't be cast"):
            kiln.compile(f, backend=backend)(x.clone(), y)

    def fine(x):  # castable in-place updates of integers stay in the graph
        x.add_(1).mul_(3)
        return x

    counting = CountingBackend()
    got = kiln.compile(fine, backend=counting)(torch.arange(5))
    assert torch.equal(got, fine(torch.arange(5))) and counting.count == 1
