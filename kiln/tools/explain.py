"""`kiln.explain(fn)(*args, **kwargs)`: run `fn` once under kiln and report what capture did.

The result has torch._dynamo's `ExplainOutput` field names plus guards with their source lines
and recompile reasons. It is built from capture's records, never from log text.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from kiln import records
from kiln.tools.compile_time import DEFINITION, format_stages, stage_seconds
from kiln.diagnostics import GuardRecord, RecompileReason, Unsupported, user_terms

__all__ = ["ExplainOutput", "explain", "op_name"]


@dataclasses.dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[Unsupported]
    op_count: int
    ops_per_graph: list[list[Any]]
    out_guards: list[GuardRecord]
    compile_times: dict[str, float]
    recompile_reasons: list[RecompileReason] = dataclasses.field(default_factory=list)
    saved_reports: list[str] = dataclasses.field(default_factory=list)
    # per graph: its symbolic input dims, each with why ("x.shape[0] (dynamic=True)")
    dynamic_dims: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    # per graph: how it was split at DDP bucket boundaries (None: compiled whole)
    ddp_splits: list[records.DDPSplitRecord | None] = dataclasses.field(default_factory=list)
    # graphs with symbolic sizes that a later stage compiles per size after all, and why
    per_size: list[str] = dataclasses.field(default_factory=list)

    @property
    def guards(self) -> list[GuardRecord]:
        return self.out_guards

    def render(self, verbose: bool = False) -> str:
        """The report. Guards are summarized by kind (a count and one example each) unless
        `verbose`, which lists every guard; a module's parameters alone give dozens of them."""
        lines = [f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}"]
        if self.break_reasons:
            lines.append("Break Reasons:")
            lines.extend(_indent(r.render()) for r in self.break_reasons)
        for i, ops in enumerate(self.ops_per_graph):
            lines.append(f"Ops per Graph ({i + 1}): {len(ops)}")
            lines.extend(f"  {op_name(op)}" for op in ops)
        if any(self.dynamic_dims):
            lines.append("Dynamic dims (symbolic sizes: one graph for every size):")
            lines.extend(f"  graph {i + 1}: {', '.join(dims)}"
                         for i, dims in enumerate(self.dynamic_dims) if dims)
        if self.per_size:
            lines.append("Compiled per size after all (each new size compiles again):")
            lines.extend(_indent(reason) for reason in self.per_size)
        if any(self.ddp_splits):
            lines.append("DDP buckets (graphs split so gradient all-reduces overlap backward):")
            lines.extend(_indent(f"graph {i + 1}: {split.render(op_name)}")
                         for i, split in enumerate(self.ddp_splits) if split is not None)
        if self.recompile_reasons:
            lines.append("Recompiles:")
            lines.extend(_indent(r.render()) for r in self.recompile_reasons)
        if self.saved_reports:
            lines.append("Saved for backward:")
            lines.extend(_indent(r) for r in self.saved_reports)
        lines.extend(_guard_lines(self.out_guards, verbose))
        lines.append(f"Compile Time: {format_stages(self.compile_times)}")
        lines.append(f"  ({DEFINITION})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def _guard_lines(guards: list[GuardRecord], verbose: bool) -> list[str]:
    if verbose:
        return [f"Guards ({len(guards)}):"] + [_indent(g.render()) for g in guards]
    by_kind: dict[str, list[GuardRecord]] = {}
    for guard in guards:
        by_kind.setdefault(guard.kind, []).append(guard)
    lines = [f"Guards ({len(guards)}, by kind; all of them with --verbose / "
             f"render(verbose=True)):"]
    for kind, group in sorted(by_kind.items(), key=lambda item: (-len(item[1]), item[0])):
        example = user_terms(group[0].expr, group[0].location)
        lines.append(f"  {len(group):4d} {kind:<14} e.g. {example}")
    return lines


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


# Operators as the user wrote them, not as the `_operator` C module names them.
_OPERATOR_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//",
                     "mod": "%", "pow": "**", "matmul": "@", "neg": "unary -", "getitem": "[]",
                     "and_": "&", "or_": "|", "xor": "^", "invert": "~", "lt": "<", "le": "<=",
                     "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "iadd": "+=",
                     "imul": "*=", "isub": "-=", "itruediv": "/="}
