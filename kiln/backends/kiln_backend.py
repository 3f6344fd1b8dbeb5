"""The "kiln" backend: capture → kiln autograd → lower → schedule → Triton codegen → wrapper.

`kiln_backend(gm, example_inputs, mode=None, options=None)` has torch.compile's backend contract, so it serves
both `kiln.compile(fn, backend="kiln")` and `torch.compile(fn, backend="kiln")` (registered
through the `torch_dynamo_backends` entry point in pyproject.toml). The autograd stage traces the
captured graph into ATen inference / forward / backward graphs; each is compiled by
`kiln.runtime.compile_graph` into generated kernels plus a Python wrapper.

Two shortcuts around the full pipeline:
- CPU tensors: generated Triton would run in Triton's interpreter (~1 ms per program), so by
  default (`config.cpu_codegen = "eager"`) the captured graph runs as torch ops, with the reason
  logged once at INFO. `cpu_codegen = "triton_interpret"` forces the whole pipeline (tests).
- Warm start (`config.warm_start`): an inference graph compiled before, in any process, is
  rebuilt from the disk cache before any tracing (`warm_start.py`).

A graph with data-dependent sizes (`nonzero`, `item()` captured with kiln.config's `capture_*`
flags: unbacked symbols) runs as torch ops, logged once at INFO: nothing below capture follows
such sizes, and neither per-size compiles nor the warm start may key on input sizes for it.

A graph that computes on CPU tensors beside CUDA inputs (`x.cpu()` then work on it) runs as torch
ops outside the interpreter (logged once at INFO): compiled Triton reads every pointer on the GPU.

Inputs the code generator does not handle (dtypes outside `SUPPORTED_DTYPES` such as float8,
devices other than CUDA and CPU, sparse tensors) make that graph run as torch ops, with one
warning per kind of input.

`options.cudagraphs` (mode="reduce-overhead", "max-autotune") is the runtime's: each compiled
graph's wrapper is replayed as CUDA graphs (`kiln.runtime.cudagraphs`). A graph that runs as
torch ops (the cases above) is not recorded; one warning says why.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import torch

from kiln._util import is_hashable
from kiln.autograd import aot_compile, has_unbacked_sizes
from kiln.backends.per_size import per_size, symbolic_inputs, symbolic_or_per_size
from kiln.backends.registry import register_backend
from kiln.config import config
from kiln.errors import KilnConfigError, KilnError
from kiln.logs import info_once, warn_once
from kiln.lower.symbolic import SymbolicShapeError, is_symbolic_graph
from kiln.options import CompileOptions, resolve_options
from kiln.passes import Pass, PassList, disabled_passes

__all__ = ["kiln_backend"]

log = logging.getLogger("kiln.backends")

CPU_CODEGEN = ("eager", "triton_interpret")


@register_backend("kiln")
def kiln_backend(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None,
                 options: CompileOptions | dict | None = None) -> Callable[..., Any]:
    """Compile a captured graph with kiln's code generator; see the module docstring.
    `options` is the `CompileOptions` kiln.compile resolved, or torch.compile's `mode` /
    `options` dict (resolved here the same way: an unknown key is an error)."""
    opts = resolve_options(mode, options)
    _check_disabled_passes()
    if _on_cpu(example_inputs) and _cpu_codegen() == "eager":
        _note_not_graphed(opts, "its inputs are CPU tensors")
        info_once("kiln-cpu-eager",
                  "kiln backend: the inputs are CPU tensors, so the graph runs as torch ops "
                  "(generated Triton would need the slow interpreter on CPU); set "
                  "KILN_CPU_CODEGEN=triton_interpret to run the generated kernels anyway", log)
        return gm
    unsupported = unsupported_input(example_inputs)
    if unsupported is not None:
        _note_not_graphed(opts, f"an input is {unsupported}")
        warn_once(("kiln-unsupported-input", unsupported),
                  f"kiln backend: a graph input is {unsupported}, which kiln's code generator "
                  "does not handle; graphs with such inputs run as torch ops (eager)", log)
        return gm
    if has_unbacked_sizes(gm):
        # generated kernels and wrappers size buffers from the inputs' sizes; a data-dependent
        # size (`nonzero`'s count) is none of them, and a kernel built for one call's count
        # would be wrong for the next with the same input sizes
        _note_not_graphed(opts, "its sizes depend on tensor values (nonzero, item(), ...: "
                                "host sync points)")
        info_once("kiln-unbacked",
                  "kiln backend: a graph with data-dependent sizes (nonzero, masked_select, "
                  "item(), ...) runs as torch ops; the code generator does not handle unbacked "
                  "sizes yet", log)
        return gm
    if _on_cpu(example_inputs):
        _check_interpreter()
    elif not _interpreting() and _computes_on_cpu(gm):
        # compiled Triton dereferences every pointer on the GPU; the CPU part of a mixed graph
        # has no code generator outside the interpreter, so the graph runs as torch ops
        _note_not_graphed(opts, "part of it computes on CPU tensors")
        info_once("kiln-mixed-devices",
                  "kiln backend: a graph computes on CPU tensors beside CUDA ones (`.cpu()`, a "
                  "tensor made without device=), so it runs as torch ops; keep the work on one "
                  "device to get generated kernels", log)
        return gm

    def compiling(symbolic: bool) -> Callable[[torch.fx.GraphModule, list], Callable[..., Any]]:
        def compile_one(graph: torch.fx.GraphModule, inputs: list) -> Callable[..., Any]:
            compiled = compile_captured(graph, inputs, opts, symbolic=symbolic)
            if not names_storage_positions(graph):
                return compiled  # kernels address inputs from their first elements
            return guard_storage_offsets(compiled, graph, inputs)
        return compile_one

    compile_static, compile_symbolic = compiling(False), compiling(True)
    if config.symbolic_kernels and symbolic_inputs(gm):
        # one compile with sizes as kernel arguments (stage C); what it cannot compile
        # compiles once per set of input sizes behind the one capture (per_size)
        return symbolic_or_per_size(compile_symbolic, compile_static, gm, list(example_inputs))
    return per_size(compile_static, gm, list(example_inputs))


def _offsets_check(offsets: list[tuple[int, int]]) -> Callable[[tuple], bool]:
    """`check(args)`: whether every listed input sits at its offset, as one generated
    expression (a Python loop over a model's dozens of inputs cost microseconds per call)."""
    terms = " and ".join(f"args[{i}].storage_offset() == {o}" for i, o in offsets) or "True"
    scope: dict[str, Any] = {}
    exec(compile(f"def check(args):\n    return {terms}\n", "<kiln storage offsets>", "exec"),
         scope)
    return scope["check"]


_AS_STRIDED = {torch.as_strided, torch.as_strided_, torch.Tensor.as_strided,
               torch.Tensor.as_strided_, "as_strided", "as_strided_"}


def names_storage_positions(gm: torch.fx.GraphModule) -> bool:
    """Whether the user's graph calls `as_strided` with an explicit storage offset: a position
    in the storage counted from its start, which changes meaning when the input sits elsewhere
    in its storage (every other op addresses an input from its first element, as the compiled
    kernels do; `x.storage_offset()` read by user code is guarded by capture)."""
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method") and is_hashable(node.target) \
                and node.target in _AS_STRIDED:
            if len(node.args) > 3 or "storage_offset" in node.kwargs:
                return True
    return False


def guard_storage_offsets(compiled: Callable[..., Any], gm: torch.fx.GraphModule,
                          example_inputs: list) -> Callable[..., Any]:
    """`compiled`, for calls whose tensor inputs sit at the storage offsets of the examples:
    for graphs that name storage positions (`names_storage_positions`), whose lowering read
    them relative to the examples' offsets. Capture's guards do not cover storage offsets, so
    a call with an input elsewhere runs the graph as torch ops (eager's answer), with a
    warning once per graph, instead of giving a wrong one."""
    offsets = [(i, t.storage_offset()) for i, t in enumerate(example_inputs)
               if isinstance(t, torch.Tensor)]
    same_offsets = _offsets_check(offsets)

    def call(*args: Any) -> Any:
        if same_offsets(args):
            return compiled(*args)
        i, offset = next((i, o) for i, o in offsets if args[i].storage_offset() != o)
        warn_once(("kiln-storage-offset", id(gm)),
                  f"kiln backend: input {i} of a compiled graph is at storage offset "
                  f"{args[i].storage_offset()}, the graph was compiled for {offset}; "
                  "calls like this run the graph as torch ops (eager)", log)
        return gm(*args)

    call.__dict__.update(getattr(compiled, "__dict__", {}))
    call.compiled = compiled  # the pipeline's object, for tools that inspect it
    return call


def compile_captured(gm: torch.fx.GraphModule, example_inputs: list,
                     options: CompileOptions, symbolic: bool = False) -> Callable[..., Any]:
    """The full pipeline, with the warm-start lookup in front on the inference path.
    `symbolic`: the autograd stage traces the graph once with symbolic sizes and its graphs
    compile into kernels with sizes as arguments; what cannot, it traces and compiles per size
    (no warm start)."""
    from kiln.backends import warm_start

    if symbolic:
        return _cold(gm, example_inputs, options, symbolic=True)
    key = None
    if config.warm_start and _inference_path(example_inputs):
        key = warm_start.graph_key(gm, example_inputs, options)
        hit = warm_start.load(key, lambda args: _cold(gm, args, options), options) if key \
            else None
        if hit is not None:
            return hit
    compiled = _cold(gm, example_inputs, options)
    if key is not None:
        warm_start.store(key, compiled)
    return compiled


def _cold(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions,
          symbolic: bool = False) -> Any:
    start = [time.perf_counter()]

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_one(graph: torch.fx.GraphModule, fake_inputs: list) -> Any:
            from kiln.runtime import compile_graph

            trace_s = time.perf_counter() - start[0] if kind != "backward" else 0.0
            artifact = compile_graph(graph, fake_inputs, options=options, name=kind,
                                     trace_s=trace_s)
            if is_symbolic_graph(graph) and not artifact.graph.symbolic:
                # kernels right for one size only: the autograd stage then traces this
                # variant per size (static graphs, compiled as such)
                raise SymbolicShapeError(f"the {kind} graph compiled with static sizes")
            return artifact

        return compile_one

    compilers = dict(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                     inference_compiler=compiler("inference"))
    rewrite = _JointRewrite()
    joint_passes = JOINT_PASSES.bind(joint_attention=rewrite)
    try:
        return aot_compile(gm, example_inputs, joint_passes=(joint_passes.run,),
                           symbolic=symbolic, **compilers)
    except Exception as err:
        what = rewrite.blame(err)
        if what is None:  # the rewrite raised nothing and changed nothing: not the cause
            raise
        # never lose the whole graph to the attention rewrite; a second failure raises as itself
        log.warning("kiln backend: %s (%s: %s); compiling without it (the joint-graph "
                    "attention rewrite)", what, type(err).__name__, err)
        return aot_compile(gm, example_inputs, symbolic=symbolic, **compilers)


class _JointRewrite:
    """The joint-graph attention pass of one compile, remembering what it did, so that a
    failure is retried without it only when the rewrite can be the cause, and named truly."""

    def __init__(self) -> None:
        self.rewritten = 0
        self.raised = False

    def __call__(self, joint: Any) -> Any:
        try:
            self.rewritten += rewrite_joint_attention(joint)
        except Exception:
            self.raised = True
            raise
        return joint

    def blame(self, err: BaseException) -> str | None:
        """What failed, in words, when retrying without the rewrite can help; else None."""
        if self.raised:
            return "the joint-graph attention rewrite failed"
        if self.rewritten and isinstance(err, KilnError):
            return (f"compiling the graph with {self.rewritten} explicit attention(s) "
                    "rewritten to SDPA failed")
        return None


def rewrite_joint_attention(joint: Any) -> int:
    """Explicit attention → SDPA forward + backward on the joint graph (in place), before
    partitioning, so the partitioner saves SDPA's logsumexp instead of the [B, H, L, L] softmax
    (the lower stage can only rewrite the forward once the graph is split). Returns how many
    attentions were rewritten."""
    from kiln.lower.attention import rewrite_attention

    return rewrite_attention(joint.gm)


def _rewrite_joint(joint: Any) -> Any:
    rewrite_joint_attention(joint)
    return joint


# the autograd stage's passes on the joint graph, before partitioning (`kiln.passes`)
JOINT_PASSES = PassList("autograd", [
    Pass("joint_attention", _rewrite_joint, "explicit attention -> SDPA forward + backward on "
         "the joint graph, so the partitioner saves logsumexp, not the softmax"),
], lambda joint: joint.gm.print_readable(print_output=False))


# dtypes the lower and codegen stages handle; anything else (quantized, float8, complex32,
# ...) would fail deep inside Triton or the launcher. Complex tensors never reach a kernel:
# every op touching one runs as its ATen op (`Interpreter.lower_complex`), so a rotary
# embedding's complex `freqs_cis` buffer compiles with the graph around it.
SUPPORTED_DTYPES = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.complex64, torch.complex128,
})
SUPPORTED_DEVICES = ("cuda", "cpu")  # cpu: through Triton's interpreter


