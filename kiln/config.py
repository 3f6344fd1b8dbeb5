"""kiln configuration: one object, defaults here, environment overrides read at import.

Use `kiln.config.config.<field>`; change values with `config.patch(**overrides)` (a context manager
and a decorator), or assign an attribute. `config.reset()` re-reads defaults and the environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

__all__ = ["Config", "config"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclasses.dataclass
class _Field:
    default: Any
    type: type
    env: str | None
    doc: str
    minimum: int | None = None  # int fields: the smallest valid value
    choices: tuple[str, ...] = ()  # str fields: the valid values (empty: any)


_FIELDS: dict[str, _Field] = {
    "recompile_limit": _Field(8, int, "KILN_RECOMPILE_LIMIT",
                              "cache entries per code object before warning once and running eagerly",
                              minimum=1),
    "accumulated_recompile_limit": _Field(256, int, "KILN_ACCUMULATED_RECOMPILE_LIMIT",
                                          "cache entries over all code objects", minimum=1),
    "debug_dir": _Field(None, str, "KILN_DEBUG_DIR", "dump one folder per compiled graph here"),
    "logs": _Field("", str, "KILN_LOGS", "comma list of log artifacts (see kiln.logs)"),
    "identity_transform": _Field(False, bool, "KILN_IDENTITY_TRANSFORM",
                                 "decode, normalize and reassemble code; run it without capture"),
    "suppress_errors": _Field(True, bool, "KILN_SUPPRESS_ERRORS",
                              "internal compiler errors fall back to eager with a warning"),
    "default_backend": _Field("kiln", str, "KILN_BACKEND", "backend used when none is given"),
    "eager_rng": _Field(False, bool, "KILN_EAGER_RNG",
                        "random ops run exactly as eager (not decomposed, unused ones kept)"),
    "cpu_codegen": _Field("eager", str, "KILN_CPU_CODEGEN",
                          "the kiln backend on CPU tensors: 'eager' runs the captured graph as "
                          "torch ops; 'triton_interpret' runs the generated Triton kernels in "
                          "Triton's interpreter (needs TRITON_INTERPRET=1; slow, for tests)",
                          choices=("eager", "triton_interpret")),
    "inference_attention": _Field("cudnn", str, "KILN_INFERENCE_ATTENTION",
                                  "fused attention kernel for rewritten inference attention on "
                                  "Hopper-class GPUs in fp16/bf16: 'cudnn' or 'flash' (training "
                                  "always uses flash: its backward is the one kiln emits)",
                                  choices=("cudnn", "flash")),
    "binary_cache": _Field(True, bool, "KILN_BINARY_CACHE",
                           "load kernel binaries compiled by an earlier process directly "
                           "(kiln.runtime.binaries) instead of through triton.compile"),
    "warm_start": _Field(True, bool, "KILN_WARM_START",
                         "the kiln backend reuses compiled inference graphs from the disk cache"),
    "disabled_passes": _Field("", str, "KILN_DISABLE_PASSES",
                              "comma list of optimization passes to switch off by name, for "
                              "debugging (kiln.passes.describe_passes() lists them; an unknown "
                              "or required pass is an error)"),
    # Off by default: with contraction, `x * 3 - mean` became one FMA whose exact product
    # kept the rounding error the stored mean had lost, and LayerNorm(1) multiplied it by
    # rsqrt(eps) ~ 316 (5e-5 where eager gives 0; kiln.codegen.kernel.KernelSpec).
    "fp_fusion": _Field(False, bool, "KILN_FP_FUSION",
                        "let Triton contract a * b + c into FMAs in generated kernels (faster, "
                        "but rounds differently from eager, which rounds each op)"),
    # On by default: eager rounds a float16/bfloat16 result at every op, and a fused chain
    # rounded once at its store turned `(acc16 * 3).long()` into an off-by-one against eager
    # (fuzz seed 92238). Two conversions per fused half-precision op (kiln.lower.rules.helpers).
    "emulate_precision_casts": _Field(True, bool, "KILN_EMULATE_PRECISION_CASTS",
                                      "fused float16/bfloat16 ops round their results to that "
                                      "dtype as eager does at every op (off: float32 through a "
                                      "fused chain, rounded once where stored, as Inductor's "
                                      "default)"),
    # On by default: a permute fused with elementwise math (convnext's layer scale + residual)
    # ran at 5.6 % of the H200's copy roofline as a 1-D kernel. Off: the 1-D kernels, for A/B.
    "tile_pointwise": _Field(True, bool, "KILN_TILE_POINTWISE",
                             "2-D tiled kernels for pointwise groups whose store and largest "
                             "read are contiguous along different dims (kiln.codegen.tiling)"),
    # Issue 15, stage C: a graph captured with symbolic sizes compiles once into kernels that
    # take the sizes as arguments; what the symbolic path cannot compile goes per size.
    "symbolic_kernels": _Field(True, bool, "KILN_SYMBOLIC_KERNELS",
                               "the kiln backend compiles a graph with symbolic sizes once, "
                               "with sizes as kernel arguments (off: once per set of sizes, "
                               "kiln.backends.per_size)"),
    # Issue 17: mode="reduce-overhead" records and replays CUDA graphs (kiln.runtime.cudagraphs).
    # The bookkeeping is tested on the CPU with a fake mechanism; real capture stays off until the
    # GPU tests (tests/runtime/test_cudagraphs_gpu.py) have passed on the H200.
    "cudagraphs_on_gpu": _Field(False, bool, "KILN_CUDAGRAPHS",
                                "replay compiled graphs as real CUDA graphs when the mode asks "
                                "for them (off: such graphs run without, with a warning saying "
                                "so; not yet validated on a GPU)"),
    # On by default, as torch._dynamo.config.optimize_ddp: one graph under DDP has one backward
    # node, so every gradient is ready only when it ends and no all-reduce overlaps it.
    "optimize_ddp": _Field(True, bool, "KILN_OPTIMIZE_DDP",
                           "split a graph captured under DistributedDataParallel at its "
                           "gradient-bucket boundaries and compile each piece on its own "
                           "(kiln.capture.ddp_split; docs/distributed.md)"),
    # Issue 15, stage D: off by default, as torch.compile's flags of the same names: an op
    # whose output size depends on values breaks the graph; on, its size is an unbacked
    # symbol (u0) and capture goes on (docs/dynamic_shapes.md, stage D).
    "capture_dynamic_output_shape_ops": _Field(
        False, bool, "KILN_CAPTURE_DYNAMIC_OUTPUT_SHAPE_OPS",
        "capture ops whose output size depends on tensor values (nonzero, masked_select, "
        "x[bool_mask], unique) with data-dependent sizes instead of breaking the graph"),
    "capture_scalar_outputs": _Field(
        False, bool, "KILN_CAPTURE_SCALAR_OUTPUTS",
        "capture tensor.item() / tolist() as data-dependent numbers in the graph instead of "
        "breaking it"),
    # On: symbolic kernels take the bound route static kernels take (kiln.runtime.launcher),
    # the grid printed into the launch function and checked against the kernel's grid when
    # built. Off, they launch through fn[grid] (~20 us of Python each: GPT-2 at batch 1 over
    # 8 lengths ran 1.3-1.8x its static compile that way, 0.94-1.28x bound, on the H200).
    "symbolic_bound_launch": _Field(True, bool, "KILN_SYMBOLIC_BOUND_LAUNCH",
                                    "kernels with symbolic sizes launch through the bound "
                                    "route (C launcher called directly, grid computed in the "
                                    "generated launch function) instead of fn[grid]"),
    # On by default (TorchDynamo's reorderable_logging_functions is opt-in): a logger call in a
    # forward (transformers' warning_once in every loss_function) otherwise splits the graph.
    "reorder_logging": _Field(True, bool, "KILN_REORDER_LOGGING",
                              "logger calls (debug/info/warning/error/critical/log, library "
                              "helpers such as warning_once), logging.info & co. and "
                              "warnings.warn are replayed after the graph with the argument "
                              "values of the call instead of breaking it; visible difference: "
                              "the record's caller location (file, line, function) is kiln's "
                              "entry, and it is emitted after the graph has computed "
                              "(docs/capture.md, 'Logging calls'); read at capture time"),
    # Off by default: its ResNet-50 gain (5.1 -> 3.5 ms of kernels, 4.0 ms in a kiln-only run)
    # did not show in a run beside eager and torch.compile (5.38 ms), and NHWC convolutions give
    # float32 results off eager's by TF32 algorithm differences (benchmarks/RESULTS.md,
    # 2026-12-02). When on, graphs with grouped convolutions keep NCHW.
    # Issue 17: GEMM templates compete with the library call only under max-autotune, and only
    # where a benchmark can decide (a CUDA device): on the interpreter nothing meaningful times.
    "gemm_templates": _Field("auto", str, "KILN_GEMM_TEMPLATES",
                             "max-autotune's Triton GEMM templates with fused epilogues "
                             "(kiln.runtime.gemm_tuning): 'auto' benchmarks them against the "
                             "library call + separate epilogue kernel on a GPU and keeps the "
                             "library call elsewhere; 'always' uses a template wherever legal "
                             "(the fastest when it can time and a template won, else the first "
                             "config; for tests on the interpreter); 'never' keeps every "
                             "library call",
                             choices=("auto", "always", "never")),
    "channels_last": _Field(False, bool, "KILN_CHANNELS_LAST",
                            "compute CUDA graphs with two or more convolutions, none grouped, in "
                            "NHWC memory order (kiln.lower.channels_last; inference graphs only)"),
}


def _parse(name: str, field: _Field, raw: str) -> Any:
    from kiln.errors import KilnConfigError

    if field.type is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise KilnConfigError(f"{field.env}={raw!r} is not a boolean (config.{name})",
                              hint="use one of 1/0, true/false, yes/no")
    if field.type is int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise KilnConfigError(f"{field.env}={raw!r} is not an integer (config.{name})",
                                  hint=f"for example {field.env}={field.default}") from None
        return check_value(name, value, f"{field.env}={raw!r}")
    return check_value(name, raw, f"{field.env}={raw!r}")


def check_value(name: str, value: Any, what: str | None = None) -> Any:
    """`value` when it is valid for setting `name` (its minimum, its choices), else a
    KilnConfigError naming `what` (the environment variable, or `config.<name>`)."""
    from kiln.errors import KilnConfigError

    field = _FIELDS[name]
    what = what or f"config.{name}={value!r}"
    if field.minimum is not None and isinstance(value, int) and value < field.minimum:
        raise KilnConfigError(f"{what} must be at least {field.minimum}",
                              hint=f"the default is {field.default}")
    if field.choices and value not in field.choices:
        raise KilnConfigError(f"{what} is not one of {field.choices} (config.{name})",
                              hint=f"use one of {', '.join(field.choices)}")
    return value


class Config:
    """The fixed set of kiln settings; see `_FIELDS` for names, defaults and environment variables."""

    __slots__ = tuple(_FIELDS)

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Restore defaults, then apply the environment."""
        for name, field in _FIELDS.items():
            value = field.default
            if field.env is not None and field.env in os.environ:
                value = _parse(name, field, os.environ[field.env])
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _FIELDS:
            raise AttributeError(f"kiln.config has no setting {name!r}; "
                                 f"valid names: {', '.join(sorted(_FIELDS))}")
        if _FIELDS[name].minimum is not None:  # choices are checked where they are used
            check_value(name, value)
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:  # only reached for names not in __slots__
        raise AttributeError(f"kiln.config has no setting {name!r}; "
                             f"valid names: {', '.join(sorted(_FIELDS))}")

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    def patch(self, **overrides: Any) -> contextlib.AbstractContextManager[None]:
        """Temporarily set values: `with config.patch(eager_rng=True):` or `@config.patch(...)`."""
        for name in overrides:
            if name not in _FIELDS:
                self.__setattr__(name, None)  # raises the AttributeError listing valid names
        return _Patch(self, overrides)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"kiln.config({body})"


class _Patch(contextlib.ContextDecorator):
    def __init__(self, cfg: Config, overrides: dict[str, Any]) -> None:
        self.cfg, self.overrides = cfg, overrides
        self.saved: list[dict[str, Any]] = []

    def __enter__(self) -> None:
        self.saved.append({name: getattr(self.cfg, name) for name in self.overrides})
        for name, value in self.overrides.items():
            setattr(self.cfg, name, value)

    def __exit__(self, *exc: object) -> None:
        for name, value in self.saved.pop().items():
            setattr(self.cfg, name, value)


config = Config()
