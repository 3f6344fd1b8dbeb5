"""`KILN_DEBUG_DIR=path`: one folder per compiled graph, one file per stage.

Each folder (`<n>_<function>`) holds what capture produced: `graph.py` (the FX graph as runnable
Python), `guards.txt` (each guard with the user line it protects), `entry.py` (the generated entry
body: inputs, graph call, side effects, result) and `bytecode.txt` (the canonical instructions
capture interpreted). The kiln backend writes one more folder per ATen graph it compiles
(`<n>_<graph name>`, through `new_dump_folder` / `write_dump`; see docs/runtime.md).
"""
from __future__ import annotations

import itertools
import os
import re
import types
from typing import Any

from kiln.config import config

__all__ = ["dump_capture", "new_dump_folder", "write_dump"]

_counter = itertools.count()


def dump_capture(code: types.CodeType, gm: Any, guards: list, body: list[str]) -> str | None:
    """Write the capture stage's artifacts for one graph; returns the folder (None when off)."""
    root = config.debug_dir
    if not root:
        return None
    name = re.sub(r"[^0-9A-Za-z_]+", "_", code.co_qualname)[:80]
    folder = os.path.join(root, f"{next(_counter):04d}_{name}")
    os.makedirs(folder, exist_ok=True)
    from kiln.capture.bytecode import decode, format_instrs
    files = {
        "graph.py": gm.print_readable(print_output=False) if gm is not None else "# no graph\n",
        "guards.txt": "\n".join(g.record().render() for g in guards) + "\n",
        "entry.py": "def entry(...):\n" + "".join(f"    {line}\n" for line in body),
        "bytecode.txt": format_instrs(decode(code)) + "\n",
    }
    for filename, text in files.items():
        with open(os.path.join(folder, filename), "w") as f:
            f.write(text)
    return folder


def new_dump_folder(name: str) -> str | None:
    """A fresh folder `<n>_<name>` under `KILN_DEBUG_DIR` (numbered with the capture folders, so
    they sort in compile order); None when dumping is off."""
    root = config.debug_dir
    if not root:
        return None
    safe = re.sub(r"[^0-9A-Za-z_]+", "_", name)[:80]
    folder = os.path.join(root, f"{next(_counter):04d}_{safe}")
    os.makedirs(folder, exist_ok=True)
    return folder


def write_dump(folder: str, files: dict[str, str]) -> None:
    """Write `files` (relative path → text) under `folder`, creating subfolders."""
    for relative, text in files.items():
        path = os.path.join(folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
