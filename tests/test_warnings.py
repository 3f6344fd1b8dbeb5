"""Warnings reach users by default, as torch.compile's do (issue 12 item 3): a failing backend
(with its reason and the fallback taken), the recompile limit, a refused cache folder, capture
that fell back to eager, inputs the backend cannot compile. Each once per site; ordinary graph
breaks are not warnings; `KILN_LOGS=-kiln` silences them; an application that configured
logging gets them through its own handlers (once, not twice).

The stderr checks run in a fresh interpreter: pytest installs logging handlers of its own,
which is exactly the "application configured logging" case."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kiln
from child_env import ROOT, child_env
from kiln.config import config

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import kiln
    import kiln.capture.convert as convert

    def boom(gm, example_inputs):
        raise RuntimeError("planted failure")

    f = kiln.compile(lambda x: torch.sin(x) + 1, backend=boom)
    for _ in range(3):
        x = torch.randn(3)
        assert torch.allclose(f(x), torch.sin(x) + 1)

    g = kiln.compile(lambda x: x * 2, backend="eager")          # KILN_RECOMPILE_LIMIT=1
    for n in (1, 2, 3):
        g(torch.randn(n))

    def with_a_break(x):
        y = x + 1
        print("breaks here", file=sys.stdout)
        return y * 2
    kiln.compile(with_a_break, backend="eager")(torch.randn(2))   # a graph break: no warning

    original = convert._capture
    def flaky(fn, *args, **kwargs):
        if fn.__name__ == "victim":
            raise RuntimeError("planted capture bug")
        return original(fn, *args, **kwargs)
    convert._capture = flaky
    def victim(x):
        return x - 1
    assert torch.equal(kiln.compile(victim, backend="eager")(torch.ones(2)), torch.zeros(2))

    m = kiln.compile(lambda x: x * 3, backend="kiln")
    assert m(torch.empty(2, device="meta")).device.type == "meta"

    h = kiln.compile(lambda x: torch.cos(x) * 2, backend="kiln")  # touches the disk cache
    x = torch.randn(8)
    assert torch.allclose(h(x), torch.cos(x) * 2, atol=1e-6)
    print("done")
""")

EXPECTED = [
    "WARNING [kiln.capture] kiln: backend 'boom' failed on a graph of <lambda> (<string>:10): "
    "RuntimeError: planted failure. Falling back: that function runs eagerly (the functions it "
    "calls are still compiled). Set KILN_SUPPRESS_ERRORS=0 to raise instead.",
    "hit the recompile limit (1, KILN_RECOMPILE_LIMIT); new inputs run eagerly",
    "kiln: capture of victim failed; running it eagerly",
    "RuntimeError: planted capture bug",
    "kiln backend: a graph input is on device meta, which kiln's code generator does not "
    "handle; graphs with such inputs run as torch ops (eager)",
    "group and others may write it (mode 0777). This process caches in the private folder",
]


@pytest.fixture(scope="module")
def loose_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("shared") / "kiln"
    path.mkdir()
    path.chmod(0o777)
    return path


def _run(loose_cache: Path, script: str = SCRIPT, **env: str) -> subprocess.CompletedProcess:
    environ = child_env({k: v for k, v in os.environ.items() if not k.startswith("KILN_")},
                        TRITON_INTERPRET="1", KILN_RECOMPILE_LIMIT="1",
                        KILN_CPU_CODEGEN="triton_interpret", KILN_CACHE_DIR=str(loose_cache),
                        **env)
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), done.stderr[-3000:]
    return done


def test_warnings_reach_stderr_by_default_once_each(loose_cache):
    err = _run(loose_cache).stderr
    for text in EXPECTED:
        assert err.count(text) == 1, f"{text!r} not shown once in:\n{err}"
    assert f"not using the cache folder {loose_cache}:" in err
    assert "with_a_break" not in err and "breaks here" not in err  # ordinary breaks are quiet


def test_kiln_logs_minus_kiln_silences_them(loose_cache):
    err = _run(loose_cache, KILN_LOGS="-kiln").stderr
    assert not any(text in err for text in EXPECTED), err
    assert "kiln" not in err, err


def test_an_application_with_logging_configured_sees_each_once(loose_cache):
    script = ("import logging\nlogging.basicConfig(format='APP %(name)s: %(message)s')\n"
              + SCRIPT)
    err = _run(loose_cache, script).stderr
    assert err.count("APP kiln.capture: kiln: backend 'boom' failed") == 1, err
    assert "WARNING [kiln" not in err  # kiln's own stderr handler stepped aside


def test_unknown_environment_settings_fail_at_import():
    environ = child_env(KILN_CPU_CODEGEN="bogus")
    done = subprocess.run([sys.executable, "-c", "import kiln"], env=environ,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0
    assert "KILN_CPU_CODEGEN='bogus' is not one of ('eager', 'triton_interpret')" in done.stderr


def test_an_unwritable_debug_dir_is_a_warning_not_a_silent_break(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config.debug_dir = str(blocker / "dump")
    f = kiln.compile(lambda x: torch.tanh(x) * 2, backend="eager")
    x = torch.randn(4)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        torch.testing.assert_close(f(x), torch.tanh(x) * 2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "running it eagerly" in warnings[0].getMessage()
    assert str(blocker / "dump") in caplog.text


def test_a_failing_backend_warns_once_per_site(caplog):
    def boom(gm, example_inputs):
        raise ValueError("nope")

    def first(x):
        return x + 1

    def second(x):
        return x + 2

    with caplog.at_level(logging.WARNING, logger="kiln"):
        for fn in (first, first, second):
            compiled = kiln.compile(fn, backend=boom)
            x = torch.randn(3)
            torch.testing.assert_close(compiled(x), fn(x))
    failed = [r.getMessage() for r in caplog.records if "failed on a graph" in r.getMessage()]
    assert len(failed) == 2 and "<locals>.first (" in failed[0] and "<locals>.second (" in failed[1]
    assert all("ValueError: nope" in m for m in failed)


def test_fullgraph_or_unsuppressed_errors_still_raise():
    def boom(gm, example_inputs):
        raise ValueError("nope")

    config.suppress_errors = False
    with pytest.raises(kiln.errors.BackendCompilerFailed, match="backend 'boom' failed"):
        kiln.compile(lambda x: x + 1, backend=boom)(torch.randn(2))
