"""A graph captured under DDP, split at gradient-bucket boundaries (TorchDynamo's DDPOptimizer).

Compiled whole, a graph is one autograd node: all its parameter gradients become ready when its
backward ends, so DDP's reducer starts every bucket's all-reduce then, none of them overlapping
the backward. Split so each piece's parameters fill about one bucket (`ddp_buckets`) and each
piece compiled by the backend on its own, the pieces are separate autograd nodes: when the last
piece's backward ends, its gradients are ready and DDP reduces their bucket while the earlier
pieces' backward still runs.

The backend sees one call per piece; capture's entry code still calls one callable, an outer
GraphModule that calls the compiled pieces in turn. Applies when `config.optimize_ddp` is on,
a DDP forward is running at capture (both `kiln.compile(DDP(m))` and `DDP(kiln.compile(m))`:
DDP sets its active module around the call of the wrapped module), the graph reads parameters
DDP reduces, and there are two buckets or more. Graphs with symbolic sizes are not split (the
pieces would pass sizes between them, which the autograd stage does not take as inputs).
"""
from __future__ import annotations

import logging
import operator
from typing import Any, Callable

import torch
import torch.fx

from kiln import records
from kiln.capture import _compat
from kiln.capture.ddp_buckets import Piece, plan_pieces
from kiln.config import config
from kiln.logs import artifact_enabled, artifact_logger

__all__ = ["SplitGraph", "bucket_key", "compile_split", "split_graph"]

_log = logging.getLogger("kiln.capture")


class SplitGraph:
    """What `compile_split` made: the callable that runs the pieces, its record, and the
    pieces' graphs as the backend got them (for KILN_DEBUG_DIR)."""

    def __init__(self, fn: torch.fx.GraphModule, record: records.DDPSplitRecord,
                 pieces: dict[str, torch.fx.GraphModule]) -> None:
        self.fn = fn
        self.record = record
        self.pieces = pieces

    def dump_files(self) -> dict[str, str]:
        """The files of the split in a capture's debug folder."""
        files = {"ddp_split/buckets.txt": self.record.render(_op_name) + "\n",
                 "ddp_split/outer.py": self.fn.print_readable(print_output=False)}
        for name, piece in self.pieces.items():
            files[f"ddp_split/{name}.py"] = piece.print_readable(print_output=False)
        return files


def bucket_key() -> tuple[int, int] | None:
    """What a split depends on besides the graph: the running DDP's bucket caps (first, others),
    or None when no graph is split now. Capture guards on it (an ambient guard), so a graph
    compiled under one DDP is not reused under another's buckets, nor outside DDP."""
    ddp = _compat.active_ddp_module() if config.optimize_ddp else None
    return None if ddp is None else _compat.ddp_bucket_caps(ddp)


def compile_split(backend: Callable, gm: torch.fx.GraphModule, example_inputs: list
                  ) -> SplitGraph | None:
    """The graph split for DDP and each piece compiled by `backend`; None when it does not
    apply (see the module docstring), and the caller compiles the graph whole."""
    ddp = _compat.active_ddp_module() if config.optimize_ddp else None
    if ddp is None or _symbolic(gm):
        return None
    param_bytes = _managed_params(gm, example_inputs, ddp)
    if not param_bytes:
        return None
    first_cap, cap = _compat.ddp_bucket_caps(ddp)
    pieces = plan_pieces(gm.graph, param_bytes, first_cap, cap)
    if len(pieces) < 2:
        return None
    outer, piece_gms = split_graph(gm, pieces)
    examples = _outer_examples(gm, example_inputs)
    for name, (piece_gm, inputs) in piece_gms.items():
        compiled = backend(piece_gm, [_example(n, examples) for n in inputs])
        setattr(outer, name, _CompiledPiece(compiled))
    record = records.DDPSplitRecord(first_cap, cap, tuple(_piece_record(p, param_bytes)
                                                          for p in pieces))
    graphs = {name: piece_gm for name, (piece_gm, _) in piece_gms.items()}
    _log_split(record, graphs)
    return SplitGraph(outer, record, graphs)


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or any(map(_compat.is_symbolic, val.shape)):
            return True
    return False


def _managed_params(gm: torch.fx.GraphModule, example_inputs: list, ddp: Any
                    ) -> dict[torch.fx.Node, int]:
    """The placeholders that are parameters DDP reduces, with their bytes as the reducer
    counts them (numel times element size)."""
    managed = {id(p) for p in ddp.parameters()
               if p.requires_grad and not _compat.ddp_ignored(p)}
    found = {}
    for node, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
        if id(example) in managed:
            found[node] = example.numel() * example.element_size()
    return found


