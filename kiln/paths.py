"""Where kiln keeps files between processes, and whether a folder is safe to read code from.

A ground-floor service (docs/architecture.md): the runtime's caches, the kernel sources written by
codegen and the report's ceilings all live under `cache_root()`. The folder is private to its
user; see docs/caching.md, "Threat model".
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from kiln.logs import warn_once

__all__ = ["cache_root", "folder_problem", "make_private_dir", "mode_problem", "private_root",
           "trusted_folder"]

log = logging.getLogger("kiln.runtime")  # the logger users already filter cache warnings by


def _default_root() -> Path:
    explicit = os.environ.get("KILN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kiln"


def cache_root() -> Path:
    """The folder holding kiln's caches (created with mode 0700). Read from the environment on
    every call, so a changed `KILN_CACHE_DIR` takes effect at once.

    Whoever can write this folder can make kiln run code (entries hold wrapper and kernel
    sources; Triton's binaries live under it), so a folder that belongs to another user or that
    group or others may write is refused: one warning names it and the fix, and this process
    caches in a private temporary folder instead (never a shared, predictable one)."""
    return trusted_folder(_default_root(), "cache folder",
                          "set KILN_CACHE_DIR to a folder of your own, or delete this one "
                          "(kiln recreates it with mode 0700)")


def trusted_folder(path: Path, what: str, fix: str) -> Path:
    """`path` (created private if missing) when it is safe to read code from, else this
    process's private temporary folder, after one warning naming `path`, the reason and `fix`."""
    try:
        make_private_dir(path)
    except OSError as exc:
        return _refuse(path, what, f"it cannot be created ({exc.strerror or exc})", fix)
    problem = folder_problem(path)
    if problem is None and not os.access(path, os.W_OK | os.X_OK):
        problem = "it is not writable"
    if problem is not None:
        return _refuse(path, what, problem, fix)
    return path


def make_private_dir(path: Path) -> None:
    """Create `path` and any missing parents; the folders created here get mode 0700."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # a concurrent process made it: checked like any other
            continue


def folder_problem(path: Path) -> str | None:
    """Why the existing folder `path` must not be trusted (None: it is safe): it is not a
    folder, it belongs to another user, or group or others may write it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    return mode_problem(st, "folder")


def mode_problem(st: os.stat_result, kind: str) -> str | None:
    if kind == "folder" and not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if not hasattr(os, "getuid"):  # no POSIX owners (Windows): nothing to compare
        return None
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                           if st.st_mode & bit)
        return f"{who} may write it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _refuse(path: Path, what: str, problem: str, fix: str) -> Path:
    private = private_root()
    warn_once(("cache-refused", str(path), problem),
              f"kiln: not using the {what} {path}: {problem}. This process caches in the "
              f"private folder {private} instead (nothing is reused across processes). "
              f"Fix: {fix}.", log)
    return private


_private: list[Path] = []


def private_root() -> Path:
    """A fresh folder only this process uses (mkdtemp: mode 0700, unpredictable name), removed
    at exit."""
    if not _private:
        path = Path(tempfile.mkdtemp(prefix="kiln-private-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _private.append(path)
    return _private[0]
