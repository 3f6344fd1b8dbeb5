"""Hugging Face transformers models (tiny configs, random weights) through kiln on the test device.

Per architecture of `kiln.tools.suite.hf.ARCHS`:
- inference compiled by kiln equals eager on fresh random inputs;
- kiln's graphs and breaks are no more than TorchDynamo's (`DYNAMO`, recorded with
  `torch._dynamo.explain` on these configs by `benchmarks/hf_capture.py`; set KILN_HF_DYNAMO=1 to
  measure Dynamo live instead);
- for the archs marked `train`, training with the "aot_eager" and "kiln" backends gives eager's
  loss and every parameter gradient (kiln: its autograd stage and partitioner, and on the GPU
  its generated kernels; on the CPU the partitioned graphs run as torch ops).
The table is printed at the end (`pytest -s`). Skipped when transformers is not installed.
"""
from __future__ import annotations

import copy
import os
import zlib

import pytest
import torch

import kiln
from kiln import records

transformers = pytest.importorskip("transformers")
from kiln.tools.suite import hf  # noqa: E402

# torch._dynamo.explain on these tiny configs (torch 2.13 CPU, transformers 5.24): every
# architecture is one graph with no break.
DYNAMO: dict[str, tuple[int, int]] = {arch.name: (1, 0) for arch in hf.ARCHS}

ARCHS = [a.name for a in hf.ARCHS]
TRAIN = [a.name for a in hf.ARCHS if a.train]
_TABLE: dict[str, dict] = {}


def _gen(name: str, salt: int = 0) -> torch.Generator:
    """A CPU generator seeded from the arch name: the same inputs in every run (str hash() is
    salted per process) and on every device (make_inputs draws on the CPU, then moves)."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) + salt)


def _capture(model: torch.nn.Module, inputs: dict, backend: str = "eager"):
    """Compile afresh, call once; the output and what kiln recorded (graphs, breaks)."""
    kiln.reset()
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    try:
        out = kiln.compile(model, backend=backend)(**inputs)
    finally:
        records.active_recorders().remove(recorder)
    graphs = sum(1 for g in recorder.graphs if g.graph is not None)
    breaks = {(r.code, r.location.filename if r.location else None,
               r.location.lineno if r.location else None) for r in recorder.breaks}
    return out, graphs, len(breaks), recorder.breaks


def _dynamo_counts(name: str, model: torch.nn.Module, inputs: dict) -> tuple[int, int]:
    if not os.environ.get("KILN_HF_DYNAMO"):
        return DYNAMO[name]
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch._dynamo.explain(model)(**inputs)
    return out.graph_count, out.graph_break_count


def _assert_outputs_equal(got, want) -> None:
    got_t, want_t = hf.tensors_of(got), hf.tensors_of(want)
    assert len(got_t) == len(want_t) > 0
    for a, b in zip(got_t, want_t):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ARCHS)
def test_inference_equal_and_no_more_breaks_than_dynamo(name, device):
    arch = hf.get(name)
    model = hf.build(arch).to(device)
    inputs = hf.make_inputs(arch, gen=_gen(name), device=device)
    with torch.no_grad():
        want = model(**inputs)
        got, graphs, breaks, reasons = _capture(model, inputs)
    _assert_outputs_equal(got, want)
    d_graphs, d_breaks = _dynamo_counts(name, model, inputs)
    _TABLE[name] = dict(kiln=(graphs, breaks), dynamo=(d_graphs, d_breaks))
    why = [r.message for r in reasons]
    assert graphs >= 1, f"{name}: kiln captured nothing: {why}"
    assert breaks <= d_breaks, f"{name}: {breaks} breaks vs Dynamo's {d_breaks}: {why}"
    assert graphs <= d_graphs, f"{name}: {graphs} graphs vs Dynamo's {d_graphs}: {why}"


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "t5"])
def test_a_sequence_sweep_compiles_each_graph_at_most_twice(name, device):
    """Automatic dynamic shapes (issue 15) on real models: the first length is compiled static,
    the second change of length makes it symbolic; later lengths reuse that graph."""
    from kiln.backends.aot_eager import aot_eager
    arch = hf.get(name)
    model = hf.build(arch).to(device)
    compiled_graphs = []

    def counting(gm, example_inputs):
        compiled_graphs.append(gm)
        return aot_eager(gm, example_inputs)

    kiln.reset()
    compiled = kiln.compile(model, backend=counting)
    for i, seq in enumerate((3, 6, 11, 16)):
        inputs = hf.make_inputs(arch, gen=_gen(name, i), seq=seq, device=device)
        with torch.no_grad():
            _assert_outputs_equal(compiled(**inputs), model(**inputs))
    first = _capture(model, hf.make_inputs(arch, gen=_gen(name), device=device))[1]
    assert 1 <= len(compiled_graphs) <= 2 * first, f"{len(compiled_graphs)} compiles"


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("name", TRAIN)
def test_training_grads_equal_eager(name, backend, device):
    arch = hf.get(name)
    model = hf.build(arch, no_dropout=True).train().to(device)
    twin = copy.deepcopy(model)
    inputs = hf.make_inputs(arch, gen=_gen(name, 7), device=device)
    want_loss = hf.loss(model(**inputs))
    want_loss.backward()
    out, graphs, _, reasons = _capture(twin, inputs, backend=backend)
    got_loss = hf.loss(out)
    got_loss.backward()
    assert graphs >= 1, [r.message for r in reasons]
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-5)
    want, got = _grads(model), _grads(twin)
    assert set(got) == set(want) and want
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5, msg=key)
    row = _TABLE.setdefault(name, {})
    row["train"] = "+".join(sorted({*row.get("train", "").split("+"), backend} - {""}))


def test_print_table():
    """Runs last in this file: the table of what ran above."""
    lines = [f"{'arch':16} {'kiln g/b':>9} {'dynamo g/b':>10}  train"]
    for name in ARCHS:
        row = _TABLE.get(name, {})
        kg, db = row.get("kiln", ("-", "-")), row.get("dynamo", ("-", "-"))
        lines.append(f"{name:16} {f'{kg[0]}/{kg[1]}':>9} {f'{db[0]}/{db[1]}':>10}  "
                     f"{row.get('train', '')}")
    print("\n".join(lines))
