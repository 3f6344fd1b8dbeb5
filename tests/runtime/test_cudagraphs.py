"""CUDA graph replay (`kiln.runtime.cudagraphs`, mode="reduce-overhead") on the CPU, through the
fake mechanism of fake_cudagraph.py: what the policy must get right whatever the device does.

The first half drives `CudaGraphRunner` with plain Python wrappers (fast); the second compiles
with the kiln backend (generated kernels in Triton's interpreter) under mode="reduce-overhead",
inference and training, and compares with eager. The same checks on a real GPU:
test_cudagraphs_gpu.py.
"""
from __future__ import annotations

import logging
import os

import pytest
import torch

from cudagraph_checks import (LOGGER, check_a_host_sync_falls_back,
                              check_held_outputs_stay_correct, check_random_numbers_like_eager,
                              check_written_inputs_are_copied_back, record_artifacts,
                              scale_by)
from fake_cudagraph import FakeGraphMechanism
from kiln.runtime.cudagraphs import CudaGraphRunner, use_mechanism

pytestmark = pytest.mark.explicit_device  # the fake mechanism records CPU work only

def runner(fn=scale_by, **kwargs):
    mechanism = kwargs.pop("mechanism", None) or FakeGraphMechanism()
    return CudaGraphRunner(fn, name="test", mechanism=mechanism, **kwargs), mechanism


def _fake_runner(fn, **kwargs):
    return runner(fn, **kwargs)[0]


def _runner_noting(mechanisms, fn, **kwargs):
    run, mechanism = runner(fn, **kwargs)
    mechanisms.append(mechanism)
    return run


def test_warmup_calls_run_the_wrapper_then_one_recording_replays():
    run, mechanism = runner(warmup=2)
    w = torch.nn.Parameter(torch.randn(4))
    for i in range(5):
        x = torch.randn(4)
        out, view = run([x, w])
        torch.testing.assert_close(out, x * w.detach())
        torch.testing.assert_close(view, (x * w.detach())[1:])
        del out, view
    assert run.stats == {"warmup": 2, "recorded": 1, "replayed": 3, "eager": 0}
    assert len(mechanism.graphs) == 1 and mechanism.graphs[0].replays == 3
    assert "aten.mul.out" in mechanism.graphs[0].ops


def test_inputs_at_new_addresses_are_copied_into_static_buffers_parameters_are_not():
    run, _ = runner()
    w = torch.nn.Parameter(torch.randn(4))
    run([torch.randn(4), w])  # warm-up
    xs = [torch.randn(4) for _ in range(3)]
    for x in xs:
        torch.testing.assert_close(run([x, w])[0], x * w.detach())
    (recording,) = run.recordings[next(iter(run.recordings))]
    assert recording.copied == (0,) and recording.pinned == {1: w.data_ptr()}
    assert all(recording.inputs[0].data_ptr() != x.data_ptr() for x in xs)
    assert recording.inputs[1] is None  # a parameter is read in place, never kept alive


def test_outputs_the_caller_holds_stay_correct_after_later_replays():
    mechanisms = []
    run = check_held_outputs_stay_correct(lambda fn, **kw: _runner_noting(mechanisms, fn, **kw),
                                          torch.device("cpu"))
    assert mechanisms[0].graphs[0].replays == 1 + 5 and run.stats["eager"] == 0


def test_a_view_the_caller_keeps_keeps_the_memory_alive():
    run, _ = runner()
    w = torch.nn.Parameter(torch.ones(4))
    run([torch.zeros(4), w])
    kept = run([torch.full((4,), 2.0), w])[0][2:]  # only a view of an output survives
    run([torch.full((4,), 3.0), w])
    torch.testing.assert_close(kept, torch.full((2,), 2.0))


def test_outputs_of_two_calls_are_different_tensors_views_of_one_base():
    run, _ = runner()
    w = torch.nn.Parameter(torch.ones(4))
    run([torch.zeros(4), w])
    out, view = run([torch.ones(4), w])
    assert view._base is out  # the caller sees eager's aliasing between outputs
    out2, _ = run([torch.ones(4), w])
    assert out2 is not out


