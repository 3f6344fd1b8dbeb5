"""kiln.runtime.launcher: launchers of generated kernels against eager (Triton interpreter on
CPU, tiny shapes), parallel vs serial builds, thread-safe compiles, and the generated fast launch
route (checked against a fake CompiledKernel: the real one needs a GPU)."""
from __future__ import annotations

import concurrent.futures
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

# DEVICE below is the GPU where there is one; oracles run on CPU copies
pytestmark = pytest.mark.explicit_device

from launch_fakes import FakeCompiledKernel  # noqa: E402

from kiln.codegen import emit_kernel  # noqa: E402
from kiln.codegen import triton_build  # noqa: E402
from kiln.codegen.triton_build import run_graph  # noqa: E402
from kiln.lower import lower_graph  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.runtime import launcher as launcher_mod  # noqa: E402
from kiln.runtime.launcher import Launcher, build_launchers, compile_mode, stage_timer  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _fn(x, y):
    z = torch.where(x > 0, x * y, torch.exp(y))
    return torch.softmax(z, -1), (x.t() + 1).sigmoid()


def _lowered(fn, *inputs):
    graph = lower_graph(trace_aten(fn, *inputs))
    specs = [emit_kernel(node, graph) for node in graph.computed]
    return graph, specs


def _run_with(graph, launchers, inputs):
    """The graph with every computed buffer made by its launcher (externs: reference)."""
    return run_graph(graph, inputs, {lc.spec.writes[0]: lc for lc in launchers})


def _inputs():
    return torch.randn(4, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE)


def test_launchers_equal_eager():
    x, y = _inputs()
    graph, specs = _lowered(_fn, x.cpu(), y.cpu())
    launchers = build_launchers(specs)
    assert [lc.spec for lc in launchers] == specs
    assert {lc.spec.kind for lc in launchers} == {"pointwise", "persistent_reduction"}
    got = _run_with(graph, launchers, [x, y])
    for g, w in zip(got, _fn(x, y)):
        torch.testing.assert_close(g, w)


def test_launcher_addresses_each_tensor_from_its_first_element():
    """Kernels index a tensor from `data_ptr()`, not from its storage's start: one compiled
    kernel serves tensors anywhere in their storages (`xs[3]` after `xs[0]`), and the
    alignment check sends the unaligned ones (a 5-float offset) through the generic route."""
    x = torch.randn(4, 8, device=DEVICE)
    graph, (spec,) = _lowered(lambda x: x.exp() * 2, x.cpu())
    (lc,) = build_launchers([spec])
    for x_at, out_at in ((0, 0), (5, 3), (8, 16)):
        x_base, out_base = torch.randn(48, device=DEVICE), torch.zeros(48, device=DEVICE)
        x_base[x_at:x_at + 32].copy_(x.flatten())
        lc(x_base[x_at:x_at + 32].view(4, 8), out_base[out_at:out_at + 32].view(4, 8))
        torch.testing.assert_close(out_base[out_at:out_at + 32].view(4, 8), x.exp() * 2)
        assert not out_base[:out_at].any() and not out_base[out_at + 32:].any()
    assert lc.grid == (1, 1, 1) and lc.meta == spec.meta_dict
    assert lc.options == {"num_warps": spec.num_warps, "num_stages": spec.num_stages,
                          **spec.compile_options()}
    with pytest.raises(TypeError, match=r"takes 2 tensors \('x_1', 'buf0'\), got 1"):
        lc(x)


def test_parallel_build_equals_serial():
    x, y = _inputs()
    graph, specs = _lowered(_fn, x.cpu(), y.cpu())
    serial = build_launchers(specs, parallel=False)
    parallel = build_launchers(specs, parallel=True)
    for a, b in zip(serial, parallel):
        assert (a.name, a.grid, a.meta, a.options) == (b.name, b.grid, b.meta, b.options)
        assert a.fn is b.fn  # one import per kernel source
    outs = [_run_with(graph, lcs, [x, y]) for lcs in (serial, parallel)]
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compile_kernel_is_thread_safe_and_deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CODEGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(triton_build, "_compiled", {})
    _, specs = _lowered(_fn, *(t.cpu() for t in _inputs()))
    work = specs * 8
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        fns = list(pool.map(triton_build.compile_kernel, work))
    for spec, fn in zip(work, fns):
        assert fn is triton_build.compile_kernel(spec)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{s.name}_{s.key}.py" for s in specs)  # no temporaries left
    _, again = _lowered(_fn, *(t.cpu() for t in _inputs()))
    assert [s.key for s in again] == [s.key for s in specs]


