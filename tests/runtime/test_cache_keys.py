"""kiln.runtime.disk_cache: stable keys across processes, JSON entries on disk (atomic, corruption
ignored), the cache folder and Triton's binary cache inside it."""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from child_env import child_env
from kiln.runtime import disk_cache
from kiln.runtime.disk_cache import (DiskCache, cache_key, cache_root, canonical,
                                configure_triton_cache, tensor_meta, versions)

REPO = Path(__file__).resolve().parents[2]

# The same graph + metadata key, computed here and in a fresh interpreter (another hash seed:
# set and dict iteration order differ between the two processes), on the device named by argv[1].
KEY_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from kiln.codegen import emit_kernel
    from kiln.lower import lower_graph
    from kiln.lower.decomposition_tables import trace_aten
    from kiln.runtime.disk_cache import cache_key, tensor_meta, versions

    def fn(x, y):
        return (x * y).sum(-1) + torch.sigmoid(y).amax(-1)

    device = torch.device(sys.argv[1])
    torch.manual_seed(0)
    x = torch.randn(4, 8, device=device)
    y = torch.randn(4, 8, dtype=torch.float64, device=device)
    gm = trace_aten(fn, x, y)
    graph = lower_graph(gm)
    sources = [emit_kernel(node, graph).source for node in graph.computed]
    meta = {"inputs": [tensor_meta(x), tensor_meta(y)], "device": device,
            "flags": {"fuse", "tune", "cudagraphs", "inplace"}, "size": torch.Size([4, 8]),
            "options": {"b": 2.5, "a": (1, None, True), "nan": float("nan")}}
    print(cache_key(gm.code, sources, meta, versions()))
