"""The kiln backend end to end: capture → autograd → lower → schedule → codegen → wrapper.

Models run at tiny sizes with the generated Triton forced onto CPU tensors
(`cpu_codegen="triton_interpret"`, kernels in Triton's interpreter) and are compared with eager
in float32: inference outputs, training outputs and every parameter gradient. The disk cache
lives in a per-test folder, so every test compiles cold unless it asks for the warm path.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
import torch

pytest.importorskip("triton")

import kiln  # noqa: E402
import models  # noqa: E402
from child_env import ROOT, child_env  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.logs import set_logs  # noqa: E402
from kiln.runtime import CompiledArtifact  # noqa: E402
from kiln.tools.seed_model import TransformerBlock  # noqa: E402


pytestmark = pytest.mark.usefixtures("generated_kernels")


@pytest.fixture
def artifacts(monkeypatch):
    """Every CompiledArtifact the backend builds during the test, in order."""
    import kiln.runtime.pipeline as pipeline

    built: list[CompiledArtifact] = []
    original = pipeline.compile_graph

    def recording(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(pipeline, "compile_graph", recording)
    monkeypatch.setattr("kiln.runtime.compile_graph", recording)
    return built


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_training(model, compiled, *args, loss_of=lambda out: out.pow(2).mean()):
    out = compiled(*args)
    loss = loss_of(out)
    loss.backward()
    got = _grads(model)
    model.zero_grad()
    ref_out = model(*args)
    ref = loss_of(ref_out)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    want = _grads(model)
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=f"grad of {name}")


def test_seed_block_inference(artifacts):
    block = TransformerBlock(32, 2).eval()
    compiled = kiln.compile(block, backend="kiln")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 8, 32)
            torch.testing.assert_close(compiled(x), block(x))
    assert [a.name for a in artifacts] == ["inference"]
    assert artifacts[0].specs and artifacts[0].kernel_launches > len(artifacts[0].specs)


def test_seed_block_training(artifacts):
    block = TransformerBlock(32, 2)
    compiled = kiln.compile(block, backend="kiln")
    _check_training(block, compiled, torch.randn(2, 8, 32))
    assert [a.name for a in artifacts] == ["forward", "backward"]
    # the explicit attention became SDPA forward + backward on the joint graph, so no softmax
    # of the scores is computed or saved for backward
    forward, backward = artifacts
    assert [e.kind for e in forward.graph.externs].count("attention") == 1
    assert [e.kind for e in backward.graph.externs].count("attention_backward") == 1
    ops = {o.op for a in artifacts for n in a.graph.computed for o in n.origins}
    assert not any("softmax" in op for op in ops), ops


def test_nanogpt_inference_and_training(artifacts):
    gpt = models.GPT()
    compiled = kiln.compile(gpt, backend="kiln")
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        logits, _ = compiled(idx)
        torch.testing.assert_close(logits, gpt(idx)[0])
    _check_training(gpt, compiled, idx, targets, loss_of=lambda out: out[1])
    assert {a.name for a in artifacts} == {"inference", "forward", "backward"}


def _kiln_entry_point() -> bool:
    return any(ep.name == "kiln" for ep in metadata.entry_points(group="torch_dynamo_backends"))


@pytest.mark.skipif(not _kiln_entry_point(), reason="kiln is not pip-installed here: "
                    "torch.compile finds backend='kiln' through the torch_dynamo_backends entry "
                    "point of the installed distribution's metadata (pyproject.toml)")
def test_torch_compile_backend_kiln(artifacts):
    block = TransformerBlock(32, 2)
    compiled = torch.compile(block, backend="kiln")
    _check_training(block, compiled, torch.randn(2, 8, 32))
    assert [a.name for a in artifacts][:1] == ["forward"]


def test_max_autotune_passes_through(monkeypatch, artifacts):
    modes = []
    import kiln.runtime.pipeline as pipeline

    original = pipeline.autotune_groups
    monkeypatch.setattr(pipeline, "autotune_groups",
                        lambda *a: modes.append("tuned") or original(*a))
    from kiln.backends.kiln_backend import kiln_backend

    def fn(x, w):
        return torch.softmax(x @ w, -1)

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = torch.fx.symbolic_trace(fn)
    with torch.no_grad():
        compiled = kiln_backend(gm, [x, w], mode="max-autotune")
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert modes == ["tuned"]


def test_debug_dir_files(tmp_path):
    config.debug_dir = str(tmp_path / "dump")
    block = TransformerBlock(32, 2).eval()
    with torch.no_grad():
        kiln.compile(block, backend="kiln")(torch.randn(2, 8, 32))
    folders = [f for f in os.listdir(config.debug_dir) if f.endswith("_inference")]
    assert len(folders) == 1
    folder = os.path.join(config.debug_dir, folders[0])
    for name in ("aten_graph.py", "ir.py", "schedule.txt", "wrapper.py", "kernels.json",
                 "fusion.json", "timings.json"):
        assert os.path.getsize(os.path.join(folder, name)) > 0, name
    compile(open(os.path.join(folder, "wrapper.py")).read(), "wrapper.py", "exec")
    kernels = json.load(open(os.path.join(folder, "kernels.json")))
    keys = {"name", "kind", "numel", "rnumel", "bytes", "flops", "nodes", "ops",
            "user_locations", "source"}
    assert kernels and all(set(k) == keys for k in kernels)
    generated = [k for k in kernels if k["source"]]
    assert generated and all(os.path.exists(os.path.join(folder, k["source"])) for k in generated)
    addmm = [k for k in kernels if k["kind"] == "extern:addmm"]
    assert addmm and all(k["flops"] > 0 and k["bytes"] > 0 for k in addmm)
    assert any("seed_model.py" in loc for k in kernels for loc in k["user_locations"])
    fusion = json.load(open(os.path.join(folder, "fusion.json")))
    assert set(fusion) == {"groups", "not_fused"}
    assert {g["kernel"] for g in fusion["groups"]} == {k["name"] for k in generated}
    timings = json.load(open(os.path.join(folder, "timings.json")))
    assert {"trace", "lower", "schedule", "codegen", "compile_kernels", "autotune",
            "total"} <= set(timings)
    assert timings["trace"] > 0


def test_output_code_and_fusion_logs(capsys):
    set_logs("output_code,fusion")
    gelu = torch.nn.GELU()
    with torch.no_grad():
        kiln.compile(lambda x: gelu(x).sum(-1), backend="kiln")(torch.randn(4, 8))
    err = capsys.readouterr().err
    assert "[kiln:output_code] kernel " in err and "@triton.jit" in err
    assert "[kiln:output_code] wrapper (inference)" in err and "def call(args):" in err
    assert "[kiln:fusion] schedule (inference)" in err


@pytest.mark.explicit_device  # the CPU switch itself
def test_cpu_default_runs_torch_ops(caplog):
    config.cpu_codegen = "eager"
    from kiln.backends.kiln_backend import kiln_backend

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="kiln"):
        assert kiln_backend(gm, [x]) is gm
        assert kiln_backend(gm, [x]) is gm
    said = [r for r in caplog.records if "CPU tensors" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    block = TransformerBlock(32, 2).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(block, backend="kiln")(x), block(x))


_WARM_GRAPH = textwrap.dedent("""
    import torch
    from kiln.backends.kiln_backend import kiln_backend
    from kiln.config import config
    from kiln.backends import warm_start

    def block(x, w1, b1, w2, b2, g, beta):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
        y = x + torch.nn.functional.linear(h, w2, b2)
        return (torch.nn.functional.layer_norm(y, (32,), g, beta),)

    def compile_and_run(device):
        config.cpu_codegen, config.suppress_errors = "triton_interpret", False
        torch.manual_seed(0)
        with torch.device(device):
            args = [torch.randn(2, 8, 32), torch.randn(64, 32), torch.randn(64),
                    torch.randn(32, 64), torch.randn(32), torch.randn(32), torch.randn(32)]
        with torch.no_grad():
            (out,) = kiln_backend(torch.fx.symbolic_trace(block), args)(*args)
        ref = block(*args)[0]
        return ((out - ref).abs() / (ref.abs() + 1)).max().item()
""")

_WARM_SCRIPT = _WARM_GRAPH + textwrap.dedent("""
    import json, sys
    err = compile_and_run(sys.argv[1])  # assert_close would import DTensor: the parent checks
    print(json.dumps({**warm_start.STATS, "dynamo": "torch._dynamo" in sys.modules, "err": err}))
""")


@pytest.mark.explicit_device  # both processes use the test device explicitly
def test_warm_start_in_a_new_process(tmp_path, monkeypatch, device):
    """This process compiles and stores the graph; a new one must rebuild it from the disk
    cache without tracing (so without importing torch._dynamo)."""
    from kiln.backends import warm_start

    stats = dict(warm_start.STATS)
    namespace: dict = {}
    exec(_WARM_GRAPH, namespace)
    assert namespace["compile_and_run"](device.type) < 1e-5
    assert warm_start.STATS["stores"] == stats["stores"] + 1
    env = child_env(TRITON_INTERPRET="1") if device.type == "cpu" else child_env()
    done = subprocess.run([sys.executable, "-c", _WARM_SCRIPT, device.type], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["hits"] == 1 and child["stores"] == 0 and child["err"] < 1e-5
    assert child["dynamo"] is False, "the warm path must not import torch._dynamo"
