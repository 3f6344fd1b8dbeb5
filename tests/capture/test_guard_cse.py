"""Guard chains read each object path once per call (kiln/capture/guard_cse.py)."""
from __future__ import annotations

import types

import torch

import kiln
from kiln.capture.guard_cse import share_reads


def _evaluate(expr: str, **names):
    return eval(compile(expr, "<guard>", "eval"), {}, dict(names))  # noqa: S307


def _counting_config(reads: list[str]) -> type:
    """A transformers-style config class: every attribute read goes through a Python
    `__getattribute__`, and is appended to `reads`."""
    class Config:
        def __getattribute__(self, name):
            reads.append(name)
            return object.__getattribute__(self, name)

    return Config


def _compiled_then_one_counted_call(model: torch.nn.Module, x: torch.Tensor,
                                    reads: list[str]) -> torch.nn.Module:
    """`model` compiled and called until warm (equal to eager), then once more with `reads`
    holding only that call's reads."""
    compiled = kiln.compile(model, backend="eager")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), model(x))
    reads.clear()
    compiled(x)
    return compiled


def test_a_repeated_path_is_read_once_and_the_answer_is_the_same():
    reads = []

    class Config:
        def __init__(self):
            object.__setattr__(self, "values", {"a": 1, "b": True})

        def __getattribute__(self, name):
            reads.append(name)
            return object.__getattribute__(self, name)

    obj = types.SimpleNamespace(cfg=Config())
    chain = ("type(obj.cfg) is T and ('values' in obj.cfg.__dict__) is True and "
             "obj.cfg.values['a'] == 1 and obj.cfg.values['b'] is True")
    shared = share_reads(chain)
    for text in (chain, shared):
        reads.clear()
        assert _evaluate(text, obj=obj, T=Config) is True
        counted = len(reads)
    assert counted == 2  # __dict__ and values, once each (4 + 2 reads before)
    obj.cfg.values["b"] = False  # a failing guard still fails
    assert _evaluate(shared, obj=obj, T=Config) is False


def test_no_name_is_defined_where_it_might_not_run():
    """`or`, conditional expressions and chained comparisons may skip an operand: a path first
    read there is bound at its next top-level read instead."""
    chain = "(flag or o.x.y == 1) and (1 if flag else o.x.y) and 0 < o.x.y < 5 and o.x.y == 2"
    shared = share_reads(chain)
    assert shared.count(":=") == 2 and shared.rindex(":=") > shared.index("0 < ")
    o = types.SimpleNamespace(x=types.SimpleNamespace(y=2))
    for flag in (True, False):
        assert _evaluate(shared, o=o, flag=flag) is (_evaluate(chain, o=o, flag=flag))


def test_a_chain_without_repeats_is_unchanged():
    chain = "type(x) is T and x.dtype is D and len(args) == 1"
    assert share_reads(chain) == chain


def test_compiled_calls_read_a_custom_getattribute_config_once_per_attribute():
    """A transformers-style config (a Python `__getattribute__`) read by several guards: each
    of its attributes costs one read per call, and a changed value still recompiles."""
    reads: list[str] = []
    Config = _counting_config(reads)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = Config()
            self.config.scale, self.config.shift, self.config.relu = 2.0, 1.0, True

        def forward(self, x):
            y = x * self.config.scale + self.config.shift
            return y.relu() if self.config.relu else y

    model = Model()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), model(x))
    reads.clear()
    compiled(x)
    assert reads.count("__dict__") <= 1 and reads.count("relu") <= 1, reads
    model.config.relu = False
    torch.testing.assert_close(compiled(x), model(x))


def test_a_graph_calls_inputs_read_their_shared_module_path_once():
    """The entry passes each parameter to the graph by its path; a layer's parameters share
    their module's path, read once per call now (left to right, as arguments evaluate), and a
    swapped layer still reaches the graph."""
    reads = []

    class Counting(torch.nn.Module):
        def __getattribute__(self, name):
            if name == "_modules":
                reads.append(name)
            return super().__getattribute__(name)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Counting()
            self.block.a, self.block.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.block.b(self.block.a(x).relu())

    model = Model()
    x = torch.randn(2, 4)
    compiled = _compiled_then_one_counted_call(model, x, reads)
    entry_reads = len(reads)
    assert entry_reads <= 2, reads  # guards and the graph call: one read each at most
    model.block.a = torch.nn.Linear(4, 4)
    torch.testing.assert_close(compiled(x), model(x))


def test_one_config_held_by_every_layer_is_read_through_one_path():
    """Every layer holds the model's config (transformers style, a Python `__getattribute__`):
    one tracker for the object, the other paths guarded to hold that same object (`is`), so a
    call reads each config attribute once, not once per layer. A layer given a config of its
    own then fails that guard and gets its own answer."""
    reads: list[str] = []
    Config = _counting_config(reads)

    class Layer(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.linear(x) * self.config.scale
            return y.relu() if self.config.relu else y

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = Config()
            self.config.scale, self.config.relu = 0.5, True
            self.layers = torch.nn.ModuleList(Layer(self.config) for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x) if self.config.relu else x
            return x

    model = Model()
    x = torch.randn(2, 4)
    compiled = _compiled_then_one_counted_call(model, x, reads)
    assert reads.count("scale") <= 1 and reads.count("relu") <= 1, reads
    own = Config()
    own.scale, own.relu = 3.0, False
    model.layers[2].config = own
    torch.testing.assert_close(compiled(x), model(x))
    model.config.scale = 2.0  # through the shared object: every other layer sees it
    torch.testing.assert_close(compiled(x), model(x))