# Where torch's public functions live in C: name them by the public path a user writes.
_TORCH_MODULE_ALIASES = {"torch._VariableFunctionsClass": "torch", "torch._C._VariableFunctions":
                         "torch", "torch._C._nn": "torch.nn.functional",
                         "torch._C._linalg": "torch.linalg", "torch._C._fft": "torch.fft",
                         "torch._C._special": "torch.special"}


def op_name(op: Any) -> str:
    """A graph op in user terms: `x + y` for operator.add, `torch.layer_norm` for
    torch._VariableFunctionsClass.layer_norm, `Tensor.relu` for a method."""
    if isinstance(op, str):
        return f"Tensor.{op}"
    module = getattr(op, "__module__", "") or ""
    name = getattr(op, "__qualname__", None) or getattr(op, "__name__", repr(op))
    if module in ("_operator", "operator") and name in _OPERATOR_SYMBOLS:
        return f"{_OPERATOR_SYMBOLS[name]} (operator.{name})"
    for prefix, public in _TORCH_MODULE_ALIASES.items():
        if f"{module}.{name}".startswith(prefix + "."):
            return f"{public}.{name.rsplit('.', 1)[-1]}"
    if module == "_operator":
        module = "operator"
    return f"{module}.{name}" if module else name


def explain(fn: Callable, *extra_args: Any, backend: Any = None, dynamic: bool | None = None,
            **extra_kwargs: Any) -> Callable[..., ExplainOutput]:
    """`kiln.explain(fn)(*args)`: compile `fn` afresh, call it once and return what kiln recorded.
    With the default the graphs run as captured; `backend="aot_eager"` also reports what the
    autograd stage saves for backward; `dynamic` is kiln.compile's (symbolic sizes, and the
    guards on them, show in the report)."""
    from kiln.api import compile as kiln_compile
    from kiln.backends import lookup_backend

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        recorder = records.Recorder()
        records.active_recorders().append(recorder)
        chosen = _ExplainBackend() if backend is None else _Fresh(lookup_backend(backend))
        try:
            compiled = kiln_compile(fn, backend=chosen, dynamic=dynamic)
            compiled(*args, **kwargs)
        finally:
            records.active_recorders().remove(recorder)
        return _summarize(recorder)

    if extra_args or extra_kwargs:
        return run(*extra_args, **extra_kwargs)
    return run


class _Fresh:
    """A backend under a new identity, so explain never reuses entries compiled elsewhere."""

    def __init__(self, backend: Callable) -> None:
        self.backend = backend
        self.__name__ = getattr(backend, "__name__", "backend")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return self.backend(gm, example_inputs)


class _ExplainBackend:
    """The eager backend under its own identity, so explain always captures afresh."""

    __name__ = "explain"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return gm.forward


def _unique_by_cost(breaks: list[Unsupported]) -> list[Unsupported]:
    """Identical breaks (same reason at the same line) once, most expensive first."""
    seen: dict[tuple, Unsupported] = {}
    for record in breaks:
        where = (record.location.filename, record.location.lineno) if record.location else None
        seen.setdefault((record.code, where), record)
    return sorted(seen.values(), key=lambda r: -r.cost)


def _summarize(recorder: records.Recorder) -> ExplainOutput:
    kept = [g for g in recorder.graphs if g.graph is not None]
    graphs = [g.graph for g in kept]
    ops = [g.ops for g in kept]
    times = stage_seconds([g.compile_seconds for g in recorder.graphs],
                          recorder.pipeline_timings)
    guards = [guard for g in recorder.graphs for guard in g.guards]
    breaks = _unique_by_cost(recorder.breaks)
    return ExplainOutput(graphs, len(graphs), len(breaks), breaks,
                         sum(len(o) for o in ops), ops, guards, times,
                         list(recorder.recompiles), list(recorder.saved),
                         [g.dynamic_dims for g in kept], [g.ddp_split for g in kept],
                         list(recorder.per_size))