def test_a_moved_parameter_is_recorded_again():
    run, _ = runner()
    x = torch.randn(4)
    w1 = torch.nn.Parameter(torch.randn(4))
    for _ in range(3):
        run([x, w1])
    w2 = torch.nn.Parameter(torch.randn(4))  # the model's weight replaced (not in place)
    torch.testing.assert_close(run([x, w2])[0], x * w2.detach())
    assert run.num_recordings() == 2


def test_the_key_leaves_parameters_and_static_inputs_out():
    """A replay's key reads the inputs that may change layout between calls; parameters and
    the autograd stage's static inputs (buffers) are checked by address instead (keying on
    them cost a tuple per parameter per call). A new size of the keyed input records again."""
    run, _ = runner(fn=lambda args: (args[0] * args[1] + args[2],), static_inputs=(2,))
    w, b = torch.nn.Parameter(torch.randn(4)), torch.randn(4)
    for length in (4, 4, 4):
        x = torch.randn(length)
        torch.testing.assert_close(run([x, w, b])[0], x * w.detach() + b)
    assert run.keyed == [0] and len(next(iter(run.recordings))) == 1
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(run([x, w, b])[0], x * w.detach() + b)
    assert run.num_recordings() == 2 and len(run.recordings) == 2


def test_a_parameter_on_another_device_blocks_the_new_recording():
    """Parameters are not in the key, so a key seen before does not check their devices: the
    recording a moved parameter needs checks them first, and the call runs the wrapper."""
    run, _ = runner(fn=lambda args: (args[0] * 2,))
    x = torch.randn(4)
    for _ in range(2):
        run([x, torch.nn.Parameter(torch.randn(4))])
    out = run([x, torch.nn.Parameter(torch.empty(4, device="meta"))])[0]
    torch.testing.assert_close(out, x * 2)
    assert run.blocked is not None and "input 1 is a meta tensor" in run.blocked


def test_past_the_cap_calls_run_the_wrapper_with_one_warning(caplog):
    run, _ = runner(max_recordings=2)
    w = torch.nn.Parameter(torch.randn(4))
    xs = [torch.randn(4) for _ in range(6)]
    with caplog.at_level(logging.WARNING, LOGGER):
        held = [run([x, w]) for x in xs]
    for x, (out, _) in zip(xs, held):
        torch.testing.assert_close(out, x * w.detach())
    assert run.stats["eager"] == 3 and run.num_recordings() == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "outputs of its earlier replays are still referenced" \
        in warnings[0]


def test_each_input_size_is_recorded_once_up_to_the_cap():
    run, _ = runner(max_recordings=3)
    w = torch.nn.Parameter(torch.randn(1))
    for n in (3, 4, 5, 6, 3, 4, 5, 6):
        x = torch.randn(n)
        for _ in range(2):
            out = run([x, w])[0]
            torch.testing.assert_close(out, x * w.detach())
            del out
    assert run.num_recordings() == 3 and run.stats["eager"] == 3  # size 6: past the cap


def test_written_inputs_are_copied_back_like_eager():
    check_written_inputs_are_copied_back(_fake_runner, torch.device("cpu"))


def test_random_numbers_differ_per_replay_and_follow_manual_seed_like_eager():
    check_random_numbers_like_eager(_fake_runner, torch.device("cpu"), 6)


def test_a_capture_that_raises_falls_back_with_the_reason(caplog):
    check_a_host_sync_falls_back(_fake_runner, torch.device("cpu"), caplog)
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 1 and "runs without CUDA graphs: capturing it raised" in messages[0]
    assert "operation not permitted when stream is capturing" in messages[0]


def test_cpu_tensors_are_a_reason_for_a_cuda_graph(caplog):
    with caplog.at_level(logging.WARNING, LOGGER):
        run, mechanism = runner(mechanism=FakeGraphMechanism(device_type="cuda"))
        w = torch.nn.Parameter(torch.randn(4))
        for _ in range(3):
            run([torch.randn(4), w])
    assert not mechanism.graphs and run.stats["eager"] == 3
    assert "input 0 is a cpu tensor" in caplog.text


@pytest.mark.parametrize("devices, ops, reason", [
    ({"cuda", "cpu"}, [], "it holds cpu buffers"),
    ({"cuda"}, [torch.ops.aten.nonzero.default], "it calls aten.nonzero, which waits for the host"),
])
def test_compile_time_reasons(devices, ops, reason, caplog):
    with caplog.at_level(logging.WARNING, LOGGER):
        run, _ = runner(mechanism=FakeGraphMechanism(device_type="cuda"), devices=devices,
                        library_ops=ops)
    assert reason in run.blocked and reason in caplog.text


