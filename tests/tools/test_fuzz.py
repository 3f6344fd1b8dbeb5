"""kiln's differential fuzzer (kiln.tools.fuzz): the generator, the oracle, the worker pool, the
shrinker, and a fixed-seed smoke campaign (eager and aot_eager; a few programs through the
generated Triton kernels in the interpreter).

The smoke seeds pass on main; known failing classes live in fuzz_findings/ with their shrunk
reproducers and are checked by test_known_findings_still_fail (strict xfail: when a fix lands, the
reproducer passes, this test reports XPASS as a failure, and the file moves to
fuzz_findings/fixed/).
"""
from __future__ import annotations

import argparse
import ast
import glob
import json
import logging
import os
import time

import pytest
import torch

from kiln.config import config
from kiln.tools.fuzz import cli, oracle
from kiln.tools.fuzz.gen import generate_program
from kiln.tools.fuzz.oracle import Verdict, check_source, load_program
from kiln.tools.fuzz.pool import WorkerPool
from kiln.tools.fuzz.shrink import shrink_source

FINDINGS = os.path.join(os.path.dirname(__file__), "..", "..", "fuzz_findings")
# Seeds that pass on main (seed 2 of the interpreter run hits the open mismatch:alias class).
SMOKE_SEED, SMOKE_COUNT, INTERPRET_SEED, INTERPRET_COUNT = 0, 30, 3, 5


def test_generator_is_deterministic_for_a_seed():
    assert generate_program(7).source == generate_program(7).source
    assert generate_program(7).source != generate_program(8).source
    assert generate_program(7, size="tiny").source != generate_program(7).source


def test_generated_programs_are_valid_python_and_mostly_valid_torch():
    raised = 0
    for seed in range(40):
        program = generate_program(seed)
        ast.parse(program.source)
        module = load_program(program.source)
        module.make_globals("cpu")
        try:
            module.fn(*module.make_inputs("cpu"))
        except Exception:
            raised += 1
    assert raised <= 4, f"{raised}/40 generated programs raise in eager"


def test_inputs_are_fresh_with_the_same_layout_on_every_call():
    source = ("import torch\nfrom kiln.tools.fuzz.inputs import make_tensor\n"
              "def make_inputs(device):\n    g = torch.Generator().manual_seed(3)\n"
              "    return [make_tensor((3, 4), 'float32', 'offset', g, device),\n"
              "            make_tensor((3, 4), 'float32', 'transposed', g, device)]\n")
    module = load_program(source)
    a, b = module.make_inputs("cpu"), module.make_inputs("cpu")
    assert a[0].storage_offset() == 3 and a[1].stride() == (1, 3)
    assert torch.equal(a[0], b[0]) and a[0].data_ptr() != b[0].data_ptr()


def _adds_one_to_sin_graphs(gm, example_inputs):
    """A planted bug: any graph that calls torch.sin returns its outputs plus one."""
    if not any(node.target is torch.sin for node in gm.graph.nodes):
        return gm.forward
    return lambda *args: [out + 1 for out in gm(*args)]


def _clones_outputs(gm, example_inputs):
    return lambda *args: [out.clone() for out in gm(*args)]


_RETURNS_INPUT = """import torch
from kiln.tools.fuzz.inputs import make_tensor
def make_inputs(device):
    g = torch.Generator().manual_seed(0)
    return [make_tensor((3, 4), 'float32', 'contiguous', g, device)]
def make_globals(device):
    return None
def fn(x0):
    t1 = torch.sin(x0)
    x0.mul_(2)
    return (t1, x0.t())
"""


def test_oracle_reports_wrong_values_aliasing_and_mutations():
    assert check_source(_RETURNS_INPUT, "eager").ok
    assert check_source(_RETURNS_INPUT, _adds_one_to_sin_graphs).failure == "mismatch:value"
    assert check_source(_RETURNS_INPUT, _clones_outputs).failure in ("mismatch:alias",
                                                                   "mismatch:mutation")
    raising = _RETURNS_INPUT.replace("x0.mul_(2)", "x0[7] = 1")
    assert check_source(raising, "eager").ok  # both raise IndexError: same behaviour


