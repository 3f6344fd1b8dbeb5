"""KILN_DISABLE_PASSES through the kiln backend: graphs compiled with optimization passes off
(the schedule's and the joint-graph attention rewrite) still give eager's answers and gradients
on fresh random inputs, the passes visibly did not run, a compile with passes off never shares
a warm-start cache entry with one with them on, every run of a pass list leaves a folder under
KILN_DEBUG_DIR, and a bad name fails before any work."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backends.kiln_backend import kiln_backend
from kiln.config import config
from kiln.errors import KilnConfigError

pytest.importorskip("triton")

OPTIMIZATIONS = ("attention_rewrite,pad_matmuls,channels_last,gemm_merge,attention_layout,elide,split,"
                 "fusion,joint_attention")


pytestmark = pytest.mark.usefixtures("generated_kernels")


def mlp(x, w, b):
    h = F.gelu(x @ w + b)
    return F.layer_norm(h, (16,)), h.sum(0)


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1) @ v


def _mlp_inputs(device):
    return [torch.randn(32, 16, device=device), torch.randn(16, 16, device=device),
            torch.randn(16, device=device)]


def test_inference_with_every_optimization_off_matches_eager(recorder, device):
    config.disabled_passes = OPTIMIZATIONS
    compiled = kiln.compile(mlp, backend="kiln")
    compiled(*_mlp_inputs(device))
    fresh = _mlp_inputs(device)
    for got, want in zip(compiled(*fresh), mlp(*fresh)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    statuses = {r.name: r.status for r in recorder.passes}
    assert statuses == {"attention_rewrite": "off", "pad_matmuls": "off", "channels_last": "off",
                        "joint_attention": "off", "gemm_merge": "off",
                        "attention_layout": "off", "elide": "off", "split": "off",
                        "fusion": "off, stand-in ran", "memory": "ran", "host_scalars": "ran"}


def test_training_without_the_joint_attention_rewrite_matches_eager(recorder, device):
    config.disabled_passes = "joint_attention"
    compiled = kiln.compile(attention, backend="kiln")

    def leaves():
        return [torch.randn(2, 4, 8, 8, device=device, requires_grad=True) for _ in range(3)]

    compiled(*leaves()).sum().backward()
    ours = leaves()
    theirs = [t.detach().clone().requires_grad_() for t in ours]
    out = compiled(*ours)
    want = attention(*theirs)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    grad = torch.randn_like(want)
    out.backward(grad)
    want.backward(grad)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
    joint = [r.status for r in recorder.passes if r.stage == "autograd"]
    assert joint and set(joint) == {"off"}


def test_warm_start_keys_differ_with_passes_off(device):
    from kiln.backends import warm_start as warm

    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    inputs = [torch.randn(4, device=device)]
    on = warm.graph_key(gm, inputs, None)
    with config.patch(disabled_passes="fusion"):
        assert warm.graph_key(gm, inputs, None) != on


def test_debug_dir_has_a_folder_per_pass_list_run(tmp_path, device):
    from kiln.tools.report.artifacts import read_debug_dir

    config.debug_dir = str(tmp_path / "debug")
    kiln.compile(mlp, backend="kiln")(*_mlp_inputs(device))
    folders = sorted(os.listdir(config.debug_dir))
    passes = [f for f in folders if f.endswith("_passes")]
    assert [f.split("_", 1)[1] for f in passes] == ["autograd_passes", "lower_passes",
                                                    "schedule_passes"]
    assert sorted(os.listdir(os.path.join(config.debug_dir, passes[0]))) == [
        "00_input.py", "01_joint_attention.py", "passes.json"]
    assert sorted(os.listdir(os.path.join(config.debug_dir, passes[1]))) == [
        "00_input.py", "01_host_scalars.py", "02_attention_rewrite.py", "03_pad_matmuls.py",
        "04_channels_last.py", "passes.json"]
    assert len(os.listdir(os.path.join(config.debug_dir, passes[2]))) == 8  # input + 6 + json
    graphs, _ = read_debug_dir(config.debug_dir)  # the report reads graph folders only
    assert not any(g.name.endswith("_passes") for g in graphs)
    assert any(g.name.endswith("_inference") for g in graphs)


@pytest.mark.parametrize("setting, message", [
    ("fusion,fuson", "no pass is named 'fuson'"),
    ("memory", "'memory' cannot be switched off"),
])
def test_a_bad_name_fails_before_any_work(setting, message):
    config.disabled_passes = setting
    config.cpu_codegen = "eager"  # even where the backend would only run the graph as torch ops
    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    with pytest.raises(KilnConfigError, match=message) as err:
        kiln_backend(gm, [torch.randn(4)])
    assert "schedule: gemm_merge, attention_layout" in str(err.value)
