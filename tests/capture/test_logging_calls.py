"""Logging calls replayed after the graph (kiln.config.reorder_logging, on by default).

Logger methods, module-level logging functions and warnings.warn in a compiled function are
recorded and emitted after the graph with their call-time arguments, so the graph does not break:
the records (level, message) and the results equal eager's on fresh inputs. Calls a replay could
not reproduce break at the call (or, for a later in-place update of a logged tensor, at the
update) with a reason, and still emit what eager emits.
"""
from __future__ import annotations

import copy
import functools
import logging
import sys
import warnings

import pytest
import torch

import kiln
from helpers import CountingBackend, assert_same_structure_and_values
from kiln.config import config

LOG = logging.getLogger("kiln_test_logging_calls")


class _Formatting(logging.Handler):
    """Keeps (level, message) formatted when emitted, as a console or file handler would
    (a LogRecord holds its arguments, which the code may change after the call)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.got = []

    def emit(self, record):
        self.got.append((record.levelname, record.getMessage()))


@pytest.fixture
def records():
    """`records()`: (level, message) of this test logger's records since the last call."""
    handler = _Formatting()
    LOG.addHandler(handler)
    LOG.setLevel(logging.DEBUG)

    def take():
        got, handler.got = handler.got, []
        return got
    yield take
    LOG.removeHandler(handler)
    LOG.setLevel(logging.NOTSET)


def _compare(fn, records, *, calls=3, make=lambda: (torch.randn(4, 3),)):
    """Eager and compiled on fresh inputs: the same results and the same records. Returns
    the backend and the eager records of the last call."""
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(calls):
        args = make()
        expected = fn(*copy.deepcopy(args))
        want = records()
        assert_same_structure_and_values(expected, compiled(*args))
        assert records() == want
    return backend, want


def _explain(fn, *args):
    out = kiln.explain(fn)(*args)
    return out.graph_count, out.graph_break_count, [r.render() for r in out.break_reasons]


def every_level(x):
    y = x.sin()
    LOG.debug("debug %s", y.sum())  # a tensor value: the graph outputs it
    LOG.info(f"info shape {tuple(y.shape)} dtype {y.dtype}")  # constants folded in an f-string
    LOG.warning("warning %d items, mean %.5f", y.numel(), y.mean())
    LOG.error("error %s", [y.shape[0], "a"])
    LOG.critical("critical %(k)s", {"k": 3})
    LOG.log(logging.INFO, "log at %s", "INFO", extra={"tag": 1})
    return y.cos() * 2


def test_logger_levels_replayed_after_one_graph(records):
    backend, want = _compare(every_level, records)
    assert [level for level, _ in want] == ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL",
                                            "INFO"]
    assert want[1][1] == "info shape (4, 3) dtype torch.float32"
    assert backend.count == 1
    assert _explain(every_level, torch.randn(4, 3))[:2] == (1, 0)


def test_tensor_argument_prints_as_eager(records):
    def fn(x):
        y = x * 3
        LOG.info("value %s", y[0])
        return y + 1
    _, want = _compare(fn, records)
    assert want[0][1].startswith("value tensor([")


def module_functions(x):
    y = x.exp()
    logging.warning("root %s", y.shape[1])
    warnings.warn(f"w {y.shape[0]}", RuntimeWarning)
    return y - 1


def test_module_level_logging_and_warnings_warn(caplog):
    caplog.set_level(logging.WARNING)
    compiled = kiln.compile(module_functions)
    for _ in range(3):
        x = torch.randn(2, 5)
        with pytest.warns(RuntimeWarning, match="w 2") as eager_warned:
            expected = module_functions(x.clone())
        with pytest.warns(RuntimeWarning, match="w 2") as warned:
            actual = compiled(x)
        assert [str(w.message) for w in warned] == [str(w.message) for w in eager_warned]
        assert_same_structure_and_values(expected, actual)
    messages = [r.getMessage() for r in caplog.records if r.name == "root"]
    assert messages == ["root 5"] * 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _explain(module_functions, torch.randn(2, 5))[:2] == (1, 0)


def test_logger_adapter(records):
    adapter = logging.LoggerAdapter(LOG, {"user": "u"})

    def fn(x):
        adapter.warning("adapter %s", x.sum())
        return x.relu()
    backend, want = _compare(fn, records)
    assert backend.count == 1 and want[0][0] == "WARNING"


