"""binaries: compiled kernel binaries found again in a new process without asking Triton.

`triton.compile` (behind `fn.warmup`) derives its cache key from a hash of Triton's own sources
and its ~100 MB shared library before it can look at its disk cache: ~0.4 s once per process,
most of a warm start (benchmarks/RESULTS.md). kiln already knows what a binary depends on — the
kernel source, the argument dtypes, the constexprs, the launch options, the device and the
toolchain versions — so after a compile it records, under a kiln key of those, where Triton put
the binary (Triton's cache hash and kernel name) and the argument signature the launcher needs.
A later process with the same key loads the stored binary directly
(`CompiledKernel(src, metadata_group, hash)`: Triton's own loading route, minus the compile).

Entries are verified like every `DiskCache` entry (content hash, owner, modes) and by shape.
Anything unexpected — a missing, malformed or foreign entry, a Triton without these internals, a binary
deleted from Triton's cache — reads as a miss and the kernel compiles as before.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from kiln.config import config
from kiln.runtime.disk_cache import DiskCache, cache_key, versions

__all__ = ["STATS", "binary_key", "recall", "remember", "well_formed"]

log = logging.getLogger("kiln.runtime")

NAMESPACE = "binaries"
STATS = {"recalled": 0, "remembered": 0, "misses": 0}  # this process's counts (tests, reports)
_PLAIN = (bool, int, float, str, type(None))


def binary_key(launcher: Any, dtypes: Sequence[torch.dtype]) -> str:
    """What the binary of `launcher` compiled for pointer arguments of `dtypes` depends on.
    `launcher.options` holds the compile options too (`KernelSpec.compile_options`:
    `enable_fp_fusion`, `debug`), so a binary built with FMA contraction never serves a launcher
    without it."""
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return cache_key("kiln-binary", launcher.spec.source, [str(d) for d in dtypes],
                     sorted(launcher.meta.items()), sorted(launcher.options.items()),
                     capability, versions())


def remember(launcher: Any, dtypes: Sequence[torch.dtype]) -> bool:
    """Record where Triton stored `launcher.kernel` (a compiled CompiledKernel)."""
    if not config.binary_cache:
        return False
    kernel = launcher.kernel
    try:
        src = kernel.src
        constants = [[list(k), v] for k, v in src.constants.items()]
        # a list of pairs: the parameters' order is the launcher's argument order (a dict would
        # come back key-sorted from the JSON file)
        signature = [[name, kind] for name, kind in src.signature.items()]
        entry = {"hash": kernel.hash, "name": kernel.name, "signature": signature,
                 "constants": constants}
        if not all(isinstance(v, _PLAIN) for _, v in constants) or \
                not all(isinstance(kind, str) for _, kind in signature):
            return False
        DiskCache(NAMESPACE).put(binary_key(launcher, dtypes), entry)
    except (AttributeError, TypeError, ValueError, OSError) as why:
        log.debug("binaries: %s not recorded (%s)", launcher.name, why)
        return False
    STATS["remembered"] += 1
    return True


def recall(launcher: Any, dtypes: Sequence[torch.dtype]) -> Any | None:
    """The stored binary of `launcher` for `dtypes` as a CompiledKernel, or None."""
    if not config.binary_cache:
        return None
    entry = DiskCache(NAMESPACE).get(binary_key(launcher, dtypes))
    if entry is not None and not well_formed(entry):
        log.debug("binaries: ignoring a malformed entry for %s", launcher.name)
        entry = None
    if entry is None:
        STATS["misses"] += 1
        return None
    try:
        kernel = _load(launcher.fn, entry)
    except Exception as why:  # a stale entry or another Triton: compile instead
        log.debug("binaries: %s not loaded (%s: %s)", launcher.name, type(why).__name__, why)
        kernel = None
    if kernel is None:
        STATS["misses"] += 1
        return None
    STATS["recalled"] += 1
    return kernel


def well_formed(entry: dict) -> bool:
    """Whether `entry` has the shape `remember` writes. Its `hash` names a folder of Triton's
    cache, so it must be a plain name (never a path)."""
    plain_name = isinstance(entry.get("hash"), str) and entry["hash"].isalnum()
    signature, constants = entry.get("signature"), entry.get("constants")
    return (plain_name and isinstance(entry.get("name"), str)
            and isinstance(signature, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                for p in signature)
            and isinstance(constants, list) and all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], list)
                and all(type(i) is int for i in c[0]) and isinstance(c[1], _PLAIN)
                for c in constants))


def _load(fn: Any, entry: dict) -> Any | None:
    from triton.compiler import ASTSource, CompiledKernel
    from triton.runtime.cache import get_cache_manager

    manager = get_cache_manager(entry["hash"])
    # Triton names the group file after the kernel (truncated when long): find it
    names = sorted(Path(manager.cache_dir).glob("__grp__*.json"))
    group = manager.get_group(names[0].name.removeprefix("__grp__")) if len(names) == 1 else None
    if not group:
        return None  # Triton's cache was cleared since
    signature = {name: kind for name, kind in entry["signature"]}
    if list(signature) != list(fn.arg_names):
        return None  # not this function's parameters, in its order
    constexprs = {tuple(k): v for k, v in entry["constants"]}
    src = ASTSource(fn, signature, constexprs)
    return CompiledKernel(src, group, entry["hash"])
