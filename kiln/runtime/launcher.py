"""launcher: `KernelSpec`s → compiled, pre-bound kernel launchers.

`build_launchers(specs, parallel=True, dtypes=None)` imports every kernel module
(`kiln.codegen.triton_build.compile_kernel`), compiles the Triton binaries ahead of time when the
buffers' dtypes are known (in parallel: compile threads through `triton.AsyncCompileMode`, or
worker processes; `KILN_COMPILE_MODE=thread|process|serial`, `KILN_COMPILE_WORKERS=n`), and
returns one `Launcher` per spec. `launcher(*tensors)` runs the kernel on the storages of
`tensors` (one per `spec.args`, any views: kernels index flat storage offsets).

The per-launch cost is what a wrapper pays per kernel on every call, so a launcher resolves
everything it can once: the grid, the constexpr meta, the compiled kernel for the argument
signature and its loaded function handle. A launch then reads each storage's address and calls
the CompiledKernel's C launcher directly (generated code, printed by `launcher.source`) — the
route Inductor's launchers take — instead of `fn[grid](...)`, which re-binds and re-specializes
the arguments and looks the kernel up on every call. Pointers are passed as integers, which the
launcher takes without a driver call. Kernels are compiled for 16-byte aligned storages; a
storage that is not aligned (rare: allocators align to 512 bytes) takes the generic route.

Under `TRITON_INTERPRET=1` (CPU tests) and whenever the fast route cannot be bound (a Triton
without the expected CompiledKernel fields, a launch hook installed by a profiler) launches go
through `fn[grid](...)` on whole-storage views. A bound launcher launches on the device that was
current when it was bound (the wrapper runs under a device guard, as Inductor's does).
"""
from __future__ import annotations

import concurrent.futures as futures
import contextlib
import contextvars
import logging
import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from kiln._util import memory_from
from kiln.codegen.triton_build import compile_kernel, source_path
from kiln.codegen.kernel import KernelSpec, grid_source
from kiln.config import config
from kiln.errors import KilnError
from kiln.runtime import binaries, cross_compile
from kiln.runtime.disk_cache import configure_triton_cache

__all__ = ["Launcher", "SymbolicLauncher", "build_launchers", "check_kernel_devices", "compile_mode", "stage_timer"]

log = logging.getLogger("kiln.runtime")

COMPILE_MODES = ("thread", "process", "serial")
DEFAULT_COMPILE_MODE = "thread"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _storage(t: torch.Tensor) -> torch.Tensor:
    """What the kernel addresses of `t`: its memory from its first element on, 1-D (the
    generic and interpreter routes; the bound route passes `t.data_ptr()`, the same address).
    Kernels index every tensor from its first element: inputs by their lowered layouts, which
    count from there; buffers whose layout has an offset are handed over as `storage_base`."""
    return memory_from(t)


