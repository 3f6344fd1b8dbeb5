"""pipeline: one ATen graph → a `CompiledArtifact` (the callable a compiler returns).

    lower            kiln.lower.lower_graph                → IRGraph
    schedule         kiln.schedule.schedule (fusion)       → Schedule (steps in order)
    codegen          kiln.codegen.emit_group per group     → KernelSpec per FusedGroup
    autotune         options.autotune: best config each    → KernelSpec per FusedGroup
                     and matmul + epilogue: library call or GEMM template (gemm_tuning)
    compile_kernels  kiln.runtime.launcher.build_launchers → one pre-bound launcher per kernel
    wrapper          kiln.runtime.wrapper                  → Python source of call(args), exec'd
    cudagraphs       options.cudagraphs: kiln.runtime.cudagraphs replays call(args) as CUDA graphs

Each stage is timed (`CompiledArtifact.timings`, seconds). The artifact keeps everything a reader
or the disk cache needs: the wrapper source, the kernel specs, the schedule and the IR graph.
Every stage runs on every graph (autotune only under `options.autotune`); with the
fusion pass switched off (`KILN_DISABLE_PASSES=fusion`) the schedule keeps one kernel per
computed buffer. The pipeline has no fallback of its own: an error in a stage reaches the caller.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import torch

from kiln.codegen import candidate_configs, emit_group
from kiln.lower import lower_graph
from kiln.options import CompileOptions, resolve_options
from kiln.schedule import schedule as schedule_ir
from kiln.runtime.gemm_tuning import choose_gemm_templates
from kiln.runtime.launcher import stage_timer
from kiln.runtime.wrapper import WrapperCode, generate_wrapper, load_wrapper

__all__ = ["CompiledArtifact", "build_kernel_launchers", "compile_graph", "with_cudagraphs"]

log = logging.getLogger("kiln.runtime")

STAGES = ("trace", "lower", "schedule", "codegen", "autotune", "compile_kernels", "total")
AUTOTUNE_BUDGET_S = CompileOptions.autotune_budget_s  # per kernel, under options.autotune


@dataclasses.dataclass(eq=False)
class CompiledArtifact:
    """A compiled graph: `artifact(*inputs) -> tuple of outputs`.

    name: the graph's name ("inference", "forward", "backward"). wrapper: the generated
    `WrapperCode` (`wrapper.source` is readable Python). specs: the `KernelSpec`s in launch
    order. schedule / graph: the `Schedule` and `IRGraph` (None when rebuilt from the disk
    cache). timings: seconds per stage (`STAGES`). kernel_launches: generated kernels + library
    calls per call."""

    name: str
    call: Callable[[Sequence[Any]], tuple]
    wrapper: WrapperCode
    specs: list[Any]
    schedule: Any = None
    graph: Any = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def cudagraphs(self) -> Any:
        """The `CudaGraphRunner` replaying this graph (options.cudagraphs), else None."""
        from kiln.runtime.cudagraphs import CudaGraphRunner

        return self.call if isinstance(self.call, CudaGraphRunner) else None

    @property
    def kernel_launches(self) -> int:
        return self.wrapper.launches

    @property
    def wrapper_source(self) -> str:
        return self.wrapper.source

    def __call__(self, *args: Any) -> tuple:
        return self.call(args)

    def call_boxed(self, args: list) -> tuple:
        """Call with a list the wrapper empties after unpacking: the caller hands its
        references over, so each input is freed after its last reader when nothing else
        holds it (the autograd runtime passes the backward's saved activations this way)."""
        return self.call(args)

    def __repr__(self) -> str:
        return (f"<CompiledArtifact {self.name}: {len(self.specs)} kernels, "
                f"{self.kernel_launches} launches per call>")


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: CompileOptions | None = None, mode: str | None = None,
                  name: str = "graph", trace_s: float = 0.0) -> CompiledArtifact:
    """Compile a functional ATen graph (the autograd stage's inference/forward/backward graph)
    into a callable artifact; see the module docstring. `options`: the `CompileOptions` the
    backend was given (`mode=` alone is resolved the same way, for direct callers). `trace_s`
    is the time the caller spent producing `gm` (reported as the "trace" stage)."""
    options = resolve_options(mode, options)
    timings = {stage: 0.0 for stage in STAGES}
    timings["trace"] = trace_s
    with stage_timer(timings, "lower"):
        graph = lower_graph(gm, example_inputs)
    with stage_timer(timings, "schedule"):
        schedule = schedule_ir(graph)
    graph = schedule.graph  # elision / splits / layout changes live in the schedule's copy
    with stage_timer(timings, "codegen"):
        specs = {group.name: emit_group(group, graph) for group in schedule.groups}
    if options.autotune:
        with stage_timer(timings, "autotune"):
            specs = autotune_groups(schedule, specs, options.autotune_budget_s)
            schedule, specs = choose_gemm_templates(schedule, specs,
                                                    options.gemm_autotune_budget_s)
    with stage_timer(timings, "compile_kernels"):
        from kiln.runtime.launcher import check_kernel_devices

        check_kernel_devices(list(specs.values()),
                             {name: buf.layout.device for name, buf in graph.buffers.items()})
        dtypes = {name: buf.dtype for name, buf in graph.buffers.items()}
        launchers = build_kernel_launchers(list(specs.values()), dtypes)
    with stage_timer(timings, "codegen"):
        code = generate_wrapper(schedule, specs, name)
        constants = {n: c.value for n, c in graph.constants.items()}
        call = load_wrapper(code.source, launchers, constants, name)
    if options.cudagraphs:
        call = with_cudagraphs(call, options, name, gm.meta.get("static_input_indices", ()),
                               graph)
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    ordered = [specs[g.name] for g in schedule.groups]
    artifact = CompiledArtifact(name, call, code, ordered, schedule, graph, timings)
    from kiln import records
    from kiln.runtime.debug import report_artifact

    records.emit("pipeline_timings", dict(timings))  # for explain's and bench's compile time
    report_artifact(artifact, gm)
    log.debug("compiled %s: %d kernels, %d launches, %.3f s", name, len(ordered),
              artifact.kernel_launches, timings["total"])
    return artifact


