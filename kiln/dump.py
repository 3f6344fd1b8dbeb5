"""`KILN_DEBUG_DIR=path`: one folder per compiled graph, one file per stage (a ground-floor
service: every stage writes its artifacts through it).

Folders are numbered in compile order (`<n>_<name>`). Capture writes one per captured frame
(`graph.py`, `guards.txt`, `entry.py`, `bytecode.txt`: kiln/capture/convert.py `dump_capture`);
the kiln backend one per ATen graph it compiles (docs/runtime.md).
"""
from __future__ import annotations

import itertools
import os
import re

from kiln.config import config

__all__ = ["new_dump_folder", "write_dump"]

_counter = itertools.count()


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