@contextlib.contextmanager
def stage_timer(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Add the seconds spent in the block to `timings[stage]` (for `timings.json`)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


class Launcher:
    """A kernel ready to launch: `launcher(*tensors, stream=None)`.

    spec: the KernelSpec; fn: its `triton.jit` function; grid: the program counts (3-tuple);
    meta: constexpr values; options: num_warps, num_stages and the spec's compile options
    (`enable_fp_fusion`, `debug`: every route passes them); kernel: the CompiledKernel once
    compiled (None under the interpreter); fast: whether launches take the bound route;
    source: the generated launch function's text (empty until bound)."""

    def __init__(self, spec: KernelSpec, fn: Any):
        self.spec = spec
        self.name = spec.name
        self.fn = fn
        meta = spec.meta_dict
        grid = tuple(int(g) for g in spec.grid(meta))
        self.grid = (grid + (1, 1))[:3]
        self.meta = meta
        self.options: dict[str, int] = {"num_warps": spec.num_warps}
        num_stages = getattr(spec, "num_stages", None)
        if num_stages is not None:
            self.options["num_stages"] = int(num_stages)
        compile_options = getattr(spec, "compile_options", None)
        if compile_options is not None:
            self.options.update(compile_options())
        self.kernel: Any = None
        self.fast = False
        self.source = ""
        self._launch: Callable[..., Any] = (
            self._generic_launch if _interpreting() else self._bind_on_first_launch)
        # KILN_CROSS_COMPILE (CPU runs): interpreted launches also compile for that GPU
        self.cross_compile = bool(os.environ.get(cross_compile.ENV)) and _interpreting()

    def __repr__(self) -> str:
        route = "bound" if self.fast else "generic"
        return f"Launcher({self.name}, grid={self.grid}, meta={self.meta}, {route})"

    def __call__(self, *tensors: torch.Tensor, stream: int | None = None) -> None:
        try:
            if stream is None:
                self._launch(*tensors)
            else:
                self._launch(*tensors, stream=stream)
        except TypeError:  # the bound route skips the arity check: name the spec's arguments
            self._check_arity(tensors)
            raise

    # -- routes ----------------------------------------------------------------------------

    def _check_arity(self, args: Sequence[Any]) -> None:
        want = len(self.spec.args) + len(self.spec.size_args)
        if len(args) != want:
            sizes = f" and sizes {self.spec.size_args}" if self.spec.size_args else ""
            raise TypeError(f"{self.name} takes {len(self.spec.args)} tensors "
                            f"{self.spec.args}{sizes}, got {len(args)} arguments")

    def _generic_launch(self, *tensors: torch.Tensor, stream: int | None = None) -> None:
        self._check_arity(tensors)
        if self.cross_compile:
            cross_compile.cross_compile(self.spec, [t.dtype for t in tensors], self.meta,
                                        self.options)
        try:
            self.fn[self.grid](*(_storage(t) for t in tensors), **self.meta, **self.options)
        except Exception as exc:  # the interpreter wraps a bounds check's IndexError
            if isinstance(exc.__cause__, IndexError):
                raise type(exc.__cause__)(f"{exc.__cause__} ({self.name})") from exc
            raise

    def _bind_on_first_launch(self, *args: Any, stream: int | None = None) -> None:
        """No dtypes were known at build time: compile for these tensors, bind, launch."""
        self._check_arity(args)
        tensors = args[:len(self.spec.args)]
        dtypes = [t.dtype for t in tensors]
        with torch.cuda.device(tensors[0].device):
            self.kernel = binaries.recall(self, dtypes)
            if self.kernel is None:
                self.kernel = _resolve(self.warmup(dtypes))
                binaries.remember(self, dtypes)
            self.bind()
        self._launch(*args, stream=stream)

    # -- compile and bind ------------------------------------------------------------------

    def positional(self, arg_values: Sequence[Any]) -> list[Any]:
        """The kernel's parameters in order: `arg_values` (one per spec arg, then one per size
        argument) for the pointer and size parameters, the meta values for the constexprs."""
        by_name = dict(zip((*self.spec.arg_names, *self.spec.size_args), arg_values))
        out = []
        for param in self.fn.arg_names:
            if param in by_name:
                out.append(by_name[param])
            elif param in self.meta:
                out.append(self.meta[param])
            else:
                raise KilnError(f"{self.name}: parameter {param!r} is neither a buffer argument "
                                "nor in the spec's meta", stage="runtime",
                                hint="KernelSpec.arg_names and meta must cover the signature")
        return out

    def warmup(self, dtypes: Sequence[torch.dtype]) -> Any:
        """Compile for pointer arguments of these dtypes (no tensors needed): a CompiledKernel,
        or a FutureKernel inside `triton.AsyncCompileMode`. Size arguments are unspecialized
        (`do_not_specialize`), so any int32 value stands for them."""
        sizes = [_SIZE_PLACEHOLDER] * len(self.spec.size_args)
        return self.fn.warmup(*self.positional([*dtypes, *sizes]), grid=self.grid,
                              **self.options)

    def bind(self) -> None:
        """Generate the fast launch function for `self.kernel` on the current device, or keep
        the generic route (with a debug line saying why)."""
        kernel = _resolve(self.kernel)
        self.kernel = kernel
        reason = _cannot_bind(kernel)
        if reason:
            log.debug("launcher %s: generic launches (%s)", self.name, reason)
            self._launch = self._generic_launch
            return
        self.source, fast = _generate_launch(self, kernel)
        self.fast = True

        def first_launch(*tensors: torch.Tensor, stream: int | None = None) -> None:
            """The first bound launch proves the C launcher takes our argument list; a Triton
            whose launcher wants another one raises TypeError here, and we stay generic."""
            self._check_arity(tensors)
            try:
                fast(*tensors, stream=stream)
            except TypeError as exc:
                log.warning("launcher %s: bound launch failed (%s); using fn[grid] launches",
                            self.name, exc)
                self.fast, self._launch = False, self._generic_launch
                self._generic_launch(*tensors)
                return
            self._launch = fast

        self._launch = first_launch


class SymbolicLauncher(Launcher):
    """A kernel with symbolic sizes: `launcher(*tensors, *sizes)`, the sizes in
    `spec.size_args` order; the grid is computed from the sizes at each launch. The size
    arguments are unspecialized (`do_not_specialize`), so one binary per argument dtypes serves
    every size. With `config.symbolic_bound_launch` launches take the bound route as static
    kernels do (the grid printed into the launch function, `codegen.kernel.grid_source`);
    otherwise, under the interpreter, or for a grid that cannot be printed, through
    `fn[grid](...)` (~20 µs of Python per launch on the H200)."""

    def __init__(self, spec: KernelSpec, fn: Any):
        super().__init__(spec, fn)
        source = grid_source(spec) if config.symbolic_bound_launch else None
        self.bindable = bool(source) and _printed_grid_agrees(spec, source)
        if not self.bindable:
            self._launch = self._generic_launch

    def _generic_launch(self, *args: Any, stream: int | None = None) -> None:
        self._check_arity(args)
        count = len(self.spec.args)
        tensors, sizes = args[:count], args[count:]
        if self.cross_compile:
            cross_compile.cross_compile(self.spec, [t.dtype for t in tensors], self.meta,
                                        self.options)
        env = dict(zip(self.spec.size_args, (int(s) for s in sizes)))
        grid = tuple(int(g) for g in self.spec.grid(self.meta, env))
        try:
            self.fn[grid](*(_storage(t) for t in tensors), *env.values(), **self.meta,
                          **self.options)
        except Exception as exc:  # the interpreter wraps a bounds check's IndexError
            if isinstance(exc.__cause__, IndexError):
                raise type(exc.__cause__)(f"{exc.__cause__} ({self.name})") from exc
            raise


def _printed_grid_agrees(spec: KernelSpec, source: tuple[str, str, str]) -> bool:
    """The bound route computes the grid from its printed source, the generic one from
    `spec.grid`: check they agree on sample sizes (each size its own value, so a swapped pair
    shows) before trusting the printed one. A disagreement is a codegen bug: log it and
    launch through `fn[grid]`, which is right, only slower."""
    try:
        printed = [compile(f"({part})", f"<grid of {spec.name}>", "eval") for part in source]
        for base in (2, 3, 17, 1000, 65_537):
            env = {name: base + 7 * i for i, name in enumerate(spec.size_args)}
            want = (*(int(g) for g in spec.grid(spec.meta_dict, env)), 1, 1)[:3]
            got = tuple(int(eval(code, {}, dict(env))) for code in printed)  # noqa: S307
            if got != want:
                raise ValueError(f"sizes {env}: printed grid {got}, spec.grid {want}")
    except Exception as exc:  # noqa: BLE001  (a printed grid that fails to evaluate, too)
        log.warning("launcher %s: the printed grid %s disagrees with the kernel's grid (%s); "
                    "launching through fn[grid]", spec.name, source, exc)
        return False
    return True


_SIZE_PLACEHOLDER = 17  # a size's stand-in when compiling: an int32, specialized on nothing


def _resolve(kernel: Any) -> Any:
    """A FutureKernel (async compile) → its CompiledKernel."""
    result = getattr(type(kernel), "result", None)
    return kernel.result() if callable(result) else kernel


def _launch_hooks() -> tuple[Any, Any]:
    """Triton's launch enter/exit hooks now installed, None where none is (newer Tritons keep
    an empty `HookChain`, which a bound launch need not call)."""
    try:
        from triton import knobs
    except ImportError:  # triton < 3.4 kept the hooks on CompiledKernel
        from triton.compiler import CompiledKernel
        hooks = (getattr(CompiledKernel, "launch_enter_hook", None),
                 getattr(CompiledKernel, "launch_exit_hook", None))
    else:
        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return tuple(None if _empty_chain(h) else h for h in hooks)  # type: ignore[return-value]


def _empty_chain(hook: Any) -> bool:
    return hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)


