"""The capture stage's only door to private torch APIs (tested on torch 2.11 and 2.13)."""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["FakeTensor", "FakeTensorMode", "autocast_state", "torch_function_mode_count",
           "torch_function_modes", "new_fake_mode", "is_fake",
           "DataDependentError", "enter_autocast", "exit_autocast", "set_grad_enabled",
           "SYM_TYPES", "new_symbolic_fake_mode", "symbolic_dispatch", "symbolic_fake",
           "is_symbolic", "symbol_of", "symbolic_int",
           "concrete", "hint", "shape_env_facts", "SymbolPrinter", "SYM_SIZE", "SYM_STRIDE",
           "SYM_NUMEL", "SYM_STORAGE_OFFSET", "active_ddp_module", "ddp_bucket_caps",
           "ddp_ignored", "share_composable_state", "UnbackedGuardError", "bind_unbacked", "unbacked_symbols",
           "needs_scalar_outputs", "printed_name_resolves"]

try:  # where torch raises when a fake tensor's value would be needed
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    DataDependentError: tuple[type[BaseException], ...] = (
        DataDependentOutputException, DynamicOutputShapeException)
except ImportError:  # pragma: no cover - older torch
    DataDependentError = ()
    DynamicOutputShapeException = DataDependentOutputException = ()  # type: ignore[misc]

_AUTOCAST_DEVICES = ("cpu", "cuda")
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def autocast_state() -> tuple:
    """() when no autocast is active, else ((device, dtype), ...) for each active device."""
    if _any_autocast is not None and not _any_autocast():
        return ()
    return tuple((dev, torch.get_autocast_dtype(dev)) for dev in _AUTOCAST_DEVICES
                 if torch.is_autocast_enabled(dev))


torch_function_mode_count = torch._C._len_torch_function_stack


def torch_function_modes() -> tuple:
    """The active torch function modes, innermost last, as (type, device) pairs: the device of a
    `torch.device(...)` context or `torch.set_default_device` (a DeviceContext mode)."""
    return tuple((type(mode), getattr(mode, "device", None))
                 for mode in (torch._C._get_function_stack_at(i)
                              for i in range(torch._C._len_torch_function_stack())))


def new_fake_mode(*, allow_non_fake_inputs: bool) -> FakeTensorMode:
    """A fresh fake mode with static shapes (no ShapeEnv: every size is a plain int): the one
    factory of every stage that traces on fake tensors (autograd and lower import it through
    their own `_compat`). `allow_non_fake_inputs`: a real tensor that reaches an op becomes a
    constant (autograd's tracer, lower's decomposition traces) instead of an error (capture,
    where every tensor must enter the graph through a tracked source)."""
    return FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs)


def is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


def printed_name_resolves(fn: Any) -> bool:
    """Whether torch.fx prints `fn` as a graph target by a dotted name that leads back to `fn`
    itself. Not for lambdas and closures defined in torch's own Python files (FX names a lambda
    after the text left of its `=`, e.g. `torch.testing._internal....op`): as graph nodes their
    code would not run, and two of them would print alike, so a cache keyed on the code would
    hand one's compiled graph to the other."""
    from torch.fx.node import _get_qualified_name
    try:
        name = _get_qualified_name(fn)
    except Exception:
        return False
    module_name, _, attr_path = name.partition(".")
    target: Any = sys.modules.get(module_name)
    for part in attr_path.split(".") if attr_path else ():
        if target is None:
            return False
        if not hasattr(target, part):  # a submodule not imported as an attribute yet
            target = sys.modules.get(f"{getattr(target, '__name__', '')}.{part}")
        else:
            target = getattr(target, part)
    return target is fn


# Graph nodes that switch ambient state inside a captured region (the same functions Dynamo emits).
set_grad_enabled = torch._C._set_grad_enabled
enter_autocast = torch.amp.autocast_mode._enter_autocast
exit_autocast = torch.amp.autocast_mode._exit_autocast


# -- symbolic sizes (issue 15, docs/dynamic_shapes.md) -------------------------------------------
# torch's ShapeEnv and symbolic FakeTensors: the meta functions of every ATen op accept SymInts,
# and the ShapeEnv records each fact a trace relied on (`s0 > 4`) as a guard.
from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,  # noqa: E402
                                                   StatelessSymbolicContext)
from torch.utils._sympy.printers import PythonPrinter  # noqa: E402

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
# the graph nodes that read a size at run time (what Dynamo and export emit)
SYM_SIZE = torch.ops.aten.sym_size.int
SYM_STRIDE = torch.ops.aten.sym_stride.int
SYM_NUMEL = torch.ops.aten.sym_numel.default
SYM_STORAGE_OFFSET = torch.ops.aten.sym_storage_offset.default


