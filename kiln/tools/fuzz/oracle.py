"""The oracle: run one program's `fn` in eager and under kiln, and say how they differ.

Eager runs on fresh inputs; kiln runs twice (the compiling call and a cache-hit call), each on
other fresh inputs. Compared: the exception (kiln raises iff eager raises, same type), the
number of outputs, each output's shape, dtype and values (tolerance by dtype; a float mismatch is
forgiven when kiln is as close as eager to an fp64 reference run, or when eager itself jumps
as far on inputs nudged by a few ulps: the program is discontinuous there), the aliasing relations between
outputs and inputs (the strides and offsets of outputs aliasing an input; for outputs that
alias only each other, which elements they share), and the
inputs' values after the call (mutations; forgiven like outputs, against the fp64 run's inputs
after its call). The first difference found is the verdict.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import linecache
import logging
import re
import types
from typing import Any, NamedTuple

import torch

from kiln.tools.fuzz.grads import gradients, parameters_of
from kiln.tools.fuzz.inputs import collecting_leaves, grown

__all__ = ["Verdict", "check_source", "load_program"]

_TOL = {"float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2),
        "float64": (1e-7, 1e-9)}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """`failure` is the class ("" when the program passed; see module docstring of classify),
    `detail` a one-line explanation, `fallbacks` the kiln warnings logged (eager fallbacks)."""
    failure: str
    detail: str = ""
    fallbacks: int = 0
    poisoned: bool = False

    @property
    def ok(self) -> bool:
        return not self.failure


class _Mismatch(Exception):
    def __init__(self, failure: str, detail: str) -> None:
        super().__init__(detail)
        self.failure, self.detail = failure, detail


def load_program(source: str, name: str = "kiln_fuzz_program") -> types.ModuleType:
    """Execute a program's source as a fresh module (registered with linecache for tracebacks
    and for kiln's source-line provenance)."""
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _run(fn, module: types.ModuleType, device: str,
         grads: bool = False) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
    """(outputs or the exception, the inputs after the call, the input leaves that require
    grad: none unless `grads`)."""
    with collecting_leaves() if grads else contextlib.nullcontext([]) as leaves:
        inputs = module.make_inputs(device)
    try:
        out = fn(*inputs)
    except Exception as exc:  # the program's own exception is a result, compared below
        return exc, inputs, leaves
    return (list(out) if isinstance(out, (tuple, list)) else [out]), inputs, leaves


def _gradients(outputs: Any, leaves: list[torch.Tensor], params: list) -> Any:
    return None if isinstance(outputs, Exception) else gradients(outputs, leaves + params)


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count, self.first = 0, ""

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if not self.first:  # the whole text and traceback: a GPU-only failure is rerun from it
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self.first = text


class _Case(NamedTuple):
    """One program at one size: its source, device and input growth (`inputs.grown`)."""
    source: str
    device: str
    growth: int


def check_source(source: str, backend: str, device: str = "cpu", calls: int = 2) -> Verdict:
    """Run the program in `source` under eager and under `kiln.compile(fn, backend=backend)`.

    A program whose module sets `GROWTH = (0, 1, 2)` (the generator's `--grow`) is checked at
    each growth in turn, `calls` kiln calls each, under one compiled function: the later sizes
    hit kiln's recompile into dynamic shapes, then that dynamic graph at a new size. One that
    sets `GRADS = True` (`--grad`) takes its float inputs requiring grad and is also compared
    by its gradients (`grads.py`)."""
    from kiln import api
    api.reset()
    module = load_program(source)
    module.make_globals(device)
    growths = tuple(getattr(module, "GROWTH", (0,)))
    grads = bool(getattr(module, "GRADS", False))
    params = parameters_of(module) if grads else []
    counter = _Counter()
    logging.getLogger("kiln").addHandler(counter)
    try:
        compiled = None
        for growth in growths:
            with grown(growth):
                expected, eager_inputs, leaves = _run(module.fn, module, device, grads)
            eager_grads = _gradients(expected, leaves, params) if grads else None
            compiled = compiled or api.compile(module.fn, backend=backend)
            for call in range(calls):
                with grown(growth):
                    got, kiln_inputs, leaves = _run(compiled, module, device, grads)
                case = _Case(source, device, growth)
                _compare(expected, eager_inputs, got, kiln_inputs, case)
                if grads:
                    _compare_grads(eager_grads, _gradients(got, leaves, params), case)
    except _Mismatch as exc:
        detail = exc.detail if growths == (0,) else f"{exc.detail} (inputs grown by {growth})"
        return Verdict(exc.failure, detail, counter.count, _poisoned(device))
    finally:
        logging.getLogger("kiln").removeHandler(counter)
    return Verdict("", counter.first, counter.count, _poisoned(device))


