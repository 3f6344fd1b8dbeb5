"""kiln.runtime.binaries: where Triton stored a compiled binary, recorded under kiln's key, and
loaded again in a new process without `triton.compile` (no hash of Triton's own sources)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from child_env import child_env  # noqa: E402
from kiln.runtime import binaries  # noqa: E402
from kiln.runtime.disk_cache import DiskCache  # noqa: E402


def _fake_launcher(source: str = "src") -> types.SimpleNamespace:
    src = types.SimpleNamespace(signature={"in_ptr0": "*fp32", "XBLOCK": "constexpr"},
                                constants={(1,): 128})
    kernel = types.SimpleNamespace(src=src, hash="ab" * 32, name="kiln_poi_sin_buf0")
    spec = types.SimpleNamespace(source=source)
    return types.SimpleNamespace(spec=spec, meta={"XBLOCK": 128}, options={"num_warps": 4},
                                 kernel=kernel, name="kiln_poi_sin_buf0", fn=None)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path


def test_remember_records_triton_hash_name_and_signature_in_parameter_order(caches):
    lc = _fake_launcher()
    assert binaries.remember(lc, [torch.float32])
    entry = DiskCache(binaries.NAMESPACE).get(binaries.binary_key(lc, [torch.float32]))
    # the order is the launcher's argument order: "XBLOCK" < "in_ptr0" must not reorder it
    assert entry == {"hash": "ab" * 32, "name": "kiln_poi_sin_buf0",
                     "signature": [["in_ptr0", "*fp32"], ["XBLOCK", "constexpr"]],
                     "constants": [[[1], 128]]}


def test_an_entry_for_other_parameters_is_not_loaded(caches):
    lc = _fake_launcher()
    lc.fn = types.SimpleNamespace(arg_names=["XBLOCK", "in_ptr0"])  # another order
    group = Path(os.environ["TRITON_CACHE_DIR"]) / ("ab" * 32)
    group.mkdir(parents=True)
    meta = group / "kiln_poi_sin_buf0.json"
    meta.write_text("{}")
    (group / "__grp__kiln_poi_sin_buf0.json").write_text(
        json.dumps({"child_paths": {meta.name: str(meta)}}))
    binaries.remember(lc, [torch.float32])
    assert binaries._load(lc.fn, DiskCache(binaries.NAMESPACE).get(
        binaries.binary_key(lc, [torch.float32]))) is None


def test_key_follows_source_dtypes_meta_and_options():
    lc = _fake_launcher()
    key = binaries.binary_key(lc, [torch.float32])
    assert key == binaries.binary_key(_fake_launcher(), [torch.float32])
    assert key != binaries.binary_key(_fake_launcher("other"), [torch.float32])
    assert key != binaries.binary_key(lc, [torch.bfloat16])
    wider = _fake_launcher()
    wider.options = {"num_warps": 8}
    assert key != binaries.binary_key(wider, [torch.float32])


def test_a_binary_gone_from_tritons_cache_is_a_miss(caches):
    lc = _fake_launcher()
    binaries.remember(lc, [torch.float32])
    before = binaries.STATS["misses"]
    assert binaries.recall(lc, [torch.float32]) is None  # nothing under Triton's hash folder
    assert binaries.recall(_fake_launcher("never stored"), [torch.float32]) is None
    assert binaries.STATS["misses"] == before + 2


def test_an_unusable_entry_is_a_miss_not_an_error(caches):
    lc = _fake_launcher()
    DiskCache(binaries.NAMESPACE).put(binaries.binary_key(lc, [torch.float32]),
                                      {"hash": 3, "name": None})
    assert binaries.recall(lc, [torch.float32]) is None


def test_unserializable_constants_are_not_recorded(caches):
    lc = _fake_launcher()
    lc.kernel.src.constants = {(1,): object()}
    assert not binaries.remember(lc, [torch.float32])


WARM_SCRIPT = textwrap.dedent("""
    import json, sys, torch, kiln
    from kiln.runtime import binaries

    def fn(x, b, w):
        return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x + b), (256,), w)

    torch.manual_seed(int(sys.argv[1]))
    args = [torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda"),
            torch.randn(256, device="cuda")]
    out = kiln.compile(fn, backend="kiln")(*args)
    ref = fn(*[a.double() for a in args])
    err = (out.double() - ref).abs().max().item()
    from triton.runtime.cache import triton_key
    hashed = triton_key.cache_info().currsize
    print("RESULT " + json.dumps({"stats": binaries.STATS, "err": err, "triton_key": hashed}))
""")


@pytest.mark.gpu
def test_a_new_process_loads_binaries_without_compiling(tmp_path):
    env = child_env(KILN_CACHE_DIR=str(tmp_path / "kiln"),
                    TRITON_CACHE_DIR=str(tmp_path / "triton"))
    runs = []
    for seed in ("1", "2"):
        proc = subprocess.run([sys.executable, "-c", WARM_SCRIPT, seed], env=env,
                              capture_output=True, text=True, timeout=300)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line, proc.stderr[-2000:]
        runs.append(json.loads(line[7:]))
    cold, warm = runs
    assert cold["stats"]["remembered"] >= 1 and cold["triton_key"] == 1
    assert warm["stats"]["recalled"] == cold["stats"]["remembered"]
    assert warm["stats"]["remembered"] == 0 and warm["triton_key"] == 0
    assert cold["err"] < 1e-4 and warm["err"] < 1e-4


def test_switched_off_by_config(caches):
    from kiln.config import config

    lc = _fake_launcher()
    with config.patch(binary_cache=False):
        assert not binaries.remember(lc, [torch.float32])
    binaries.remember(lc, [torch.float32])
    with config.patch(binary_cache=False):
        assert binaries.recall(lc, [torch.float32]) is None
