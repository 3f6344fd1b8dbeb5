from __future__ import annotations

import pytest
import torch

from kiln.config import config
from kiln.errors import KilnConfigError, KilnError


@pytest.fixture
def env(monkeypatch):
    """Set environment variables, re-read config, and re-read the clean env afterwards."""
    def setenv(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        config.reset()

    yield setenv
    monkeypatch.undo()
    config.reset()


def test_defaults():
    config.reset()
    assert config.to_dict() == {
        "recompile_limit": 8,
        "accumulated_recompile_limit": 256,
        "debug_dir": None,
        "logs": "",
        "identity_transform": False,
        "suppress_errors": True,
        "eager_rng": False,
        "default_backend": "kiln",
        "cpu_codegen": "eager",
        "inference_attention": "cudnn",
        "binary_cache": True,
        "warm_start": True,
        "disabled_passes": "",
        "fp_fusion": False,
        "emulate_precision_casts": True,
        "tile_pointwise": True,
        "channels_last": False,
        "gemm_templates": "auto",
        "symbolic_kernels": True,
        "symbolic_bound_launch": True,
        "cudagraphs_on_gpu": False,
        "optimize_ddp": True,
        "reorder_logging": True,
        "capture_dynamic_output_shape_ops": False,
        "capture_scalar_outputs": False,
    }


@pytest.mark.parametrize("raw, expected", [
    ("1", True), ("true", True), ("YES", True), ("0", False), ("false", False), ("no", False),
])
def test_env_bool(env, raw, expected):
    env(KILN_EAGER_RNG=raw, KILN_SUPPRESS_ERRORS=raw)
    assert config.eager_rng is expected
    assert config.suppress_errors is expected


def test_env_turns_ddp_split_off(env):
    env(KILN_OPTIMIZE_DDP="0")
    assert config.optimize_ddp is False


def test_env_int_str(env):
    env(KILN_RECOMPILE_LIMIT="3", KILN_DEBUG_DIR="/tmp/kd", KILN_BACKEND="inductor")
    assert config.recompile_limit == 3
    assert config.debug_dir == "/tmp/kd"
    assert config.default_backend == "inductor"


def test_env_capture_flags(env):
    env(KILN_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS="1", KILN_CAPTURE_SCALAR_OUTPUTS="yes")
    assert config.capture_dynamic_output_shape_ops is True
    assert config.capture_scalar_outputs is True


def test_bad_bool_names_variable(env):
    with pytest.raises(KilnConfigError) as info:
        env(KILN_IDENTITY_TRANSFORM="maybe")
    text = str(info.value)
    assert text.startswith("[kiln.config] KILN_IDENTITY_TRANSFORM='maybe' is not a boolean")
    assert "hint: use one of 1/0, true/false, yes/no" in text
    assert isinstance(info.value, KilnError)


def test_bad_int_names_variable(env):
    with pytest.raises(KilnConfigError, match=r"KILN_RECOMPILE_LIMIT='eight' is not an integer"):
        env(KILN_RECOMPILE_LIMIT="eight")


def test_patch_context_manager_restores():
    before = config.recompile_limit
    with config.patch(recompile_limit=before + 5, eager_rng=True):
        assert config.recompile_limit == before + 5
        assert config.eager_rng is True
    assert config.recompile_limit == before
    assert config.eager_rng is False


def test_patch_restores_on_exception():
    with pytest.raises(RuntimeError):
        with config.patch(eager_rng=True):
            raise RuntimeError("boom")
    assert config.eager_rng is False


def test_patch_decorator_restores():
    @config.patch(default_backend="inductor")
    def read() -> str:
        return config.default_backend

    assert read() == "inductor"
    assert config.default_backend == "kiln"
    assert read() == "inductor"  # reusable


def test_patch_nested():
    with config.patch(recompile_limit=1):
        with config.patch(recompile_limit=2):
            assert config.recompile_limit == 2
        assert config.recompile_limit == 1
    assert config.recompile_limit == 8


def test_unknown_name_lists_valid_names():
    with pytest.raises(AttributeError) as info:
        config.recompile_limt = 3
    assert "kiln.config has no setting 'recompile_limt'" in str(info.value)
    assert "recompile_limit" in str(info.value).split("valid names:")[1]
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        config.patch(nope=1)
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        config.nope  # noqa: B018


def test_compile_hands_mode_and_options_to_backends_that_take_them():
    import kiln

    seen = []

    def backend(gm, example_inputs, mode=None, options=None):
        seen.append((mode, options))
        return gm.forward

    x = torch.randn(3)
    f = kiln.compile(lambda t: t * 2 + 1, backend=backend, mode="max-autotune",
                     options={"k": 1})
    torch.testing.assert_close(f(x), x * 2 + 1)
    assert seen == [("max-autotune", {"k": 1})]
    g = kiln.compile(lambda t: t - 3, backend="eager", mode="max-autotune")  # takes no mode
    torch.testing.assert_close(g(x), x - 3)
