"""The DDP graph split on one process, no process group (kiln/capture/ddp_buckets.py,
ddp_split.py): where the pieces are cut by parameter bytes, and, with a stand-in for the running
DDP module, that explain shows the split and each piece is a backward node of its own.
The 2-process runs are in test_ddp_fsdp_gloo.py (`test_ddp_split_at_buckets_matches_eager`).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.capture import _compat
from kiln.capture.ddp_buckets import plan_pieces
from kiln.config import config

pytestmark = pytest.mark.explicit_device

# parameter bytes (float32) of the MLP's layers: 0: 16x32 + 32, 2: 32x32 + 32, 4: 32x16 + 16
L0, L2, L4 = 2176, 4224, 2112


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 16))


class TiedChunks(nn.Module):
    """`w` is used first and last (its gradient is ready only when the first use's backward
    ran); `chunk` gives a tuple whose getitems must stay in the piece that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))
        self.mid = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = (x @ self.w).chunk(2, dim=-1)
        return (self.mid(a * b.sigmoid()) @ self.w).tanh()


def _captured(model: nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, dict]:
    """The graph kiln captures for `model(x)`, and its placeholders that are parameters."""
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    kiln.compile(model, backend=backend)(x)
    (gm, examples), = seen
    params = {id(p) for p in model.parameters()}
    found = {n: t.numel() * t.element_size()
             for n, t in zip(gm.graph.find_nodes(op="placeholder"), examples) if id(t) in params}
    return gm, found


def _layout(pieces) -> list[tuple[list[str], int]]:
    """Per piece: its ops by name and its parameter bytes."""
    return [([getattr(n.target, "__name__", str(n.target)) for n in p.nodes], p.nbytes)
            for p in pieces]


def test_pieces_close_when_their_parameter_bytes_reach_the_cap():
    gm, params = _captured(mlp(), torch.randn(4, 16))
    assert len(params) == 6 and sum(params.values()) == L0 + L2 + L4
    assert _layout(plan_pieces(gm.graph, params, 2000, 2000)) == [
        (["linear", "gelu"], L0), (["linear", "tanh"], L2), (["linear"], L4)]
    # a cap above one layer: the last two layers fill one bucket, the first is what is left
    assert _layout(plan_pieces(gm.graph, params, 5000, 5000)) == [
        (["linear", "gelu"], L0), (["linear", "tanh", "linear"], L2 + L4)]
    assert len(plan_pieces(gm.graph, params, 10**6, 10**6)) == 1  # all in one bucket


def test_first_bucket_has_its_own_cap():
    """DDP's first bucket (the gradients ready first: the last layers) is the small one."""
    gm, params = _captured(mlp(), torch.randn(4, 16))
    assert _layout(plan_pieces(gm.graph, params, 2000, 7000)) == [
        (["linear", "gelu", "linear", "tanh"], L0 + L2), (["linear"], L4)]


def test_parameter_counts_at_its_first_use_and_tuples_are_not_cut():
    gm, params = _captured(TiedChunks(), torch.randn(4, 16))
    pieces = plan_pieces(gm.graph, params, 1, 1)  # every parameter closes a piece
    w_bytes, mid_bytes = 16 * 16 * 4, 8 * 16 * 4 + 16 * 4
    assert [p.nbytes for p in pieces] == [w_bytes, mid_bytes]
    first_ops = [getattr(n.target, "__name__", str(n.target)) for n in pieces[0].nodes]
    assert first_ops[:2] == ["matmul", "chunk"] and first_ops.count("getitem") == 2


class _RunningDDP:
    """What the split reads of the running DDP module: its parameters and bucket cap."""

    def __init__(self, module: nn.Module, cap: int) -> None:
        self.module, self.bucket_bytes_cap = module, cap

    def parameters(self):
        return self.module.parameters()


@pytest.fixture
def under_ddp(monkeypatch):
    def enter(module: nn.Module, cap: int) -> None:
        monkeypatch.setattr(_compat, "active_ddp_module", lambda: _RunningDDP(module, cap))
    return enter


def _backward_nodes(out: torch.Tensor) -> int:
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(n for n, _ in node.next_functions)
    return sum("AccumulateGrad" not in type(n).__name__ for n in seen)


def test_explain_shows_the_split(under_ddp):
    model = mlp()
    under_ddp(model, 2000)
    out = kiln.explain(model, backend="aot_eager")(torch.randn(4, 16))
    (split,) = out.ddp_splits
    assert [p.nbytes for p in split.pieces] == [L0, L2, L4]
    assert split.pieces[2].params == ("self.4.weight", "self.4.bias")
    text = out.render()
    assert "DDP buckets" in text and "graph 1: 3 pieces (bucket cap 2000 B" in text
    assert "params: self.0.weight, self.0.bias" in text


def test_pieces_are_backward_nodes_of_their_own_with_eager_gradients(under_ddp):
    model, ref = mlp(), mlp()
    ref.load_state_dict(model.state_dict())
    under_ddp(model, 2000)
    x = torch.randn(4, 16)
    out = kiln.compile(model, backend="aot_eager")(x)
    assert _backward_nodes(out) == 3  # one compiled autograd function per piece
    out.square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_no_split_when_switched_off(under_ddp):
    model = mlp()
    under_ddp(model, 2000)
    with config.patch(optimize_ddp=False):
        out = kiln.explain(model, backend="aot_eager")(torch.randn(4, 16))
    assert out.ddp_splits == [None] and "DDP buckets" not in out.render()


def test_new_bucket_caps_capture_again(under_ddp):
    """A graph split for one DDP's buckets is guarded on them (an ambient guard)."""
    model = mlp()
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(4, 16)
    under_ddp(model, 2000)
    out = compiled(x)
    under_ddp(model, 5000)
    torch.testing.assert_close(compiled(x), out)
    assert _backward_nodes(compiled(x)) == 2


def test_debug_dir_and_log_show_the_pieces(under_ddp, tmp_path, capsys):
    from kiln import logs
    model = mlp()
    under_ddp(model, 2000)
    logs.set_logs("ddp_graphs")
    try:
        with config.patch(debug_dir=str(tmp_path)):
            kiln.compile(model, backend="eager")(torch.randn(4, 16))
    finally:
        logs.set_logs()
    assert "graph split at DDP bucket boundaries: 3 pieces" in capsys.readouterr().err
    (folder,) = tmp_path.iterdir()
    written = sorted(p.name for p in (folder / "ddp_split").iterdir())
    assert written == ["buckets.txt", "outer.py", "piece_0.py", "piece_1.py", "piece_2.py"]
    assert "self.2.weight, self.2.bias" in (folder / "ddp_split" / "buckets.txt").read_text()
