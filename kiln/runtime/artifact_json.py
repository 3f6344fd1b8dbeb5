"""artifact_json: a `CompiledArtifact` as plain JSON data, and the artifact again from it.

The runtime's half of the kiln backend's warm start (`kiln/backends/warm_start.py`, which stores
the data in the disk cache with what it needs besides). The data holds the wrapper source, the
launch order and every kernel's `KernelSpec` fields and argument dtypes; rebuilding compiles the
kernels from their sources and execs the wrapper: no fake tensors, no trace, no lowering.

Stored data is read back only after `check_artifact_json` accepted its whole shape, and it never
picks which code runs beyond its own sources: record types come from an allowlist by name,
dtypes from torch's dtype table, grids are constants (`FixedGrid`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from kiln.runtime.pipeline import CompiledArtifact, build_kernel_launchers
from kiln.runtime.wrapper import WrapperCode, load_wrapper

__all__ = ["NotCacheable", "SchemaError", "artifact_from_json", "artifact_json",
           "check_artifact_json", "expect", "is_int"]


class NotCacheable(Exception):
    """Why a graph or artifact is not stored (logged at debug)."""


class SchemaError(Exception):
    """Why stored data does not have the shape it was written with (a miss, logged at debug;
    the entry is rewritten by the cold compile that follows)."""


# -- artifact -> data ------------------------------------------------------------------------------

def artifact_json(artifact: CompiledArtifact) -> dict:
    """The artifact as JSON data (NotCacheable when it holds tensor constants or kernel spec
    values of other types than the stored ones)."""
    if artifact.graph is not None and artifact.graph.constants:
        raise NotCacheable("the graph holds tensor constants")
    return {
        "name": artifact.name,
        "wrapper": artifact.wrapper.source,
        "launch_order": list(artifact.wrapper.kernels),
        "externs": artifact.wrapper.externs,
        "kernels": [_spec_json(spec) for spec in artifact.specs],
        "dtypes": {name: str(dtype).removeprefix("torch.")
                   for spec in artifact.specs for name, dtype in _arg_dtypes(artifact, spec)},
        "timings": artifact.timings,
    }


def _arg_dtypes(artifact: CompiledArtifact, spec: Any) -> list[tuple[str, torch.dtype]]:
    return [(name, artifact.graph.buffers[name].dtype) for name in spec.args]


def _spec_json(spec: Any) -> dict:
    out: dict[str, Any] = {}
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if field.name == "grid":
            out["grid"] = list(value(spec.meta_dict))
        elif field.name == "origins":
            out["origins"] = [[o.node, o.op, o.user_location] for o in value]
        else:
            out[field.name] = _plain_json(value)
    return out


def _plain_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain_json(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value).__qualname__
        if _record_types().get(kind) is not type(value):
            raise NotCacheable(f"kernel spec value of type {kind} (not a stored record type)")
        fields = {f.name: _plain_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__dataclass__": kind, "fields": fields}
    if isinstance(value, dict):
        return {"__dict__": [[_plain_json(k), _plain_json(v)] for k, v in value.items()]}
    raise NotCacheable(f"kernel spec value of type {type(value).__name__}")


# -- the data's schema: checked whole before any of it is used -------------------------------------

_DTYPES = {str(v).removeprefix("torch."): v for v in vars(torch).values()
           if isinstance(v, torch.dtype)}


def check_artifact_json(data: Any) -> None:
    """Raise `SchemaError` unless `data` has the shape `artifact_json` writes: every field of
    the right type, kernel names that are identifiers, known dtypes. (The entry's hash already
    rules out edits; this keeps data of another shape from failing later, inside a user's
    call.)"""
    expect(isinstance(data, dict), "the payload is not an object")
    for field, kind in (("name", str), ("wrapper", str), ("launch_order", list),
                        ("externs", int), ("kernels", list), ("dtypes", dict)):
        expect(isinstance(data.get(field), kind), f"{field} is not a {kind.__name__}")
    names = {_check_kernel(kernel) for kernel in data["kernels"]}
    expect(all(name in names for name in data["launch_order"]),
           "launch_order names a kernel the entry does not hold")
    expect(all(text in _DTYPES for text in data["dtypes"].values()), "unknown dtype")


def expect(condition: bool, why: str) -> None:
    """Raise `SchemaError(why)` unless `condition`."""
    if not condition:
        raise SchemaError(why)


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON data's integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


_KERNEL_FIELDS: dict[str, Callable[[Any], bool]] = {
    "name": lambda v: isinstance(v, str) and v.isidentifier(),
    "source": lambda v: isinstance(v, str),
    "args": _strings, "arg_names": _strings, "reads": _strings, "writes": _strings,
    "members": _strings,
    "meta": lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and is_int(p[1])
        for p in v),
    "num_warps": is_int, "num_stages": is_int, "numel": is_int, "rnumel": is_int,
    "grid": lambda v: isinstance(v, list) and 1 <= len(v) <= 3 and all(
        is_int(g) and g >= 0 for g in v),
    "kind": lambda v: isinstance(v, str), "reduction_class": lambda v: isinstance(v, str),
    "index_checks": lambda v: isinstance(v, bool),
    "size_args": lambda v: v == [],  # kernels with symbolic sizes are not warm-started
    "origins": lambda v: isinstance(v, list) and all(
        isinstance(o, list) and len(o) == 3 and isinstance(o[0], str) and isinstance(o[1], str)
        and isinstance(o[2], (str, type(None))) for o in v),
    "config": lambda v: v is None or (isinstance(v, dict)
                                      and v.get("__dataclass__") in _record_types()),
}


def _check_kernel(data: Any) -> str:
    expect(isinstance(data, dict), "a kernel is not an object")
    expect(set(data) == set(_KERNEL_FIELDS), "a kernel has other fields than KernelSpec")
    for field, valid in _KERNEL_FIELDS.items():
        expect(valid(data[field]), f"kernel field {field} has the wrong type")
    return data["name"]


# -- data -> artifact ------------------------------------------------------------------------------

def artifact_from_json(data: dict) -> CompiledArtifact:
    """The artifact again from data `check_artifact_json` accepted: kernels built from their
    sources, the wrapper exec'd (no schedule or IR graph: None)."""
    specs = [_spec_from_json(s) for s in data["kernels"]]
    dtypes = {name: _DTYPES[text] for name, text in data["dtypes"].items()}
    launchers = build_kernel_launchers(specs, dtypes)
    code = WrapperCode(data["wrapper"], tuple(data["launch_order"]), data["externs"])
    call = load_wrapper(code.source, launchers, {}, data["name"])
    timings = {k: 0.0 for k in data.get("timings", {})}
    return CompiledArtifact(data["name"], call, code, specs, timings=timings)


