"""Reference backends: "eager" runs the captured FX graph as torch code; "inductor" hands the graph
to torch's own compiler (for comparison only, never used by kiln's pipeline)."""

from __future__ import annotations

from typing import Any, Callable

from kiln.backends.registry import register_backend

__all__ = ["eager", "inductor"]


@register_backend("eager")
def eager(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Run the captured graph unchanged: checks capture alone."""
    return gm.forward


@register_backend("inductor")
def inductor(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """torch's Inductor on kiln's captured graph (kiln capture + torch backend)."""
    from torch._inductor.compile_fx import compile_fx  # private torch API: comparison only

    return compile_fx(gm, example_inputs)