def test_the_fake_capture_computes_nothing():
    """The fake is only a test of the policy if forgetting to replay would show."""
    mechanism = FakeGraphMechanism()
    w = torch.ones(4)
    _, outputs = mechanism.record(lambda: scale_by([torch.ones(4), w]), None, w.device)
    assert outputs[0].isnan().all() and torch.equal(w, torch.ones(4))


# -- through the kiln backend ----------------------------------------------------------------------

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.tools.seed_model import TransformerBlock  # noqa: E402


@pytest.fixture
def fake_graphs(generated_kernels):
    # the compiled half runs generated kernels on CPU tensors (the interpreter: CPU runs only)
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1): runs in the CPU suite; "
                    "test_cudagraphs_gpu.py is its CUDA counterpart")
    with use_mechanism(FakeGraphMechanism()) as mechanism:
        yield mechanism


@pytest.fixture
def artifacts(monkeypatch):
    return record_artifacts(monkeypatch)


def test_seed_block_inference_replays_and_equals_eager(fake_graphs, artifacts):
    block = TransformerBlock(32, 2).eval()
    compiled = kiln.compile(block, backend="kiln", mode="reduce-overhead")
    held = []
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 8, 32)
            held.append((compiled(x), block(x)))
    for got, want in held:
        torch.testing.assert_close(got, want)
    (artifact,) = artifacts
    runner = artifact.cudagraphs
    assert runner is not None and runner.stats["replayed"] == 3
    (recording, *_) = next(iter(runner.recordings.values()))
    num_params = len(list(block.parameters()))
    assert len(recording.pinned) == num_params and len(recording.copied) == 1


def _training_step(model, compiled, x):
    out = compiled(x)
    loss = out.pow(2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def test_seed_block_training_forward_and_backward_replay_and_equal_eager(fake_graphs, artifacts):
    block = TransformerBlock(32, 2)
    compiled = kiln.compile(block, backend="kiln", mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(2, 8, 32)
        got_out, got = _training_step(block, compiled, x)
        want_out, want = _training_step(block, block, x)
        torch.testing.assert_close(got_out, want_out)
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], msg=f"grad of {name}")
    by_name = {a.name: a.cudagraphs for a in artifacts}
    assert set(by_name) == {"forward", "backward"}
    assert by_name["forward"].stats["replayed"] == 2
    assert by_name["backward"].stats["replayed"] == 2
    (backward, *_) = next(iter(by_name["backward"].recordings.values()))
    assert backward.pinned  # saved parameters and the forward's saved activations: in place


def test_two_forwards_before_their_backwards_keep_saved_activations(fake_graphs):
    """Gradient accumulation order: forward 1, forward 2, backward 2, backward 1. Forward 2
    must not overwrite what forward 1 saved."""
    block = TransformerBlock(32, 2)
    compiled = kiln.compile(block, backend="kiln", mode="reduce-overhead")
    _training_step(block, compiled, torch.randn(2, 8, 32))  # warm-up
    x1, x2 = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    loss1 = compiled(x1).pow(2).mean()
    loss2 = compiled(x2).pow(2).mean()
    loss2.backward()
    loss1.backward()
    got = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    (block(x1).pow(2).mean() + block(x2).pow(2).mean()).backward()
    for name, p in block.named_parameters():
        torch.testing.assert_close(got[name], p.grad, msg=f"grad of {name}")


def test_input_mutation_is_written_back_like_eager(fake_graphs):
    def step(x, buf):
        buf.mul_(0.5).add_(x)
        return x * buf

    compiled = kiln.compile(step, backend="kiln", mode="reduce-overhead")
    buf_c, buf_e = torch.zeros(8), torch.zeros(8)
    for _ in range(4):
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x, buf_c), step(x, buf_e))
        torch.testing.assert_close(buf_c, buf_e)