class FixedGrid:
    """The launch grid of a stored kernel (shapes are static, so the grid is a constant)."""

    def __init__(self, grid: tuple[int, ...]) -> None:
        self.grid = grid

    def __call__(self, meta: Any) -> tuple[int, ...]:
        return self.grid


def _spec_from_json(data: dict) -> Any:
    from kiln.codegen import KernelSpec
    from kiln.lower.ir import Origin

    kwargs = {}
    for field in dataclasses.fields(KernelSpec):
        value = data[field.name]
        if field.name == "grid":
            value = FixedGrid(tuple(value))
        elif field.name == "origins":
            value = tuple(Origin(*o) for o in value)
        elif field.name == "meta":
            value = tuple((k, v) for k, v in value)
        else:
            value = _plain_from_json(value)
        kwargs[field.name] = value
    return KernelSpec(**kwargs)


@functools.lru_cache(maxsize=None)
def _record_types() -> dict[str, type]:
    """The only classes a stored entry may rebuild, by name: an entry is data, and a name in it
    never picks what code runs (an importable "module:callable" would)."""
    from kiln.codegen.kernel_configs import KernelConfig

    return {cls.__qualname__: cls for cls in (KernelConfig,)}


def _plain_from_json(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_plain_from_json(v) for v in value)
    if isinstance(value, dict) and "__dataclass__" in value:
        cls = _record_types().get(value["__dataclass__"])
        if cls is None or not isinstance(value.get("fields"), dict):
            raise SchemaError(f"unknown record type {value['__dataclass__']!r}")
        return cls(**{k: _plain_from_json(v) for k, v in value["fields"].items()})
    if isinstance(value, dict) and "__dict__" in value:
        return {_plain_from_json(k): _plain_from_json(v) for k, v in value["__dict__"]}
    return value