_MUTATES_IN_HALF = """import torch
from kiln.tools.fuzz.inputs import make_tensor
def make_inputs(device):
    g = torch.Generator().manual_seed(4322)
    return [make_tensor((2, 3), 'float16', 'contiguous', g, device),
            make_tensor((2, 3), 'float32', 'contiguous', g, device)]
def make_globals(device):
    return None
def fn(x0, x1):
    x1.copy_(x0 * 1.5)
    return (x0 + 1,)
"""


def test_oracle_forgives_a_mutation_only_when_kiln_is_as_close_as_eager_to_fp64():
    """GPU seed 4322: eager rounds the fp16 product before copying it into a float32 input,
    kiln (fused, float32) does not. The mutated input is judged like an output: against the
    fp64 run's input after its call."""
    module = load_program(_MUTATES_IN_HALF)
    x0, x1 = module.make_inputs("cpu")
    module.fn(x0, x1)
    eager, exact = x1.double(), x0.double() * 1.5
    assert (eager - exact).abs().max() > 1e-4  # fp16 rounding: a float32 mismatch
    near = oracle._near_reference
    assert near(oracle._Case(_MUTATES_IN_HALF, "cpu", 0), ("input", 1), eager, exact, 1e-5)
    worse = eager + 3 * (eager - exact) + 1e-3
    assert not near(oracle._Case(_MUTATES_IN_HALF, "cpu", 0), ("input", 1), eager, worse, 1e-5)
    assert not near(oracle._Case(_MUTATES_IN_HALF, "cpu", 0), ("input", 0), x0.double(), x0.double() + 1e-2,
                    1e-3)  # an input the program does not write: eager is exact


_CASTS_TO_BF16 = """import torch
from kiln.tools.fuzz.inputs import make_tensor
def make_inputs(device):
    g = torch.Generator().manual_seed(56038)
    return [make_tensor((3, 3, 3), 'float32', 'contiguous', g, device)]
def make_globals(device):
    return None
def fn(x1):
    t2 = x1.to(torch.bfloat16)
    acc = torch.zeros_like(t2[0])
    for i in range(3):
        acc = acc + t2[i] * (i + 1)
    return (acc, t2.half().float())
"""


def test_reference_run_ignores_the_programs_own_half_casts():
    """Seed 56038: the reference must be the exact value of the program, not eager's rounding
    of it, or a kiln that keeps float32 inside a fused bf16 chain (closer to the exact value)
    is called wrong. The program's `.to(bfloat16)`, `.half()` and `.float()` run in float64."""
    oracle._reference_run.cache_clear()
    (x1,) = load_program(_CASTS_TO_BF16).make_inputs("cpu")
    outputs, _, _ = oracle._reference_run(oracle._Case(_CASTS_TO_BF16, "cpu", 0))
    x = x1.double()
    exact = x[0] + x[1] * 2 + x[2] * 3
    torch.testing.assert_close(outputs[0], exact, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outputs[1], x, rtol=0, atol=0)
    eager = load_program(_CASTS_TO_BF16).fn(x1)[0].double()
    fused = exact.to(torch.bfloat16).double()  # kiln: one rounding, at the store
    near = oracle._near_reference
    assert near(oracle._Case(_CASTS_TO_BF16, "cpu", 0), ("output", 0), eager, fused, 1e-2)
    assert not near(oracle._Case(_CASTS_TO_BF16, "cpu", 0), ("output", 0), eager, fused + 0.25, 1e-2)


_INTS_FROM_FLOATS = """import torch
from kiln.tools.fuzz.inputs import make_tensor
def make_inputs(device):
    g = torch.Generator().manual_seed(3302347)
    return [make_tensor((4, 4), 'float32', 'contiguous', g, device)]
def make_globals(device):
    return None
def fn(x0):
    return ((x0 * 12).exp() * 3).long(), (x0 * 3).long()
"""


