"""kiln.passes, the pass-list runner, on a toy stage: passes run in order, each is timed and
recorded, a keyword flag or `config.disabled_passes` switches one off (its stand-in runs
instead), the debug dir gets one file per pass, and bad names are errors that list the passes."""
from __future__ import annotations

import json
import os

import pytest

import kiln.schedule  # noqa: F401  (declares the schedule passes the error messages list)
from kiln import passes
from kiln.config import config
from kiln.errors import KilnConfigError


@pytest.fixture
def toy(monkeypatch):
    """A stage `toy` whose state is a list of pass names in the order they ran."""
    monkeypatch.setattr(passes, "_DECLARED", dict(passes._DECLARED))

    def step(name):
        return lambda state: state + [name]

    return passes.PassList("toy", [
        passes.Pass("toy_a", step("toy_a"), "first"),
        passes.Pass("toy_b", step("toy_b"), "second", flag="bee", off=step("toy_b_off")),
        passes.Pass("toy_c", step("toy_c"), "third"),
        passes.Pass("toy_d", step("toy_d"), "needed", required=True),
    ], lambda state: "\n".join(f"# {name}" for name in state) + "\n")


def test_passes_run_in_order_each_timed_and_recorded(toy, recorder):
    assert toy.names == ("toy_a", "toy_b", "toy_c", "toy_d")
    assert passes.known_passes()["toy"] == toy.names
    assert toy.run([]) == ["toy_a", "toy_b", "toy_c", "toy_d"]
    assert [(r.name, r.status) for r in recorder.passes] == [
        ("toy_a", "ran"), ("toy_b", "ran"), ("toy_c", "ran"), ("toy_d", "ran")]
    assert all(r.stage == "toy" and r.seconds >= 0.0 for r in recorder.passes)


def test_a_name_switches_a_pass_off(toy, recorder):
    config.disabled_passes = "toy_c, toy_a"
    assert toy.run([]) == ["toy_b", "toy_d"]
    assert [r.status for r in recorder.passes] == ["off", "ran", "off", "ran"]


def test_a_switched_off_pass_runs_its_stand_in(toy, recorder):
    assert toy.run([], flags={"bee": False}) == ["toy_a", "toy_b_off", "toy_c", "toy_d"]
    config.disabled_passes = ["toy_b"]  # a list works as well as a comma string
    assert toy.run([], flags={"bee": True}) == ["toy_a", "toy_b_off", "toy_c", "toy_d"]
    assert recorder.passes[1].status == recorder.passes[5].status == "off, stand-in ran"


def test_unknown_name_lists_the_passes(toy):
    config.disabled_passes = "toy_a,toy_typo"
    with pytest.raises(KilnConfigError, match="no pass is named 'toy_typo'") as err:
        toy.run([])
    assert "toy: toy_a, toy_b, toy_c, toy_d (required)" in str(err.value)
    assert "schedule: gemm_merge" in str(err.value)  # every stage's passes, not only this one's


def test_a_required_pass_cannot_be_switched_off(toy):
    config.disabled_passes = "toy_d"
    with pytest.raises(KilnConfigError, match="'toy_d' cannot be switched off: the toy stage "
                                              r"needs it for correct results \(needed\)") as err:
        toy.run([])
    assert str(err.value).endswith("toy: toy_a, toy_b, toy_c")


def test_names_are_unique_across_stages(toy):
    with pytest.raises(ValueError, match=r"\['toy_a'\] are already toy's"):
        passes.PassList("other", [passes.Pass("toy_a", list)], str)
    with pytest.raises(ValueError, match="repeat"):
        passes.PassList("other", [passes.Pass("x", list), passes.Pass("x", list)], str)


def test_bind_replaces_a_function_and_keeps_the_names(toy):
    bound = toy.bind(toy_c=lambda state: state + ["bound"])
    assert bound.names == toy.names
    assert bound.run([]) == ["toy_a", "toy_b", "bound", "toy_d"]
    with pytest.raises(ValueError, match="no passes"):
        toy.bind(toy_z=list)


def test_debug_dir_gets_one_file_per_pass(toy, tmp_path):
    config.debug_dir = str(tmp_path)
    config.disabled_passes = "toy_a"
    toy.run([], flags={"bee": False})
    folder, = os.listdir(tmp_path)
    assert folder.endswith("_toy_passes")
    files = sorted(os.listdir(tmp_path / folder))
    # toy_a was off with no stand-in: no 01 file; toy_b's stand-in ran: 02 shows its result
    assert files == ["00_input.py", "02_toy_b.py", "03_toy_c.py", "04_toy_d.py", "passes.json"]
    assert (tmp_path / folder / "03_toy_c.py").read_text() == "# toy_b_off\n# toy_c\n"
    rows = json.loads((tmp_path / folder / "passes.json").read_text())
    assert [(r["pass"], r["status"]) for r in rows] == [
        ("toy_a", "off"), ("toy_b", "off, stand-in ran"), ("toy_c", "ran"), ("toy_d", "ran")]


def test_no_dump_without_a_debug_dir(toy, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    toy.run([])
    assert os.listdir(tmp_path) == []


def test_describe_lists_every_pass_with_its_doc(toy):
    lines = passes.describe_passes().splitlines()
    assert any(line.split()[:2] == ["toy", "toy_b"] and line.endswith("second") for line in lines)
    assert any("toy_d" in line and line.endswith("(required)") for line in lines)
