"""The disk caches cannot be turned against the user (docs/caching.md, "Threat model").

- The cache root is private (0700 folders, 0600 files); a root that another user owns or that
  group/others may write is refused with one warning, and the process caches in a fresh private
  folder instead (never a shared, predictable one).
- Entries are data: a content hash is verified on read; a mismatch, bytes that are not UTF-8,
  or a payload of the wrong shape is a miss and the next compile rewrites the entry.
- Code planted in any stored field never runs: the wrapper, a kernel source, a record type name,
  a dtype name, a kernel name, the kernel files and their `__pycache__`.
"""
from __future__ import annotations

import json
import logging
import os
import py_compile
import stat
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kiln.backends import warm_start  # noqa: E402
from kiln.backends.kiln_backend import kiln_backend  # noqa: E402
from kiln.codegen import triton_build  # noqa: E402
from kiln.config import config  # noqa: E402
from kiln.runtime import artifact_json, binaries, disk_cache  # noqa: E402
from kiln.runtime.disk_cache import DiskCache, cache_key, cache_root, entry_hash  # noqa: E402

FOREIGN_UID = 12345


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def root(tmp_path, monkeypatch):
    path = tmp_path / "home" / "kiln"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    return path


# -- the root --------------------------------------------------------------------------------------

def test_root_folders_are_0700_and_entries_0600(root):
    old = os.umask(0)  # the most permissive umask: modes must not depend on it
    try:
        assert cache_root() == root
        path = DiskCache("graphs").put(cache_key("k"), {"a": 1})
    finally:
        os.umask(old)
    for folder in (root.parent, root, path.parent.parent, path.parent):
        assert _mode(folder) == 0o700, folder
    assert _mode(path) == 0o600


@pytest.mark.parametrize("mode, who", [(0o777, "group and others"), (0o770, "group"),
                                       (0o703, "others")])
def test_a_group_or_world_writable_root_is_refused(root, caplog, mode, who):
    store = DiskCache("graphs")
    key = cache_key("k")
    store.put(key, {"planted": True})  # a valid entry, hash and all: still never read
    root.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        used = cache_root()
        assert store.get(key) is None
    assert used != root and _mode(used) == 0o700 and used.stat().st_uid == os.getuid()
    (record,) = [r for r in caplog.records if "not using" in r.getMessage()]
    text = record.getMessage()
    assert f"not using the cache folder {root}: {who} may write it (mode {mode:04o})" in text
    assert "Fix: set KILN_CACHE_DIR to a folder of your own, or delete this one" in text


@pytest.mark.skipif(not hasattr(os, "chown") or os.getuid() != 0, reason="needs root to chown")
def test_a_foreign_owned_root_is_refused(root, caplog):
    store = DiskCache("graphs")
    key = cache_key("k")
    store.put(key, {"planted": True})
    os.chown(root, FOREIGN_UID, FOREIGN_UID)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        assert cache_root() != root
        assert store.get(key) is None
    assert f"belongs to uid {FOREIGN_UID}, not to you (uid 0)" in caplog.text


def test_the_refusal_is_one_warning(root, caplog):
    root.mkdir(parents=True)
    root.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            cache_root()
    assert len([r for r in caplog.records if "not using" in r.getMessage()]) == 1


def test_an_uncreatable_root_falls_back_to_a_private_folder_not_a_shared_one(tmp_path,
                                                                             monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker / "kiln"))
    uid = os.getuid()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        used = cache_root()
    assert used.name.startswith("kiln-private-") and _mode(used) == 0o700
    assert used != Path("/tmp") / f"kiln-cache-{uid}"  # the old, predictable fallback
    assert f"not using the cache folder {blocker / 'kiln'}: it cannot be created" in caplog.text


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown")
def test_an_entry_or_shard_folder_not_private_to_the_user_is_a_miss(root, caplog):
    store = DiskCache("graphs")
    key = cache_key("k")
    path = store.put(key, {"a": 1})
    for target, change in ((path, lambda p: p.chmod(0o666)),
                           (path, lambda p: os.chown(p, FOREIGN_UID, FOREIGN_UID)),
                           (path.parent, lambda p: p.chmod(0o777))):
        change(target)
        with caplog.at_level(logging.DEBUG, logger="kiln.runtime"):
            assert store.get(key) is None
        assert "ignoring entry" in caplog.text
        os.chown(target, os.getuid(), os.getgid())
        target.chmod(0o700 if target.is_dir() else 0o600)
        assert store.get(key) == {"a": 1}


