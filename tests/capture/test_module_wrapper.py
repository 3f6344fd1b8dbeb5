"""kiln.compile's wrappers: an nn.Module compiled behaves like the module (attributes, parameters,
state_dict, train/eval, hooks); the decorator forms; disable; recompiles on new shapes and cache
hits on old ones; and the small escape hatches (reset, disable, is_compiling, allow_in_graph).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

import kiln
from helpers import (
    CountingBackend,
    assert_same_structure_and_values,
    call_nodes,
    target_names,
)
from models import TransformerBlock


def _block():
    torch.manual_seed(0)
    return TransformerBlock(d_model=32, nhead=4)


class ModeBranch(nn.Module):
    """Output depends on self.training, so a stale entry is visible in the values."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 3


# --- attribute and parameter forwarding -----------------------------------------------------------

def test_attribute_access_forwards_to_the_original():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    assert compiled._orig_mod is model
    assert compiled.attn is model.attn
    assert compiled.norm1.weight is model.norm1.weight
    assert compiled.mlp[0] is model.mlp[0]
    assert isinstance(compiled.attn, nn.MultiheadAttention)


def test_parameters_and_named_parameters_are_the_originals():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    names = [n for n, _ in compiled.named_parameters()]
    assert names == [n for n, _ in model.named_parameters()]
    assert len(names) == 12


def test_state_dict_round_trip_and_load_is_not_stale():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 8, 32)
    compiled(x)  # compile first, so the loaded weights must reach the cached graph

    sd = compiled.state_dict()
    assert list(sd) == list(model.state_dict())
    plain = TransformerBlock(d_model=32, nhead=4)
    plain.load_state_dict(sd)  # strict: same keys, no prefix
    assert_same_structure_and_values(model(x), plain(x))

    torch.manual_seed(1)
    other = TransformerBlock(d_model=32, nhead=4)
    compiled.load_state_dict(other.state_dict())
    assert torch.equal(model.norm1.weight, other.norm1.weight)
    assert torch.equal(model.attn.in_proj_weight, other.attn.in_proj_weight)
    assert_same_structure_and_values(other(x), compiled(x))


def test_train_eval_toggle_reaches_the_original_and_recompiles():
    torch.manual_seed(0)
    model = ModeBranch()
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert_same_structure_and_values(model.lin(x) * 2, compiled(x))
        assert backend.count == 1

        compiled.eval()
        assert model.training is False and model.lin.training is False
        assert_same_structure_and_values(model.lin(x) - 3, compiled(x))
        assert backend.count == 2

        compiled.train()
        assert model.training is True and model.lin.training is True
        assert_same_structure_and_values(model.lin(x) * 2, compiled(x))
        assert backend.count == 2  # the training entry is still cached

        model.eval()  # toggled on the original, not through the wrapper
        assert_same_structure_and_values(model.lin(x) - 3, compiled(x))
        assert backend.count == 2


def test_eval_changes_dropout_behaviour_not_stale():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5))
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(64, 16)
    with torch.no_grad():
        train_out = compiled(x)
        assert (train_out == 0).sum() > 0  # dropout is active
        compiled.eval()
        assert_same_structure_and_values(model(x), compiled(x))
        assert (compiled(x) == 0).sum() == 0


# --- hooks ----------------------------------------------------------------------------------------

def test_hooks_registered_before_compile_run_with_right_args():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    ref = copy.deepcopy(model)
    calls = []

    def pre_hook(module, args):
        calls.append(("pre", module, args[0].detach().clone()))
        return (args[0] + 1,)

    def post_hook(module, args, output):
        calls.append(("post", module, output.detach().clone()))
        return output * 2

    model.register_forward_pre_hook(pre_hook)
    model.register_forward_hook(post_hook)
    compiled = kiln.compile(model, backend="eager")
    for _ in range(2):
        calls.clear()
        x = torch.randn(3, 4)
        out = compiled(x)
        expected = ref(x + 1) * 2
        assert_same_structure_and_values(expected, out)
        assert [c[0] for c in calls] == ["pre", "post"]
        assert calls[0][1] is model and calls[1][1] is model
        torch.testing.assert_close(calls[0][2], x, rtol=0, atol=0)
        torch.testing.assert_close(calls[1][2], ref(x + 1), rtol=0, atol=0)