def _poisoned(device: str) -> bool:
    if device != "cuda":
        return False
    try:
        torch.cuda.synchronize()
    except Exception:  # a sticky CUDA error: the worker must be replaced
        return True
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _compare(expected, eager_inputs, got, kiln_inputs, case: _Case) -> None:
    if isinstance(got, Exception) and re.search(r"CUDA error|illegal memory", str(got)):
        raise _Mismatch("crash:cuda_error", _first_line(got))
    if isinstance(expected, Exception) or isinstance(got, Exception):
        _compare_raises(expected, got)
        return
    if len(expected) != len(got):
        raise _Mismatch("mismatch:count", f"{len(expected)} outputs in eager, {len(got)} in kiln")
    for i, (e, k) in enumerate(zip(expected, got)):
        _compare_value(f"output {i}", e, k, case, ("output", i))
    _compare_aliasing(expected, eager_inputs, got, kiln_inputs)
    for i, (e, k) in enumerate(zip(eager_inputs, kiln_inputs)):
        try:
            _compare_value(f"input {i} after the call", e, k, case, ("input", i))
        except _Mismatch as exc:
            raise _Mismatch("mismatch:mutation", exc.detail) from None


def _compare_raises(expected, got) -> None:
    if not isinstance(got, Exception):
        raise _Mismatch(f"raises:eager_only:{type(expected).__name__}",
                        f"eager raised {_first_line(expected)}; kiln returned")
    if not isinstance(expected, Exception):
        raise _Mismatch(f"raises:kiln_only:{type(got).__name__}", _first_line(got))
    if not isinstance(got, type(expected)):
        raise _Mismatch(f"raises:type:{type(expected).__name__}->{type(got).__name__}",
                        f"eager {_first_line(expected)}; kiln {_first_line(got)}")


def _compare_grads(expected, got, case: _Case) -> None:
    """Eager's and kiln's gradients (`grads.gradients`): the same leaves reached (None where
    nothing depends on one: a zero tensor instead is a different `.grad`), then values as
    outputs are, against the fp64 run's gradients."""
    if expected is None or got is None:
        if (expected is None) != (got is None):
            raise _Mismatch("mismatch:grad", "the outputs require grad in "
                            f"{'kiln' if expected is None else 'eager'} only")
        return
    if _stale_saved_value(expected) and not isinstance(got, Exception):
        return  # eager's autograd refuses what the functional graph computes (as torch.compile)
    if isinstance(expected, Exception) or isinstance(got, Exception):
        try:
            _compare_raises(expected, got)
        except _Mismatch as exc:
            raise _Mismatch(f"grad:{exc.failure}", exc.detail) from None
        return
    for j, (e, k) in enumerate(zip(expected, got)):
        if (e is None) != (k is None):
            raise _Mismatch("mismatch:grad", f"gradient {j}: {'None' if e is None else 'a tensor'}"
                            f" in eager, {'None' if k is None else 'a tensor'} in kiln")
        if e is not None:
            try:
                _compare_value(f"gradient {j}", e, k, case, ("grad", j))
            except _Mismatch as exc:
                raise _Mismatch(f"mismatch:grad:{exc.failure.split(':', 1)[1]}",
                                exc.detail) from None


def _stale_saved_value(result: Any) -> bool:
    """Eager's backward raised because the program wrote in place into a value its backward
    saved (`t = x.sigmoid(); t.mul_(2)`: "modified by an inplace operation"). kiln's graph is
    functional: the backward reads the saved value, as torch.compile's does, so kiln computes
    a gradient there instead of raising; not compared (seed 3500164)."""
    return isinstance(result, RuntimeError) and "modified by an inplace operation" in str(result)


