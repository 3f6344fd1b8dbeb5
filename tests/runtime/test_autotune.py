"""kiln.runtime.autotune: the selection logic with an injected timer (the interpreter cannot time
kernels), the on-disk choice reused by a later call and by another process, the budget, failing
candidates, and the interpreter rule (first candidate, nothing benchmarked or cached)."""
from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

# DEVICE below is the GPU where there is one; oracles run on CPU copies
pytestmark = pytest.mark.explicit_device

from child_env import child_env  # noqa: E402
from kiln.codegen import candidate_configs, emit_group  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.runtime.autotune import autotune, fingerprint  # noqa: E402
from kiln.runtime.disk_cache import DiskCache  # noqa: E402
from kiln.schedule import trivial_schedule  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _fn(x):
    return (x * 2).amax(-1)


def _candidates():
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    graph = lower_graph(trace_aten(_fn, x))
    (group,) = trivial_schedule(graph).steps
    return [emit_group(group, graph, config) for config in candidate_configs(group, graph)]


def _make_args():
    return [torch.randn(8, 32, device=DEVICE), torch.empty(8, device=DEVICE)]


class FakeTimer:
    """Runs each candidate once (its result must be right) and reports a chosen time."""

    def __init__(self, candidates, times_ms, fail=()):
        self.candidates, self.times, self.fail = candidates, times_ms, set(fail)
        self.timed: list[int] = []

    def __call__(self, launcher, args):
        i = next(i for i, c in enumerate(self.candidates) if c is launcher.spec)
        self.timed.append(i)
        if i in self.fail:
            raise RuntimeError("out of resources: shared memory")
        x, out = args
        out.fill_(float("nan"))
        launcher(x, out)
        torch.testing.assert_close(out, _fn(x))
        return self.times[i]


def _refuse(*args):
    raise AssertionError("must not benchmark or make arguments")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    return tmp_path / "kiln"


def test_candidates_differ():
    cands = _candidates()
    assert len(cands) >= 3 and len({fingerprint(c) for c in cands}) == len(cands)


def test_interpreter_returns_first_unbenchmarked_and_caches_nothing(cache_dir, caplog,
                                                                     monkeypatch):
    # the rule reads the environment per call: on a GPU machine too, TRITON_INTERPRET=1 means
    # there is nothing real to time
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cands = _candidates()
    with caplog.at_level(logging.INFO, logger="kiln.runtime"):
        assert autotune(cands, _refuse) is cands[0]
    assert "no GPU to time on" in caplog.text and f"first of {len(cands)}" in caplog.text
    assert not (cache_dir / "autotune").exists()


def test_single_candidate_is_returned_as_is(cache_dir):
    (first, *_) = _candidates()
    assert autotune([first], _refuse, timer=_refuse) is first
    assert not (cache_dir / "autotune").exists()


def test_picks_the_fastest_and_reuses_the_disk_choice(cache_dir, caplog):
    cands = _candidates()
    times = [3.0, 1.0, 2.0] + [5.0] * (len(cands) - 3)
    timer = FakeTimer(cands, times)
    with caplog.at_level(logging.INFO, logger="kiln.runtime"):
        assert autotune(cands, _make_args, timer=timer) is cands[1]
    assert timer.timed == list(range(len(cands)))
    assert f"chose 1 of {len(cands)}" in caplog.text
    # a later compile (new KernelSpec objects, same sources) takes the recorded choice
    again = _candidates()
    assert autotune(again, _refuse, timer=_refuse) is again[1]
    (entry,) = list((cache_dir / "autotune").rglob("*.json"))
    payload = DiskCache("autotune").get(entry.stem)
    assert payload["choice"] == 1 and payload["complete"] is True
    assert payload["timings_ms"] == times and payload["fingerprint"] == fingerprint(cands[1])


SECOND_PROCESS = textwrap.dedent("""
    import sys
    sys.path[:0] = [{tests!r}, {tests_root!r}]  # test_autotune imports child_env
    from test_autotune import _candidates, _refuse
    from kiln.runtime.autotune import autotune
    cands = _candidates()
    print(cands.index(autotune(cands, _refuse, timer=_refuse)))
""")