def test_hooks_registered_after_compile_run_and_removal_is_seen():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same_structure_and_values(model(x), compiled(x))  # compiled without hooks

        seen = []

        def post_hook(module, args, output):
            seen.append(module)
            return output + 100

        handle = model.register_forward_hook(post_hook)
        out = compiled(x)
        assert seen == [model]
        assert_same_structure_and_values(torch.nn.functional.linear(x, model.weight, model.bias)
                                         + 100, out)

        pre = model.register_forward_pre_hook(lambda module, args: (args[0] * 0 + 1,))
        out = compiled(x)
        ones = torch.ones(3, 4)
        assert_same_structure_and_values(
            torch.nn.functional.linear(ones, model.weight, model.bias) + 100, out)

        handle.remove()
        pre.remove()
        assert_same_structure_and_values(torch.nn.functional.linear(x, model.weight, model.bias),
                                         compiled(x))
        assert len(seen) == 2


def test_hook_returning_none_keeps_the_output():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    seen = []
    model.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    model.register_forward_pre_hook(lambda m, a: None)
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same_structure_and_values(model(x), compiled(x))
    assert seen == [torch.Size([3, 4]), torch.Size([3, 4])]


# --- decorator forms ------------------------------------------------------------------------------

def test_bare_decorator_on_a_function():
    @kiln.compile
    def f(a, b):
        return torch.sin(a) + b * 2

    a, b = torch.randn(5), torch.randn(5)
    assert_same_structure_and_values(torch.sin(a) + b * 2, f(a, b))


def test_decorator_with_arguments_on_a_function():
    backend = CountingBackend()

    @kiln.compile(backend=backend)
    def f(a, b):
        return torch.cos(a) - b

    a, b = torch.randn(5), torch.randn(5)
    assert_same_structure_and_values(torch.cos(a) - b, f(a, b))
    assert backend.count == 1
    a, b = torch.randn(5), torch.randn(5)
    assert_same_structure_and_values(torch.cos(a) - b, f(a, b))
    assert backend.count == 1