def _compare_value(what: str, e, k, case: _Case, which: tuple[str, int]) -> None:
    if not isinstance(e, torch.Tensor) or not isinstance(k, torch.Tensor):
        if type(e) is not type(k) or e != k:
            raise _Mismatch("mismatch:value", f"{what}: eager {e!r}, kiln {k!r}")
        return
    if e.shape != k.shape:
        raise _Mismatch("mismatch:shape", f"{what}: eager {tuple(e.shape)}, kiln {tuple(k.shape)}")
    if e.dtype != k.dtype:
        raise _Mismatch("mismatch:dtype", f"{what}: eager {e.dtype}, kiln {k.dtype}")
    if e.device != k.device:
        raise _Mismatch("mismatch:device", f"{what}: eager {e.device}, kiln {k.device}")
    e64, k64 = e.detach().cpu().double(), k.detach().cpu().double()
    rtol, atol = _TOL.get(str(e.dtype).removeprefix("torch."), (0.0, 0.0))
    if torch.allclose(k64, e64, rtol=rtol, atol=atol, equal_nan=True):
        return
    integer = not e.is_floating_point() and e.dtype != torch.bool and not e.is_complex()
    if (e.is_floating_point() or integer) and _near_reference(case, which, e64, k64, atol,
                                                              integer):
        return
    if e.is_floating_point() and _decided_by_rounding(case, which, e64, k64):
        return
    bad = ~torch.isclose(k64, e64, rtol=rtol, atol=atol, equal_nan=True)
    raise _Mismatch("mismatch:value", f"{what} ({e.dtype}, {tuple(e.shape)}): "
                    f"{int(bad.sum())}/{e.numel()} elements differ, max abs diff "
                    f"{float((k64 - e64).abs().nan_to_num(float('inf')).max()):.3g}")


def _near_reference(case: _Case, which: tuple[str, int], e64, k64, atol: float,
                    integer: bool = False) -> bool:
    """Whether kiln's value `which` — ("output", i), or ("input", i) after the call — is about
    as close as eager's to the same value in an fp64 run: kiln's largest error at most 1.5x
    eager's plus the dtype's atol. A kiln that keeps float32 where eager rounds an fp16 product
    (`x.copy_(x_fp16 * 1.5)`, GPU seed 4322) passes; one farther off than eager does not.
    `integer`: the value has an integer dtype (see below)."""
    run = _reference_run(case)
    if run is None:  # no reference for this program: the mismatch stands
        return False
    kind, index = which
    values = run[{"output": 0, "input": 1, "grad": 2}[kind]]
    ref = values[index] if index < len(values) else None
    if ref is None or ref.shape != e64.shape:
        return False
    err_e = (e64 - ref).abs().nan_to_num(0.0).max()
    err_k = (k64 - ref).abs().nan_to_num(float("inf")).max()
    if err_k <= 1.5 * err_e + atol:
        return True
    # Integers made from floats (`(torch.exp(x * s) * 3).long()`): eager's own ints are off
    # from the fp64 run's, so they carry float rounding at full weight, and large ones a
    # float32 rounding apart (a sum in another order, amplified by exp: seed 3302347) are
    # within float32's relative tolerance. No absolute slack: an off-by-one of a small int
    # (`(x16 * 3).long()`, seed 92238) is still judged exactly. Integers from integers are exact
    # in the fp64 run: eager's error is 0 there and kiln must match.
    return bool(integer and err_e > 0 and
                torch.allclose(k64, e64, rtol=_TOL["float32"][0], atol=0.0))


_TO_DOUBLE = {torch.Tensor.half: torch.Tensor.double, torch.Tensor.bfloat16: torch.Tensor.double,
              torch.Tensor.float: torch.Tensor.double}


def _as_double(value: Any) -> Any:
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    if isinstance(value, (tuple, list)):
        return type(value)(_as_double(v) for v in value)
    return value