def _cannot_bind(kernel: Any) -> str:
    if kernel is None:
        return "no compiled kernel"
    for field in ("run", "function", "packed_metadata", "launch_metadata"):
        if not hasattr(kernel, field):
            return f"this Triton's CompiledKernel has no {field!r}"
    if _launch_hooks() != (None, None):
        return "a launch hook is installed (profiling): launch metadata must be computed"
    return ""


def _stream_source() -> tuple[Callable[[int], int], int]:
    """Triton's current-stream getter and the current device (what `fn[grid]` launches on)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream, driver.active.get_current_device()


def _generate_launch(launcher: Launcher, kernel: Any) -> tuple[str, Callable[..., Any]]:
    """The launch function's source and the function, with every constant in its scope."""
    params = [f"a{i}" for i in range(len(launcher.spec.args))]
    ptrs = [f"p{i}" for i in range(len(params))]
    sizes = list(launcher.spec.size_args)  # symbol names: valid identifiers, never a*/p*
    constants: dict[str, Any] = {}
    run_args = []
    for i, value in enumerate(launcher.positional(ptrs + sizes)):
        if isinstance(value, str):  # a pointer variable
            run_args.append(value)
        elif type(value) in (int, bool):
            run_args.append(repr(value))
        else:
            constants[f"const_{i}"] = value
            run_args.append(f"const_{i}")
    g0, g1, g2 = grid_source(launcher.spec) if sizes else launcher.grid
    lines = [f"def launch_{launcher.name}({', '.join(params + sizes + ['stream=None'])}):"]
    lines += [f"    {p} = {a}.data_ptr()" for p, a in zip(ptrs, params)]
    if ptrs:
        lines += [f"    if ({' | '.join(ptrs)}) & 15:  # compiled for 16-byte aligned pointers",
                  f"        return generic({', '.join(params + sizes)})"]
    lines += ["    if stream is None:",
              "        stream = current_stream(device)",
              f"    run({g0}, {g1}, {g2}, stream, function, metadata, None, enter_hook, "
              f"exit_hook, {', '.join(run_args)})"]
    source = "\n".join(lines) + "\n"
    enter_hook, exit_hook = _launch_hooks()
    scope: dict[str, Any] = {
        "run": kernel.run, "function": kernel.function, "metadata": kernel.packed_metadata,
        "enter_hook": enter_hook, "exit_hook": exit_hook, "generic": launcher._generic_launch,
    }
    scope["current_stream"], scope["device"] = _stream_source()
    scope.update(constants)
    exec(compile(source, f"<kiln launcher {launcher.name}>", "exec"), scope)
    return source, scope[f"launch_{launcher.name}"]


