"""The schedule stage's pass list (`kiln.schedule.PASSES`): the passes in order by name; each
optimization pass switched off by name still gives eager's answer on fresh random inputs and
visibly did not run; the memory plan cannot be switched off; the debug dir gets one runnable
file per pass."""
from __future__ import annotations

import os

import pytest
import torch
from schedule_graphs import assert_runs_like_eager, assert_valid_order, lower_fn, real_inputs, \
    seed_block_graphs

from kiln.config import config
from kiln.errors import KilnConfigError
from kiln.lower import lower_graph
from kiln.passes import known_passes
from kiln.schedule import PASSES, schedule

ORDER = ("gemm_merge", "attention_layout", "elide", "split", "fusion", "memory")


@pytest.fixture(scope="module")
def inference():
    (gm, example), = seed_block_graphs(training=False)
    return gm, example, lower_graph(gm, example)


def _statuses(recorder) -> dict[str, str]:
    return {r.name: r.status for r in recorder.passes if r.stage == "schedule"}


def _gemms(sched) -> list:
    return [n for n in sched.graph.externs if n.kind in ("mm", "addmm")]


def test_passes_are_listed_in_order():
    assert PASSES.names == ORDER
    assert known_passes()["schedule"] == ORDER
    assert [p.name for p in PASSES.passes if p.required] == ["memory"]


# what each pass leaves behind on the seed block's inference graph, when it runs / when it is off
EFFECTS = {
    "gemm_merge": lambda s: len(_gemms(s)) == 4,  # q/k/v in one GEMM, out_proj, fc1, fc2
    "elide": lambda s: len(s.elided) > 0,
    "fusion": lambda s: any(len(g.nodes) > 1 for g in s.groups),
}


@pytest.mark.explicit_device  # module-scoped CPU seed-block graphs
@pytest.mark.parametrize("name", [n for n in ORDER if n != "memory"])
def test_a_pass_switched_off_by_name_still_gives_eagers_answer(name, inference, recorder):
    gm, example, graph = inference
    with config.patch(disabled_passes=name):
        sched = schedule(graph)
    statuses = _statuses(recorder)
    assert statuses[name] == ("off, stand-in ran" if name == "fusion" else "off")
    assert all(status == "ran" for other, status in statuses.items() if other != name)
    if name in EFFECTS:
        assert not EFFECTS[name](sched) and EFFECTS[name](schedule(graph))
    assert_valid_order(sched)
    inputs = real_inputs(example)
    eager = gm(*inputs)
    assert_runs_like_eager(sched, inputs, list(eager) if isinstance(eager, tuple) else [eager])


def test_split_off_keeps_a_long_column_sum_whole(recorder):
    graph, _ = lower_fn(lambda t: t.sum(0), torch.randn(2048, 24))
    assert schedule(graph).split  # split when on
    with config.patch(disabled_passes="split"):
        sched = schedule(graph)
    assert sched.split == {} and _statuses(recorder)["split"] == "off"
    fresh = torch.randn(2048, 24)
    assert_runs_like_eager(sched, [fresh], [fresh.sum(0)])


def test_keyword_flags_switch_the_same_passes_off(inference, recorder):
    _, _, graph = inference
    sched = schedule(graph, fuse=False, elide=False, split=False)
    assert _statuses(recorder) == {
        "gemm_merge": "ran", "attention_layout": "off", "elide": "off", "split": "off",
        "fusion": "off, stand-in ran", "memory": "ran"}
    assert all(len(g.nodes) == 1 for g in sched.groups) and not sched.elided


def test_the_memory_plan_cannot_be_switched_off(inference):
    with config.patch(disabled_passes="memory"):
        with pytest.raises(KilnConfigError, match="'memory' cannot be switched off: the "
                                                  "schedule stage needs it"):
            schedule(inference[2])


def test_debug_dir_gets_one_runnable_file_per_pass(inference, tmp_path):
    with config.patch(debug_dir=str(tmp_path), disabled_passes="gemm_merge"):
        schedule(inference[2])
    folder, = os.listdir(tmp_path)
    assert folder.endswith("_schedule_passes")
    files = sorted(os.listdir(tmp_path / folder))
    assert files == ["00_input.py"] + [f"{i:02d}_{n}.py" for i, n in enumerate(ORDER, 1)
                                       if n != "gemm_merge"] + ["passes.json"]
    for name in files[:-1]:
        text = (tmp_path / folder / name).read_text()
        compile(text, name, "exec")  # every dump is Python (the schedule as comments)
        assert ("# schedule" in text) == (name >= "05")
