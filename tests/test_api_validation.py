"""kiln.compile checks its arguments where they are given, and `mode` / `options` become one
validated `CompileOptions` that reaches the runtime (issue 12 item 4, issue 17 item 1)."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln.backends.kiln_backend import kiln_backend
from kiln.config import config
from kiln.errors import InvalidArgument, KilnConfigError
from kiln.options import CompileOptions, resolve_options


def _f(x):
    return torch.sin(x) + 1


@pytest.mark.parametrize("kwargs, message", [
    ({"options": [1, 2]}, "options must be a dict, got list [1, 2]"),
    ({"options": "autotune"}, "options must be a dict, got str"),
    ({"fullgraph": "yes"}, "kiln.compile(fullgraph='yes'): expected True or False, got str"),
    ({"disable": "no"}, "kiln.compile(disable='no'): expected True or False, got str"),
    ({"fullgraph": 1}, "kiln.compile(fullgraph=1): expected True or False, got int"),
    ({"dynamic": "auto"}, "kiln.compile(dynamic='auto'): expected None, True or False"),
    ({"backend": 3}, "kiln.compile(backend=3): expected a registered name or a callable"),
    ({"mode": "fast"}, "unknown mode 'fast'"),
    ({"mode": 1}, "unknown mode 1"),
    ({"options": {1: True}}, "keys must be strings"),
])
def test_bad_arguments_are_invalid_argument_errors(kwargs, message):
    with pytest.raises(InvalidArgument) as info:
        kiln.compile(_f, **kwargs)
    assert message in str(info.value)
    with pytest.raises(InvalidArgument):  # the decorator form checks when it is written
        kiln.compile(**kwargs)


def test_disable_no_is_not_taken_as_true():
    """Before: any truthy value disabled compilation (the string "no" did)."""
    with pytest.raises(InvalidArgument):
        kiln.compile(_f, disable="no")
    assert kiln.compile(_f, disable=True) is _f


def test_unknown_option_lists_the_known_keys():
    with pytest.raises(InvalidArgument) as info:
        kiln.compile(_f, options={"autotunee": True})
    text = str(info.value)
    assert "unknown option 'autotunee'" in text
    assert "known keys: autotune, cudagraphs, autotune_budget_s, gemm_autotune_budget_s, " \
           "cudagraph_warmup, cudagraph_max_recordings, max_autotune, triton.cudagraphs" in text


@pytest.mark.parametrize("options, message", [
    ({"autotune": "yes"}, "option 'autotune' must be a bool, got 'yes'"),
    ({"autotune_budget_s": 0}, "option 'autotune_budget_s' must be positive, got 0"),
    ({"autotune_budget_s": True}, "option 'autotune_budget_s' must be a int or float"),
    ({"gemm_autotune_budget_s": -2}, "option 'gemm_autotune_budget_s' must be positive"),
    ({"cudagraph_warmup": -1}, "option 'cudagraph_warmup' must be at least 0, got -1"),
    ({"cudagraph_max_recordings": 0}, "option 'cudagraph_max_recordings' must be at least 1"),
    ({"cudagraph_warmup": 1.5}, "option 'cudagraph_warmup' must be a int, got 1.5"),
])
def test_option_values_are_typed(options, message):
    with pytest.raises(InvalidArgument, match=message):
        kiln.compile(_f, options=options)


@pytest.mark.parametrize("mode, autotune, cudagraphs", [
    (None, False, False), ("default", False, False), ("reduce-overhead", False, True),
    ("max-autotune", True, True), ("max-autotune-no-cudagraphs", True, False),
])
def test_torch_mode_names_map_onto_options(mode, autotune, cudagraphs):
    opts = resolve_options(mode)
    assert (opts.mode, opts.autotune, opts.cudagraphs) == (mode or "default", autotune,
                                                           cudagraphs)


def test_options_override_the_mode_and_accept_torch_spellings():
    opts = resolve_options("max-autotune", {"triton.cudagraphs": False, "autotune_budget_s": 1})
    assert opts == CompileOptions("max-autotune", autotune=True, autotune_budget_s=1.0,
                                  cudagraphs=False)
    assert resolve_options(None, {"max_autotune": True}).autotune
    assert resolve_options(None, opts) is opts  # already resolved: passed down as is
    tuned = resolve_options("reduce-overhead", {"cudagraph_warmup": 3,
                                                "cudagraph_max_recordings": 2})
    assert (tuned.cudagraphs, tuned.cudagraph_warmup, tuned.cudagraph_max_recordings) == \
        (True, 3, 2)


def test_kiln_backend_receives_one_resolved_options_object():
    compiled = kiln.compile(_f, backend="kiln", mode="max-autotune-no-cudagraphs",
                            options={"autotune_budget_s": 0.5})
    settings = compiled._kiln_compiled.settings
    assert settings.backend.func is kiln_backend
    assert settings.backend.keywords == {"options": CompileOptions(
        "max-autotune-no-cudagraphs", autotune=True, autotune_budget_s=0.5)}
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), _f(x))


def test_options_reach_the_autotuner(monkeypatch, tmp_path, device):
    """options={"autotune": True} (no mode) turns autotuning on, with the given budget (on the
    test device: interpreted kernels on the CPU, benchmarked binaries on CUDA)."""
    import kiln.runtime.pipeline as pipeline

    budgets = []
    original = pipeline.autotune_groups
    monkeypatch.setattr(pipeline, "autotune_groups",
                        lambda schedule, specs, budget: budgets.append(budget)
                        or original(schedule, specs, budget))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config.cpu_codegen, config.warm_start = "triton_interpret", False

    def fn(x, w):
        return torch.softmax(x @ w, -1)

    compiled = kiln.compile(fn, backend="kiln", options={"autotune": True,
                                                         "autotune_budget_s": 0.25})
    x, w = torch.randn(4, 8, device=device), torch.randn(8, 8, device=device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert budgets and set(budgets) == {0.25}


def test_torch_compile_style_mode_string_reaches_the_kiln_backend(monkeypatch, device):
    seen = []
    monkeypatch.setattr("kiln.backends.kiln_backend.compile_captured",
                        lambda gm, inputs, options, symbolic=False: seen.append(options) or gm)
    config.cpu_codegen = "triton_interpret"  # CPU inputs: the interpreter, not torch ops
    gm = torch.fx.symbolic_trace(_f)
    x = torch.randn(3, device=device)
    kiln_backend(gm, [x], mode="max-autotune")
    assert seen == [resolve_options("max-autotune")]
    with pytest.raises(InvalidArgument, match="unknown option 'nope'"):
        kiln_backend(gm, [x], options={"nope": 1})


def test_other_backends_get_mode_and_options_as_torch_compile_gives_them():
    seen = []

    def backend(gm, example_inputs, mode=None, options=None):
        seen.append((mode, options))
        return gm.forward

    x = torch.randn(3)
    f = kiln.compile(_f, backend=backend, mode="reduce-overhead", options={"k": [1, 2]})
    torch.testing.assert_close(f(x), _f(x))
    assert seen == [("reduce-overhead", {"k": [1, 2]})]


# -- config limits -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, env", [("recompile_limit", "KILN_RECOMPILE_LIMIT"),
                                       ("accumulated_recompile_limit",
                                        "KILN_ACCUMULATED_RECOMPILE_LIMIT")])
@pytest.mark.parametrize("raw", ["0", "-1"])
def test_recompile_limits_must_be_at_least_one(monkeypatch, name, env, raw):
    monkeypatch.setenv(env, raw)
    with pytest.raises(KilnConfigError) as info:
        config.reset()
    assert f"{env}='{raw}' must be at least 1" in str(info.value)
    monkeypatch.delenv(env)
    config.reset()
    with pytest.raises(KilnConfigError, match=f"config.{name}=0 must be at least 1"):
        setattr(config, name, 0)
    setattr(config, name, 1)  # the smallest valid value


def test_cpu_codegen_choice_is_checked_when_read(monkeypatch):
    monkeypatch.setenv("KILN_CPU_CODEGEN", "bogus")
    with pytest.raises(KilnConfigError) as info:
        config.reset()
    assert "KILN_CPU_CODEGEN='bogus' is not one of ('eager', 'triton_interpret')" in \
        str(info.value)
    monkeypatch.delenv("KILN_CPU_CODEGEN")
    config.reset()


# -- inputs the code generator does not handle ---------------------------------------------------

def _scale(x):
    return x * 3 + x


@pytest.mark.parametrize("make, what", [
    (lambda: torch.randn(4).to(torch.float8_e4m3fn), "of dtype torch.float8_e4m3fn"),
    (lambda: torch.randn(4, device="meta"), "on device meta"),
    (lambda: torch.randn(4, 4).to_sparse(), "a torch.sparse_coo tensor"),
])
def test_unsupported_inputs_run_that_graph_eagerly_with_one_warning(caplog, make, what):
    config.cpu_codegen = "triton_interpret"  # else every CPU graph runs as torch ops anyway
    gm = torch.fx.symbolic_trace(_scale)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        x = make()
        assert kiln_backend(gm, [x]) is gm
        assert kiln_backend(torch.fx.symbolic_trace(_scale), [make()]) is not None
    warnings = [r.getMessage() for r in caplog.records if "code generator" in r.getMessage()]
    assert warnings == [f"kiln backend: a graph input is {what}, which kiln's code generator "
                        "does not handle; graphs with such inputs run as torch ops (eager)"]


def test_complex_and_meta_inputs_through_kiln_compile_equal_eager(caplog):
    """Complex inputs compile (their ops run as ATen calls inside the graph); meta inputs run
    that graph as torch ops, with a warning."""
    config.cpu_codegen = "triton_interpret"
    compiled = kiln.compile(_scale, backend="kiln")
    z = torch.randn(6, dtype=torch.complex64)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        torch.testing.assert_close(compiled(z), _scale(z))
        meta = compiled(torch.empty(2, 3, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 3)
    assert "complex64" not in caplog.text and "on device meta" in caplog.text