def new_symbolic_fake_mode(dynamic_output_shapes: bool = False,
                           scalar_outputs: bool = False) -> FakeTensorMode:
    """Capture's fake mode: with a ShapeEnv, so chosen dims can be symbolic. Static tensors
    (`from_tensor(static_shapes=True)`) behave as without one. Ops whose output size depends on
    values (`nonzero`) and scalar outputs (`item`) raise, so they break the graph, unless
    `dynamic_output_shapes` / `scalar_outputs` (kiln.config's `capture_*` flags): then their
    sizes and values are unbacked symbols (`u0`, stage D). No duck sizing: two dims equal by
    chance at capture stay separate symbols, so the next call need not keep them equal (an op
    that needs them equal records that as a guard)."""
    _floor_pooled_sizes()
    shape_env = ShapeEnv(allow_scalar_outputs=scalar_outputs,
                         allow_dynamic_output_shape_ops=dynamic_output_shapes,
                         duck_shape=False, specialize_zero_one=True)
    return FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=False)


def _floor_pooled_sizes() -> None:
    """torch 2.11's meta `div_rtn` (pooled extents: `max_pool2d`'s output size) asks
    `(H - 1) % 2 != 0` of a symbolic H, recording a parity guard: a conv net over image sizes
    then recompiled for every other parity (torch 2.11 on the GPU machine). `x // y` is the
    same value for every int (Python's floor division rounds toward negative infinity, which is
    what the C++ port's remainder fix-up computed), with no guard; torch 2.13 defines it so."""
    from torch import _meta_registrations as metas

    if getattr(metas, "div_rtn", _floor_div) is not _floor_div:
        metas.div_rtn = _floor_div


def _floor_div(x: Any, y: Any) -> Any:
    return x // y


def symbolic_fake(fake_mode: FakeTensorMode, real: torch.Tensor, dynamic_dims: set[int],
                  name: str, dynamic_strides: set[int] = frozenset()) -> FakeTensor:
    """A fake copy of `real` whose `dynamic_dims` are symbols (sizes 0 and 1 stay plain ints:
    torch specializes them) and whose `dynamic_strides` are symbols of their own; `name` only
    labels the symbols in torch's own messages."""
    from torch._dynamo.source import LocalSource  # a torch Source: the ShapeEnv requires one
    sizes = [DimDynamic.DYNAMIC if d in dynamic_dims else DimDynamic.STATIC
             for d in range(real.dim())]
    strides = [DimDynamic.DYNAMIC if d in dynamic_strides else DimDynamic.INFER_STRIDE
               for d in range(real.dim())]
    context = StatelessSymbolicContext(dynamic_sizes=sizes, dynamic_strides=strides)
    fake = fake_mode.from_tensor(real, source=LocalSource(name), symbolic_context=context)
    _specialize_own_stride_symbols(fake, dynamic_strides)
    return fake


def symbolic_int(fake_mode: FakeTensorMode, value: int, name: str) -> torch.SymInt:
    """A SymInt of the capture's ShapeEnv for a Python int argument `value` >= 2 (automatic
    dynamic or `dynamic=True`), made like a symbolic size: its range starts at 2, as the
    kernels' size arguments assume (`lower/_compat.symbol_range`), and the guard `n >= 2` sends
    0, 1 and negative values to a capture of their own. `name` labels the symbol."""
    from torch._dynamo.source import LocalSource  # a torch Source: the ShapeEnv requires one
    source = LocalSource(name)
    env = fake_mode.shape_env
    symbol = env.create_symbol(value, source, DimDynamic.DYNAMIC)
    return env.create_symintnode(symbol, hint=value, source=source)


def _specialize_own_stride_symbols(fake: FakeTensor, keep: set[int]) -> None:
    """A stride torch could not write as a product of the sizes (a slice of a wider buffer:
    `big[:, :n]` has stride `(40, 1)`) gets a symbol of its own. It stays one only for the dims
    `keep` (strides that changed between calls: automatic dynamic); the others are specialized
    to their values here (the stride guard then checks them: a call with another recompiles)."""
    from torch.fx.experimental.symbolic_shapes import guard_int
    size_symbols = set().union(*(s.node.expr.free_symbols for s in fake.shape
                                 if isinstance(s, torch.SymInt)))
    for d, stride in enumerate(fake.stride()):
        if d not in keep and isinstance(stride, torch.SymInt) and \
                stride.node.expr.free_symbols - size_symbols:
            guard_int(stride)


