"""disk_cache: stable cache keys and small JSON caches on disk.

- `cache_key(*parts)`: a sha256 over a canonical serialization of its parts. Only values whose
  text is the same in every process are accepted (strings, numbers, tuples/lists, dicts and sets
  in sorted order, torch dtypes/devices/sizes, enums, dataclasses of those); an object whose only
  text would be a memory address (a function, a tensor) raises `TypeError` with a hint instead of
  silently making a key that differs per process.
- `versions()`: kiln, torch, triton, Python, CUDA and device name: part of every key whose value
  depends on the toolchain.
- `DiskCache(namespace)`: `get(key) -> dict | None`, `put(key, payload)`; one JSON file per key
  under `cache_root()/<namespace>/`, carrying a sha256 of its content. Writes go to a temporary
  file (mode 0600) renamed into place (`os.replace` is atomic), so readers never see a partial
  entry and need no lock; an entry that does not decode, belongs to another key, namespace or
  schema, fails its hash or is not private to this user reads as a miss (debug log) and the
  next `put` replaces it.
- `cache_root()`: `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`, created
  0700. A root that another user owns, that group/others may write or that cannot be created
  is refused with one warning; the process then caches in a private `mkdtemp` folder.
  `configure_triton_cache()` points Triton's binary cache (`TRITON_CACHE_DIR`) at
  `cache_root()/triton` unless the user set it. Threat model: docs/caching.md.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import logging
import math
import os
import platform
import threading
from pathlib import Path, PurePath
from typing import Any

import torch

from kiln.paths import (cache_root, folder_problem, make_private_dir, mode_problem, private_root,
                        trusted_folder)
from kiln.version import __version__

__all__ = [
    "CorruptEntry",
    "DiskCache",
    "cache_key",
    "cache_root",
    "canonical",
    "configure_triton_cache",
    "entry_hash",
    "folder_problem",
    "make_private_dir",
    "private_root",
    "tensor_meta",
    "trusted_folder",
    "versions",
]

log = logging.getLogger("kiln.runtime")

SCHEMA = 2  # bump when the meaning of a key or a payload changes: old entries then miss

# ---------------------------------------------------------------------------------------------
# canonical serialization


def _float_text(x: float) -> str:
    # repr round-trips and is identical everywhere; nan/inf spelled out (JSON has no literal)
    return repr(x) if math.isfinite(x) else str(x)


def canonical(value: Any) -> Any:
    """`value` as nested JSON-ready lists, each tagged with its kind, so that `1`, `1.0`, `True`,
    `"1"`, `(1,)` and `[1]` all serialize differently and dicts/sets do not depend on insertion
    order. Raises `TypeError` for values without a process-independent text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, enum.Enum):  # before int: IntEnum members are ints
        return ["enum", type(value).__qualname__, value.name]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", _float_text(value)]
    if isinstance(value, torch.Size):
        return ["size", [int(s) for s in value]]
    if isinstance(value, (tuple, list)):
        tag = "tuple" if isinstance(value, tuple) else "list"
        return [tag, [canonical(v) for v in value]]
    if isinstance(value, dict):
        items = [[canonical(k), canonical(v)] for k, v in value.items()]
        return ["dict", sorted(items, key=_dumps)]
    if isinstance(value, (set, frozenset)):
        return ["set", sorted((canonical(v) for v in value), key=_dumps)]
    if isinstance(value, torch.dtype):
        return ["dtype", str(value)]
    if isinstance(value, torch.device):
        return ["device", str(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", bytes(value).hex()]
    if isinstance(value, PurePath):
        return ["path", value.as_posix()]
    return _canonical_object(value)


def _canonical_object(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        raise TypeError("cache_key does not hash tensors: pass tensor_meta(t) for its metadata, "
                        "or its values as bytes (t.cpu().numpy().tobytes()) if they matter")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [[f.name, canonical(getattr(value, f.name))] for f in dataclasses.fields(value)]
        return ["dataclass", type(value).__qualname__, fields]
    hook = getattr(value, "__kiln_cache_key__", None)
    if callable(hook):
        return ["object", type(value).__qualname__, canonical(hook())]
    raise TypeError(f"cache_key cannot serialize a {type(value).__qualname__} the same way in "
                    "every process (its default text is a memory address); pass its defining "
                    "parts instead, or give the class a __kiln_cache_key__() method")


def _dumps(tree: Any) -> str:
    return json.dumps(tree, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def cache_key(*parts: Any) -> str:
    """sha256 (hex) of the canonical serialization of `parts`: equal in every process for equal
    parts, different when any part differs."""
    text = _dumps(["kiln-cache-key", SCHEMA, canonical(parts)])
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def tensor_meta(t: torch.Tensor) -> tuple:
    """The metadata of a tensor that a compiled graph depends on (not its values)."""
    return (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.device),
            bool(t.requires_grad))


@functools.lru_cache(maxsize=None)
def versions() -> dict[str, str]:
    """Versions of everything a compiled artifact depends on (cached per process)."""
    out = {
        "kiln": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "triton": _triton_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        out["device"] = props.name
        out["capability"] = f"{props.major}.{props.minor}"
        out["sm_count"] = str(props.multi_processor_count)
    return out


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return str(triton.__version__)


_triton_dir_we_set: str | None = None


def configure_triton_cache() -> str:
    """Point Triton's binary cache inside kiln's cache unless the user chose one; return the
    folder in use. Triton reads `TRITON_CACHE_DIR` when it compiles, so call this before."""
    global _triton_dir_we_set
    current = os.environ.get("TRITON_CACHE_DIR")
    if current and current != _triton_dir_we_set:
        return current  # the user's choice
    path = str(cache_root() / "triton")
    os.environ["TRITON_CACHE_DIR"] = path
    _triton_dir_we_set = path
    return path


# ---------------------------------------------------------------------------------------------
# JSON entries on disk


class CorruptEntry(Exception):
    """Why an entry on disk reads as a miss (logged at debug; the next `put` replaces it)."""


class DiskCache:
    """JSON payloads by key under `cache_root()/<namespace>/<key[:2]>/<key>.json`.

    An entry is `{"schema", "namespace", "key", "sha256", "payload"}`; `sha256` covers the
    other four (the payload canonically: sorted keys, so every field and every kernel source in
    it). Anything else reads as a miss: bytes that are not UTF-8 JSON, another schema, key or
    namespace, a hash mismatch (a torn write, a hand edit, a flipped bit), a file or folder that
    another user owns or that group/others may write. `put` writes atomically (mode 0600); the
    last writer wins."""

    def __init__(self, namespace: str):
        if not namespace or not namespace.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"DiskCache namespace must be a plain name, got {namespace!r}")
        self.namespace = namespace

    @property
    def folder(self) -> Path:
        return cache_root() / self.namespace

    def path(self, key: str) -> Path:
        if not key or not all(c.isalnum() or c in "-_" for c in key):
            raise ValueError(f"cache keys are plain names (cache_key() gives hex), got {key!r}")
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self.path(key)
        try:
            data = _read_private(path)
            if data is None:
                return None
            return self._payload(key, data)
        except CorruptEntry as why:
            log.debug("cache %s: ignoring entry %s: %s", self.namespace, path, why)
            return None

    def _payload(self, key: str, data: bytes) -> dict:
        try:
            entry = json.loads(data.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise CorruptEntry(f"not UTF-8 JSON ({type(exc).__name__}: {exc})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("payload"), dict):
            raise CorruptEntry("not an entry object")
        if (entry.get("schema"), entry.get("namespace"), entry.get("key")) != \
                (SCHEMA, self.namespace, key):
            raise CorruptEntry("other schema, namespace or key")
        if entry.get("sha256") != entry_hash(self.namespace, key, entry["payload"]):
            raise CorruptEntry("content hash mismatch")
        return entry["payload"]

    def put(self, key: str, payload: dict) -> Path:
        """Store `payload` (JSON-serializable; checked before anything touches the disk)."""
        if not isinstance(payload, dict):
            raise TypeError(f"DiskCache payloads are dicts, got {type(payload).__name__}")
        # the stored form (tuples → lists, keys → strings) is what the hash is computed over
        plain = json.loads(json.dumps(payload, allow_nan=False))
        entry = {"schema": SCHEMA, "namespace": self.namespace, "key": key,
                 "sha256": entry_hash(self.namespace, key, plain), "payload": plain}
        text = json.dumps(entry, sort_keys=True, indent=1, allow_nan=False)
        path = self.path(key)
        make_private_dir(path.parent)
        _write_private(path, text.encode("utf-8"))
        return path


def entry_hash(namespace: str, key: str, payload: dict) -> str:
    """sha256 over an entry's schema, namespace, key and canonical payload."""
    text = json.dumps(["kiln-entry", SCHEMA, namespace, key, payload], sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _read_private(path: Path) -> bytes | None:
    """The bytes of the entry at `path`, None when there is none; raises `CorruptEntry` when
    the file or a folder above it (up to the cache root) is not private to this user."""
    for folder in (path.parent, path.parent.parent):
        problem = folder_problem(folder) if folder.exists() else None
        if problem is not None:
            raise CorruptEntry(f"its folder {folder}: {problem}")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CorruptEntry(f"cannot open it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as file:
        problem = mode_problem(os.fstat(file.fileno()), "file")
        if problem is not None:
            raise CorruptEntry(problem)
        return file.read()


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (a temporary file renamed into place), mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)  # atomic within one file system
    finally:
        if tmp.exists():
            tmp.unlink()