def test_kernel_source_folder_is_checked_too(tmp_path, monkeypatch, caplog):
    loose = tmp_path / "kernels"
    loose.mkdir()
    loose.chmod(0o777)
    monkeypatch.setenv("KILN_CODEGEN_CACHE_DIR", str(loose))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        assert triton_build.cache_dir() != loose
    assert f"not using the kernel source folder (KILN_CODEGEN_CACHE_DIR) {loose}" in caplog.text


# -- entries -------------------------------------------------------------------------------------

def _entry_file(store: DiskCache, key: str) -> Path:
    return store.path(key)


def _edit(path: Path, mutate, rehash: bool = False) -> None:
    """Change a stored entry's payload in place; `rehash` also recomputes its content hash
    (an attacker who knows the format: only the shape checks and allowlists stop that)."""
    entry = json.loads(path.read_text())
    mutate(entry["payload"])
    if rehash:
        entry["sha256"] = entry_hash(entry["namespace"], entry["key"], entry["payload"])
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize("damage", [
    b"\xff\xfe\x00garbage\x80",  # not UTF-8: raised UnicodeDecodeError before
    os.urandom(64) + b"\xff",
    b'{"schema": 2}',
])
def test_undecodable_entries_are_misses_and_heal(root, caplog, damage):
    store = DiskCache("autotune")
    key = cache_key("k")
    path = store.put(key, {"choice": 1})
    path.write_bytes(damage)
    with caplog.at_level(logging.DEBUG, logger="kiln.runtime"):
        assert store.get(key) is None
    assert "ignoring entry" in caplog.text
    store.put(key, {"choice": 2})
    assert store.get(key) == {"choice": 2}


def test_valid_json_with_other_content_fails_the_hash(root, caplog):
    store = DiskCache("graphs")
    key = cache_key("k")
    path = store.put(key, {"grid": [4, 1, 1], "XBLOCK": 128})
    _edit(path, lambda p: p.update(grid=[1, 1, 1]))
    with caplog.at_level(logging.DEBUG, logger="kiln.runtime"):
        assert store.get(key) is None
    assert "content hash mismatch" in caplog.text


def test_an_entry_copied_to_another_namespace_or_key_is_a_miss(root):
    graphs, other = DiskCache("graphs"), DiskCache("binaries")
    key, key2 = cache_key("a"), cache_key("b")
    path = graphs.put(key, {"x": 1})
    target = other.path(key)
    target.parent.mkdir(parents=True)
    target.write_bytes(path.read_bytes())
    assert other.get(key) is None
    moved = graphs.path(key2)
    moved.parent.mkdir(parents=True, exist_ok=True)
    moved.write_bytes(path.read_bytes())
    assert graphs.get(key2) is None


# -- planted code in a graph entry ---------------------------------------------------------------

def _graph(x, y):
    return (torch.sin(x) * y + 1.0, x.sum(-1))


@pytest.fixture
def stored(root, monkeypatch, tmp_path):
    """Compile `_graph` once (stored in the warm cache); return a function that compiles it
    again (a fresh process would do the same) and checks the result against eager."""
    config.cpu_codegen = "triton_interpret"
    config.suppress_errors = False

    def compile_and_check():
        triton_build._compiled.clear()  # as in a new process: kernels built again from sources
        x, y = torch.randn(4, 16), torch.randn(4, 16)
        with torch.no_grad():
            out = kiln_backend(torch.fx.symbolic_trace(_graph), [x, y])(x, y)
        for got, want in zip(out, _graph(x, y)):
            torch.testing.assert_close(got, want)

    compile_and_check()
    (entry,) = (root / warm_start.NAMESPACE).rglob("*.json")
    return compile_and_check, entry


def _marker_code(marker: Path) -> str:
    return f"import pathlib as _p; _p.Path({str(marker)!r}).write_text('ran')\n"


def _plant_wrapper(p, code):
    p["wrapper"] = code + p["wrapper"]


def _plant_source(p, code):
    p["kernels"][0]["source"] = code + p["kernels"][0]["source"]


def _plant_record_type(p, code):
    command = f"python3 -c \"{code.strip()}\""
    p["kernels"][0]["config"] = {"__dataclass__": "os:system", "fields": {"command": command}}


def _plant_dtype(p, code):
    p["dtypes"] = {name: "load" for name in p["dtypes"]}  # getattr(torch, "load") before


def _plant_name(p, code):
    p["kernels"][0]["name"] = "x;" + code.strip()


