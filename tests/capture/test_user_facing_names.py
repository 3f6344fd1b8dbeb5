"""Internal names of generated code never reach the user.

Graph breaks compile resume functions (`__resume_at_<line>_in_<fn>`) whose stack-slot arguments
are `___stack<i>`; a user never wrote either. Over the whole graph-break corpus, every text kiln
shows (explain's report, break reasons, guards, recompile reasons, every log artifact, warnings)
must name them in user terms instead.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import sys
import warnings

import pytest
import torch

import kiln
from kiln.logs import set_logs

INTERNAL = ("___stack", "__resume_at")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_corpus():
    name = "kiln_break_corpus"  # shared with test_graph_break_corpus: one copy per process
    if name not in sys.modules:
        path = os.path.join(ROOT, "benchmarks", "break_corpus.py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


corpus = _load_corpus()


@contextlib.contextmanager
def _all_user_text():
    """Everything kiln logs (all artifacts on) or warns inside the block, as one string."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("kiln")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    set_logs("all")
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        try:
            yield stream
        finally:
            set_logs()
            logger.removeHandler(handler)
            logger.setLevel(old_level)
            stream.write("\n".join(str(w.message) for w in caught))


def _explain_text(case) -> str:
    torch.manual_seed(0)
    out = kiln.explain(case.target())(*case.make_args())
    parts = [str(out), out.render(verbose=True)]
    parts += [r.render() for r in out.break_reasons] + [g.render() for g in out.out_guards]
    parts += [r.render() for r in out.recompile_reasons]
    return "\n".join(parts)


def _calls_text(case, calls: int = 4) -> str:
    """Several calls on fresh inputs, so that value guards on resume frames fail and recompile."""
    compiled = kiln.compile(case.target(), backend="eager")
    for seed in range(calls):
        torch.manual_seed(seed)
        compiled(*case.make_args())
    return ""


@pytest.mark.parametrize("case", corpus.CASES, ids=[c.name for c in corpus.CASES])
def test_no_internal_names_in_user_facing_text(case):
    kiln.reset()
    with _all_user_text() as logged:
        text = _explain_text(case) + _calls_text(case)
    kiln.reset()
    text += logged.getvalue()
    for name in INTERNAL:
        assert name not in text, f"{case.name}: {name!r} shown to the user:\n{text}"


def test_the_corpus_exercises_resume_functions_and_recompiles():
    """The test above cannot pass vacuously: the corpus breaks and recompiles resume frames."""
    kiln.reset()
    seen = ""
    for case in corpus.CASES:
        with _all_user_text() as logged:
            _explain_text(case) + _calls_text(case)
        seen += logged.getvalue()
    kiln.reset()
    assert "Recompiling the code after line" in seen
    assert "Graph break" in seen


def test_user_terms_names_resume_frames_and_stack_values():
    from kiln.diagnostics import GuardFailure, RecompileReason, UserLocation, user_terms
    here = UserLocation("g.py", 46, "__resume_at_46_in_g", "y = float(y.sum())")
    assert user_terms("__resume_at_46_in_g") == "the code after line 46 of g"
    assert user_terms("__resume_at_50_in___resume_at_46_in_g") == "the code after line 50 of g"
    assert user_terms("___stack3 == 22.16", here) == (
        "the value of `float(y.sum())` at line 46 == 22.16")
    assert user_terms("___stack0 is None") == "a value live at the graph break is None"
    assert "in g (after line 46)" in here.render()
    branch = UserLocation("g.py", 5, "g", "if x.sum() > 0:")
    assert user_terms("___stack1", branch) == "the value of `x.sum() > 0` at line 5"
    reason = RecompileReason("__resume_at_5_in_g", None, (GuardFailure("___stack3", "20.69",
                                                                       "19.70"),), 2)
    assert reason.render() == ("Recompiling the code after line 5 of g, entry 2: a value live "
                               "at the graph break: expected 20.69, got 19.70")


def _float_of_sum(x):
    y = x.sin()
    s = float(y.sum())
    return y * s


def _prints(x):
    y = x.sin()
    print("y")
    return y.cos()


def test_break_labels_say_what_kind_of_limit_it_is():
    kiln.reset()
    with contextlib.redirect_stdout(io.StringIO()):
        value = kiln.explain(_float_of_sum)(torch.randn(4)).break_reasons[0].render()
        printed = kiln.explain(_prints)(torch.randn(4)).break_reasons[0].render()
    kiln.reset()
    assert value.startswith("Graph break [fundamental] builtin-arguments: float() of ")
    assert "needs the tensor's value in Python" in value and "not supported yet" not in value
    assert "hint: the graph breaks there and the print runs in place" in printed
    assert "once they land" not in printed