def with_cudagraphs(call: Callable[[Sequence[Any]], tuple], options: CompileOptions,
                    name: str, static_inputs: Sequence[int] = (), graph: Any = None
                    ) -> Callable[[Sequence[Any]], tuple]:
    """`call` replayed as CUDA graphs (options.cudagraphs; `kiln.runtime.cudagraphs`).
    static_inputs: positions the autograd stage knows keep their address (parameters,
    buffers). graph: the IRGraph, for what it tells before any call (inputs the wrapper writes,
    buffers on other devices, library calls that wait for the host); None when rebuilt from
    the disk cache (such graphs write no input)."""
    from kiln.runtime.cudagraphs import CudaGraphRunner

    written: list[int] = []
    devices: set[str] = set()
    ops: list[Any] = []
    if graph is not None:
        positions = {buf.name: i for i, buf in enumerate(graph.inputs) if buf is not None}
        written = [positions[n] for n, _ in graph.mutations if n in positions]
        devices = {buf.layout.device.type for buf in graph.buffers.values()}
        ops = [node.op for node in graph.nodes if hasattr(node, "op")]
    return CudaGraphRunner(call, name=name, static_inputs=static_inputs, written_inputs=written,
                           devices=devices, library_ops=ops,
                           warmup=options.cudagraph_warmup,
                           max_recordings=options.cudagraph_max_recordings)


def build_kernel_launchers(specs: list[Any], dtypes: dict[str, torch.dtype] | None = None
                           ) -> dict[str, Callable[..., None]]:
    """Kernel name → pre-bound launcher (`launcher(*tensors)`, one tensor per `spec.args`);
    `dtypes` (buffer name → dtype) lets the launchers compile every binary now, in parallel."""
    from kiln.runtime.launcher import build_launchers

    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise RuntimeError(f"kernel names must be unique within a graph; repeated: {dup}")
    return dict(zip(names, build_launchers(specs, dtypes=dtypes)))


def autotune_groups(schedule: Any, specs: dict[str, Any],
                    budget_s: float = AUTOTUNE_BUDGET_S) -> dict[str, Any]:
    """options.autotune: each group's fastest config among `candidate_configs` (benchmarked
    on random inputs of the buffers' layouts by `kiln.runtime.autotune`, `budget_s` each)."""
    from kiln.runtime.autotune import autotune

    graph = schedule.graph
    tuned = dict(specs)
    for group in schedule.groups:
        configs = candidate_configs(group, graph)
        if len(configs) < 2:
            continue
        candidates = [emit_group(group, graph, config) for config in configs]
        tuned[group.name] = autotune(candidates, _arg_maker(graph, candidates[0]),
                                     budget_s)
    return tuned


def _arg_maker(graph: Any, spec: Any) -> Callable[..., list[torch.Tensor]]:
    """Random tensors with the layouts of the kernel's buffers (integers are zeros: they may
    be indices, and a kernel without bounds checks must stay in bounds)."""

    def make_args(candidate: Any = None) -> list[torch.Tensor]:
        out = []
        for name in (candidate or spec).args:
            lay = graph.buffers[name].layout
            base = torch.empty(lay.storage_size(), dtype=lay.dtype, device=lay.device)
            base = base.normal_() if lay.dtype.is_floating_point else base.zero_()
            out.append(torch.as_strided(base, lay.size, lay.stride, lay.offset))
        return out

    return make_args
