"""benchmarks/sweep_opinfo.py: torch's own operator and module samples through kiln.

The samples below each found a kiln bug on 2026-12-04 (docs/testing.md); they stay here as a
small, fast slice of the sweep that runs in CI, on the CPU (Triton's interpreter), against code
torch's authors wrote. The whole sweep is `python benchmarks/sweep_opinfo.py`.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("expecttest")
pytest.importorskip("triton")
pytestmark = pytest.mark.explicit_device  # the samples are made on the CPU by torch's tables

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sweep():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("sweep_opinfo")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(autouse=True)
def _interpreted(tmp_path, monkeypatch):
    from kiln.config import config
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    config.cpu_codegen = "triton_interpret"


FOUND = {  # operator regex -> what kiln did wrong there before the fix
    "byte|zero_|new_zeros|new_ones": "lambdas in torch's files recorded as nodes printed alike",
    "view_as_complex": "an input viewed as another dtype came back in the input's dtype",
    "gather|index_select": "0-d source: the lowering indexed a dim it has not",
    "histogramdd": "a library call returning Tensor[] bound as one tensor",
    "nn.functional.pixel_shuffle": "zero-element reshape: index modulo 0",
}


@pytest.mark.parametrize("ops", list(FOUND))
def test_the_samples_that_found_bugs_equal_eager(sweep, ops):
    cases = sweep.opinfo_cases(torch.float32, [0, -1], True, f"^({ops})$")
    assert cases, ops
    results = {c.name: sweep.sweep_foreign.run_case(c, "kiln", 120.0, False)[:2] for c in cases}
    bad = {name: r for name, r in results.items() if r[0] not in ("ok", "ok(fp64)")}
    assert not bad, f"{FOUND[ops]}: {bad}"


@pytest.mark.parametrize("ops, backend", [("fft.ifft", "kiln_train"), ("kthvalue|topk", "kiln_train"),
                                          ("logit", "kiln")])
def test_training_and_integer_samples(sweep, ops, backend):
    """fft.ifft: a conjugate-view output came back conjugated, and a complex copy kernel
    failed at launch; kthvalue/topk of a 0-d tensor: the backward's scatter; logit_ of int64:
    computed silently where eager raises."""
    dtype = torch.int64 if ops == "logit" else torch.float32
    cases = sweep.opinfo_cases(dtype, [0, -1], ops == "logit", f"^({ops})$")
    assert cases, ops
    for case in cases:
        result, detail, _ = sweep.sweep_foreign.run_case(case, backend, 120.0, False)
        assert result in ("ok", "ok(fp64)", "fallback"), f"{case.name}: {result} {detail}"


def test_a_sample_becomes_a_function_of_its_tensors(sweep):
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == "cat")
    sample = next(iter(op.sample_inputs("cpu", torch.float32)))
    fn, tensors, source = sweep.make_function(op.op, sample, inplace=False)
    assert source.startswith(f"def sample_fn({', '.join(f'a{i}' for i in range(len(tensors)))})")
    torch.testing.assert_close(fn(*tensors), op.op(sample.input, *sample.args, **sample.kwargs))


def test_lazy_modules_hold_the_same_weights_in_both_copies(sweep):
    (case,) = sweep.module_cases(torch.float32, [0], "^nn.LazyConv1d$")
    result, detail, _ = sweep.sweep_foreign.run_case(case, "kiln", 120.0, False)
    assert result in ("ok", "ok(fp64)"), detail