def test_num_stages_passed_from_the_spec():
    x = torch.randn(16, device=DEVICE)
    _, (spec,) = _lowered(lambda x: x + 1, x.cpu())
    (lc,) = build_launchers([dataclasses.replace(spec, num_stages=3)])
    assert lc.options == {"num_warps": spec.num_warps, "num_stages": 3, **spec.compile_options()}
    out = torch.empty(16, device=DEVICE)
    lc(x, out)
    torch.testing.assert_close(out, x + 1)


def test_compile_mode_from_environment(monkeypatch):
    assert compile_mode(False, 10) == "serial" and compile_mode(True, 1) == "serial"
    monkeypatch.delenv("KILN_COMPILE_MODE", raising=False)
    assert compile_mode(True, 10) == launcher_mod.DEFAULT_COMPILE_MODE
    monkeypatch.setenv("KILN_COMPILE_MODE", "process")
    assert compile_mode(True, 10) == "process"
    monkeypatch.setenv("KILN_COMPILE_MODE", "fork")
    with pytest.raises(Exception, match="KILN_COMPILE_MODE='fork'.*thread"):
        compile_mode(True, 10)


def test_stage_timer_accumulates():
    timings: dict[str, float] = {}
    with stage_timer(timings, "codegen"):
        sum(range(1000))
    first = timings["codegen"]
    with stage_timer(timings, "codegen"):
        sum(range(1000))
    assert 0 < first < timings["codegen"] < 5


def test_bound_launch_passes_data_pointers_grid_and_constexprs(monkeypatch):
    monkeypatch.setattr(launcher_mod, "_stream_source", lambda: (lambda device: 1000 + device, 3))
    x = torch.randn(4, 8)
    _, (spec,) = _lowered(lambda x: x.sum(-1), x)
    lc = Launcher(spec, triton_build.compile_kernel(spec))
    fake = lc.kernel = FakeCompiledKernel()
    lc.bind()
    assert lc.fast and ".data_ptr()" in lc.source and "untyped_storage" not in lc.source
    base = torch.empty(64)
    out = base[16:20]  # a view: its own address is passed (kernels index from it)
    lc(x, out)
    assert lc._launch.__name__ == f"launch_{spec.name}"  # first launch done: the bound function
    lc(x, out, stream=7)
    (g0, g1, g2, stream, function, metadata, launch_meta, *rest), second = fake.calls
    hooks, pointers, constexprs = rest[:2], rest[2:4], rest[4:]
    meta = spec.meta_dict
    assert (g0, g1, g2) == spec.grid(meta) + (1, 1) and stream == 1003 and second[3] == 7
    assert (function, metadata, launch_meta, hooks) == (0xF00, ("metadata",), None, [None, None])
    assert pointers == [x.data_ptr(), out.data_ptr()] != [x.data_ptr(), base.data_ptr()]
    assert list(lc.fn.arg_names[-2:]) == ["XBLOCK", "RBLOCK"]  # the kernel's parameter order
    assert constexprs == [meta["XBLOCK"], meta["RBLOCK"]] and meta["RBLOCK"] == 8


def _unaligned_copy(x):
    """`x` copied into a storage whose address is 4 bytes past a 16-byte boundary."""
    buf = bytearray(x.numel() * 4 + 32)
    for offset in range(0, 16, 4):
        t = torch.frombuffer(buf, dtype=torch.float32, offset=offset, count=x.numel())
        if t.untyped_storage().data_ptr() % 16:
            return t.copy_(x.reshape(-1))
    raise AssertionError("no unaligned offset found")