# ---------------------------------------------------------------------------------------------
# building


def compile_mode(parallel: bool, count: int) -> str:
    """How `build_launchers` compiles `count` kernels: `KILN_COMPILE_MODE` or the default."""
    if not parallel or count <= 1:
        return "serial"
    mode = os.environ.get("KILN_COMPILE_MODE", DEFAULT_COMPILE_MODE).strip().lower()
    if mode not in COMPILE_MODES:
        raise KilnError(f"KILN_COMPILE_MODE={mode!r} is not one of {COMPILE_MODES}",
                        stage="runtime", hint="unset it to use the default (thread)")
    return mode


def _workers(count: int) -> int:
    raw = os.environ.get("KILN_COMPILE_WORKERS")
    default = min(8, os.cpu_count() or 1)
    return max(1, min(count, int(raw) if raw else default))


def _arg_dtypes(spec: KernelSpec, dtypes: Mapping[str, torch.dtype] | None) -> list | None:
    known = getattr(spec, "arg_dtypes", None)
    if known:
        return list(known)
    if dtypes is not None and all(name in dtypes for name in spec.args):
        return [dtypes[name] for name in spec.args]
    return None


def check_kernel_devices(specs: Sequence[KernelSpec], devices: Mapping[str, torch.device]) -> None:
    """Compiled Triton kernels dereference every pointer on the GPU: a CPU buffer would be read
    as device memory (garbage, then an illegal memory access that poisons the process). CPU
    buffers are only valid when the kernels run in Triton's interpreter."""
    if _interpreting():
        return
    for spec in specs:
        on_cpu = [n for n in spec.args if n in devices and devices[n].type == "cpu"]
        if on_cpu:
            raise KilnError(f"kernel {spec.name} would run on CPU buffers {on_cpu} as a "
                            "compiled Triton kernel", stage="runtime",
                            hint="generated kernels on CPU tensors need TRITON_INTERPRET=1 "
                                 "(set before triton is imported)")