def test_decorator_on_a_method_binds_self_per_instance():
    backend = CountingBackend()

    class Net(nn.Module):
        def __init__(self, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.lin = nn.Linear(4, 4)

        @kiln.compile(backend=backend)
        def forward(self, x):
            return self.lin(x).relu()

    a, b = Net(0), Net(1)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same_structure_and_values(a.lin(x).relu(), a(x))
        assert_same_structure_and_values(b.lin(x).relu(), b(x))  # never a's weights
        assert_same_structure_and_values(a.lin(x).relu(), a(x))
    assert 1 <= backend.count <= 2


def test_decorator_on_a_plain_class_method():
    class Scaler:
        def __init__(self, k):
            self.k = k

        @kiln.compile(backend="eager")
        def apply(self, x):
            return x * self.k + 1

    x = torch.randn(4)
    assert_same_structure_and_values(x * 3 + 1, Scaler(3).apply(x))
    assert_same_structure_and_values(x * 5 + 1, Scaler(5).apply(x))


# --- disable, shapes, reset -----------------------------------------------------------------------

def test_disable_true_runs_eagerly_without_compiling():
    backend = CountingBackend()

    def f(x):
        return x.exp() + 1

    compiled = kiln.compile(f, backend=backend, disable=True)
    x = torch.randn(4)
    assert_same_structure_and_values(f(x), compiled(x))

    model = _block()
    compiled_model = kiln.compile(model, backend=backend, disable=True)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert_same_structure_and_values(model(x), compiled_model(x))
    assert backend.count == 0


def test_new_batch_size_recompiles_and_old_shape_still_hits():
    model = _block()
    ref = copy.deepcopy(model)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        x2 = torch.randn(2, 8, 32)
        assert_same_structure_and_values(ref(x2), compiled(x2))
        assert backend.count == 1
        x3 = torch.randn(3, 8, 32)
        assert_same_structure_and_values(ref(x3), compiled(x3))
        assert backend.count == 2
        x2b = torch.randn(2, 8, 32)
        assert_same_structure_and_values(ref(x2b), compiled(x2b))
        assert backend.count == 2
        x3b = torch.randn(3, 8, 32)
        assert_same_structure_and_values(ref(x3b), compiled(x3b))
        assert backend.count == 2


def test_dtype_change_recompiles():
    backend = CountingBackend()
    compiled = kiln.compile(lambda x: x * 2 + 1, backend=backend)
    x = torch.randn(4)
    assert_same_structure_and_values(x * 2 + 1, compiled(x))
    xd = torch.randn(4, dtype=torch.float64)
    assert_same_structure_and_values(xd * 2 + 1, compiled(xd))
    assert backend.count == 2
    assert_same_structure_and_values(x * 2 + 1, compiled(x))
    assert backend.count == 2


def test_reset_clears_the_cache():
    backend = CountingBackend()

    def f(x):
        return x + 1

    compiled = kiln.compile(f, backend=backend)
    x = torch.randn(3)
    compiled(x)
    compiled(x)
    assert backend.count == 1
    kiln.reset()
    assert_same_structure_and_values(x + 1, compiled(x))
    assert backend.count == 2


# --- escape hatches -------------------------------------------------------------------------------

def test_is_compiling_is_false_eagerly_and_true_while_capturing():
    def f(x):
        if kiln.is_compiling():
            return x + 1
        return x - 1

    x = torch.randn(3)
    assert kiln.is_compiling() is False
    assert_same_structure_and_values(x - 1, f(x))
    assert_same_structure_and_values(x + 1, kiln.compile(f, backend="eager")(x))
    assert kiln.is_compiling() is False


def test_disable_marks_a_function_to_run_eagerly():
    ran_eagerly = []

    def helper(x):
        ran_eagerly.append(type(x))
        return x * 3

    disabled = kiln.disable(helper)
    x = torch.randn(4)
    assert_same_structure_and_values(x * 3, disabled(x))

    def f(x):
        return disabled(x.sin()) + 1

    ran_eagerly.clear()
    assert_same_structure_and_values(x.sin() * 3 + 1, kiln.compile(f, backend="eager")(x))
    assert ran_eagerly == [torch.Tensor]  # called once, on a real tensor


def test_allow_in_graph_keeps_the_function_as_one_node():
    def my_op(x):
        return x.relu() * 2 + x.sin()

    allowed = kiln.allow_in_graph(my_op)
    assert allowed is my_op or callable(allowed)

    def f(x):
        return allowed(x) + 1

    backend = CountingBackend()
    x = torch.randn(6)
    assert_same_structure_and_values(my_op(x) + 1, kiln.compile(f, backend=backend)(x))
    assert backend.count == 1
    names = target_names(backend.gm)
    assert "my_op" in names, names
    assert not any(n in ("relu", "sin") for n in names), names
    assert len(call_nodes(backend.gm)) == 2


# --- ambient state, dtype, kwargs, lifetime -------------------------------------------------------

def test_grad_mode_switch_on_an_eval_module_never_stale():
    # eval + no_grad takes MultiheadAttention's fast path, eval + grad does not: two entries
    model = _block().eval()
    ref = copy.deepcopy(model)
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert_same_structure_and_values(ref(x), compiled(x))
    out = compiled(x)
    assert out.requires_grad
    assert_same_structure_and_values(ref(x), out)
    assert backend.count == 2
    with torch.no_grad():
        assert_same_structure_and_values(ref(x), compiled(x))
    assert backend.count == 2


def test_module_converted_to_double_after_compile():
    model = _block().eval()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        compiled(x)
        compiled.double()
        assert model.norm1.weight.dtype is torch.float64
        xd = x.double()
        out = compiled(xd)
        assert out.dtype is torch.float64
        assert_same_structure_and_values(model(xd), out)


def test_module_called_with_keyword_argument():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert_same_structure_and_values(model(x), compiled(x=x))
        assert_same_structure_and_values(model(x), compiled(x))


def test_deleting_the_module_frees_it():
    import gc
    import weakref

    model = _block()
    compiled = kiln.compile(model, backend=CountingBackend())
    with torch.no_grad():
        compiled(torch.randn(2, 8, 32))
    alive = weakref.ref(model)
    del model, compiled
    gc.collect()
    assert alive() is None, "kiln's caches keep a compiled module alive"


# --- composable APIs (FSDP2's fully_shard): shared state, the class swapped on the wrapper ---------

class _Marker:
    """Stands in for FSDPModule: fully_shard puts it first in the MRO of a new subclass."""


def _swap_class(module):
    """What fully_shard does to its argument: state in `module.__dict__`, a hook, and the class
    replaced by a dynamic subclass with a mixin first."""
    module.__dict__.setdefault("__composable_api_state_key", {})["api"] = "state"
    module.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    module.__class__ = type(f"Marked{type(module).__name__}", (_Marker, type(module)), {})
    return module


def test_state_written_into_the_wrappers_dict_is_the_originals():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    compiled.__dict__["_api_state"] = 1  # composable APIs write module.__dict__ directly
    assert model._api_state == 1
    model.extra = 2
    assert compiled.extra == 2


def test_class_swapped_on_the_wrapper_stays_the_wrappers_and_runs_compiled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    ref = copy.deepcopy(model)
    backend = CountingBackend()
    compiled = _swap_class(kiln.compile(model, backend=backend))
    from kiln.capture.module_wrapper import CompiledModule
    assert isinstance(compiled, _Marker) and isinstance(compiled, CompiledModule)
    assert type(model) is nn.Sequential  # the original keeps its class
    assert model.__dict__["__composable_api_state_key"] == {"api": "state"}
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same_structure_and_values(ref(x * 2), compiled(x))  # hook, then compiled forward
    assert backend.count == 1
    # the wrapper is the root of its module tree now (FSDP2 looks its state up by identity)
    assert next(iter(compiled.modules())) is compiled
    assert [n for n, _ in compiled.named_modules()] == [n for n, _ in model.named_modules()]
    assert list(compiled.state_dict()) == list(ref.state_dict())


def test_unswapped_wrapper_lists_the_original_first():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    assert next(iter(compiled.modules())) is model
    assert [m for _, m in compiled.named_modules()] == list(model.modules())


def test_copy_and_deepcopy_of_a_compiled_module():
    model = _block()
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 8, 32)
    shallow = copy.copy(compiled)
    assert shallow._orig_mod is model
    deep = copy.deepcopy(compiled)
    assert deep._orig_mod is not model
    assert deep.norm1.weight is not model.norm1.weight
    with torch.no_grad():
        assert_same_structure_and_values(model(x), deep(x))
        deep.norm1.weight.add_(1)
        assert not torch.equal(model(x), deep(x))


