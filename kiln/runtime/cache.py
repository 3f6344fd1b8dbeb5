"""cache: stable cache keys and small JSON caches on disk.

- `cache_key(*parts)`: a sha256 over a canonical serialization of its parts. Only values whose
  text is the same in every process are accepted (strings, numbers, tuples/lists, dicts and sets
  in sorted order, torch dtypes/devices/sizes, enums, dataclasses of those); an object whose only
  text would be a memory address (a function, a tensor) raises `TypeError` with a hint instead of
  silently making a key that differs per process.
- `versions()`: kiln, torch, triton, Python, CUDA and device name: part of every key whose value
  depends on the toolchain.
- `DiskCache(namespace)`: `get(key) -> dict | None`, `put(key, payload)`; one JSON file per key
  under `cache_root()/<namespace>/`. Writes go to a temporary file renamed into place
  (`os.replace` is atomic), so readers never see a partial entry and need no lock; an entry that
  does not parse, or belongs to another key or schema, reads as a miss (debug log).
- `cache_root()`: `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln` (a
  temporary folder if that cannot be created). `configure_triton_cache()` points Triton's binary
  cache (`TRITON_CACHE_DIR`) at `cache_root()/triton` unless the user set it.
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
import tempfile
import threading
from pathlib import Path, PurePath
from typing import Any

import torch

__all__ = [
    "DiskCache",
    "cache_key",
    "cache_root",
    "canonical",
    "configure_triton_cache",
    "tensor_meta",
    "versions",
]

log = logging.getLogger("kiln.runtime")

SCHEMA = 1  # bump when the meaning of a key or a payload changes: old entries then miss

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
    import kiln

    out = {
        "kiln": kiln.__version__,
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


# ---------------------------------------------------------------------------------------------
# the cache folder


def _default_root() -> Path:
    explicit = os.environ.get("KILN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kiln"


def cache_root() -> Path:
    """The folder holding kiln's caches (created). Read from the environment on every call, so
    a changed `KILN_CACHE_DIR` takes effect at once."""
    root = _default_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        fallback = Path(tempfile.gettempdir()) / f"kiln-cache-{uid}"
        log.debug("cache: cannot create %s (%s); using %s", root, exc, fallback)
        fallback.mkdir(parents=True, exist_ok=True)
        root = fallback
    return root


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


class DiskCache:
    """JSON payloads by key under `cache_root()/<namespace>/<key[:2]>/<key>.json`.

    Entries carry the schema and their key; anything else (a torn file from a crashed writer of
    an older kiln, a hand edit) reads as a miss. `put` writes atomically; last writer wins."""

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
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.debug("cache %s: cannot read %s: %s", self.namespace, path, exc)
            return None
        try:
            entry = json.loads(text)
        except ValueError as exc:
            log.debug("cache %s: ignoring corrupt entry %s: %s", self.namespace, path, exc)
            return None
        if (not isinstance(entry, dict) or entry.get("schema") != SCHEMA
                or entry.get("key") != key or not isinstance(entry.get("payload"), dict)):
            log.debug("cache %s: ignoring entry %s (other schema, key or shape)",
                      self.namespace, path)
            return None
        return entry["payload"]

    def put(self, key: str, payload: dict) -> Path:
        """Store `payload` (JSON-serializable; checked before anything touches the disk)."""
        if not isinstance(payload, dict):
            raise TypeError(f"DiskCache payloads are dicts, got {type(payload).__name__}")
        text = json.dumps({"schema": SCHEMA, "key": key, "payload": payload},
                          sort_keys=True, indent=1, allow_nan=False)
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)  # atomic within one file system
        finally:
            if tmp.exists():
                tmp.unlink()
        return path
