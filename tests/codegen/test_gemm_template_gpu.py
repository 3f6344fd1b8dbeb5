"""GEMM templates on the GPU (`-m gpu`; `-s` prints the timings): max-autotune's real benchmark
on the seed block's GEMM shapes (M = 16384 tokens, bf16) returns a valid choice, caches it, and
the compiled graph matches an fp32 reference; every template config is also run once, forced,
against the same reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.lower.decomposition_tables import trace_aten  # noqa: E402
from kiln.options import resolve_options  # noqa: E402
from kiln.runtime import compile_graph, gemm_tuning  # noqa: E402
from kiln.runtime.gemm_tuning import LIBRARY, gemm_timer  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.explicit_device,
              pytest.mark.usefixtures("generated_kernels")]

TUNED = "max-autotune-no-cudagraphs"
M = 16384  # B * L of the seed block


def fc1(x, w, b, r):
    return F.gelu(F.linear(x, w, b))


def fc2_residual(x, w, b, r):
    return r + F.linear(x, w, b)


def out_proj_residual(x, w, b, r):
    return r + F.linear(x, w, b)


CASES = [(fc1, 1024, 4096), (fc2_residual, 4096, 1024), (out_proj_residual, 1024, 1024)]


def _args(k: int, n: int):
    torch.manual_seed(0)
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(M, n, device="cuda", dtype=torch.bfloat16)
    return x, w, b, r


def _compile(fn, args):
    return compile_graph(trace_aten(fn, *args), list(args), options=resolve_options(TUNED))


def _assert_close_to_fp32(fn, args, got):
    (got,) = got  # a compiled graph returns its outputs as a tuple
    ref = fn(*[a.float() for a in args])
    eager = fn(*args)
    err = (got.float() - ref).abs().max().item()
    eager_err = (eager.float() - ref).abs().max().item()
    assert err <= 2 * eager_err + 1e-2, (err, eager_err)


@pytest.mark.parametrize("fn,k,n", CASES, ids=[c[0].__name__ for c in CASES])
def test_benchmark_picks_a_valid_choice_and_caches_it(fn, k, n, monkeypatch):
    config.gemm_templates = "auto"
    args = _args(k, n)
    calls: list[str] = []
    real = gemm_tuning.benchmark_ms

    def counted(label, run):
        calls.append(label)
        return real(label, run)

    monkeypatch.setattr(gemm_tuning, "benchmark_ms", counted)
    artifact = _compile(fn, args)
    assert calls and calls[0] == LIBRARY
    templates = [s for s in artifact.specs if s.kind == "gemm_template"]
    assert len(templates) <= 1
    got = artifact(*args)
    _assert_close_to_fp32(fn, args, got)
    print(f"\n{fn.__name__} [{M}x{k}] x [{k}x{n}] bf16: "
          f"{'template ' + templates[0].name if templates else 'library + epilogue kernel'}"
          f" ({len(calls)} candidates timed)")
    kiln.reset()
    calls.clear()
    again = _compile(fn, args)
    assert calls == []  # the choice came from the disk cache
    assert [s.source for s in again.specs] == [s.source for s in artifact.specs]


@pytest.mark.parametrize("fn,k,n", CASES[:2], ids=[c[0].__name__ for c in CASES[:2]])
def test_every_config_is_correct_on_the_gpu(fn, k, n, tmp_path, monkeypatch):
    from kiln.codegen.gemm_template import gemm_configs
    from kiln.lower import lower_graph
    from kiln.schedule import schedule
    from kiln.schedule.gemm_epilogue import find_gemm_epilogues

    config.gemm_templates = "always"
    args = _args(k, n)
    (cand,) = find_gemm_epilogues(schedule(lower_graph(trace_aten(fn, *args), list(args))))
    configs = gemm_configs(cand.group.gemm, torch.bfloat16)
    for i, cfg in enumerate(configs):
        kiln.reset()
        monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / str(i)))
        times = [9.0] * (len(configs) + 1)
        times[i + 1] = 1.0
        with gemm_timer(lambda label, run, t=iter(times): next(t)):
            artifact = _compile(fn, args)
        (spec,) = [s for s in artifact.specs if s.kind == "gemm_template"]
        assert spec.meta_dict["BLOCK_N"] == cfg.BLOCK_N and spec.num_warps == cfg.num_warps
        _assert_close_to_fp32(fn, args, artifact(*args))
        ms = gemm_tuning.benchmark_ms(spec.name, lambda: artifact(*args))
        print(f"\n{fn.__name__} {cfg.short()}: {ms * 1e3:.1f} us")


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_seed_block_under_max_autotune_matches_eager(train):
    """The whole seed block (bf16, [32, 512, 1024]) under max-autotune-no-cudagraphs with the
    real benchmark: outputs (and gradients) within 2x eager's error against fp32."""
    from kiln.tools.seed_model import TransformerBlock

    config.gemm_templates = "auto"
    torch.manual_seed(0)
    block = TransformerBlock().cuda()
    x = torch.randn(32, 512, 1024, device="cuda")
    ref_out = block(x)
    low = TransformerBlock().cuda().to(torch.bfloat16)
    low.load_state_dict(block.state_dict())
    xl = x.to(torch.bfloat16).requires_grad_(train)
    compiled = kiln.compile(low, backend="kiln", mode=TUNED)
    with torch.set_grad_enabled(train):
        got = compiled(xl)
        eager = low(xl)
    err = (got.float() - ref_out).abs().max().item()
    eager_err = (eager.float() - ref_out).abs().max().item()
    assert err <= 2 * eager_err + 1e-2, (err, eager_err)
    if train:
        grad = torch.randn_like(got)
        (g_compiled,) = torch.autograd.grad(got, xl, grad)
        (g_eager,) = torch.autograd.grad(eager, xl, grad)
        gerr = (g_compiled.float() - g_eager.float()).abs().max().item()
        assert gerr <= 5e-2 * max(1.0, g_eager.float().abs().max().item()), gerr
