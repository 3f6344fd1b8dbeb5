"""The "aot_eager" backend: kiln's autograd stage with graphs run as torch code.

The captured graph is traced to functional ATen forward/backward graphs (`kiln.autograd`), and
the forward and backward compilers are the identity: each GraphModule runs as it is. This checks
capture + autograd without any code generation. A graph captured with symbolic sizes is traced
once, symbolically, and its graphs run for every size; when that trace fails, the autograd stage
traces it per set of input sizes instead (`kiln/autograd/size_variants.py`).
"""
from __future__ import annotations

from typing import Any, Callable

from kiln.autograd import aot_compile
from kiln.backends.registry import register_backend

__all__ = ["aot_eager"]


@register_backend("aot_eager")
def aot_eager(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Capture + kiln autograd; the ATen graphs run as torch code."""
    return aot_compile(gm, list(example_inputs), symbolic=True)
