"""runtime: ATen graph → a callable that runs generated kernels (the kiln backend's compiler).

Input: a functional ATen FX graph from the autograd stage (inference, forward or backward; nodes
carry `meta["val"]`) and its example (fake) inputs. Output: a `CompiledArtifact`, called like the
graph (`artifact(*inputs) -> tuple`).

Steps (`compile_graph`): lower → schedule → codegen (→ autotune under max-autotune) →
compile kernels → generate the wrapper (`wrapper.py`: readable Python of the whole per-call
program: allocations, pre-bound kernel launches, library calls, frees, outputs) → exec it.
Under `options.cudagraphs` (mode="reduce-overhead") `cudagraphs.py` replays that call as CUDA
graphs (policy there, device mechanism behind a small interface; docs/cudagraphs.md).
`debug.py` logs `output_code` / `fusion` and writes the `KILN_DEBUG_DIR` files;
`artifact_json.py` turns an artifact into plain data and back without tracing (the kiln
backend's warm start stores that data on disk).

Invariants: the wrapper reads no IR at run time (sizes and strides are literals); every buffer
is freed after its last reader; outputs carry eager's strides. Never: traces or differentiates
(the autograd stage does), picks fusion (schedule) or prints device code (codegen).
"""
from __future__ import annotations

from kiln.runtime.pipeline import CompiledArtifact, compile_graph
from kiln.runtime.wrapper import WrapperCode, generate_wrapper, load_wrapper

__all__ = ["CompiledArtifact", "WrapperCode", "compile_graph", "generate_wrapper", "load_wrapper"]