def _dropout(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 2


def test_dropout_draws_new_numbers_every_replay(fake_graphs):
    compiled = kiln.compile(_dropout, backend="kiln", mode="reduce-overhead")
    x = torch.ones(64)
    outs = [compiled(x).clone() for _ in range(4)]
    assert all(not torch.equal(a, b) for a, b in zip(outs, outs[1:]))


def test_dropout_under_manual_seed_equals_the_same_graph_without_cuda_graphs(fake_graphs):
    x = torch.ones(64)

    def draws(mode):
        kiln.reset()
        compiled = kiln.compile(_dropout, backend="kiln", mode=mode)
        torch.manual_seed(3)
        return [compiled(x).clone() for _ in range(4)]

    for got, want in zip(draws("reduce-overhead"), draws(None)):
        torch.testing.assert_close(got, want)


def test_graphs_that_run_as_torch_ops_say_why_they_are_not_graphed(caplog):
    """The CPU default (no generated code) under reduce-overhead: one warning with the reason."""
    compiled = kiln.compile(lambda x: x.sin() + 1, backend="kiln", mode="reduce-overhead")
    with caplog.at_level(logging.WARNING, LOGGER):
        compiled(torch.randn(4))
        compiled(torch.randn(4))
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 1 and "its inputs are CPU tensors" in messages[0]


def test_options_reach_the_runner(fake_graphs, artifacts):
    compiled = kiln.compile(lambda x: x.cos() * 2, backend="kiln", mode="reduce-overhead",
                            options={"cudagraph_warmup": 2, "cudagraph_max_recordings": 3})
    for _ in range(4):
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x), x.cos() * 2)
    runner = artifacts[0].cudagraphs
    assert (runner.warmup, runner.max_recordings) == (2, 3)
    assert runner.stats["warmup"] == 2 and runner.stats["recorded"] == 1


def test_a_warm_started_graph_is_replayed_too(fake_graphs):
    from kiln.backends import warm_start

    def f(x):
        return torch.tanh(x) + 1

    hits = warm_start.STATS["hits"]
    for _ in range(2):  # the second compile is rebuilt from the disk cache
        kiln.reset()
        compiled = kiln.compile(f, backend="kiln", mode="reduce-overhead")
        for _ in range(3):
            x = torch.randn(8)
            torch.testing.assert_close(compiled(x), f(x))
    assert warm_start.STATS["hits"] == hits + 1
    assert len(fake_graphs.graphs) == 2  # one recording per compile


def test_each_recording_reports_its_pool(fake_graphs, recorder, caplog):
    compiled = kiln.compile(lambda x: x.exp() - 1, backend="kiln", mode="reduce-overhead")
    with caplog.at_level(logging.INFO, LOGGER):
        for _ in range(3):
            compiled(torch.randn(8))
    (entry,) = recorder.cudagraphs
    assert entry["graph"] == "inference" and entry["pool_bytes"] == fake_graphs.pool_bytes
    assert "private pool 0.00 MiB" in caplog.text and "1 copied, 0 read in place" in caplog.text


def test_the_cap_warning_names_a_moving_parameter(caplog):
    run, _ = runner(max_recordings=1)
    x = torch.randn(4)
    with caplog.at_level(logging.WARNING, LOGGER):
        for _ in range(3):  # a buffer reassigned every call: never at the recorded address
            w = torch.nn.Parameter(torch.randn(4))
            torch.testing.assert_close(run([x, w])[0], x * w.detach())
    assert "an input it reads in place (a parameter or buffer" in caplog.text


def test_cpu_scalars_beside_device_tensors_are_host_values_keyed_by_value():
    """Attention's philox seed and offset reach a training backward as 0-dim CPU tensors: they
    blocked its recording ("input 14 is a cpu tensor", the seed block on the H200). They are
    host values now: allowed, and part of the key (a capture that reads one bakes it in). A
    CPU tensor with elements still blocks."""
    from kiln.runtime.cudagraphs import input_key

    # "meta" stands for the GPU: the CPU is another device here
    run, _ = runner(mechanism=FakeGraphMechanism(device_type="meta"))
    on_device = torch.empty(4, device="meta")
    assert run._call_blocker([on_device, torch.tensor(7)]) is None
    assert "input 1 is a cpu tensor" in run._call_blocker([on_device, torch.ones(2)])
    assert "no tensor inputs on its device" in run._call_blocker([torch.tensor(7)])
    keys = {input_key([on_device, torch.tensor(v)], host_scalars=True) for v in (7, 7, 8)}
    assert len(keys) == 2
    assert input_key([on_device, torch.tensor(7)]) == input_key([on_device, torch.tensor(8)])