def unsupported_input(example_inputs: list) -> str | None:
    """What makes a graph's inputs unsupported by the code generator ("of dtype
    torch.complex64", "on device meta", "a sparse tensor"), or None when they are fine."""
    for t in _tensors(example_inputs):
        if t.dtype not in SUPPORTED_DTYPES:
            return f"of dtype {t.dtype}"
        if t.device.type not in SUPPORTED_DEVICES:
            return f"on device {t.device.type}"
        if t.layout is not torch.strided:
            return f"a {t.layout} tensor"
    return None


def _note_not_graphed(options: CompileOptions, why: str) -> None:
    """options.cudagraphs, for a graph that runs as torch ops: say once why it is not
    replayed as a CUDA graph (kiln records only its own compiled wrappers)."""
    if options.cudagraphs:
        warn_once(("kiln-cudagraphs-eager", why),
                  f"kiln cudagraphs: mode={options.mode!r}, but a graph runs as torch ops "
                  f"without CUDA graphs: {why}", logging.getLogger("kiln.runtime.cudagraphs"))


def _tensors(example_inputs: list) -> list[torch.Tensor]:
    return [t for t in example_inputs if isinstance(t, torch.Tensor)]


def _on_cpu(example_inputs: list) -> bool:
    return all(t.device.type == "cpu" for t in _tensors(example_inputs))


