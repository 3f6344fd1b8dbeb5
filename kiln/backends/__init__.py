"""backends: captured FX graph + example inputs → callable (torch.compile's backend contract).

Registered names: "eager" (run the captured graph), "aot_eager" (kiln's autograd stage: ATen
forward/backward graphs run by torch), "kiln" (autograd + lower + schedule + Triton codegen +
generated wrapper; `kiln_backend.py`), "inductor" (torch's, for comparison). Any
callable(gm, example_inputs) is a backend too.
"""

from __future__ import annotations

from kiln.backends import eager as _eager  # noqa: F401  (registers "eager" and "inductor")
from kiln.backends import aot_eager as _aot_eager  # noqa: F401  (registers "aot_eager")
from kiln.backends import kiln_backend as _kiln  # noqa: F401  (registers "kiln")
from kiln.backends.registry import Backend, list_backends, lookup_backend, register_backend

__all__ = ["Backend", "list_backends", "lookup_backend", "register_backend"]