def build_launchers(specs: Sequence[KernelSpec], *, parallel: bool = True,
                    dtypes: Mapping[str, torch.dtype] | None = None) -> list[Launcher]:
    """One `Launcher` per spec, in order. With `dtypes` (buffer name → dtype, e.g. from the
    IRGraph's buffers) every binary is compiled and bound now, in parallel when `parallel`;
    without, each kernel compiles on its first launch. Compiles are deterministic (source
    files and Triton's cache keys depend only on the source and options)."""
    configure_triton_cache()
    launchers = [(SymbolicLauncher if getattr(spec, "size_args", ()) else Launcher)(
        spec, compile_kernel(spec)) for spec in specs]
    if _interpreting() or not torch.cuda.is_available():
        for lc in launchers:  # KILN_CROSS_COMPILE: now, where the dtypes are known
            sig = _arg_dtypes(lc.spec, dtypes) if lc.cross_compile else None
            if sig is not None:
                cross_compile.cross_compile(lc.spec, sig, lc.meta, lc.options)
        return launchers
    todo = [(lc, sig) for lc in launchers if getattr(lc, "bindable", True)
            and (sig := _arg_dtypes(lc.spec, dtypes)) is not None]
    if todo:
        start = time.perf_counter()
        for lc, sig in todo:  # binaries an earlier process compiled: no Triton compile call
            lc.kernel = binaries.recall(lc, sig)
        compile_now = [(lc, sig) for lc, sig in todo if lc.kernel is None]
        mode = compile_mode(parallel, len(compile_now))
        if compile_now:
            _COMPILERS[mode](compile_now)
        for lc, sig in compile_now:
            binaries.remember(lc, sig)
        for lc, _ in todo:
            lc.bind()
        log.debug("runtime: %d kernels loaded, %d compiled (%s) in %.3f s",
                  len(todo) - len(compile_now), len(compile_now), mode,
                  time.perf_counter() - start)
    return launchers