def test_integers_made_from_floats_are_judged_with_float32s_relative_tolerance():
    """Seed 3302347: `(exp(x * s) * 3).long()` of ~1e17 differs from eager's by a float32
    rounding amplified by exp; eager's own ints are off from the fp64 run's, so such ints are
    judged at float32's rtol. A small int (`(x * 3).long()`, exact in the fp64 run too) one
    unit off is not forgiven."""
    oracle._reference_run.cache_clear()
    (x0,) = load_program(_INTS_FROM_FLOATS).make_inputs("cpu")
    big, small = (t.double() for t in load_program(_INTS_FROM_FLOATS).fn(x0))
    case = oracle._Case(_INTS_FROM_FLOATS, "cpu", 0)
    near = oracle._near_reference
    assert big.abs().max() > 1e10
    assert near(case, ("output", 0), big, (big * (1 + 3e-6)).round(), 0.0, integer=True)
    assert not near(case, ("output", 0), big, (big * (1 + 3e-3)).round(), 0.0, integer=True)
    assert not near(case, ("output", 1), small, small + 1, 0.0, integer=True)


_BRANCH_ON_ROUNDING = """import torch
from kiln.tools.fuzz.inputs import make_tensor
def make_inputs(device):
    g = torch.Generator().manual_seed(315707)
    return [make_tensor((1, 1), 'bool', 'contiguous', g, device),
            make_tensor((3,), 'float32', 'stepped', g, device)]
def make_globals(device):
    global m4
    torch.manual_seed(315707)
    m4 = torch.nn.LayerNorm(3)
def fn(x0, x1):
    t5 = m4(x1)
    if t5.sum() > 0:
        t6 = t5 * 2
    else:
        t6 = t5 - 1
    return (t6,)
"""


_BRANCH_ON_ROUNDING_3D = _BRANCH_ON_ROUNDING.replace("315707", "411446").replace(
    "[make_tensor((1, 1), 'bool', 'contiguous', g, device),\n            "
    "make_tensor((3,), 'float32', 'stepped', g, device)]",
    "[make_tensor((1,), 'bool', 'contiguous', g, device), "
    "make_tensor((3, 2, 2), 'float32', 'contiguous', g, device)]").replace(
    "LayerNorm(3)", "LayerNorm(2)")


def test_oracle_forgives_the_other_side_of_a_jump_only_where_rounding_decides_it():
    """Fuzz seed 315707: a LayerNorm's outputs sum to 0 up to rounding, so `t5.sum() > 0` goes
    either way; kiln's norm (rows reduced in another order) took the other branch. Eager on
    inputs nudged by a few ulps jumps between the branches too: forgiven. A wrong value in a
    program continuous at its inputs, or farther off than eager's own jump, is not."""
    oracle._nudged_runs.cache_clear()
    module = load_program(_BRANCH_ON_ROUNDING)
    module.make_globals("cpu")
    x0, x1 = module.make_inputs("cpu")
    norm = module.m4(x1).detach().double()
    branches = [norm * 2, norm - 1]
    eager = module.fn(x0, x1)[0].detach().double()
    other = branches[1] if torch.equal(eager, branches[0]) else branches[0]
    decided = oracle._decided_by_rounding
    assert decided(oracle._Case(_BRANCH_ON_ROUNDING, "cpu", 0), ("output", 0), eager, other)
    assert not decided(oracle._Case(_BRANCH_ON_ROUNDING, "cpu", 0), ("output", 0), eager, other + 10)
    # seed 411446's shape: input nudges never flip its branch, other roundings of the ops do
    oracle._nudged_runs.cache_clear()
    module = load_program(_BRANCH_ON_ROUNDING_3D)
    module.make_globals("cpu")
    x0, x1 = module.make_inputs("cpu")
    assert x1.shape == (3, 2, 2)
    norm = module.m4(x1).detach().double()
    eager = module.fn(x0, x1)[0].detach().double()
    other = norm - 1 if torch.equal(eager, norm * 2) else norm * 2
    assert decided(oracle._Case(_BRANCH_ON_ROUNDING_3D, "cpu", 0), ("output", 0), eager, other)
    smooth = _RETURNS_INPUT
    (x0,) = load_program(smooth).make_inputs("cpu")
    sin = torch.sin(x0).double()
    assert not decided(oracle._Case(smooth, "cpu", 0), ("output", 0), sin, sin + 1e-3)


def _warns_at_length(gm, example_inputs):
    """A backend that falls back with a long, multi-line warning (a GPU compile failure)."""
    try:
        raise ValueError("ptxas failed: the deep cause")
    except ValueError:
        logging.getLogger("kiln.fake").warning("kiln: compiling kernel k failed; running eagerly "
                                               + "x" * 300, exc_info=True)
    return gm.forward


