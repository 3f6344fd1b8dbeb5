"""warm: compiled inference graphs on disk, rebuilt in a new process without tracing.

The kiln backend looks a captured graph up here *before* the autograd stage runs, keyed on what
the compiled code depends on: the captured graph's code, each input's dtype / shape / stride /
storage offset / device / requires_grad, the mode, kiln's config and source files, and the
toolchain versions (`kiln.runtime.cache`). A hit rebuilds the callable from the stored wrapper
source and kernel sources alone: no fake tensors, no trace, no lowering (so `torch._dynamo`,
which FakeTensorMode pulls in, is never imported).

Only self-contained graphs are stored: tensor inputs only, no attributes read from the module
(`get_attr`), only torch / operator functions called, no mutated inputs, no tensor constants,
outputs whose structure is nested tuples / lists / dicts. Anything else simply compiles cold.
A stored entry serves inference calls; the first training call (grad mode on and an input
requiring grad) compiles the full pipeline then.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from kiln.config import config
from kiln.runtime.cache import DiskCache, cache_key, tensor_meta, versions
from kiln.runtime.pipeline import CompiledArtifact, build_kernel_launchers
from kiln.runtime.wrapper import WrapperCode, load_wrapper

__all__ = ["STATS", "WarmGraph", "check_payload", "graph_key", "load", "store"]

log = logging.getLogger("kiln.runtime")

NAMESPACE = "graphs"
STATS = {"hits": 0, "misses": 0, "stores": 0}  # this process's lookups (for tests and reports)
_SAFE_MODULES = ("torch", "_operator", "operator", "builtins", "math")


class NotCacheable(Exception):
    """Why a graph or artifact is not stored (logged at debug)."""


class SchemaError(Exception):
    """Why a stored payload does not have the shape `_payload` writes (a miss, logged at debug;
    the entry is rewritten by the cold compile that follows)."""


# -- the key ---------------------------------------------------------------------------------------

def graph_key(gm: torch.fx.GraphModule, example_inputs: list, options: Any) -> str | None:
    """The cache key of a captured graph, or None when the graph cannot be stored."""
    try:
        _check_graph(gm, example_inputs)
    except NotCacheable as why:
        log.debug("warm start: not cached: %s", why)
        return None
    settings = {k: v for k, v in config.to_dict().items() if k not in ("debug_dir", "logs")}
    return cache_key("kiln-graph", gm.code, [tensor_meta(t) for t in example_inputs], options,
                     settings, versions(), _source_fingerprint())


def _check_graph(gm: torch.fx.GraphModule, example_inputs: list) -> None:
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise NotCacheable("a graph input is not a tensor")
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            raise NotCacheable(f"the graph reads module state ({node.op} {node.target})")
        if node.op == "call_function":
            module = getattr(node.target, "__module__", None) or ""
            if not module.startswith(_SAFE_MODULES):
                raise NotCacheable(f"the graph calls {node.target!r} from {module!r}")


@functools.lru_cache(maxsize=None)
def _source_fingerprint() -> str:
    """A hash of kiln's Python sources (~5 ms once per process): an edited kiln misses the
    entries an older one stored."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


# -- storing ---------------------------------------------------------------------------------------

def store(key: str, compiled: Any) -> bool:
    """Store the inference artifact of a `CompiledGraph` under `key` (if it can be)."""
    try:
        payload = _payload(compiled)
        DiskCache(NAMESPACE).put(key, payload)
    except (NotCacheable, TypeError, ValueError, OSError) as why:
        log.debug("warm start: not stored: %s", why)
        return False
    STATS["stores"] += 1
    return True


def _payload(compiled: Any) -> dict:
    from kiln.autograd.compiled_graph import InferenceVariant

    variant = getattr(compiled, "variants", {}).get((False, ()))
    if not isinstance(variant, InferenceVariant) or not isinstance(variant.fn, CompiledArtifact):
        raise NotCacheable("no compiled inference variant")
    joint, artifact = variant.joint, variant.fn
    if joint.mutated_inputs or joint.lifted_attrs:
        raise NotCacheable("the graph mutates inputs or reads module attributes")
    if artifact.graph is not None and artifact.graph.constants:
        raise NotCacheable("the graph holds tensor constants")
    from kiln.autograd._compat import tree_unflatten

    structure = tree_unflatten(list(range(len(joint.outputs))), joint.output_spec)
    return {
        "name": artifact.name,
        "wrapper": artifact.wrapper.source,
        "launch_order": list(artifact.wrapper.kernels),
        "externs": artifact.wrapper.externs,
        "kernels": [_spec_json(spec) for spec in artifact.specs],
        "dtypes": {name: str(dtype).removeprefix("torch.")
                   for spec in artifact.specs for name, dtype in _arg_dtypes(artifact, spec)},
        "outputs": [_output_json(info) for info in joint.outputs],
        "structure": _structure_json(structure),
        "timings": artifact.timings,
    }


