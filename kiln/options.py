"""options: `kiln.compile`'s `mode` and `options`, resolved once into a typed `CompileOptions`.

`kiln.compile` resolves them (`resolve_options`) and hands the result to the kiln backend, which
passes it down to the runtime; nothing below api.py reads a mode string. torch.compile's mode
names map onto it:

    mode                          autotune  cudagraphs
    None / "default"              False     False
    "reduce-overhead"             False     True
    "max-autotune"                True      True
    "max-autotune-no-cudagraphs"  True      False

`options` (a dict) then overrides single fields: `{"autotune": True, "autotune_budget_s": 5.0}`
(`gemm_autotune_budget_s`: seconds per graph for the GEMM templates' benchmarks);
torch.compile's spellings `"max_autotune"` and `"triton.cudagraphs"` name the same fields. An
unknown key or a value of the wrong type is an `InvalidArgument` that lists the known keys.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from kiln.errors import InvalidArgument

__all__ = ["MODES", "CompileOptions", "resolve_options"]


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """How the kiln backend compiles. mode: the mode name these settings started from.
    autotune: benchmark each kernel's candidate configs and keep the fastest.
    autotune_budget_s: seconds of benchmarking per kernel. gemm_autotune_budget_s: seconds per
    graph for choosing between each matmul's library call (+ its separate epilogue kernel) and
    Triton GEMM templates with the epilogue fused (`kiln.runtime.gemm_tuning`; seconds of
    timing over all of a graph's matmuls, compiling the candidates not counted). cudagraphs: record each compiled
    graph's launches (kernels and library calls) as a CUDA graph per set of input sizes and
    replay it (`kiln.runtime.cudagraphs`, docs/cudagraphs.md); graphs that cannot be captured
    (CPU tensors, host syncs) run as without, with one warning saying why. Real capture also
    needs `config.cudagraphs_on_gpu` (`KILN_CUDAGRAPHS=1`) until validated on the GPU.
    cudagraph_warmup: calls per set of input sizes run without a graph before recording (torch's
    default, 1). cudagraph_max_recordings: recordings per compiled graph, over input sizes and
    generations (a new one is made when outputs of earlier replays are still referenced); past
    it, calls run without a graph (warned once)."""

    mode: str = "default"
    autotune: bool = False
    autotune_budget_s: float = 2.0
    gemm_autotune_budget_s: float = 5.0
    cudagraphs: bool = False
    cudagraph_warmup: int = 1
    cudagraph_max_recordings: int = 8


MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"autotune": True, "cudagraphs": True},
    "max-autotune-no-cudagraphs": {"autotune": True},
}

_ALIASES = {"max_autotune": "autotune", "triton.cudagraphs": "cudagraphs"}  # torch's spellings
_TYPES: dict[str, tuple[type, ...]] = {"autotune": (bool,), "cudagraphs": (bool,),
                                       "autotune_budget_s": (int, float),
                                       "gemm_autotune_budget_s": (int, float),
                                       "cudagraph_warmup": (int,),
                                       "cudagraph_max_recordings": (int,)}
_BUDGETS = {"autotune_budget_s": "per kernel, e.g. 2.0",
            "gemm_autotune_budget_s": "per graph for its matmuls, e.g. 5.0"}
_MINIMUM = {"cudagraph_warmup": 0, "cudagraph_max_recordings": 1}  # int options


def resolve_options(mode: Any = None, options: Any = None) -> CompileOptions:
    """The `CompileOptions` of a `mode` name and an `options` dict (either may be None); a
    `CompileOptions` passed as `options` is returned as is (already resolved)."""
    if isinstance(options, CompileOptions):
        if mode not in (None, options.mode):
            raise InvalidArgument(f"mode={mode!r} disagrees with options.mode={options.mode!r}",
                                  hint="pass the mode once")
        return options
    fields = dict(MODES[_mode_name(mode)])
    fields.update(_option_fields(options))
    return CompileOptions(mode=_mode_name(mode), **fields)


def _mode_name(mode: Any) -> str:
    if mode is None:
        return "default"
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidArgument(f"unknown mode {mode!r}",
                              hint=f"use None or one of {', '.join(map(repr, MODES))}")
    return mode


def _option_fields(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidArgument(f"options must be a dict, got {type(options).__name__} "
                              f"{options!r}", hint=f"for example options={{'autotune': True}}; "
                                                   f"known keys: {_known()}")
    fields: dict[str, Any] = {}
    for key, value in options.items():
        name = _ALIASES.get(key, key) if isinstance(key, str) else key
        if name not in _TYPES:
            raise InvalidArgument(f"unknown option {key!r}", hint=f"known keys: {_known()}")
        fields[name] = _checked(key, name, value)
    return fields


def _checked(key: str, name: str, value: Any) -> Any:
    types = _TYPES[name]
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        expected = " or ".join(t.__name__ for t in types)
        raise InvalidArgument(f"option {key!r} must be a {expected}, got {value!r}",
                              hint=f"known keys: {_known()}")
    if name in _BUDGETS:
        if not value > 0:
            raise InvalidArgument(f"option {key!r} must be positive, got {value!r}",
                                  hint=f"seconds of benchmarking {_BUDGETS[name]}")
        return float(value)
    if name in _MINIMUM and value < _MINIMUM[name]:
        raise InvalidArgument(f"option {key!r} must be at least {_MINIMUM[name]}, got {value!r}",
                              hint=f"known keys: {_known()}")
    return value


def _known() -> str:
    return ", ".join([*_TYPES, *_ALIASES])