# moves between devices, not work on them: `x.cpu()` alone needs no CPU kernel
_DEVICE_MOVES = ("cpu", "to", "cuda", torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.cuda)


def _computes_on_cpu(gm: torch.fx.GraphModule) -> bool:
    """Whether an operation in the graph makes a CPU tensor (kernels would run on CPU buffers).
    0-dim CPU tensors are scalars to CUDA kernels, read on the host."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr") or node.target in _DEVICE_MOVES:
            continue
        vals = node.meta.get("val")
        for val in vals if isinstance(vals, (tuple, list)) else (vals,):
            if isinstance(val, torch.Tensor) and val.device.type == "cpu" and val.dim() > 0:
                return True
    return False


def _inference_path(example_inputs: list) -> bool:
    """What the autograd runtime will pick for this call: inference unless grad mode is on and
    an input requires grad."""
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(example_inputs)))


def _check_disabled_passes() -> None:
    """A misspelled or required name in KILN_DISABLE_PASSES fails before any work, with the
    passes of every stage this backend runs in the message."""
    if config.disabled_passes:
        import kiln.lower.driver  # noqa: F401  (declares the lower stage's passes)
        import kiln.schedule  # noqa: F401  (declares the schedule stage's passes)

        disabled_passes()


def _cpu_codegen() -> str:
    choice = config.cpu_codegen
    if choice not in CPU_CODEGEN:
        raise KilnConfigError(f"KILN_CPU_CODEGEN / config.cpu_codegen={choice!r} is not one of "
                              f"{CPU_CODEGEN}", hint="use 'eager' (default) or 'triton_interpret'")
    return choice


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_interpreter() -> None:
    if not _interpreting():
        raise KilnConfigError(
            "cpu_codegen='triton_interpret' runs generated kernels on CPU tensors in Triton's "
            "interpreter, but TRITON_INTERPRET is not 1",
            hint="set TRITON_INTERPRET=1 in the environment before starting Python")