def test_backward_hooks_run_around_the_compiled_forward():
    """A full backward hook needs nn.Module's own call (it wraps inputs and outputs); the
    forward inside it is still the compiled one, and the hook sees eager's gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    ref = copy.deepcopy(model)
    got, want = [], []
    model.register_full_backward_hook(lambda m, gi, go: got.append((m, go[0].clone())))
    ref.register_full_backward_hook(lambda m, gi, go: want.append(go[0].clone()))
    backend = CountingBackend()
    compiled = kiln.compile(model, backend=backend)
    x = torch.randn(5, 4, requires_grad=True)
    y = torch.randn(5, 3)
    (compiled(x) * y).sum().backward()
    (ref(x) * y).sum().backward()
    assert backend.count == 1  # compiled, not run eagerly
    assert len(got) == len(want) == 1 and got[0][0] is model
    torch.testing.assert_close(got[0][1], want[0])
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert "forward" not in model.__dict__


def test_global_forward_hooks_run_around_the_compiled_forward():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    seen = []

    def hook(module, args, output):
        seen.append(module)
        return output + 1

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        backend = CountingBackend()
        compiled = kiln.compile(model, backend=backend)
        x = torch.randn(3, 4)
        with torch.no_grad():
            out = compiled(x)
            want = torch.nn.functional.linear(x, model.weight, model.bias) + 1
    finally:
        handle.remove()
    assert_same_structure_and_values(want, out)
    assert seen == [model] and backend.count == 1