def _arg_dtypes(artifact: CompiledArtifact, spec: Any) -> list[tuple[str, torch.dtype]]:
    return [(name, artifact.graph.buffers[name].dtype) for name in spec.args]


def _output_json(info: Any) -> dict:
    out = {"kind": info.kind, "index": info.index}
    if info.kind == "input_view":
        view = info.view
        out["view"] = [list(view.shape), list(view.stride), view.storage_offset]
    if info.kind == "constant":
        if not isinstance(info.value, (int, float, bool, str, type(None))):
            raise NotCacheable(f"output constant {type(info.value).__name__}")
        out["value"] = info.value
    return out


def _structure_json(tree: Any) -> Any:
    if isinstance(tree, int) and not isinstance(tree, bool):
        return {"leaf": tree}
    if tree is None:
        return {"none": True}
    if type(tree) in (tuple, list):
        return {type(tree).__name__: [_structure_json(t) for t in tree]}
    if type(tree) is dict and all(isinstance(k, str) for k in tree):
        return {"dict": [[k, _structure_json(v)] for k, v in tree.items()]}
    raise NotCacheable(f"output structure {type(tree).__name__}")


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


# -- loading ---------------------------------------------------------------------------------------

def load(key: str, cold: Callable[[list], Any]) -> WarmGraph | None:
    """The stored graph for `key` as a callable, or None on a miss. `cold(args)` compiles the
    full pipeline for the first training call."""
    payload = DiskCache(NAMESPACE).get(key)
    if payload is None:
        STATS["misses"] += 1
        return None
    try:
        check_payload(payload)
        artifact = _artifact(payload)
        epilogue = _epilogue(payload["outputs"], payload["structure"])
    except Exception as err:  # a stale or foreign entry must never break compilation
        log.debug("warm start: entry %s unusable (%s: %s)", key[:12], type(err).__name__, err)
        STATS["misses"] += 1
        return None
    STATS["hits"] += 1
    log.debug("warm start: %s rebuilt from the disk cache", artifact.name)
    return WarmGraph(artifact, epilogue, cold)


# -- the payload's schema: checked whole before any of it is used ----------------------------------

_DTYPES = {str(v).removeprefix("torch."): v for v in vars(torch).values()
           if isinstance(v, torch.dtype)}
_OUTPUT_KINDS = ("tensor", "input", "input_view", "duplicate", "constant")


def check_payload(payload: Any) -> None:
    """Raise `SchemaError` unless `payload` has the shape `_payload` writes: every field of the
    right type, kernel names that are identifiers, known dtypes and output kinds, structure
    leaves that name outputs. (The entry's hash already rules out edits; this keeps a payload
    of another shape from failing later, inside a user's call.)"""
    _expect(isinstance(payload, dict), "the payload is not an object")
    for field, kind in (("name", str), ("wrapper", str), ("launch_order", list),
                        ("externs", int), ("kernels", list), ("dtypes", dict),
                        ("outputs", list), ("structure", dict)):
        _expect(isinstance(payload.get(field), kind), f"{field} is not a {kind.__name__}")
    names = {_check_kernel(kernel) for kernel in payload["kernels"]}
    _expect(all(name in names for name in payload["launch_order"]),
            "launch_order names a kernel the entry does not hold")
    _expect(all(text in _DTYPES for text in payload["dtypes"].values()), "unknown dtype")
    for position, output in enumerate(payload["outputs"]):
        _check_output(output, position)
    _check_structure(payload["structure"], len(payload["outputs"]))


def _expect(condition: bool, why: str) -> None:
    if not condition:
        raise SchemaError(why)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


_KERNEL_FIELDS: dict[str, Callable[[Any], bool]] = {
    "name": lambda v: isinstance(v, str) and v.isidentifier(),
    "source": lambda v: isinstance(v, str),
    "args": _strings, "arg_names": _strings, "reads": _strings, "writes": _strings,
    "members": _strings,
    "meta": lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and _is_int(p[1])
        for p in v),
    "num_warps": _is_int, "num_stages": _is_int, "numel": _is_int, "rnumel": _is_int,
    "grid": lambda v: isinstance(v, list) and 1 <= len(v) <= 3 and all(
        _is_int(g) and g >= 0 for g in v),
    "kind": lambda v: isinstance(v, str), "reduction_class": lambda v: isinstance(v, str),
    "index_checks": lambda v: isinstance(v, bool),
    "origins": lambda v: isinstance(v, list) and all(
        isinstance(o, list) and len(o) == 3 and isinstance(o[0], str) and isinstance(o[1], str)
        and isinstance(o[2], (str, type(None))) for o in v),
    "config": lambda v: v is None or (isinstance(v, dict)
                                      and v.get("__dataclass__") in _record_types()),
}