def _compile_error(lc: Launcher, exc: BaseException) -> KilnError:
    path = source_path(lc.spec)
    return KilnError(f"compiling kernel {lc.name} failed: {type(exc).__name__}: {exc}",
                     stage="runtime", hint=f"the kernel source is {path}")


def _compile_serial(todo: list) -> None:
    for lc, sig in todo:
        try:
            lc.kernel = lc.warmup(sig)
        except Exception as exc:
            raise _compile_error(lc, exc) from exc


def _compile_threads(todo: list) -> None:
    """Triton's AsyncCompileMode: this thread binds and specializes the arguments, the pool
    runs the compiler passes (which release the GIL) and ptxas."""
    import triton

    async_mode = getattr(triton, "AsyncCompileMode", None)
    if async_mode is None:
        log.debug("runtime: this Triton has no AsyncCompileMode; compiling serially")
        _compile_serial(todo)
        return
    try:
        with futures.ThreadPoolExecutor(_workers(len(todo)), "kiln-compile") as pool:
            with async_mode(pool):
                _compile_serial(todo)  # each warmup only submits
    except KilnError:
        raise
    except Exception as exc:  # raised on leaving AsyncCompileMode: find the kernel it was
        _resolve_all(todo)
        raise KilnError(f"compiling {len(todo)} kernels failed: {exc}", stage="runtime",
                        hint="KILN_COMPILE_MODE=serial names the kernel") from exc
    finally:
        _leave_async_compile_mode()
    _resolve_all(todo)


def _leave_async_compile_mode() -> None:
    """Make sure no AsyncCompileMode is left active. Triton 3.6 clears its active mode only after
    every compile of the block succeeded: one failing kernel left it set, and every later
    compile in this thread then failed ("Another AsyncCompileMode is already active", or a
    submit to the closed pool), so the whole process ran eagerly after one bad kernel."""
    module = sys.modules.get("triton.runtime._async_compile")
    active = getattr(module, "active_mode", None)
    if isinstance(active, contextvars.ContextVar):
        if active.get() is not None:
            active.set(None)
    elif active is not None:  # older Tritons keep it as a module global
        module.active_mode = None


def _resolve_all(todo: list) -> None:
    for lc, _ in todo:
        try:
            lc.kernel = _resolve(lc.kernel)
        except Exception as exc:
            raise _compile_error(lc, exc) from exc


def _compile_processes(todo: list) -> None:
    """Worker processes fill Triton's disk cache; this process then loads from it. Workers are
    spawned (never forked: CUDA is initialized here), so each pays a torch import."""
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(_workers(len(todo)), mp_context=context) as pool:
        jobs = [pool.submit(_compile_in_worker, _worker_job(lc, sig)) for lc, sig in todo]
        for (lc, _), job in zip(todo, jobs):
            try:
                job.result()
            except Exception as exc:
                raise _compile_error(lc, exc) from exc
    _compile_serial(todo)  # disk-cache hits


def _worker_job(lc: Launcher, dtypes: Sequence[torch.dtype]) -> dict:
    """What a worker needs, as plain picklable values (no grid function)."""
    return {"source": lc.spec.source, "name": lc.spec.name, "key": lc.spec.key,
            "args": lc.positional([str(d).removeprefix("torch.") for d in dtypes]),
            "pointer_params": list(lc.spec.arg_names), "grid": lc.grid, "options": lc.options}


def _compile_in_worker(job: dict) -> None:
    """Runs in a worker process: import the kernel module and compile it (Triton caches it)."""
    import types

    from kiln.codegen.triton_build import _import_kernel

    fn = _import_kernel(types.SimpleNamespace(**{k: job[k] for k in ("source", "name", "key")}))
    args = [getattr(torch, a) if p in job["pointer_params"] else a
            for p, a in zip(fn.arg_names, job["args"])]
    fn.warmup(*args, grid=job["grid"], **job["options"])


_COMPILERS: dict[str, Callable[[list], None]] = {
    "serial": _compile_serial,
    "thread": _compile_threads,
    "process": _compile_processes,
}