def split_graph(gm: torch.fx.GraphModule, pieces: list[Piece]
                ) -> tuple[torch.fx.GraphModule, dict[str, tuple[torch.fx.GraphModule, list]]]:
    """An outer GraphModule calling one submodule per piece (`piece_0`, ...; the caller sets
    them to the compiled pieces), and per piece its GraphModule and the outer nodes it takes."""
    owner = {n: k for k, piece in enumerate(pieces) for n in piece.nodes}
    outer = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:  # graph inputs and attributes stay outside every piece
        if node.op in ("placeholder", "get_attr"):
            env[node] = outer.node_copy(node, env.__getitem__)
    made = {}
    for k, piece in enumerate(pieces):
        piece_gm, inputs, outputs = _piece_graph(gm, piece, owner, k)
        call = outer.call_module(f"piece_{k}", tuple(env[n] for n in inputs))
        for j, node in enumerate(outputs):
            env[node] = outer.call_function(operator.getitem, (call, j))
        made[f"piece_{k}"] = (piece_gm, inputs)
    (out,) = gm.graph.find_nodes(op="output")
    outer.output(torch.fx.map_arg(out.args[0], env.__getitem__))
    attrs = {n.target: _fetch(gm, n.target) for n in gm.graph.find_nodes(op="get_attr")}
    attrs.update((name, torch.nn.Module()) for name in made)  # placeholders until compiled
    return torch.fx.GraphModule(attrs, outer, class_name="DDPSplitGraph"), made


def _piece_graph(gm: torch.fx.GraphModule, piece: Piece, owner: dict, k: int
                 ) -> tuple[torch.fx.GraphModule, list, list]:
    """Piece `k` as a GraphModule whose placeholders are the values it reads from outside (with
    their meta, so the backend sees their fake values), returning a tuple of the values used
    after it."""
    graph = torch.fx.Graph()
    inputs = list(dict.fromkeys(a for n in piece.nodes for a in n.all_input_nodes
                                if owner.get(a) != k))
    local = {}
    for node in inputs:
        local[node] = graph.placeholder(node.name)
        local[node].meta = dict(node.meta)
    for node in piece.nodes:
        local[node] = graph.node_copy(node, local.__getitem__)
    outputs = [n for n in piece.nodes if any(owner.get(u) != k for u in n.users)]
    graph.output(tuple(local[n] for n in outputs))
    return torch.fx.GraphModule(gm, graph, class_name=f"DDPPiece{k}"), inputs, outputs


class _CompiledPiece(torch.nn.Module):
    """A compiled piece as a submodule of the outer GraphModule (call_module needs a module)."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _fetch(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _outer_examples(gm: torch.fx.GraphModule, example_inputs: list) -> dict:
    found: dict[torch.fx.Node, Any] = dict(zip(gm.graph.find_nodes(op="placeholder"),
                                               example_inputs))
    for node in gm.graph.find_nodes(op="get_attr"):
        found[node] = _fetch(gm, node.target)
    return found


def _example(node: torch.fx.Node, examples: dict) -> Any:
    """A piece input's example: the graph's own for its inputs; for a value another piece
    computes, a zero tensor with its fake value's layout (the backends read only layout and
    requires_grad at compile time; running the pieces for real examples would run the
    forward's side effects and random ops twice)."""
    if node in examples:
        return examples[node]
    return _stand_in(node.meta["val"])


def _stand_in(val: torch.Tensor) -> torch.Tensor:
    size, stride, offset = val.shape, val.stride(), val.storage_offset()
    extent = offset + 1 + sum((s - 1) * st for s, st in zip(size, stride)) if val.numel() else 0
    storage = torch.zeros(max(extent, offset), dtype=val.dtype, device=val.device)
    with torch.enable_grad():  # a non-leaf requiring grad, as another piece's output is
        storage.requires_grad_(val.requires_grad)
        return storage.as_strided(size, stride, offset)


def _piece_record(piece: Piece, param_bytes: dict) -> records.DDPPieceRecord:
    return records.DDPPieceRecord(
        tuple(p.meta.get("source", p.name) for p in piece.params),
        sum(param_bytes[p] for p in piece.params),
        tuple(n.target for n in piece.nodes if n.op.startswith("call")))


def _log_split(record: records.DDPSplitRecord, pieces: dict) -> None:
    if not artifact_enabled("ddp_graphs"):
        return
    text = [record.render(_op_name)]
    for name, piece_gm in pieces.items():
        text.append(f"{name}:\n{piece_gm.print_readable(print_output=False)}")
    artifact_logger("ddp_graphs").info("graph split at DDP bucket boundaries: %s",
                                       "\n".join(text))


def _op_name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))
