"""The environment of a child Python process that a test starts (`python -m kiln ...`, a script).

The child imports kiln from this checkout and everything else the way the parent does: the repo
root goes in front of the parent's PYTHONPATH, which is kept (on the GPU machine kiln is not
installed and `bytecode` comes from PYTHONPATH=/tmp/site:..., so replacing it breaks the child).
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROOT", "child_env"]

ROOT = Path(__file__).resolve().parents[1]


def child_env(base: dict[str, str] | None = None, **overrides: str) -> dict[str, str]:
    """`base` (default: os.environ) with the repo root prepended to its PYTHONPATH, then
    `overrides` on top."""
    env = dict(os.environ if base is None else base)
    paths = [str(ROOT), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env.update(overrides)
    return env
