"""cross_compile: compile generated kernels for a GPU this machine does not have.

With `KILN_CROSS_COMPILE=cuda:90` (the H200's sm_90; any `cuda:<capability>`), every kernel
launched through Triton's interpreter (CPU runs: tests, fuzz campaigns, sweeps) is also compiled
by the installed Triton's real compiler for that target, to PTX and a cubin, with the signature
a GPU launch would use: each pointer's dtype, 16-byte aligned (kiln compiles for aligned
storages), size arguments as int32, the launcher's constexprs and options (num_warps,
num_stages, debug, fp fusion). Nothing runs on a GPU.

Why: the interpreter executes a kernel as Python on NumPy and accepts programs the compiler
refuses (a loop-carried value that changes type or shape, a block where a scalar must be, an
op with no lowering for a dtype). Those failures would otherwise show first on the GPU machine,
whose time is scarce. A compile error raises `CrossCompileError` at the launch, naming the
kernel and carrying Triton's message. Memory faults and numerics still need the GPU.

Each (kernel, dtypes) pair compiles once per process (`compiled`), in one worker process
started without TRITON_INTERPRET (here `triton.language` was imported interpreted: its library
functions are not compilable), where `triton_build.compile_kernel` imports the kernel module
again as a GPU run does.
"""
from __future__ import annotations

import os
import types
from typing import Any, Sequence

import torch

from kiln.errors import KilnError

__all__ = ["CrossCompileError", "cross_compile", "target"]

ENV = "KILN_CROSS_COMPILE"

# torch dtype -> Triton's signature name for a pointer to it
_POINTEE = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "i1",
}


class CrossCompileError(KilnError):
    """A generated kernel the real Triton compiler refuses for the cross-compile target."""


compiled: set[tuple[str, tuple]] = set()
# A tool that wants every refusal of a model (benchmarks/cross_compile_models.py) sets
# `collect` to a list: refusals are appended there instead of raised.
collect: list[CrossCompileError] | None = None


def target() -> Any:
    """The `GPUTarget` named by `KILN_CROSS_COMPILE` ("cuda:90"), or None when unset."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    backend, _, arch = text.partition(":")
    if backend != "cuda" or not arch.isdigit():
        raise KilnError(f"{ENV}={text!r} is not 'cuda:<compute capability>'", stage="runtime",
                        hint=f"e.g. {ENV}=cuda:90 for the H200")
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", int(arch), 32)


def cross_compile(spec: Any, dtypes: Sequence[torch.dtype], meta: dict, options: dict) -> bool:
    """Compile `spec`'s kernel for the `KILN_CROSS_COMPILE` target with pointers of `dtypes`
    (one per `spec.args`), its constexprs `meta` and compile `options` (num_warps, ...); True
    when it compiled now, False when no target is set or this pair compiled before. Raises
    CrossCompileError when Triton refuses the kernel."""
    gpu = target()
    key = (spec.key, tuple(dtypes))
    if gpu is None or key in compiled or not all(d in _POINTEE for d in dtypes):
        return False  # (complex and float8 buffers never reach generated kernels)
    pointers = {name: "*" + _POINTEE[d] for name, d in zip(spec.arg_names, dtypes)}
    job = (spec.source, spec.name, spec.key, pointers, tuple(spec.size_args), dict(meta),
           dict(options), gpu.arch)
    error = _worker().submit(job)
    if error:
        refusal = CrossCompileError(
            f"{spec.name} does not compile for {os.environ[ENV]} "
            f"(dtypes {[str(d).removeprefix('torch.') for d in dtypes]}): {error}",
            stage="codegen", hint="the interpreter ran it; the GPU compiler refuses it")
        if collect is None:
            raise refusal
        collect.append(refusal)
    compiled.add(key)
    return True


_workers: list[Any] = []


class _Worker:
    """A Python running `cross_compile.main` without TRITON_INTERPRET (here `triton.language`
    was imported interpreted: its library functions are not compilable): jobs and answers as
    length-prefixed pickles over its stdin and stdout."""

    def __init__(self) -> None:
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.proc = subprocess.Popen([sys.executable, "-c",
                                      "from kiln.runtime.cross_compile import main; main()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def submit(self, job: tuple) -> str:
        _send(self.proc.stdin, job)
        answer = _receive(self.proc.stdout)
        if answer is None:
            raise KilnError("the cross-compile worker exited", stage="runtime",
                            hint="its stderr above says why")
        return answer


def _worker() -> _Worker:
    if not _workers or _workers[0].proc.poll() is not None:
        _workers[:] = [_Worker()]
    return _workers[0]


def _send(stream: Any, value: Any) -> None:
    import pickle

    data = pickle.dumps(value)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    import pickle

    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(int.from_bytes(head, "little")))


def _compile_job(job: tuple) -> str:
    """In the worker: import the kernel as a GPU run does (`triton_build.compile_kernel`, here
    without TRITON_INTERPRET) and compile it as a launch of these pointers would (16-byte
    aligned; sizes int32, unspecialized); "" or the error text."""
    source, name, key, pointers, size_args, meta, options, arch = job
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kiln.codegen.triton_build import compile_kernel

    try:
        fn = compile_kernel(types.SimpleNamespace(source=source, name=name, key=key))
        signature, constexprs, attrs = {}, {}, {}
        for i, param in enumerate(fn.arg_names):
            if param in meta:
                signature[param], constexprs[(i,)] = "constexpr", meta[param]
            elif param in size_args:
                signature[param] = "i32"
            elif param in pointers:
                signature[param] = pointers[param]
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                return f"parameter {param!r} is neither a buffer, a size nor a constexpr"
        triton.compile(ASTSource(fn, signature, constexprs, attrs),
                       target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as exc:  # Triton's CompilationError and the backends' RuntimeErrors
        return f"{type(exc).__name__}: {exc}"
    return ""


def main() -> None:
    """The worker loop: one job in, "" or the compile error out, until stdin closes."""
    import sys

    answers = sys.stdout.buffer
    sys.stdout = sys.stderr  # a print during a compile must not corrupt the answers
    while True:
        job = _receive(sys.stdin.buffer)
        if job is None:
            return
        _send(answers, _compile_job(job))
