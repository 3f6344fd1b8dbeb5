from __future__ import annotations

import logging

import pytest

from kiln import logs
from kiln.errors import KilnConfigError


def test_artifacts_silent_by_default(capsys):
    """Artifacts print only when enabled. (kiln's warnings do reach stderr by default, when the
    application configured no logging: tests/test_warnings.py, in a fresh interpreter.)"""
    logs.set_logs()
    logs.artifact_logger("recompiles").info("not shown")
    logs.artifact_logger("graph_breaks").info("nor this")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert not logs.artifact_enabled("recompiles")


def test_default_warning_handler_steps_aside_for_application_handlers(capsys, monkeypatch):
    """With no handler anywhere, a kiln warning goes to stderr; with one on the root logger
    (pytest's here, an application's in real life) only that handler shows it."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    logging.getLogger("kiln.runtime").warning("shown by kiln")
    assert capsys.readouterr().err == "WARNING [kiln.runtime] shown by kiln\n"
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    monkeypatch.setattr(root, "handlers", [handler])
    logging.getLogger("kiln.runtime").warning("shown by the application")
    assert capsys.readouterr().err == "" and [r.getMessage() for r in seen] == [
        "shown by the application"]


def test_minus_kiln_silences_warnings_but_not_artifacts(capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    logs.set_logs("-kiln,recompiles")
    logging.getLogger("kiln.capture").warning("silenced")
    logs.artifact_logger("recompiles").info("still shown")
    assert capsys.readouterr().err == "[kiln:recompiles] still shown\n"
    logs.set_logs()
    logging.getLogger("kiln.capture").warning("back")
    assert capsys.readouterr().err == "WARNING [kiln.capture] back\n"


def test_artifact_logger_name():
    assert logs.artifact_logger("graph_breaks").name == "kiln.graph_breaks"


def test_set_logs_emits_to_stderr(capsys):
    logs.set_logs("recompiles")
    assert logs.artifact_enabled("recompiles")
    assert not logs.artifact_enabled("guards")
    logs.artifact_logger("recompiles").info("Recompiling forward")
    logs.artifact_logger("guards").info("guard text")
    assert capsys.readouterr().err == "[kiln:recompiles] Recompiling forward\n"
    assert logs.artifact_logger("recompiles").propagate


def test_set_logs_off_removes_handler(capsys):
    logs.set_logs("recompiles,guards")
    logs.set_logs()
    logs.artifact_logger("recompiles").info("gone")
    assert capsys.readouterr().err == ""
    assert logs.artifact_logger("recompiles").handlers == []


def test_all_enables_every_artifact():
    for alias in ("all", "+kiln"):
        logs.set_logs(alias)
        assert all(logs.artifact_enabled(name) for name in logs.ARTIFACTS)
        logs.set_logs()


def test_unknown_artifact_lists_valid_names():
    with pytest.raises(KilnConfigError) as info:
        logs.set_logs("graph_brakes")
    text = str(info.value)
    assert "unknown log artifact 'graph_brakes'" in text
    assert "graph_breaks, recompiles, guards" in text
    assert "('-kiln' silences kiln's warnings)" in text
    with pytest.raises(KilnConfigError, match="unknown log artifact 'x'"):
        logs.artifact_logger("x")


def test_warn_once(caplog):
    with caplog.at_level(logging.WARNING, logger="kiln"):
        assert logs.warn_once(("site", 1), "recompile limit hit")
        assert not logs.warn_once(("site", 1), "recompile limit hit")
        logs.warn_once(("site", 2), "another site")
    assert [r.getMessage() for r in caplog.records] == ["recompile limit hit", "another site"]
    logs.reset_warnings()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        logs.warn_once(("site", 1), "recompile limit hit")
    assert [r.getMessage() for r in caplog.records] == ["recompile limit hit"]
