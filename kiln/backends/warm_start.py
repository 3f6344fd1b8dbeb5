"""warm_start: the kiln backend's compiled inference graphs on disk, rebuilt in a new process
without tracing.

The kiln backend looks a captured graph up here *before* the autograd stage runs, keyed on what
the compiled code depends on: the captured graph's code, each input's dtype / shape / stride /
storage offset / device / requires_grad, the mode, kiln's config and source files, and the
toolchain versions (`kiln.runtime.disk_cache`). An entry holds the compiled inference artifact
(`kiln.runtime.artifact_json`) and the autograd stage's `Epilogue` for it, as plain data. A hit
rebuilds the callable from these alone: no fake tensors, no trace, no lowering (so
`torch._dynamo`, which FakeTensorMode pulls in, is never imported).

Only self-contained graphs are stored: tensor inputs only, no attributes read from the module
(`get_attr`), only torch / operator functions called, no mutated inputs, no tensor constants,
outputs whose structure is nested tuples / lists / dicts. Anything else simply compiles cold.
A stored entry serves inference calls; the first training call (grad mode on and an input
requiring grad) compiles the full pipeline then.
"""
from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from kiln.autograd import CompiledGraph
from kiln.capture._compat import printed_name_resolves
from kiln.autograd.epilogue import OUTPUT_KINDS, Epilogue, OutputRule
from kiln.config import config
from kiln.runtime.artifact_json import (NotCacheable, artifact_from_json, artifact_json,
                                        check_artifact_json, expect, is_int)
from kiln.runtime.disk_cache import DiskCache, cache_key, tensor_meta, versions
from kiln.runtime.pipeline import CompiledArtifact, with_cudagraphs

__all__ = ["STATS", "WarmGraph", "check_payload", "graph_key", "load", "store"]

log = logging.getLogger("kiln.backends")

NAMESPACE = "graphs"
STATS = {"hits": 0, "misses": 0, "stores": 0}  # this process's lookups (for tests and reports)
_SAFE_MODULES = ("torch", "_operator", "operator", "builtins", "math")


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
            if not printed_name_resolves(node.target):  # the key is the code: names must be exact
                raise NotCacheable(f"the graph's code does not name {node.target!r} exactly")


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
    inference = compiled.compiled_inference() if isinstance(compiled, CompiledGraph) else None
    if inference is None or not isinstance(inference[0], CompiledArtifact):
        raise NotCacheable("no self-contained compiled inference variant (it is not compiled "
                           "yet, mutates inputs or reads module attributes)")
    artifact, epilogue = inference
    return {**artifact_json(artifact),
            "outputs": [_output_json(rule) for rule in epilogue.outputs],
            "structure": _structure_json(epilogue.output_structure())}


def _output_json(rule: OutputRule) -> dict:
    out = {"kind": rule.kind, "index": rule.index}
    if rule.kind == "input_view":
        if rule.dtype is not None:
            raise NotCacheable("an output views an input as another dtype")
        shape, stride, offset = rule.view
        out["view"] = [list(shape), list(stride), offset]
    if rule.kind == "constant":
        if not isinstance(rule.value, (int, float, bool, str, type(None))):
            raise NotCacheable(f"output constant {type(rule.value).__name__}")
        out["value"] = rule.value
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


# -- loading ---------------------------------------------------------------------------------------

def load(key: str, cold: Callable[[list], Any], options: Any = None) -> WarmGraph | None:
    """The stored graph for `key` as a callable, or None on a miss. `cold(args)` compiles the
    full pipeline for the first training call. `options.cudagraphs`: the rebuilt wrapper is
    replayed as CUDA graphs, as a cold compile's is."""
    payload = DiskCache(NAMESPACE).get(key)
    if payload is None:
        STATS["misses"] += 1
        return None
    try:
        check_payload(payload)
        artifact = artifact_from_json(payload)
        epilogue = _epilogue(payload["outputs"], payload["structure"])
    except Exception as err:  # a stale or foreign entry must never break compilation
        log.debug("warm start: entry %s unusable (%s: %s)", key[:12], type(err).__name__, err)
        STATS["misses"] += 1
        return None
    STATS["hits"] += 1
    log.debug("warm start: %s rebuilt from the disk cache", artifact.name)
    if options is not None and options.cudagraphs:
        artifact.call = with_cudagraphs(artifact.call, options, artifact.name)
    return WarmGraph(artifact, epilogue, cold)