class _Float64Everywhere(torch.overrides.TorchFunctionMode):
    """Every float dtype a program names (`x.to(torch.bfloat16)`, `.half()`,
    `zeros(..., dtype=torch.float32)`) becomes float64: the reference is the program's exact
    value, not eager's rounding of it. Without this, a program that casts to bf16 itself gets a
    'reference' rounded like eager, and a kiln that keeps float32 between fused ops (closer to
    the exact value, as torch.compile does) looked wrong (seed 56038)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        func = _TO_DOUBLE.get(func, func)
        kwargs = {k: _as_double(v) for k, v in (kwargs or {}).items()}
        return func(*_as_double(tuple(args)), **kwargs)


# Relative size of the input nudges `_decided_by_rounding` tries, per input dtype: a few units
# in the last place, the size of the rounding differences two correct compilers may have.
_NUDGE = {torch.float32: 2.0 ** -20, torch.float64: 2.0 ** -49, torch.float16: 2.0 ** -8,
          torch.bfloat16: 2.0 ** -5}
_NUDGES = 4


def _decided_by_rounding(case: _Case, which: tuple[str, int], e64, k64) -> bool:
    """Whether the program is discontinuous at these inputs within rounding: eager itself,
    with its inputs nudged by a few ulps or every op's result rounded a little differently (as
    a compiler that reorders a reduction does), moves its value `which` by at least half of
    kiln's difference, and by far more than a continuous program would (1000x the nudge). Then
    which side of the jump a run lands on is decided by rounding, and eager's side is no more
    right than kiln's: `if t.sum() > 0` over a LayerNorm's output, whose sum is 0 up to
    rounding (fuzz seeds 315707, 326347, 408551, 411446). A program continuous at its inputs
    is never forgiven here."""
    runs = _nudged_runs(case)
    if not runs:
        return False
    kind, index = which
    diff = float((k64 - e64).abs().nan_to_num(float("inf")).max())
    scale = float(e64.abs().nan_to_num(0.0).max()) + 1.0
    for outputs, inputs, nudge in runs:
        if kind == "grad":  # the nudged runs take no gradients
            return False
        values = outputs if kind == "output" else inputs
        moved = values[index] if index < len(values) else None
        if moved is None or moved.shape != e64.shape:
            continue
        jump = float((moved - e64).abs().nan_to_num(float("inf")).max())
        if jump > 1000 * nudge * scale and jump >= 0.5 * diff:
            return True
    return False


class _RoundingNoise(torch.overrides.TorchFunctionMode):
    """Multiplies every fresh floating result of a torch call by 1 +- `_NUDGE` of its dtype
    (signs from `gen`): eager with other roundings. Views and in-place results (sharing an
    argument's storage) are left alone, so the program's aliasing is unchanged."""

    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.gen = gen
        self.nudge = 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype in _NUDGE and out.numel() \
                and not _shares_storage(out, args, kwargs):
            self.nudge = max(self.nudge, _nudge_(out, self.gen))
        return out


def _nudge_(t: torch.Tensor, gen: torch.Generator) -> float:
    """Multiply each element of `t` by 1 +- `_NUDGE` of its dtype (signs from `gen`), in
    place; the nudge."""
    step = _NUDGE[t.dtype]
    sign = torch.randint(0, 2, t.shape, generator=gen).to(t.device) * 2 - 1
    with torch.no_grad():
        t.mul_((1 + step * sign).to(t.dtype))
    return step


def _shares_storage(out: torch.Tensor, args: tuple, kwargs: dict | None) -> bool:
    ptr = out.untyped_storage().data_ptr()
    values = list(args) + list((kwargs or {}).values())
    flat = [v for a in values for v in (a if isinstance(a, (list, tuple)) else [a])]
    return any(isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == ptr
               for v in flat)


@functools.lru_cache(maxsize=2)
def _nudged_runs(case: _Case) -> list[tuple[list, list, float]]:
    """Eager runs of the program with other roundings: the inputs of one float dtype nudged by
    a few ulps of it (each element times 1 +- `_NUDGE`; one dtype at a time, so the nudge a
    jump is judged by is the one that made it: seed 3301588's float32 LayerNorm flipped its
    branch while an unused float16 input had the coarser nudge), and every op's result so
    nudged (`_RoundingNoise`), signs from fixed generators: (outputs, inputs after the call,
    nudge) as CPU float64 values; runs that raise are left out."""
    runs = []
    try:
        with grown(case.growth):
            made = load_program(case.source, "kiln_fuzz_nudged").make_inputs(case.device)
    except Exception:
        return runs
    dtypes = sorted({t.dtype for t in made if isinstance(t, torch.Tensor) and t.dtype in _NUDGE},
                    key=str)
    plan = [(dtype, k) for dtype in dtypes for k in range(_NUDGES)]
    plan += [(None, len(plan) + k) for k in range(_NUDGES)]
    for dtype, k in plan:
        try:
            module = load_program(case.source, "kiln_fuzz_nudged")
            module.make_globals(case.device)
            gen = torch.Generator().manual_seed(1000 + k)
            with grown(case.growth):
                inputs = module.make_inputs(case.device)
            if dtype is not None:
                nudge = max(_nudge_(t, gen) for t in inputs
                            if isinstance(t, torch.Tensor) and t.dtype == dtype)
                out = module.fn(*inputs)
            else:
                noise = _RoundingNoise(gen)
                with noise:
                    out = module.fn(*inputs)
                nudge = noise.nudge
        except Exception:
            continue
        if not nudge:
            continue
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        runs.append(([_as_ref(o) for o in out], [_as_ref(t) for t in inputs], nudge))
    return runs


@functools.lru_cache(maxsize=2)
def _reference_run(case: _Case) -> tuple[list, list, list] | None:
    """The program run in float64 (float inputs, module parameters and every float dtype it
    names): its outputs, its inputs after the call and (a `GRADS` program) the gradients
    `grads.gradients` takes, as CPU float64 tensors (None for a non-tensor value), or None
    when it raises. Run once per program (both kiln calls compare against it)."""
    try:
        module = load_program(case.source, "kiln_fuzz_reference")
        module.make_globals(case.device)
        for value in vars(module).values():
            if isinstance(value, torch.nn.Module):
                value.double()
        with grown(case.growth):
            made = module.make_inputs(case.device)
        wants_grad = bool(getattr(module, "GRADS", False))
        leaves = [t.double().requires_grad_() for t in made
                  if wants_grad and isinstance(t, torch.Tensor) and t.is_floating_point()]
        floats = iter(leaves)
        inputs = [(next(floats) * 1 if wants_grad else t.double())
                  if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in made]
        with _Float64Everywhere():
            out = module.fn(*inputs)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        grads = gradients(out, leaves + parameters_of(module), torch.float64) \
            if wants_grad else None
    except Exception:
        return None
    grads = grads if isinstance(grads, list) else []
    return [_as_ref(o) for o in out], [_as_ref(t) for t in inputs], [_as_ref(g) for g in grads]


def _as_ref(value: Any) -> torch.Tensor | None:
    """A result as a CPU float64 tensor to compare against (None for a non-tensor value)."""
    return value.detach().cpu().double() if isinstance(value, torch.Tensor) else None


def _storage(t) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


def _alias_map(outputs, inputs) -> list[tuple]:
    ins, outs = [_storage(t) for t in inputs], [_storage(t) for t in outputs]
    return [tuple(sorted({f"input {j}" for j, s in enumerate(ins) if s == p and p}
                         | {f"output {j}" for j, s in enumerate(outs) if s == p and p and j != i}))
            for i, p in enumerate(outs)]


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """Strides that matter: a dim of size 1 is never stepped over, so its stride is free."""
    return tuple(st for st, size in zip(t.stride(), t.shape) if size != 1)


def _compare_aliasing(expected, eager_inputs, got, kiln_inputs) -> None:
    want, have = _alias_map(expected, eager_inputs), _alias_map(got, kiln_inputs)
    for i, (w, h) in enumerate(zip(want, have)):
        w_in, h_in = _inputs_of(w), _inputs_of(h)
        if w_in != h_in:
            raise _Mismatch("mismatch:alias", f"output {i} shares storage with "
                            f"{list(w) or 'nothing'} in eager, {list(h) or 'nothing'} in kiln")
        e, k = expected[i], got[i]
        if w_in and (_strides(e) != _strides(k) or e.storage_offset() != k.storage_offset()):
            raise _Mismatch("mismatch:stride", f"aliasing output {i}: eager stride {e.stride()} "
                            f"offset {e.storage_offset()}, kiln stride {k.stride()} "
                            f"offset {k.storage_offset()}")
        if not w_in:
            _compare_overlaps(i, sorted(set(w) | set(h)), expected, got)


def _inputs_of(group: tuple) -> tuple:
    return tuple(name for name in group if name.startswith("input"))


def _compare_overlaps(i: int, group: list, expected, got) -> None:
    """Outputs that alias no input live in fresh memory: where it starts, how it is laid out and
    whether two outputs that share no element also share a storage is not observable through
    their values; which elements they share is (a write through one output is seen through the
    other). Compare that, element by element (seed 66139: `t[0::3]` and `t[2]` of one
    intermediate share a storage in eager and no element)."""
    for name in group:
        if not name.startswith("output"):
            continue
        j = int(name.split()[1])
        if _shared(expected[i], expected[j]) != _shared(got[i], got[j]):
            raise _Mismatch("mismatch:alias", f"outputs {i} and {j} share other elements in "
                            f"eager (strides {expected[i].stride()}, {expected[j].stride()}) "
                            f"than in kiln (strides {got[i].stride()}, {got[j].stride()})")


def _shared(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int]]:
    return _overlap(a, b) if _storage(a) == _storage(b) else []


def _byte_addresses(t: torch.Tensor) -> list[int]:
    address = torch.full(tuple(t.shape), t.storage_offset(), dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        address = address + torch.arange(size).view(shape) * stride
    return (address.flatten() * t.element_size()).tolist()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int]]:
    """(flat index in a, flat index in b) of the elements that start at the same byte."""
    where_b = {addr: n for n, addr in enumerate(_byte_addresses(b))}
    return [(n, where_b[addr]) for n, addr in enumerate(_byte_addresses(a)) if addr in where_b]