def symbolic_dispatch(active: bool) -> Any:
    """Around fake computations on symbolic sizes: torch's Python dispatcher, whose kernels
    for composite ops (`F.pad`'s `constant_pad_nd`, ...) accept SymInts where the C++ ones
    want concrete sizes (Dynamo traces the same way). Nothing when `active` is False."""
    import contextlib
    if not active:
        return contextlib.nullcontext()
    from torch._dispatch.python import enable_python_dispatcher
    return enable_python_dispatcher()


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool whose value is not a known constant."""
    return isinstance(value, SYM_TYPES) and not value.node.is_constant() and \
        bool(value.node.expr.free_symbols)


def symbol_of(value: Any) -> Any:
    """The sympy symbol a size is, when it is exactly one fresh symbol; else None."""
    if not isinstance(value, torch.SymInt):
        return None
    expr = value.node.expr
    return expr if expr.is_Symbol else None


def concrete(value: Any) -> Any:
    """`value` as a plain Python number; a symbolic one is specialized to the value seen while
    tracing, and the ShapeEnv records that as a guard (`Eq(s0, 8)`)."""
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    return value


def hint(value: Any) -> Any:
    """The value a symbolic number had while tracing, without guarding on it (for probes whose
    answer does not depend on sizes); a plain number as it is."""
    if isinstance(value, SYM_TYPES):
        return value.node.hint if value.node.hint is not None else concrete(value)
    return value


def shape_env_facts(fake_mode: FakeTensorMode, symbols: Any) -> tuple[list, dict]:
    """What a finished trace assumed about its `symbols`: the guards the ShapeEnv recorded,
    simplified with its final replacements (those that became always true dropped), and each
    symbol's replacement (a constant when it was specialized, another symbol when two sizes
    were found equal; the symbol itself otherwise)."""
    env = fake_mode.shape_env
    replaced = {s: env.replace(s) for s in symbols}
    facts = []
    for guard in env.guards:
        expr = env.simplify(guard.expr)
        if expr != True and expr not in facts:  # noqa: E712 - a sympy true, not a Python bool
            facts.append(expr)
    return facts, replaced


class SymbolPrinter(PythonPrinter):
    """Python source for a sympy size expression, each symbol printed by `names` (a symbol ->
    source text mapping)."""

    def __init__(self, names: dict) -> None:
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr: Any) -> str:  # noqa: N802 - sympy's printer protocol
        return self.names[expr]


# -- DDP (docs/distributed.md, "Graph split at gradient-bucket boundaries") ----------------------
# What the split reads of a DistributedDataParallel module: none of it is public API.

def active_ddp_module() -> Any:
    """The DDP module whose forward is running (DDP sets a class attribute around the call of
    its wrapped module; TorchDynamo reads the same), or None."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a build without torch.distributed
        return None
    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


def share_composable_state(module: Any, alias: Any) -> None:
    """Register `alias` (kiln.compile's wrapper of `module`) under the composable-API state of
    `module` (FSDP2's `fully_shard`, `replicate`), when it has one. torch looks these states up
    by module identity, and the wrapper takes `module`'s place in its parent's tree: without
    this, `fully_shard(root)` met the wrapper of a sharded layer as an unsharded module and
    sharded its DTensors again."""
    try:
        from torch.distributed import _composable_state as composable
    except ImportError:  # a build without torch.distributed
        return
    states = getattr(composable, "_module_state_mapping", None)
    if states is None or module not in states or alias in states:
        return
    composable._insert_module_state(alias, composable._get_module_state(module))


def ddp_bucket_caps(ddp: Any) -> tuple[int, int]:
    """(first bucket's cap, every other bucket's cap) in bytes, as DDP hands them to its
    reducer. torch 2.13 keeps the first cap in `_bucket_config` (1 MiB by default, the general
    cap when the user set `bucket_cap_mb`); older versions always pass the 1 MiB default."""
    cap = int(ddp.bucket_bytes_cap)
    first = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
    if first is None:
        import torch.distributed as dist
        first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", cap)
    return min(int(first), cap), cap


def ddp_ignored(param: torch.Tensor) -> bool:
    """A parameter DDP was told to leave alone (`_set_params_and_buffers_to_ignore_for_model`):
    it has no bucket."""
    return bool(getattr(param, "_ddp_ignored", False))


# -- data-dependent sizes (stage D): unbacked symbols -------------------------------------------
# With capture's `capture_*` flags on, `nonzero` / `item` give SymInts (`u0`) that no input
# carries: their value is known only once the graph runs. Python code that decides on one
# (`if idx.shape[0] > 0:`) makes torch raise GuardOnDataDependentSymNode: a graph break.
from torch.fx.experimental.symbolic_shapes import (  # noqa: E402
    GuardOnDataDependentSymNode, compute_unbacked_bindings, free_unbacked_symbols)

UnbackedGuardError = GuardOnDataDependentSymNode


def bind_unbacked(fake_mode: FakeTensorMode, value: Any) -> dict | None:
    """The unbacked symbols `value` (an op's fake result) introduced, each with where it sits in
    the value (`.size()[0]`), as torch's passes read `meta["unbacked_bindings"]`; None when it
    introduced none. Claims them from the ShapeEnv's pending list, as Dynamo does per node."""
    if fake_mode.shape_env is None:
        return None
    return compute_unbacked_bindings(fake_mode.shape_env, value)


def unbacked_symbols(value: Any) -> set:
    """The unbacked symbols in a value's sizes (a tensor, a SymInt, or a container of them)."""
    return set(free_unbacked_symbols(value))


def needs_scalar_outputs(err: BaseException) -> bool:
    """Whether a data-dependent error came from a scalar output (`item`) rather than an op
    with a data-dependent output size (`nonzero`): which capture flag would avoid it."""
    return isinstance(err, DataDependentOutputException)
