"""codegen: loop IR → Triton kernels.

Input: `ComputedBuffer`s of a lowered `IRGraph` (`kiln.lower`), later fused groups from the
schedule stage. Output: `KernelSpec`s (`kernel.py`): a Triton module's source text, the buffer
arguments in call order, constexpr meta, a grid function and the FX provenance (also written as
a comment header of the source).

Steps: run the node's body under `TritonPrinter` (`triton_printer.py`, one more ops handler),
wrap the printed statements in a pointwise (1-D, `XBLOCK`) or persistent-reduction
(`[XBLOCK=1, RBLOCK]`) prologue; `build.py` writes the source to a cache dir, imports it
(`triton.jit` needs a real file) and launches it on flat storages.

Invariants: static shapes are specialized into the source; loads and stores are masked;
low-precision data is computed in float32 and rounded once at the store (the IR's explicit
casts); floor `//`/`%` is printed with Triton's truncating operators only for non-negative
dividends. Never: fuses (the schedule stage hands fused groups), allocates or orders buffers (the
wrapper does), or needs a GPU to emit source (CPU tests run it under TRITON_INTERPRET=1).
"""
from __future__ import annotations

from kiln.codegen.kernel import KernelSpec, emit_kernel
from kiln.codegen.triton_printer import CodegenError, TritonPrinter

__all__ = ["CodegenError", "KernelSpec", "TritonPrinter", "emit_kernel"]
