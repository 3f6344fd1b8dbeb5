"""triton_build: compile a `KernelSpec` with Triton and launch it.

`triton.jit` reads the function's source file, so `compile_kernel` writes `spec.source` to
`<cache dir>/<spec.name>_<spec.key>.py` (`KILN_CODEGEN_CACHE_DIR`, default
`<kiln cache_root()>/kernels`), runs `spec.source` (from memory, never the file) as a module
named after the same two parts and returns the `JITFunction`, memoized per key in the process. Names and files depend only on the
source text (deterministic across processes) and a lock makes concurrent calls from compile
threads import each module once. Triton compiles the binary later, on the first launch or a
`warmup` (`kiln.runtime.launcher.build_launchers` does that in parallel).

`launch(spec, *tensors)` passes each tensor's whole storage (the kernel indexes flat storage
offsets, as the IR does); it is the simple route for tests (the runtime's launchers are bound).
On a machine without CUDA, set `TRITON_INTERPRET=1` before triton is imported
(tests/conftest.py does) to run on CPU tensors.

`run_graph(graph, inputs)` is an unfused driver for tests and debugging: one kernel per
`ComputedBuffer`, externs and fallbacks through the reference runtime.
"""
from __future__ import annotations

import linecache
import logging
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from kiln.codegen.kernel import KernelSpec, emit_kernel

__all__ = ["cache_dir", "compile_kernel", "launch", "run_graph", "source_path"]

log = logging.getLogger("kiln.codegen")

_compiled: dict[str, Any] = {}
_compile_lock = threading.Lock()


def cache_dir() -> Path:
    """Where kernel sources are written: `KILN_CODEGEN_CACHE_DIR`, else `<cache_root()>/kernels`
    (a folder another user owns or may write is refused, as the cache root is)."""
    from kiln.paths import cache_root, make_private_dir, trusted_folder

    path = os.environ.get("KILN_CODEGEN_CACHE_DIR")
    if path:
        return trusted_folder(Path(path), "kernel source folder (KILN_CODEGEN_CACHE_DIR)",
                              "point KILN_CODEGEN_CACHE_DIR at a folder of your own")
    out = cache_root() / "kernels"
    make_private_dir(out)
    return out


def source_path(spec: Any) -> Path:
    """Where `spec`'s source is written (readers, tracebacks, error hints)."""
    return cache_dir() / f"{spec.name}_{spec.key}.py"


def compile_kernel(spec: KernelSpec) -> Any:
    """The `triton.jit` function of `spec` (source written to the cache dir and imported)."""
    fn = _compiled.get(spec.key)
    if fn is not None:
        return fn
    with _compile_lock:  # compile threads: one import per module, never a half-run module
        fn = _compiled.get(spec.key)
        if fn is None:
            fn = _compiled[spec.key] = _import_kernel(spec)
    return fn


def _import_kernel(spec: KernelSpec) -> Any:
    """Run `spec.source` as a module whose file is `<cache dir>/<name>_<key>.py`.

    The code run is `spec.source` itself, compiled from memory: never the file's text and never
    a `__pycache__` file, which whoever can write the folder could have replaced. The source is
    registered with linecache under the file's name, so `triton.jit` (which reads its function's
    source through `inspect`) sees the same text."""
    if not spec.name.isidentifier():  # it names a file and a module
        raise ValueError(f"kernel names are identifiers, got {spec.name!r}")
    key = spec.key
    path = source_path(spec)
    _write_source(path, spec.source)
    mod_name = f"kiln_codegen_{spec.name}_{key}"
    filename = str(path)
    linecache.cache[filename] = (len(spec.source), None, spec.source.splitlines(True), filename)
    module = types.ModuleType(mod_name)
    module.__file__ = filename
    sys.modules[mod_name] = module  # triton resolves globals through the module
    try:
        exec(compile(spec.source, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return getattr(module, spec.name)


def _write_source(path: Path, source: str) -> None:
    """The file is for readers and tracebacks (nothing executes it): rewrite it when it differs."""
    try:
        if path.read_bytes() == source.encode():
            return
    except OSError:
        pass
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(source)
        os.replace(tmp, path)  # atomic: a concurrent reader never sees a partial file
    except OSError as exc:  # a full disk costs the readable copy, never the kernel
        log.debug("codegen: kernel source not written to %s: %s", path, exc)
        tmp.unlink(missing_ok=True)


def _storage(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of `t` as a 1-D tensor starting at storage offset 0."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0)


def launch(spec: KernelSpec, *tensors: torch.Tensor) -> None:
    """Run the kernel on `tensors`, one per `spec.args` (any views of those buffers: the
    kernel addresses their storages)."""
    if len(tensors) != len(spec.args):
        raise TypeError(f"{spec.name} takes {len(spec.args)} tensors {spec.args}, "
                        f"got {len(tensors)}")
    fn = compile_kernel(spec)
    meta = spec.meta_dict
    fn[spec.grid(meta)](*(_storage(t) for t in tensors), **spec.launch_options())


def run_graph(graph: Any, inputs: Sequence[Any],
              launchers: Mapping[str, Any] | None = None) -> list[Any]:
    """Run an `IRGraph` with one generated kernel per computed buffer (no fusion).
    `launchers` (buffer name → a pre-bound launcher with `.spec`) replace `launch` for the
    buffers they cover (the runtime's launchers under test)."""
    from kiln.lower.evaluate import _new_storage, _run_node, run_ir
    from kiln.lower.ir import ComputedBuffer

    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
    launchers = launchers or {}

    def run_node(rt: Any, node: Any) -> None:
        if not isinstance(node, ComputedBuffer):
            _run_node(rt, node)
            return
        lay = node.layout
        storage = _new_storage(lay.dtype, lay.size, lay.stride, lay.offset)
        rt.storages[node.name] = storage.to(device)  # where the inputs live
        bound = launchers.get(node.name)
        if bound is not None:
            bound(*(rt.storages[n] for n in bound.spec.args))
            return
        spec = emit_kernel(node, graph)
        launch(spec, *(rt.storages[n] for n in spec.args))

    return run_ir(graph, inputs, run_node)
