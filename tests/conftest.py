"""Shared test setup: the test device, GPU-test skips, and kiln's state restored after every test.

The device (docs/testing.md): `KILN_TEST_DEVICE=cpu|cuda`, by default `cuda` where
torch.cuda.is_available() and `cpu` elsewhere. On `cpu`, Triton runs interpreted (see DESIGN.md)
and the tests that compile with the kiln backend set `cpu_codegen="triton_interpret"`. On `cuda`,
every test under the stage folders that compare compiled results with eager (`DEVICE_DIRS`) runs
inside `torch.device("cuda")`, so the tensors it makes land on the GPU and kiln's kernels run as
real Triton binaries; tests that take the `device` fixture use it explicitly, and tests marked
`explicit_device` (files that pick their device themselves, CPU-specific pins) run outside that
context. One Triton mode per
process: the interpreter is chosen when triton.jit decorates a kernel, so both devices cannot share
a run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

_CUDA = torch.cuda.is_available()
TEST_DEVICE = os.environ.get("KILN_TEST_DEVICE", "cuda" if _CUDA else "cpu").strip().lower()
if TEST_DEVICE not in ("cpu", "cuda"):
    raise pytest.UsageError(f"KILN_TEST_DEVICE={TEST_DEVICE!r}: use cpu or cuda")
if TEST_DEVICE == "cuda" and not _CUDA:
    raise pytest.UsageError("KILN_TEST_DEVICE=cuda but torch.cuda.is_available() is False")
if TEST_DEVICE == "cpu":
    # CPU runs Triton kernels in its interpreter; set before triton loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")
# A CUDA run compiles Triton for the GPU, so the interpreter is off for the whole process: CPU
# tensors there run through cpu_codegen's default (eager), as on a user's GPU machine.
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
if TEST_DEVICE == "cuda":
    # fp32 convolutions compared with eager's: cuDNN's TF32 (torch's default) rounds inputs to
    # 10 mantissa bits, and two algorithm choices then differ by ~4e-4 (a bottleneck block's
    # gradients) at the suite's 1e-4 tolerance. Full fp32 makes the comparison mean something.
    torch.backends.cudnn.allow_tf32 = False

from kiln import logs  # noqa: E402
from kiln.config import config  # noqa: E402

# Stage folders whose tests compare compiled results with eager: on cuda they run on the GPU.
DEVICE_DIRS = ("lower", "schedule", "codegen", "runtime", "backends", "autograd", "suite")
_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _CUDA:
        return
    skip = pytest.mark.skip(reason="gpu test: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    """The device compiled-vs-eager tests put their tensors on (KILN_TEST_DEVICE)."""
    return torch.device(TEST_DEVICE)


def _on_test_device(item: pytest.Item) -> bool:
    try:
        rel = Path(str(item.path)).resolve().relative_to(_TESTS.resolve())
    except ValueError:
        return False
    if item.get_closest_marker("explicit_device") is not None:
        return False  # the test places its tensors itself (or pins CPU-only expectations)
    return TEST_DEVICE == "cuda" and rel.parts[0] in DEVICE_DIRS


@pytest.fixture(autouse=True)
def _restore_kiln_state(request):
    """Every test starts with empty caches and warn-once state and a fixed seed, and leaves the
    config and log artifacts as it found them; on cuda, stage tests make their tensors there."""
    import contextlib

    import kiln
    saved = config.to_dict()
    saved_logs = sorted(logs._enabled)
    kiln.reset()
    torch.manual_seed(0)
    where = torch.device("cuda") if _on_test_device(request.node) else contextlib.nullcontext()
    with where:
        yield
    kiln.reset()
    for name, value in saved.items():
        setattr(config, name, value)
    logs.set_logs(*saved_logs)
    logs.reset_warnings()


@pytest.fixture
def generated_kernels(tmp_path, monkeypatch):
    """The kiln backend's generated kernels in this test (Triton interpreted on the CPU), with
    a private cache folder, and a backend failure failing the test instead of running eagerly.
    Modules use it with `pytestmark = pytest.mark.usefixtures("generated_kernels")`. In a CUDA
    run CUDA tensors get real kernels and CPU tensors the default CPU codegen (no interpreter)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    if INTERPRETER:
        config.cpu_codegen = "triton_interpret"
    config.suppress_errors = False


@pytest.fixture
def recorder():
    """A `kiln.records.Recorder` active for the test: what the stages emitted (graphs, passes)."""
    from kiln import records
    found = records.Recorder()
    records.active_recorders().append(found)
    yield found
    records.active_recorders().remove(found)
