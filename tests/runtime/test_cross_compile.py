"""KILN_CROSS_COMPILE: kernels launched in Triton's interpreter also compile, with the real
compiler, for a GPU this machine does not have (sm_90, the H200): a kernel the compiler refuses
raises at its launch, naming the kernel; a kernel that compiles runs as before."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

from kiln.codegen.triton_build import launch  # noqa: E402
from kiln.errors import KilnError  # noqa: E402
from kiln.runtime import cross_compile  # noqa: E402

pytestmark = [
    pytest.mark.explicit_device,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="cross-compiling is for interpreted (CPU) runs"),
]


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setenv(cross_compile.ENV, "cuda:90")
    monkeypatch.setattr(cross_compile, "compiled", set())


def test_kernels_compile_for_sm90_and_still_run(sm90, monkeypatch):
    """A compiled function's kernels (a bf16 GELU and a row sum: pointwise and reduction)."""
    import kiln
    from kiln.config import config

    monkeypatch.setattr(config, "cpu_codegen", "triton_interpret")

    def fn(x):
        return torch.nn.functional.gelu(x.to(torch.bfloat16)).float().sum(-1)

    x = torch.randn(4, 40)
    got = kiln.compile(fn, backend="kiln")(x)
    torch.testing.assert_close(got, fn(x), rtol=2e-2, atol=2e-2)
    assert cross_compile.compiled  # every launched (kernel, dtypes) pair, once


_REFUSED = '''
import triton
import triton.language as tl


@triton.jit
def refused(in_ptr0, out_ptr0, XBLOCK: tl.constexpr):
    acc = 0
    for i in range(0, 4):
        acc = acc + tl.load(in_ptr0 + i)  # int32 before the loop, float32 in it
    tl.store(out_ptr0 + tl.arange(0, XBLOCK), acc + tl.zeros([XBLOCK], tl.float32))
'''


@dataclasses.dataclass
class _Spec:
    """The fields a launch reads, for a hand-written kernel."""
    source: str = _REFUSED
    name: str = "refused"
    key: str = "0123abcd"
    args: tuple = ("x", "y")
    arg_names: tuple = ("in_ptr0", "out_ptr0")
    size_args: tuple = ()
    num_warps: int = 1
    num_stages: int = 1
    meta_dict: dict = dataclasses.field(default_factory=lambda: {"XBLOCK": 8})

    def grid(self, meta):
        return (1,)

    def compile_options(self):
        return {}

    def launch_options(self):
        return {**self.meta_dict, "num_warps": 1, "num_stages": 1}


def test_a_kernel_the_compiler_refuses_raises_with_its_name(sm90):
    """The interpreter runs the loop-carried type change; the compiler refuses it."""
    x, y = torch.randn(4), torch.empty(8)
    spec = _Spec()
    launch(spec, x, y)  # interpreted: runs
    torch.testing.assert_close(y, x.sum().expand(8))
    with pytest.raises(cross_compile.CrossCompileError, match="refused does not compile for "
                       "cuda:90.*float32"):
        cross_compile.cross_compile(spec, [x.dtype, y.dtype], spec.meta_dict, {"num_warps": 1})
    assert not cross_compile.compiled


def test_the_target_must_name_a_cuda_capability(monkeypatch):
    monkeypatch.setenv(cross_compile.ENV, "sm90")
    with pytest.raises(KilnError, match="cuda:<compute capability>"):
        cross_compile.target()
    monkeypatch.delenv(cross_compile.ENV)
    assert cross_compile.target() is None
