"""settings: `CompileSettings`, what one `kiln.compile` call fixes for every frame it compiles
(backend, fullgraph, mode, options, dynamic), and the cache key they make.

Below the frame compiler (`convert.py`), the break machinery (`breaks.py`) and the entry code
builder (`entry.py`), which all carry it; `kiln.capture.convert` re-exports it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = ["CompileSettings"]


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    backend: Callable
    backend_name: str
    fullgraph: bool = False
    mode: str | None = None
    options: tuple = ()
    dynamic: bool | None = None  # kiln.compile(dynamic=...): see capture/dynamic_dims.py

    def key(self) -> tuple:
        return (self.backend, self.fullgraph, self.mode, self.options, self.dynamic)
