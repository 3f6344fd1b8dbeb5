"""codegen: fused groups of the loop IR → Triton kernels.

Input: a `FusedGroup` from the schedule stage (`ComputedBuffer` members in order over one
iteration space, the buffers to store) and its `IRGraph`. Output: a `KernelSpec` (`kernel.py`):
a Triton module's source text (a header listing every member with its IR and FX provenance),
the buffer arguments in call order, constexpr meta, launch options, a grid function.

Steps: pick a `KernelConfig` (`kernel_configs.py`: pointwise, 2-D tiled pointwise, persistent or
looped reduction; block sizes, warps, stages; `candidate_configs` for autotuning), run the
members' bodies under one `TritonPrinter` (`group.py`, `triton_printer.py`, `reductions.py`) with
fused values kept in registers, wrap them in the kind's prologue and loops; `triton_build.py`
writes the source to a cache dir, imports it (`triton.jit` needs a real file) and launches it.

Invariants: static shapes are specialized into the source; masks are elided only where the
blocks divide the sizes; low-precision data is computed in float32 and rounded once at each
store; floor `//`/`%` is printed with Triton's truncating operators only for non-negative
dividends; every config of a group takes the same arguments. Never: decides fusion (the schedule
stage hands groups; codegen refuses a group it cannot serve from registers), allocates or orders
buffers (the wrapper does), or needs a GPU to emit source (CPU tests run it under
TRITON_INTERPRET=1).
"""
from __future__ import annotations

from kiln.codegen.kernel_configs import KernelConfig, candidate_configs
from kiln.codegen.kernel import KernelSpec, emit_group, emit_kernel
from kiln.codegen.triton_printer import CodegenError, TritonPrinter

__all__ = ["CodegenError", "KernelConfig", "KernelSpec", "TritonPrinter", "candidate_configs",
           "emit_group", "emit_kernel"]