def check_payload(payload: Any) -> None:
    """Raise `SchemaError` unless `payload` has the shape `_payload` writes: the artifact's
    fields (`check_artifact_json`), known output kinds and structure leaves that name outputs.
    (The entry's hash already rules out edits; this keeps a payload of another shape from
    failing later, inside a user's call.)"""
    check_artifact_json(payload)
    expect(isinstance(payload.get("outputs"), list), "outputs is not a list")
    expect(isinstance(payload.get("structure"), dict), "structure is not a dict")
    for position, output in enumerate(payload["outputs"]):
        _check_output(output, position)
    _check_structure(payload["structure"], len(payload["outputs"]))


def _check_output(output: Any, position: int) -> None:
    expect(isinstance(output, dict) and output.get("kind") in OUTPUT_KINDS,
           "an output of unknown kind")
    index = output.get("index")
    if output["kind"] in ("input", "input_view", "duplicate"):
        expect(is_int(index) and index >= 0, "an output index is not a natural number")
    if output["kind"] == "duplicate":
        expect(index < position, "a duplicate output refers forward")
    if output["kind"] == "input_view":
        view = output.get("view")
        expect(isinstance(view, list) and len(view) == 3 and _ints(view[0])
               and _ints(view[1]) and is_int(view[2]), "a malformed input view")
    if output["kind"] == "constant":
        expect(isinstance(output.get("value"), (int, float, bool, str, type(None))),
               "a constant output that is not a plain value")


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(v) for v in value)


def _check_structure(tree: Any, outputs: int) -> None:
    expect(isinstance(tree, dict) and len(tree) == 1, "a malformed output structure")
    (kind, body), = tree.items()
    if kind == "leaf":
        expect(is_int(body) and 0 <= body < outputs, "a structure leaf names no output")
    elif kind == "none":
        expect(body is True, "a malformed output structure")
    elif kind in ("tuple", "list"):
        expect(isinstance(body, list), "a malformed output structure")
        for item in body:
            _check_structure(item, outputs)
    else:
        expect(kind == "dict" and isinstance(body, list), "a malformed output structure")
        for item in body:
            expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str),
                   "a malformed output structure")
            _check_structure(item[1], outputs)


def _epilogue(outputs: list[dict], structure: dict) -> Epilogue:
    """The autograd stage's epilogue again, from the payload's outputs and structure."""
    rules = [_output_rule(output) for output in outputs]
    return Epilogue.from_structure(rules, _structure_from_json(structure))


def _output_rule(output: dict) -> OutputRule:
    kind, view = output["kind"], None
    if kind == "input_view":
        shape, stride, offset = output["view"]
        view = (tuple(shape), tuple(stride), offset)
    return OutputRule(kind, output.get("index"), view,
                      output.get("value") if kind == "constant" else None)


def _structure_from_json(tree: dict) -> Any:
    if "leaf" in tree:
        return tree["leaf"]
    if "none" in tree:
        return None
    if "tuple" in tree:
        return tuple(_structure_from_json(t) for t in tree["tuple"])
    if "list" in tree:
        return [_structure_from_json(t) for t in tree["list"]]
    return {k: _structure_from_json(v) for k, v in tree["dict"]}


class WarmGraph:
    """A compiled graph rebuilt from the disk cache: inference calls run the stored wrapper;
    a training call compiles the full pipeline once (`cold(args)`) and uses it from then on."""

    def __init__(self, artifact: CompiledArtifact, epilogue: Epilogue,
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