class CountingLogger(logging.Logger):
    def info_scale(self):  # the subclass's own method: user code, traced as before
        return 3


def test_logger_subclass(records):
    sub = CountingLogger(LOG.name + ".sub")
    sub.parent = LOG  # its records reach the test handler

    def fn(x):
        sub.info("sub %s", x.shape)
        return x * sub.info_scale()
    backend, want = _compare(fn, records)
    assert want == [("INFO", "sub torch.Size([4, 3])")] and backend.count == 1


@pytest.fixture
def warning_once(monkeypatch):
    """A transformers-style `Logger.warning_once`: an lru_cache'd function set on the class."""
    @functools.lru_cache(None)
    def once(self, *args, **kwargs):
        self.warning(*args, **kwargs)
    monkeypatch.setattr(logging.Logger, "warning_once", once, raising=False)
    return once


def test_warning_once_warns_once_across_calls(records, warning_once):
    def fn(x):
        LOG.warning_once(f"once for shape {tuple(x.shape)}")
        return x * 2
    compiled = kiln.compile(fn)
    for _ in range(3):
        x = torch.randn(3)
        assert_same_structure_and_values(x * 2, compiled(x))  # eager's fn would fill the cache
    assert records() == [("WARNING", "once for shape (3,)")]
    warning_once.cache_clear()  # eager, from a clean cache: the same single record
    for _ in range(3):
        fn(torch.randn(3))
    assert records() == [("WARNING", "once for shape (3,)")]
    assert _explain(fn, torch.randn(3))[:2] == (1, 0)


def test_order_kept_with_print_after_a_logging_call(capsys):
    handler = logging.StreamHandler(sys.stdout)  # made now: writes to the captured stdout
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    try:
        def fn(x):
            y = x.sin()
            LOG.info("logged %s", y.shape[0])
            print("printed")
            LOG.info("after print")
            return y.cos()
        compiled = kiln.compile(fn)
        for _ in range(3):
            x = torch.randn(5)
            expected = fn(x.clone())
            want = capsys.readouterr().out
            assert_same_structure_and_values(expected, compiled(x))
            assert capsys.readouterr().out == want == "logged 5\nprinted\nafter print\n"
        graphs, breaks, reasons = _explain(fn, torch.randn(5))
        assert (graphs, breaks) == (2, 1) and "print" in reasons[0]
    finally:
        LOG.removeHandler(handler)
        LOG.setLevel(logging.NOTSET)


def test_flag_off_restores_the_break(records, warning_once):
    def fn(x):
        LOG.warning("plain %s", x.shape[0])
        LOG.warning_once("once")
        return x + 1
    with config.patch(reorder_logging=False):
        graphs, breaks, reasons = _explain(fn, torch.randn(2))
    assert breaks == 2, reasons
    assert any("logging.Logger.warning is standard-library code" in r for r in reasons)
    assert any("descriptor 'warning_once'" in r for r in reasons)


def test_changing_int_argument(records):
    def fn(x, step):
        LOG.info("step %d", step)  # becomes a graph input once it changed (automatic dynamic)
        return x * step
    steps = iter(range(1, 100))
    backend, _ = _compare(fn, records, calls=5, make=lambda: (torch.randn(3), next(steps)))
    assert backend.count <= 2


def test_is_enabled_for_is_a_guarded_constant(records):
    def fn(x):
        y = x.tanh()
        if LOG.isEnabledFor(logging.DEBUG):
            LOG.debug("detail %s", y.max())
        return y * LOG.getEffectiveLevel()
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for level, graphs in ((logging.INFO, 1), (logging.INFO, 1), (logging.DEBUG, 2)):
        LOG.setLevel(level)  # a new level fails the guard: a second graph, no break
        x = torch.randn(3)
        expected, want = fn(x.clone()), records()
        assert_same_structure_and_values(expected, compiled(x))
        assert records() == want and backend.count == graphs
    assert want and want[0][0] == "DEBUG"
    assert _explain(fn, torch.randn(3))[:2] == (1, 0)


# --- refusals: a break at the call, with the reason; the records and results are eager's -------

class Box:
    def __init__(self):
        self.n = 1

    def __repr__(self):
        return f"Box({self.n})"


def with_exc_info(x):
    LOG.error("failed", exc_info=True)
    return x + 1


def with_exception(x):
    LOG.exception("failed")
    return x + 1


def with_stacklevel(x):
    LOG.warning("caller", stacklevel=2)
    return x + 1