def _check_kernel(data: Any) -> str:
    _expect(isinstance(data, dict), "a kernel is not an object")
    _expect(set(data) == set(_KERNEL_FIELDS), "a kernel has other fields than KernelSpec")
    for field, valid in _KERNEL_FIELDS.items():
        _expect(valid(data[field]), f"kernel field {field} has the wrong type")
    return data["name"]


def _check_output(output: Any, position: int) -> None:
    _expect(isinstance(output, dict) and output.get("kind") in _OUTPUT_KINDS,
            "an output of unknown kind")
    index = output.get("index")
    if output["kind"] in ("input", "input_view", "duplicate"):
        _expect(_is_int(index) and index >= 0, "an output index is not a natural number")
    if output["kind"] == "duplicate":
        _expect(index < position, "a duplicate output refers forward")
    if output["kind"] == "input_view":
        view = output.get("view")
        _expect(isinstance(view, list) and len(view) == 3 and _ints(view[0])
                and _ints(view[1]) and _is_int(view[2]), "a malformed input view")
    if output["kind"] == "constant":
        _expect(isinstance(output.get("value"), (int, float, bool, str, type(None))),
                "a constant output that is not a plain value")


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _check_structure(tree: Any, outputs: int) -> None:
    _expect(isinstance(tree, dict) and len(tree) == 1, "a malformed output structure")
    (kind, body), = tree.items()
    if kind == "leaf":
        _expect(_is_int(body) and 0 <= body < outputs, "a structure leaf names no output")
    elif kind == "none":
        _expect(body is True, "a malformed output structure")
    elif kind in ("tuple", "list"):
        _expect(isinstance(body, list), "a malformed output structure")
        for item in body:
            _check_structure(item, outputs)
    else:
        _expect(kind == "dict" and isinstance(body, list), "a malformed output structure")
        for item in body:
            _expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str),
                    "a malformed output structure")
            _check_structure(item[1], outputs)


def _artifact(payload: dict) -> CompiledArtifact:
    specs = [_spec_from_json(s) for s in payload["kernels"]]
    dtypes = {name: _DTYPES[text] for name, text in payload["dtypes"].items()}
    launchers = build_kernel_launchers(specs, dtypes)
    code = WrapperCode(payload["wrapper"], tuple(payload["launch_order"]), payload["externs"])
    call = load_wrapper(code.source, launchers, {}, payload["name"])
    timings = {k: 0.0 for k in payload.get("timings", {})}
    return CompiledArtifact(payload["name"], call, code, specs, timings=timings)


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
    from kiln.codegen.config import KernelConfig

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


def _epilogue(outputs: list[dict], structure: Any) -> Callable[[tuple, tuple], Any]:
    """Rebuild the captured graph's outputs from the wrapper's (as the autograd runtime's
    epilogue does for a graph without mutations)."""
    plain = all(o["kind"] == "tensor" for o in outputs) and \
        structure == {"tuple": [{"leaf": i} for i in range(len(outputs))]}
    if plain:
        return lambda args, outs: outs

    def epilogue(args: tuple, outs: tuple) -> Any:
        flat: list[Any] = []
        position = 0
        for info in outputs:
            flat.append(_output_value(info, args, outs, position, flat))
            if info["kind"] != "constant":
                position += 1
        return _rebuild(structure, flat)

    return epilogue


def _output_value(info: dict, args: tuple, outs: tuple, position: int, flat: list) -> Any:
    kind = info["kind"]
    if kind == "tensor":
        return outs[position]
    if kind == "input":
        return args[info["index"]]
    if kind == "input_view":
        shape, stride, offset = info["view"]
        return args[info["index"]].as_strided(shape, stride, offset)
    if kind == "duplicate":
        return flat[info["index"]]
    return info.get("value")


def _rebuild(tree: dict, flat: list) -> Any:
    if "leaf" in tree:
        return flat[tree["leaf"]]
    if "none" in tree:
        return None
    if "tuple" in tree:
        return tuple(_rebuild(t, flat) for t in tree["tuple"])
    if "list" in tree:
        return [_rebuild(t, flat) for t in tree["list"]]
    return {k: _rebuild(v, flat) for k, v in tree["dict"]}


class WarmGraph:
    """A compiled graph rebuilt from the disk cache: inference calls run the stored wrapper;
    a training call compiles the full pipeline once (`cold(args)`) and uses it from then on."""

    def __init__(self, artifact: CompiledArtifact, epilogue: Callable[[tuple, tuple], Any],
                 cold: Callable[[list], Any]) -> None:
        self.artifact = artifact
        self.epilogue = epilogue
        self.cold = cold
        self.full: Any = None

    def __call__(self, *args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            if self.full is None:
                self.full = self.cold(list(args))
            return self.full(*args)
        with torch.no_grad():
            outs = self.artifact.call(args)
        return self.epilogue(args, outs)