def test_oracle_keeps_the_whole_first_warning():
    verdict = check_source(_RETURNS_INPUT, _warns_at_length)
    assert verdict.ok and verdict.fallbacks >= 1
    assert "x" * 300 in verdict.detail and "ValueError: ptxas failed: the deep cause" in \
        verdict.detail


def test_campaign_summary_keeps_each_warning_class_first_seed_and_whole_message(tmp_path,
                                                                                 capsys):
    message = "kiln: compiling kernel k_1 failed: " + "y" * 300 + "\nTraceback: the cause"

    class Pool:  # seeds 12 and 13 pass with a kiln warning
        def check_all(self, jobs, deadline=None):
            for seed, _ in jobs:
                warned = seed >= 12
                yield seed, Verdict("", message if warned else "", fallbacks=int(warned))

    args = argparse.Namespace(seed=10, count=4, backend="kiln", device="cpu",
                              cpu_codegen="eager", workers=1, out=str(tmp_path),
                              time_budget=None, shrink_budget=0, shrink_time=1.0, grow=False, grad=False)
    assert cli._campaign(Pool(), args, "tiny") == 0
    with open(tmp_path / "summary.json") as handle:
        (entry,) = json.load(handle)["warnings"].values()
    assert entry == {"count": 2, "first_seed": 12, "first_message": message}
    out = capsys.readouterr().out
    assert "(first: seed 12)" in out and "y" * 300 in out and "Traceback: the cause" in out


def test_shrinker_reduces_a_planted_failure_to_the_failing_statement():
    seed = next(s for s in range(200) if "torch.sin(" in generate_program(s).source
                and len(generate_program(s).source.splitlines()) > 30)
    source = generate_program(seed).source
    assert check_source(source, _adds_one_to_sin_graphs).failure == "mismatch:value"

    def still_fails(candidate: str) -> bool:
        return check_source(candidate, _adds_one_to_sin_graphs).failure == "mismatch:value"

    small = shrink_source(source, still_fails, budget=300)
    body = ast.parse(small).body[-1].body
    assert still_fails(small) and "torch.sin(" in small
    assert len(body) <= 3, small  # the sin, maybe one producer, the return


def test_pool_attributes_a_crash_and_a_timeout_and_keeps_going():
    segfault = "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)"
    crash = _RETURNS_INPUT.replace("    t1 = torch.sin(x0)", segfault)
    hang = _RETURNS_INPUT.replace("    t1 = torch.sin(x0)", "    import time\n    time.sleep(60)")
    pool = WorkerPool("eager", "cpu", workers=1, timeout=20)
    verdicts = dict(pool.check_all([(0, crash), (1, _RETURNS_INPUT)]))
    assert verdicts[0].failure == "crash:signal:SIGSEGV" and verdicts[1].ok
    pool.timeout = 1
    ((_, verdict),) = pool.check_all([(2, hang)])
    assert verdict.failure == "timeout"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_smoke_campaign(backend):
    start, failures = time.perf_counter(), []
    for seed in range(SMOKE_SEED, SMOKE_SEED + SMOKE_COUNT):
        verdict = check_source(generate_program(seed).source, backend)
        if not verdict.ok:
            failures.append(f"seed {seed}: {verdict.failure}: {verdict.detail}")
    assert not failures, "\n".join(failures)
    assert time.perf_counter() - start < 60


# Read at import, before any reproducer runs: a reproducer sets TRITON_INTERPRET itself (for
# running it alone), which must not make a CUDA test process look interpreted.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _generated_kernels_device() -> str:
    """Where the kiln backend's generated kernels run in this process: the Triton interpreter
    on the CPU (TRITON_INTERPRET=1, set by tests/conftest.py on CPU runs), else the GPU (the
    CUDA suite: one Triton mode per process, so the interpreter is not available there)."""
    return "cpu" if _INTERPRETED else "cuda"