PLANTS = [_plant_wrapper, _plant_source, _plant_record_type, _plant_dtype, _plant_name]


@pytest.mark.parametrize("rehash", [False, True], ids=["hash-stale", "hash-recomputed"])
@pytest.mark.parametrize("plant", PLANTS, ids=lambda f: f.__name__.removeprefix("_plant_"))
def test_planted_code_in_a_stored_field_does_not_run(stored, tmp_path, plant, rehash):
    compile_and_check, entry = stored
    if rehash and plant in (_plant_wrapper, _plant_source):
        pytest.skip("code with a valid hash runs: only the owner can write there (threat model)")
    marker = tmp_path / "marker"
    _edit(entry, lambda p: plant(p, _marker_code(marker)), rehash=rehash)
    misses = warm_start.STATS["misses"]
    compile_and_check()
    assert not marker.exists(), "planted code ran"
    assert warm_start.STATS["misses"] == misses + 1
    payload = DiskCache(warm_start.NAMESPACE).get(entry.stem)  # rewritten by the cold compile
    assert payload is not None and "_p.Path" not in json.dumps(payload) and \
        "os:system" not in json.dumps(payload)
    hits = warm_start.STATS["hits"]
    compile_and_check()
    assert warm_start.STATS["hits"] == hits + 1


@pytest.mark.parametrize("damage", ["bytes", "schema"])
def test_a_damaged_graph_entry_is_rewritten_by_the_next_compile(stored, damage):
    compile_and_check, entry = stored
    if damage == "bytes":
        entry.write_bytes(b"\x80\x81" + os.urandom(32))
    else:  # valid JSON, valid hash, wrong shape
        _edit(entry, lambda p: p.update(kernels="not a list"), rehash=True)
    stores = warm_start.STATS["stores"]
    compile_and_check()
    assert warm_start.STATS["stores"] == stores + 1
    assert warm_start.check_payload(DiskCache(warm_start.NAMESPACE).get(entry.stem)) is None


def test_planted_kernel_files_and_bytecode_do_not_run(stored, root, tmp_path):
    """Kernels run their source from memory: neither the file on disk nor a `__pycache__`
    entry (an unchecked-hash .pyc would be loaded whatever the .py says) is executed."""
    compile_and_check, _ = stored
    marker = tmp_path / "marker"
    kernels = sorted((root / "kernels").glob("*.py"))
    assert kernels
    for path in kernels:
        planted = path.with_name("planted_src.py")
        planted.write_text(_marker_code(marker) + path.read_text())
        pyc = Path(_cache_tag_path(path))
        py_compile.compile(str(planted), cfile=str(pyc),
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        path.write_text(planted.read_text())
        planted.unlink()
    for name in [m for m in sys.modules if m.startswith("kiln_codegen_")]:
        del sys.modules[name]
    compile_and_check()
    assert not marker.exists(), "a planted kernel file ran"
    assert all(_marker_code(marker) not in p.read_text() for p in kernels)  # rewritten


def _cache_tag_path(path: Path) -> str:
    import importlib.util

    return importlib.util.cache_from_source(str(path))


# -- binaries --------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("hash", "../../elsewhere"), ("hash", 3),
                                          ("signature", [["x", 1]]), ("constants", "x")])
def test_a_malformed_binary_entry_is_a_miss(root, field, value):
    import types

    entry = {"hash": "ab" * 32, "name": "k", "signature": [["in_ptr0", "*fp32"]],
             "constants": [[[1], 128]]}
    assert binaries.well_formed(entry)
    entry[field] = value
    assert not binaries.well_formed(entry)
    launcher = types.SimpleNamespace(spec=types.SimpleNamespace(source="src"), meta={},
                                     options={}, name="k", fn=None)
    DiskCache(binaries.NAMESPACE).put(binaries.binary_key(launcher, [torch.float32]), entry)
    misses = binaries.STATS["misses"]
    assert binaries.recall(launcher, [torch.float32]) is None
    assert binaries.STATS["misses"] == misses + 1


def test_private_root_is_one_per_process():
    assert disk_cache.private_root() == disk_cache.private_root()
    assert _mode(disk_cache.private_root()) == 0o700


def test_the_kernel_schema_names_every_kernelspec_field():
    """A field added to KernelSpec but not to the warm-start schema made every stored graph a
    miss (the schema check refused it): the two must list the same fields."""
    import dataclasses
    from kiln.codegen.kernel import KernelSpec
    assert set(artifact_json._KERNEL_FIELDS) == {f.name for f in dataclasses.fields(KernelSpec)}