def with_stack_info(x):
    LOG.info("stack", stack_info=True)
    return x + 1


def with_object(x, box):
    LOG.info("box %s", box)
    box.n += 1
    return x + 1


def warn_stacklevel(x):
    warnings.warn("from the caller", UserWarning, stacklevel=2)
    return x + 1


REFUSED = [(with_exc_info, "exc_info"), (with_exception, "logger.exception"),
           (with_stacklevel, "stacklevel"), (with_stack_info, "stack_info"),
           (with_object, "Box"), (warn_stacklevel, "stacklevel")]


@pytest.mark.parametrize("fn, reason", REFUSED, ids=[f.__name__ for f, _ in REFUSED])
def test_refused_calls_break_with_a_reason(fn, reason, records):
    make = (lambda: (torch.randn(3), Box())) if fn is with_object else (lambda: (torch.randn(3),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _compare(fn, lambda: [(lvl, msg.splitlines()[0]) for lvl, msg in records()], make=make)
        graphs, breaks, reasons = _explain(fn, *make())
    assert breaks == 1, reasons
    assert "logging-call" in reasons[0] and reason in reasons[0], reasons[0]


def test_tensor_updated_in_place_after_the_call(records):
    def fn(x):
        y = x * 2
        LOG.info("before %s", y)
        y.add_(1)  # the replay would see this: the graph ends here, the record comes first
        LOG.info("after %s", y)
        return y
    backend, want = _compare(fn, records)
    assert len(want) == 2
    graphs, breaks, reasons = _explain(fn, torch.randn(4, 3))
    assert breaks == 1 and "in-place update" in reasons[0], reasons


def test_list_mutated_after_the_call_logs_its_call_time_value(records):
    def fn(x):
        items = [x.shape[0]]
        LOG.info("items %s", items)
        items.append(7)
        LOG.info("items %s", items)
        return x * len(items)
    backend, want = _compare(fn, records)
    assert [m for _, m in want] == ["items [4]", "items [4, 7]"]
    assert backend.count == 1


# --- transformers: the loss_function's warning_once no longer splits GPT-2's training graph ----

def test_gpt2_training_with_labels_is_one_graph():
    pytest.importorskip("transformers")
    from kiln import records as kiln_records
    from kiln.tools.suite import hf
    arch = hf.get("gpt2")
    model = hf.build(arch, no_dropout=True).train()
    twin = copy.deepcopy(model)
    inputs = hf.make_inputs(arch, gen=torch.Generator().manual_seed(11))
    inputs["labels"] = inputs["input_ids"].clone()
    want = model(**inputs).loss
    want.backward()
    recorder = kiln_records.Recorder()
    kiln_records.active_recorders().append(recorder)
    try:
        got = kiln.compile(twin, backend="aot_eager")(**inputs).loss
    finally:
        kiln_records.active_recorders().remove(recorder)
    got.backward()
    assert [b.message for b in recorder.breaks] == []
    assert sum(1 for g in recorder.graphs if g.graph is not None) == 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def _logs_and_warns(x):
    y = x.sin()
    LOG.warning("rows: %d", y.shape[0])
    warnings.warn("kiln-test: located warning")
    return y * 2


def test_a_replayed_call_reports_the_users_line_like_eager():
    """The replay runs after the graph, but the record's caller (pathname, lineno, funcName)
    and the warning's file and line are the user's call site, as in eager."""
    seen = []

    class Where(logging.Handler):
        def emit(self, record):
            seen.append((record.pathname, record.lineno, record.funcName))

    handler = Where(logging.DEBUG)
    LOG.addHandler(handler)
    LOG.setLevel(logging.DEBUG)
    backend = CountingBackend()
    compiled = kiln.compile(_logs_and_warns, backend=backend)
    try:
        places = []
        for fn in (_logs_and_warns, compiled, compiled):
            x = torch.randn(5, 3)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert_same_structure_and_values(fn(x), _logs_and_warns(x))
            located = [(w.filename, w.lineno) for w in caught if "located" in str(w.message)]
            places.append((seen[-2], located[0]))
    finally:
        LOG.removeHandler(handler)
        LOG.setLevel(logging.NOTSET)
    assert backend.count == 1  # no graph break at the calls
    first = _logs_and_warns.__code__.co_firstlineno
    assert places[0] == ((__file__, first + 2, "_logs_and_warns"), (__file__, first + 3))
    assert places[1] == places[0] and places[2] == places[0]
