"""symbolic: the run-time side of kernels with symbolic sizes (issue 15, stage C).

A graph lowered with symbolic sizes (`IRGraph.symbolic`) has layouts, loop ranges and strides
that are expressions of size symbols (`s0`). Its wrapper binds each symbol from an input's shape
at every call (`s0 = x.shape[0]`: the symbol's source is the first input dim that is exactly
that symbol), then computes allocation sizes, strides and kernel grids from them; the kernels
take the symbols as arguments (`KernelSpec.size_args`), so one compile serves every size.

Kernels index in int32: the wrapper checks at every call that no buffer's extent reaches
2**31 (`check_extents`) and raises `SymbolicSizeOverflow` otherwise, which the backend answers
by compiling for those sizes (`kiln/backends/per_size.py`).
"""
from __future__ import annotations

from typing import Any

from kiln.lower.index import Expr, size_names
from kiln.lower.ir import IRGraph, TensorArg

__all__ = ["SymbolicSizeOverflow", "check_extents", "size_param", "size_sources",
           "symbolic_prologue"]

INT32_EXTENT = 2**31 - 1


class SymbolicSizeOverflow(RuntimeError):
    """A call's sizes make some buffer too large for the kernels' int32 index math."""


def check_extents(*extents: int) -> None:
    if extents and max(extents) >= INT32_EXTENT:
        raise SymbolicSizeOverflow(f"a buffer of {max(extents)} elements needs 64-bit "
                                   "indices; the symbolic kernels index in 32 bits")


class SymbolicWrapperError(RuntimeError):
    """A size symbol of the graph has no input dim to read it from."""


def size_param(i: int) -> str:
    """The wrapper's name for input `i` when it is a symbolic size (`IRGraph.size_inputs`)."""
    return f"_size{i}"


def size_sources(graph: IRGraph) -> dict[str, str]:
    """Each size symbol → the wrapper expression that reads it at a call: the first input dim
    that is exactly that symbol (`x.shape[0]`), else an input stride that is (`x.stride(0)`),
    or an int input (`IRGraph.size_inputs`) that is it (`_size1`) or an affine function of it (`2*s0 - 1`, a number the forward computed from
    an int argument and saved for the backward: `(_size0 - -1)//2`)."""
    sources: dict[str, str] = {}
    _read_from_inputs(sources, graph, "size", "{}.shape[{}]")
    # a stride that is a symbol of its own (a slice of a growing buffer); sizes come first
    _read_from_inputs(sources, graph, "stride", "{}.stride({})")
    for i, size in graph.size_inputs.items():
        name = _plain_symbol(size)
        if name is not None:
            sources.setdefault(name, size_param(i))
    for i, size in graph.size_inputs.items():
        solved = _affine_symbol(size)
        if solved is not None and solved[0] not in sources:
            name, coef, const = solved
            sources[name] = f"({size_param(i)} - {const})//{coef}"
    return sources


def _read_from_inputs(sources: dict[str, str], graph: IRGraph, field: str,
                      template: str) -> None:
    """Each input layout's `field` ("size" or "stride") entry that is exactly a symbol not in
    `sources` yet: read as `template.format(buffer, dim)`."""
    for buf in graph.inputs:
        if buf is None:
            continue
        for d, value in enumerate(getattr(buf.layout, field)):
            name = _plain_symbol(value)
            if name is not None:
                sources.setdefault(name, template.format(buf.name, d))


def _names_in(value: Any) -> set[str]:
    """Size symbols in a non-tensor output (a symbolic int, nested in lists and tuples)."""
    if isinstance(value, (list, tuple)):
        return set().union(*(_names_in(v) for v in value)) if value else set()
    return size_names(value) if isinstance(value, Expr) else set()


def _plain_symbol(size: Any) -> str | None:
    if isinstance(size, Expr) and size.const == 0 and len(size.terms) == 1:
        (atom, coef), = size.terms
        if coef == 1 and size_names(size) == {str(atom)}:
            return str(atom)
    return None


def _affine_symbol(size: Any) -> tuple[str, int, int] | None:
    """(symbol, coef, const) where `size` is `coef*symbol + const`, else None."""
    if isinstance(size, Expr) and len(size.terms) == 1:
        (atom, coef), = size.terms
        if coef != 0 and size_names(size) == {str(atom)}:
            return str(atom), coef, size.const
    return None


def symbolic_prologue(graph: IRGraph) -> list[str]:
    """The wrapper lines that bind the size symbols and check the extents."""
    sources = size_sources(graph)
    needed: set[str] = set()
    extents: list[str] = []
    for buf in graph.buffers.values():
        lay = buf.layout
        for value in (*lay.size, *lay.stride, lay.offset):
            needed |= size_names(value)
        if size_names(lay.storage_size()):
            extents.append(str(lay.storage_size()))
    # outputs and input updates are views whose geometry may name sizes no buffer has (the
    # backward of a sum: an expand of a static gradient to the input's symbolic shape)
    views = [*graph.outputs, *(arg for _, arg in graph.mutations)]
    for view in views:
        if isinstance(view, TensorArg):
            for value in (*view.size, *view.stride, view.offset):
                needed |= size_names(value)
        else:
            needed |= _names_in(view)
    for size in graph.size_inputs.values():  # kernels take these as scalars (`x * (2*n - 1)`)
        needed |= size_names(size)
    missing = needed - set(sources)
    if missing:
        raise SymbolicWrapperError(f"no input dim gives the size(s) {sorted(missing)}")
    lines = [f"{name} = {src}"
             for name, src in sorted(sources.items(), key=lambda kv: (len(kv[0]), kv[0]))]
    if extents:
        lines.append(f"check_extents({', '.join(dict.fromkeys(extents))})")
    return lines