def test_smoke_campaign_through_triton_interpreter():
    device = _generated_kernels_device()
    with config.patch(cpu_codegen="triton_interpret"):
        for seed in range(INTERPRET_SEED, INTERPRET_SEED + INTERPRET_COUNT):
            verdict = check_source(generate_program(seed, size="tiny").source, "kiln", device)
            assert verdict.ok, f"seed {seed}: {verdict.failure}: {verdict.detail}"


def _known(pattern: str) -> list:
    return [pytest.param(path, id=os.path.basename(path), marks=pytest.mark.xfail(
        strict=True, reason="a known kiln bug, see fuzz_findings/FINDINGS.md"))
        for path in sorted(glob.glob(os.path.join(FINDINGS, pattern)))]


def _check_reproducer(path: str) -> None:
    """Run a reproducer with the backend its name gives (the kiln backend's through the Triton
    interpreter on CPU runs, on the GPU in the CUDA suite) and assert the oracle's verdict."""
    with open(path) as handle:
        source = handle.read()
    backend = next(b for b in ("aot_eager", "eager", "kiln") if f"-{b}-" in path)
    device = _generated_kernels_device() if backend == "kiln" else "cpu"
    if device == "cuda":
        # A reproducer sets TRITON_INTERPRET=1 (setdefault) for its own CPU runs; "0" here keeps
        # this process's Triton on the GPU.
        os.environ.setdefault("TRITON_INTERPRET", "0")
        if os.path.basename(path).startswith("raises_"):
            return _check_in_child(path, backend)
    with config.patch(cpu_codegen="triton_interpret" if backend == "kiln" else "eager"):
        verdict = check_source(source, backend, device)
    assert verdict.ok, f"{verdict.failure}: {verdict.detail}"


_CHILD = """
import sys
from kiln.config import config
from kiln.tools.fuzz.oracle import check_source
config.cpu_codegen = "triton_interpret"
verdict = check_source(open(sys.argv[1]).read(), sys.argv[2], sys.argv[3])
print(verdict)
sys.exit(0 if verdict.ok else 1)
"""


def _check_in_child(path: str, backend: str) -> None:
    """On the GPU, a program whose eager run raises may raise through a device-side assert (an
    out-of-range index), which leaves the process unusable: it runs in a child process. Where
    only eager raises, eager's assert poisons the kiln run after it, so the oracle cannot judge
    kiln there: that child runs the CPU interpreter (kiln's own device asserts on CUDA are
    tested by tests/runtime/test_eager_parity.py, one child per case)."""
    import subprocess
    import sys

    from tests.child_env import child_env
    on_cpu = os.path.basename(path).startswith("raises_eager_only")
    done = subprocess.run([sys.executable, "-c", _CHILD, path, backend, "cpu" if on_cpu else "cuda"],
                          capture_output=True, text=True, timeout=300,
                          env=child_env(TRITON_INTERPRET="1" if on_cpu else "0"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("path", _known("*.py"))
def test_known_findings_still_fail(path):
    """Each open finding's reproducer still fails (strict xfail: a fix shows up as XPASS)."""
    _check_reproducer(path)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FINDINGS, "fixed", "*.py"))),
                         ids=os.path.basename)
def test_fixed_findings_pass(path):
    """Each fixed finding's reproducer passes the oracle now (a regression test per class)."""
    _check_reproducer(path)


def test_smoke_campaign_with_growth_and_gradients():
    """`--grow --grad` programs (dynamic shapes, number arguments, gradients) through aot_eager
    and, fewer, the kiln backend's generated kernels."""
    failures = []
    for seed in range(SMOKE_SEED, SMOKE_SEED + SMOKE_COUNT // 2):
        source = generate_program(seed, grow=True, grad=True).source
        verdict = check_source(source, "aot_eager")
        if not verdict.ok:
            failures.append(f"seed {seed} (aot_eager): {verdict.failure}: {verdict.detail}")
    device = _generated_kernels_device()
    with config.patch(cpu_codegen="triton_interpret"):
        for seed in range(INTERPRET_SEED, INTERPRET_SEED + 6):
            source = generate_program(seed, size="tiny", grow=True, grad=True).source
            verdict = check_source(source, "kiln", device)
            if not verdict.ok:
                failures.append(f"seed {seed} (kiln): {verdict.failure}: {verdict.detail}")
    assert not failures, "\n".join(failures)