def test_unaligned_storage_takes_the_generic_route(monkeypatch):
    monkeypatch.setattr(launcher_mod, "_stream_source", lambda: (lambda device: 1000 + device, 3))
    x = torch.randn(8)
    _, (spec,) = _lowered(lambda x: x * 3, x)
    lc = Launcher(spec, triton_build.compile_kernel(spec))
    fake = lc.kernel = FakeCompiledKernel()
    generic_calls = []
    lc._generic_launch = lambda *t: generic_calls.append(t)  # what bind() captures
    lc.bind()
    out = torch.empty(8)
    lc(x, out)
    assert len(fake.calls) == 1 and not generic_calls
    odd = _unaligned_copy(x)
    lc(odd, out)
    assert len(fake.calls) == 1 and len(generic_calls) == 1 and generic_calls[0][0] is odd


def test_generic_route_when_a_launch_hook_is_installed(monkeypatch):
    monkeypatch.setattr(launcher_mod, "_launch_hooks", lambda: (print, None))
    x = torch.randn(8)
    _, (spec,) = _lowered(lambda x: x * 3, x)
    lc = Launcher(spec, triton_build.compile_kernel(spec))
    lc.kernel = FakeCompiledKernel()
    lc.bind()
    assert not lc.fast and lc._launch == lc._generic_launch


class WrongArityKernel(FakeCompiledKernel):
    def run(self, *args):
        raise TypeError(f"function takes exactly {len(args) - 2} arguments ({len(args)} given)")


def test_a_launcher_that_rejects_our_arguments_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(launcher_mod, "_stream_source", lambda: (lambda device: 0, 0))
    x = torch.randn(8)
    _, (spec,) = _lowered(lambda x: x * 3, x)
    lc = Launcher(spec, triton_build.compile_kernel(spec))
    lc.kernel = WrongArityKernel()
    generic_calls = []
    lc._generic_launch = lambda *t: generic_calls.append(t)
    lc.bind()
    with pytest.raises(TypeError, match="takes 2 tensors"):  # the caller's mistake: no fallback
        lc(x)
    assert lc.fast
    out = torch.empty(8)
    lc(x, out)
    lc(x, out)
    assert not lc.fast and len(generic_calls) == 2
    assert "bound launch failed" in caplog.text


class FakeJit:
    """Stands in for a JITFunction on a GPU: records warmups, returns fake CompiledKernels."""

    def __init__(self, arg_names, fail=False):
        self.arg_names, self.fail, self.warmups = list(arg_names), fail, []

    def warmup(self, *args, grid, **options):
        self.warmups.append((args, grid, options))
        if self.fail:
            raise RuntimeError("PTXAS error: Entry function uses too much shared data")
        return FakeCompiledKernel()


@pytest.mark.parametrize("mode", ["serial", "thread"])
def test_compile_ahead_warms_up_with_dtypes_and_names_failures(mode, monkeypatch):
    monkeypatch.setattr(launcher_mod, "_stream_source", lambda: (lambda device: 0, 0))
    x = torch.randn(4, 8)
    _, (spec,) = _lowered(lambda x: x.sum(-1), x)
    real = triton_build.compile_kernel(spec)
    good = Launcher(spec, FakeJit(real.arg_names))
    launcher_mod._COMPILERS[mode]([(good, [torch.float32, torch.float32])])
    good.bind()
    ((args, grid, options),) = good.fn.warmups
    meta = spec.meta_dict
    assert list(args) == [torch.float32, torch.float32, meta["XBLOCK"], meta["RBLOCK"]]
    assert grid == good.grid and options == good.options and good.fast
    bad = Launcher(spec, FakeJit(real.arg_names, fail=True))
    with pytest.raises(Exception, match=rf"compiling kernel {spec.name} failed.*PTXAS"):
        launcher_mod._COMPILERS[mode]([(good, [torch.float32] * 2), (bad, [torch.float32] * 2)])


def test_process_jobs_are_plain_picklable_data():
    import pickle

    x = torch.randn(4, 8)
    _, (spec,) = _lowered(lambda x: x.sum(-1), x)
    lc = Launcher(spec, triton_build.compile_kernel(spec))
    job = pickle.loads(pickle.dumps(launcher_mod._worker_job(lc, [torch.float32] * 2)))
    meta = spec.meta_dict
    assert job["args"] == ["float32", "float32", meta["XBLOCK"], meta["RBLOCK"]]
    assert job["source"] == spec.source and job["key"] == spec.key and job["grid"] == lc.grid
