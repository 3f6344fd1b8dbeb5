"""The graph-break corpus (benchmarks/break_corpus.py) against TorchDynamo.

For every small function (or module) of the corpus, in this process:
- kiln.compile(fn, backend="eager") gives eager's outputs, argument mutations and printed/logged
  text on fresh inputs;
- kiln.explain(fn)(*args).graph_count is never more than torch._dynamo.explain(fn)(*args)
  .graph_count (each measured after a reset of its compiler).

`python benchmarks/break_corpus.py` prints the same measurements as a markdown table.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_corpus():
    name = "kiln_break_corpus"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks",
                                                                     "break_corpus.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


corpus = _load_corpus()


def test_corpus_is_large_enough():
    assert len(corpus.CASES) >= 25
    assert len({c.name for c in corpus.CASES}) == len(corpus.CASES)


@pytest.mark.parametrize("case", corpus.CASES, ids=[c.name for c in corpus.CASES])
def test_corpus_case_matches_eager(case):
    ok, error = corpus.check_kiln(case, calls=2)
    assert ok, f"{case.name}: {error}"


# Cases where kiln is known to need more graphs than TorchDynamo, each marked xfail(strict) so the
# gap stays visible and closing it shows up. None left: numpy_sum closed when kiln started tracing
# NumPy code on tensors as torch ops (kiln/capture/numpy_ops.py), as TorchDynamo does.
_KNOWN_ABOVE_DYNAMO: dict[str, str] = {}


def _marked(case):
    why = _KNOWN_ABOVE_DYNAMO.get(case.name)
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_marked(c) for c in corpus.CASES])
def test_corpus_case_kiln_graphs_not_above_dynamo(case):
    kiln_graphs, kiln_breaks = corpus.measure_kiln(case)
    dynamo_graphs, dynamo_breaks = corpus.measure_dynamo(case)
    assert kiln_graphs <= dynamo_graphs, (
        f"{case.name} ({case.what}): kiln {kiln_graphs} graphs / {kiln_breaks} breaks, "
        f"TorchDynamo {dynamo_graphs} graphs / {dynamo_breaks} breaks")