def test_another_process_reuses_the_choice(cache_dir):
    cands = _candidates()
    times = [4.0] * len(cands)
    times[2] = 1.0
    autotune(cands, _make_args, timer=FakeTimer(cands, times))
    here = Path(__file__).parent
    script = SECOND_PROCESS.format(tests=str(here), tests_root=str(here.parent))
    out = subprocess.run([sys.executable, "-c", script], env=child_env(PYTHONHASHSEED="7"),
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "2"


def test_key_and_candidate_set_are_part_of_the_cache_key(cache_dir):
    cands = _candidates()
    autotune(cands, _make_args, key="a", timer=FakeTimer(cands, [2.0, 1.0] + [3.0] * 9))
    timer = FakeTimer(cands, [1.0, 2.0] + [3.0] * 9)
    assert autotune(cands, _make_args, key="b", timer=timer) is cands[0]
    assert timer.timed  # another key: benchmarked again
    fewer = cands[:1] + cands[2:]
    timer = FakeTimer(fewer, [1.0] * len(fewer))
    assert autotune(fewer, _make_args, key="a", timer=timer) is fewer[0]
    assert timer.timed  # another candidate set: benchmarked again


def test_budget_stops_after_the_first(cache_dir, caplog):
    cands = _candidates()
    timer = FakeTimer(cands, [5.0] + [1.0] * (len(cands) - 1))
    with caplog.at_level(logging.INFO, logger="kiln.runtime"):
        assert autotune(cands, _make_args, budget_s=0.0, timer=timer) is cands[0]
    assert timer.timed == [0] and "budget of 0.0 s spent after 1" in caplog.text
    (entry,) = list((cache_dir / "autotune").rglob("*.json"))
    assert DiskCache("autotune").get(entry.stem)["complete"] is False


def test_failing_candidates_are_skipped_ties_go_to_the_earlier(cache_dir):
    cands = _candidates()
    timer = FakeTimer(cands, [2.0, 0.5, 1.0, 1.0] + [9.0] * 9, fail={1})
    assert autotune(cands, _make_args, timer=timer) is cands[2]
    assert timer.timed == list(range(len(cands)))


def test_all_failing_returns_first_and_caches_no_choice(cache_dir, caplog):
    cands = _candidates()
    timer = FakeTimer(cands, [1.0] * len(cands), fail=range(len(cands)))
    with caplog.at_level(logging.WARNING, logger="kiln.runtime"):
        assert autotune(cands, _make_args, timer=timer) is cands[0]
    assert "no candidate ran" in caplog.text and timer.timed == list(range(len(cands)))
    # no tuning record; on a GPU the candidates did compile, and their binaries (binaries/,
    # triton/) are cached like any compiled kernel's: they are not a choice
    assert not list((cache_dir / "autotune").rglob("*.json"))


def test_corrupt_entry_is_benchmarked_again(cache_dir):
    cands = _candidates()
    autotune(cands, _make_args, timer=FakeTimer(cands, [2.0, 1.0] + [3.0] * 9))
    (entry,) = list((cache_dir / "autotune").rglob("*.json"))
    entry.write_text('{"schema": 1, "key": "trunc')
    timer = FakeTimer(cands, [1.0, 2.0] + [3.0] * 9)
    assert autotune(cands, _make_args, timer=timer) is cands[0]
    assert timer.timed and DiskCache("autotune").get(entry.stem)["choice"] == 0


def test_progress_on_a_terminal(cache_dir, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stderr = Tty()
    monkeypatch.setattr(sys, "stderr", stderr)
    cands = _candidates()
    autotune(cands, _make_args, key="progress",
             timer=FakeTimer(cands, [2.0, 1.0] + [3.0] * 9))
    text = stderr.getvalue()
    n = len(cands)
    assert f"[kiln autotune] progress: {n}/{n}, best 1000.0 us" in text and text.endswith("\n")