""")


def _key_in_subprocess(seed: str, device: torch.device) -> str:
    out = subprocess.run([sys.executable, "-c", KEY_SCRIPT, device.type],
                         env=child_env(PYTHONHASHSEED=seed), cwd=REPO, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.explicit_device  # both processes put the tensors on the test device themselves
def test_key_identical_across_processes(device):
    namespace: dict = {}
    here = (KEY_SCRIPT.replace("print(cache_key(", "KEY = (cache_key(")
            .replace("sys.argv[1]", repr(device.type)))
    exec(compile(here, "<key script>", "exec"), namespace)
    there = _key_in_subprocess("12345", device)
    assert len(namespace["KEY"]) == 64 and namespace["KEY"] == there
    assert namespace["x"].device.type == device.type  # the key covered the test device


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass(frozen=True)
class Config:
    block: int
    warps: int


BASE = ("graph text", 1, 2.0, (3, 4), {"a": 1, "b": [1, 2]}, torch.float32,
        torch.device("cpu"), torch.Size([2, 3]), Color.RED, Config(64, 4), frozenset({1, 2}))

# every variant changes one part a little (position in BASE, new value), some by type only
VARIANTS = {
    "text": (0, "graph text!"), "int_vs_float": (1, 1.0), "int_vs_bool": (1, True),
    "int_vs_str": (1, "1"), "float": (2, 2.0000001), "tuple_vs_list": (3, [3, 4]),
    "dict_value": (4, {"a": 1, "b": [1, 3]}), "dict_key": (4, {"a": 1, "c": [1, 2]}),
    "dtype": (5, torch.float16), "device": (6, torch.device("cuda", 0)),
    "size": (7, torch.Size([3, 2])), "size_vs_tuple": (7, (2, 3)), "enum": (8, Color.BLUE),
    "dataclass": (9, Config(64, 8)), "set": (10, frozenset({1, 3})),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_key_changes_with_any_part(name):
    position, value = VARIANTS[name]
    parts = list(BASE)
    parts[position] = value
    assert cache_key(*BASE) != cache_key(*parts)
    assert cache_key(*BASE) != cache_key(*BASE[:-1])


def test_key_ignores_dict_and_set_order_but_not_part_boundaries():
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})
    assert cache_key({3, 1, 2}) == cache_key({2, 3, 1})
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key(("a",)) != cache_key("a")
    assert cache_key(*BASE) == cache_key(*BASE)


def test_key_refuses_values_without_a_stable_text():
    with pytest.raises(TypeError, match="tensor_meta"):
        cache_key(torch.randn(2))
    with pytest.raises(TypeError, match="memory address"):
        cache_key(lambda x: x)
    with pytest.raises(TypeError, match="memory address"):
        canonical(object())


def test_tensor_meta_covers_layout_not_values():
    x = torch.randn(4, 6)
    assert cache_key(tensor_meta(x)) == cache_key(tensor_meta(torch.randn(4, 6)))
    assert cache_key(tensor_meta(x)) != cache_key(tensor_meta(x.t()))
    assert cache_key(tensor_meta(x)) != cache_key(tensor_meta(x.double()))
    assert cache_key(tensor_meta(x)) != cache_key(tensor_meta(x[1:]))


def test_versions_name_the_toolchain():
    v = versions()
    assert {"kiln", "torch", "python", "triton"} <= set(v)
    assert v["torch"] == torch.__version__
    if torch.cuda.is_available():
        assert v["device"] == torch.cuda.get_device_name()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    return tmp_path / "kiln"


def test_cache_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "kiln"
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine" and (tmp_path / "mine").is_dir()


def test_disk_cache_round_trip(cache_dir):
    store = DiskCache("autotune")
    key = cache_key("some kernel", 3)
    assert store.get(key) is None
    payload = {"choice": 2, "timings_ms": [0.5, None, 0.25], "name": "k"}
    path = store.put(key, payload)
    assert path.is_relative_to(cache_dir / "autotune")
    assert store.get(key) == payload
    assert DiskCache("other").get(key) is None
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left


def test_disk_cache_write_is_atomic(cache_dir, monkeypatch):
    store = DiskCache("graphs")
    key = cache_key("graph")
    store.put(key, {"version": 1})

    def crash(src, dst):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(disk_cache.os, "replace", crash)
        with pytest.raises(OSError, match="disk full"):
            store.put(key, {"version": 2})
    assert store.get(key) == {"version": 1}  # the old entry, whole
    assert [p.suffix for p in store.path(key).parent.iterdir()] == [".json"]


def test_disk_cache_rejects_bad_payloads_before_writing(cache_dir):
    store = DiskCache("graphs")
    key = cache_key("x")
    with pytest.raises(TypeError):
        store.put(key, {"fn": print})
    with pytest.raises(TypeError):
        store.put(key, ["not", "a", "dict"])  # type: ignore[arg-type]
    assert not store.path(key).exists()
    with pytest.raises(ValueError, match="plain names"):
        store.get("../escape")


@pytest.mark.parametrize("text", ["{not json", "", '"a string"',
                                  '{"schema": 1, "key": "other", "payload": {}}',
                                  '{"schema": 999, "key": "KEY", "payload": {}}'])
def test_disk_cache_ignores_corrupt_entries(cache_dir, caplog, text):
    store = DiskCache("autotune")
    key = cache_key("kernel")
    store.put(key, {"choice": 0})
    store.path(key).write_text(text.replace("KEY", key))
    with caplog.at_level(logging.DEBUG, logger="kiln.runtime"):
        assert store.get(key) is None
    assert "ignoring" in caplog.text and store.namespace in caplog.text
    store.put(key, {"choice": 1})  # a corrupt entry is simply replaced
    assert store.get(key) == {"choice": 1}


def test_triton_cache_inside_kiln_cache_unless_user_set(cache_dir, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(disk_cache, "_triton_dir_we_set", None)
    assert configure_triton_cache() == str(cache_dir / "triton")
    assert os.environ["TRITON_CACHE_DIR"] == str(cache_dir / "triton")
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache_dir / "moved"))
    assert configure_triton_cache() == str(cache_dir / "moved" / "triton")  # ours: follows
    monkeypatch.setenv("TRITON_CACHE_DIR", "/users/choice")
    assert configure_triton_cache() == "/users/choice"
    assert os.environ["TRITON_CACHE_DIR"] == "/users/choice"
    json.dumps(versions())  # versions are JSON (they go into payloads)
