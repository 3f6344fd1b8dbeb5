"""cudagraphs: `mode="reduce-overhead"` — a compiled graph's launches replayed as a CUDA graph.

The policy (`CudaGraphRunner`: when to record, static input buffers, which outputs are still
alive, when to fall back) is separate from the device mechanism behind a small interface
(`GraphMechanism`: `new_pool()`, `record(fn, pool, device) -> (replayable, outputs)`,
`replayable.replay()`, `memory_reserved()`, `device_type`). The real mechanism is
`CudaGraphMechanism` (`torch.cuda.CUDAGraph` on a private pool); tests swap in a CPU fake with
`use_mechanism(...)` (tests/runtime/fake_cudagraph.py). docs/cudagraphs.md has the why.

A runner wraps one compiled wrapper's `call(args)`. Per call:

1. blocked (a reason found at compile time or at a call: CPU tensors, host syncs, a capture that
   raised): run the wrapper, as without CUDA graphs (one warning per reason says why).
2. key = every input's shape, stride, storage offset, dtype, device and every non-tensor value,
   parameters and buffers left out (step 3 checks their addresses; their layouts are what the
   wrapper was compiled for): one recording serves one key (a dynamic size is recorded per
   concrete size, up to the cap).
   The first `warmup` calls of a key run the wrapper (lazy initialisation happens outside capture).
3. a recording of the key is replayed when (a) its address-stable inputs (parameters, buffers,
   outputs of another recording such as the forward's saved activations) sit at the addresses it
   read, and (b) no output it handed out earlier is still referenced (storage use counts, as
   torch's CUDA graph trees check): a replay never overwrites a tensor the caller still holds.
   Other inputs are copied into the recording's static buffers first; inputs the wrapper writes
   are copied back after.
4. else a new recording (a new generation with its own private pool) is made, up to
   `max_recordings` per runner; past the cap the wrapper runs (warned once).

Every replay hands out fresh tensors aliasing the recording's output memory (views stay views of
one base), so the caller's tensors of two calls are different objects and liveness is per call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref
from typing import Any, Callable, Collection, Iterator, Protocol, Sequence

import torch

from kiln import records
from kiln.config import config
from kiln.logs import warn_once
from kiln.runtime._compat import data_ptrs_equal, end_failed_capture, storage_use_count

__all__ = ["CudaGraphMechanism", "CudaGraphRunner", "GraphMechanism", "Recording",
           "current_mechanism", "input_key", "use_mechanism"]

log = logging.getLogger("kiln.runtime.cudagraphs")

MiB = 1024 * 1024


# -- the mechanism ---------------------------------------------------------------------------------

class Replayable(Protocol):
    def replay(self) -> None: ...


class GraphMechanism(Protocol):
    """What records and replays device work. `device_type`: the only device a recorded graph
    may touch. `unavailable()`: why it cannot record here (None: it can)."""

    device_type: str

    def unavailable(self) -> str | None: ...

    def new_pool(self) -> Any: ...

    def record(self, fn: Callable[[], Sequence[Any]], pool: Any, device: torch.device
               ) -> tuple[Replayable, Sequence[Any]]: ...

    def memory_reserved(self, device: torch.device) -> int: ...


class CudaGraphMechanism:
    """torch.cuda.CUDAGraph captured on a private memory pool. Capture runs nothing: the outputs
    it returns are allocated but unwritten until the first `replay()`. Random ops draw from
    torch's CUDA generator, which a capture registers: each replay reads the generator's seed and
    offset from device memory and advances the offset by what the graph consumes, as eager does."""

    device_type = "cuda"

    def unavailable(self) -> str | None:
        if not config.cudagraphs_on_gpu:
            return ("CUDA graph replay is not yet validated on a GPU (KILN_CUDAGRAPHS=1 turns it "
                    "on)")
        return None if torch.cuda.is_available() else "CUDA is not available"

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def record(self, fn: Callable[[], Sequence[Any]], pool: Any, device: torch.device
               ) -> tuple[Replayable, Sequence[Any]]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device):
            torch.cuda.synchronize()  # pending eager work must not land in the capture
            stream = torch.cuda.current_stream()
            try:
                # thread_local: another thread's unsafe call does not abort this capture
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    outputs = fn()
            except BaseException:
                # when capture_end raises (a host sync invalidated the capture), torch.cuda.graph
                # leaves its side stream current and the CUDA RNG in capture mode
                torch.cuda.set_stream(stream)
                end_failed_capture(device, pool)
                raise
        return graph, outputs

    def memory_reserved(self, device: torch.device) -> int:
        return torch.cuda.memory_reserved(device)


_mechanisms: list[GraphMechanism] = []


def current_mechanism() -> GraphMechanism:
    return _mechanisms[-1] if _mechanisms else CudaGraphMechanism()


@contextlib.contextmanager
def use_mechanism(mechanism: GraphMechanism) -> Iterator[GraphMechanism]:
    """Runners made inside the block record with `mechanism` (tests: a CPU fake)."""
    _mechanisms.append(mechanism)
    try:
        yield mechanism
    finally:
        _mechanisms.remove(mechanism)


# -- recordings ------------------------------------------------------------------------------------

# storage data pointer of an output of a live recording -> that recording: an input found here
# (the forward's saved activations reaching the backward) is read in place, not copied
_pool_outputs: weakref.WeakValueDictionary[int, Recording] = weakref.WeakValueDictionary()


@dataclasses.dataclass(eq=False)
class Recording:
    """One captured graph for one input key.

    graph: the replayable. inputs: what the capture read, per position: the static buffer of a
    copied input, a non-tensor value, or (address-stable inputs) the live call's tensor while a
    replay runs and None between calls (a recording keeps no parameter alive; a fake mechanism
    reads this slot). pinned: position -> data pointer the graph reads in place. copied: positions
    copied into static buffers. written: copied positions the wrapper writes (copied back).
    outputs: the outputs of the capture, at the addresses every replay writes. tracked: (tensor,
    use count right after recording) per output storage this recording owns."""

    key: tuple
    graph: Replayable
    inputs: list[Any]
    pinned: dict[int, int]
    copied: tuple[int, ...]
    written: tuple[int, ...]
    outputs: tuple[Any, ...] = ()
    tracked: list[tuple[torch.Tensor, int]] = dataclasses.field(default_factory=list)
    pool_bytes: int = 0
    static_input_bytes: int = 0
    replays: int = 0

    def __post_init__(self) -> None:
        # pointers by input position, as torch's one-call check reads them
        self._pinned_ptrs = [self.pinned.get(i, 0) for i in range(max(self.pinned, default=-1) + 1)]
        self._pinned_indices = list(self.pinned)

    def reads_inputs_of(self, args: Sequence[Any]) -> bool:
        return data_ptrs_equal(args if isinstance(args, list) else list(args),
                               self._pinned_ptrs, self._pinned_indices)

    def outputs_alive(self) -> bool:
        """True while anyone but this recording references an output of an earlier replay
        (the caller, autograd's saved tensors, a view, a stolen .grad)."""
        return any(storage_use_count(t) > baseline for t, baseline in self.tracked)

    def run(self, args: Sequence[Any]) -> tuple:
        """Copy the call's inputs in, replay, copy written inputs back, hand out the outputs."""
        with torch.no_grad():
            for i in self.copied:
                if args[i].data_ptr() != self.inputs[i].data_ptr():
                    self.inputs[i].copy_(args[i])
            for i in self.pinned:
                self.inputs[i] = args[i]
            try:
                self.graph.replay()
            finally:
                for i in self.pinned:
                    self.inputs[i] = None
            for i in self.written:
                args[i].copy_(self.inputs[i])
        self.replays += 1
        return fresh_aliases(self.outputs)

    def track_outputs(self, pinned_storages: set[int]) -> None:
        """Remember each output storage's use count now (only this recording references it);
        a larger count later means an output handed out is still alive. Storages of in-place
        inputs are the caller's, not tracked."""
        seen: set[int] = set()
        for out in self.outputs:
            if not isinstance(out, torch.Tensor):
                continue
            ptr = out.untyped_storage().data_ptr()
            if ptr == 0 or ptr in seen or ptr in pinned_storages:  # 0: empty, nothing to keep
                continue
            seen.add(ptr)
            _pool_outputs[ptr] = self
        self.tracked = [(out, storage_use_count(out)) for out in self._first_per_storage(seen)]

    def _first_per_storage(self, ptrs: set[int]) -> list[torch.Tensor]:
        found: dict[int, torch.Tensor] = {}
        for out in self.outputs:
            if isinstance(out, torch.Tensor):
                ptr = out.untyped_storage().data_ptr()
                if ptr in ptrs:
                    found.setdefault(ptr, out)
        return list(found.values())


def fresh_aliases(outputs: Sequence[Any]) -> tuple:
    """New tensor objects over the same memory as `outputs`: one fresh base per base, views of
    it where an output was a view (autograd treats views of one base as aliases), so the caller's
    tensors are not the recording's and their references can be counted."""
    bases: dict[int, torch.Tensor] = {}
    out = []
    for o in outputs:
        if not isinstance(o, torch.Tensor):
            out.append(o)
            continue
        base = o._base if o._base is not None and o._base.dtype == o.dtype else o
        fresh = bases.get(id(base))
        if fresh is None:
            fresh = bases[id(base)] = _same_memory(base)
        out.append(fresh if o is base else fresh.as_strided(o.shape, o.stride(),
                                                            o.storage_offset()))
    return tuple(out)


def _same_memory(t: torch.Tensor) -> torch.Tensor:
    alias = torch.empty((0,), dtype=t.dtype, device=t.device)
    return alias.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def static_buffer_like(t: torch.Tensor) -> torch.Tensor:
    """An owned tensor with `t`'s size, stride and storage offset: the compiled kernels address
    storages at the offset they were compiled for, so a static buffer must keep it."""
    extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    base = torch.empty((extent if t.numel() else t.storage_offset(),), dtype=t.dtype,
                       device=t.device)
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def input_key(args: Sequence[Any], host_scalars: bool = False,
              positions: Sequence[int] | None = None) -> tuple:
    """What a recording is specific to: tensor layouts and devices, non-tensor values (the
    wrapper bakes them into launches: a symbolic size is recorded per concrete value) and, with
    `host_scalars`, the values of 0-dim CPU tensors (read on the host, so baked too). Only the
    args at `positions` when given (the runner leaves out address-stable inputs)."""
    picked = args if positions is None else [args[i] for i in positions]
    return tuple((a.shape, a.stride(), a.storage_offset(), a.dtype, a.is_cuda, a.get_device())
                 + ((a.item(),) if host_scalars and _host_scalar(a) else ())
                 if isinstance(a, torch.Tensor) else ("value", type(a).__name__, repr(a))
                 for a in picked)  # is_cuda + get_device(): the device without building one


def _host_scalar(t: torch.Tensor) -> bool:
    """A 0-dim CPU tensor beside device tensors: a value kernels receive from the host
    (attention's philox seed and offset reach the backward this way, dropout or not)."""
    return not t.is_cuda and t.dim() == 0 and t.device.type == "cpu"


# library ops that wait for the host (a value or a data-dependent size): not capturable
HOST_SYNC_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "unique",
                           "_unique", "_unique2", "unique_consecutive", "unique_dim",
                           "repeat_interleave", "is_nonzero", "equal", "argwhere"})


def capture_blockers(devices: Collection[str], library_ops: Sequence[Any],
                     device_type: str) -> str | None:
    """Why a graph cannot be captured, from what is known before any call (None: no reason):
    buffers on another device (a CUDA graph holds device work only), or a library call that
    synchronizes with the host (CUDA forbids it while a stream is capturing)."""
    others = sorted(set(devices) - {device_type})
    if others:
        return f"it holds {'/'.join(others)} buffers (a {device_type} graph replays " \
               f"{device_type} work only)"
    for op in library_ops:
        name = _op_name(op)
        if name in HOST_SYNC_OPS:
            return f"it calls aten.{name}, which waits for the host (a sync point)"
    return None


def _op_name(op: Any) -> str:
    """`aten.nonzero.default` -> "nonzero"."""
    schema = getattr(op, "_schema", None)
    name = schema.name if schema is not None else str(op)
    return name.split("::")[-1].split(".")[0]


# -- the policy ------------------------------------------------------------------------------------

class CudaGraphRunner:
    """`call(args) -> tuple` of a compiled wrapper, replayed as CUDA graphs (module docstring).

    run: the wrapper's call. name: the graph's name ("inference", "forward", "backward").
    static_inputs: positions whose tensors keep their address between calls (parameters,
    buffers: the autograd stage's static inputs); nn.Parameter inputs count too. written_inputs:
    positions the wrapper writes in place. devices / library_ops: the device types of the
    graph's buffers and the ATen ops of its library calls, checked before any call
    (`capture_blockers`). warmup: calls per key before recording. max_recordings: recordings
    per runner over all keys and generations."""

    def __init__(self, run: Callable[[Sequence[Any]], tuple], *, name: str = "graph",
                 static_inputs: Sequence[int] = (), written_inputs: Sequence[int] = (),
                 devices: Collection[str] = (), library_ops: Sequence[Any] = (),
                 warmup: int = 1, max_recordings: int = 8,
                 mechanism: GraphMechanism | None = None) -> None:
        self.run = run
        self.name = name
        self.static_inputs = frozenset(static_inputs)
        self.written_inputs = frozenset(written_inputs)
        self.warmup = warmup
        self.max_recordings = max_recordings
        self.mechanism = mechanism or current_mechanism()
        self.recordings: dict[tuple, list[Recording]] = {}
        self.calls: dict[tuple, int] = {}
        self.stats = {"warmup": 0, "recorded": 0, "replayed": 0, "eager": 0}
        self.blocked: str | None = None
        self.keyed: list[int] | None = None  # positions in the key (`_keyed_positions`)
        reason = (self.mechanism.unavailable()
                  or capture_blockers(devices, library_ops, self.mechanism.device_type))
        if reason is not None:
            self._block(reason)

    def __call__(self, args: Sequence[Any]) -> tuple:
        if self.blocked is not None:
            return self._eager(args)
        if self.keyed is None:
            self.keyed = self._keyed_positions(args)
        key = input_key(args, self.mechanism.device_type != "cpu", self.keyed)
        seen = self.calls.get(key, 0) + 1
        if seen == 1:  # a known key passed this check (parameters: again before each recording)
            reason = self._call_blocker(args)
            if reason is not None:
                self._block(reason)
                return self._eager(args)
        self.calls[key] = seen
        if seen <= self.warmup:
            self.stats["warmup"] += 1
            return self.run(args)
        recording = self._reusable(key, args) or self._record(key, args)
        if recording is None:
            return self._eager(args)
        self.stats["replayed"] += 1
        return recording.run(args)

    @property
    def pool_bytes(self) -> int:
        return sum(r.pool_bytes for rs in self.recordings.values() for r in rs)

    def num_recordings(self) -> int:
        return sum(len(rs) for rs in self.recordings.values())

    # -- choosing --------------------------------------------------------------------------------
    def _keyed_positions(self, args: Sequence[Any]) -> list[int]:
        """The positions a call's key reads: all but parameters and buffers. Those keep their
        address, which every replay checks (`Recording.reads_inputs_of`), and their layout,
        which the wrapper itself was compiled for; keying on them cost a tuple per parameter
        per call (~1.7 us each on the CPU: 23 us for the seed block's 13 inputs)."""
        return [i for i, a in enumerate(args)
                if i not in self.static_inputs and not isinstance(a, torch.nn.Parameter)]

    def _call_blocker(self, args: Sequence[Any]) -> str | None:
        """Why this call cannot replay. 0-dim CPU tensors are host values, keyed by value
        (`input_key`): a capture that copies one to the device fails and blocks then."""
        on_device = False
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if a.device.type == self.mechanism.device_type:
                on_device = True
            elif not _host_scalar(a):
                return (f"input {i} is a {a.device.type} tensor (a "
                        f"{self.mechanism.device_type} graph replays device work only)")
        if not on_device:
            return "the graph has no tensor inputs on its device"
        return None

    def _reusable(self, key: tuple, args: Sequence[Any]) -> Recording | None:
        for recording in self.recordings.get(key, ()):
            if recording.reads_inputs_of(args) and not recording.outputs_alive():
                return recording
        return None

    def _record(self, key: tuple, args: Sequence[Any]) -> Recording | None:
        blocker = self._call_blocker(args)  # a parameter moved to another device: not keyed
        if blocker is not None:
            self._block(blocker)
            return None
        why = self._why_new(key, args)
        if self.num_recordings() >= self.max_recordings:
            warn_once(("kiln-cudagraphs-cap", id(self)), self._cap_message(why), log)
            return None
        log.debug("kiln cudagraphs: recording the %s graph again: %s", self.name, why)
        try:
            recording = self._capture(key, args)
        except Exception as err:  # noqa: BLE001 - whatever fails in capture, eager is right
            self._block(f"capturing it raised {type(err).__name__}: {err}")
            return None
        self.recordings.setdefault(key, []).append(recording)
        self.stats["recorded"] += 1
        self._report(recording)
        return recording

    def _why_new(self, key: tuple, args: Sequence[Any]) -> str:
        """Why no recording of `key` serves this call, in words."""
        recordings = self.recordings.get(key)
        if not recordings:
            return "it was called with new input sizes"
        if not any(r.reads_inputs_of(args) for r in recordings):
            return ("an input it reads in place (a parameter or buffer, or another graph's "
                    "output) is at a new address")
        return "outputs of its earlier replays are still referenced"

    def _cap_message(self, why: str) -> str:
        return (f"kiln cudagraphs: the {self.name} graph has {self.num_recordings()} CUDA graph "
                f"recordings (the cap, max_recordings) and {why}; such calls run the compiled "
                "kernels without a CUDA graph. Free or clone outputs you keep across calls, or "
                "raise options={'cudagraph_max_recordings': n}")

    # -- recording -------------------------------------------------------------------------------
    def _capture(self, key: tuple, args: Sequence[Any]) -> Recording:
        pinned = {i: a.data_ptr() for i, a in enumerate(args) if self._in_place(i, a)}
        copied = tuple(i for i, a in enumerate(args)
                       if isinstance(a, torch.Tensor) and i not in pinned)
        inputs: list[Any] = list(args)
        with torch.no_grad():
            for i in copied:
                inputs[i] = static_buffer_like(args[i]).copy_(args[i])
        device = next(a.device for a in args if isinstance(a, torch.Tensor)
                      and a.device.type == self.mechanism.device_type)
        before = self.mechanism.memory_reserved(device)
        graph, outputs = self.mechanism.record(lambda: self.run(list(inputs)),
                                               self.mechanism.new_pool(), device)
        recording = Recording(key, graph, inputs, pinned, copied,
                              tuple(i for i in copied if i in self.written_inputs),
                              tuple(outputs))
        recording.pool_bytes = self.mechanism.memory_reserved(device) - before
        recording.static_input_bytes = sum(inputs[i].untyped_storage().nbytes() for i in copied)
        for i in pinned:
            inputs[i] = None  # address-stable inputs are read in place, not kept alive
        pinned_storages = {args[i].untyped_storage().data_ptr() for i in pinned}
        recording.track_outputs(pinned_storages)
        return recording

    def _in_place(self, i: int, a: Any) -> bool:
        """Read at its address by the graph (not copied): parameters and buffers, and outputs
        of another live recording (the forward's saved activations, read by the backward)."""
        if not isinstance(a, torch.Tensor) or i in self.written_inputs:
            return False
        ptr = a.untyped_storage().data_ptr()
        return (i in self.static_inputs or isinstance(a, torch.nn.Parameter)
                or (ptr != 0 and ptr in _pool_outputs))

    # -- falling back ----------------------------------------------------------------------------
    def _block(self, reason: str) -> None:
        self.blocked = reason
        warn_once(("kiln-cudagraphs-fallback", self.name, reason),
                  f"kiln cudagraphs: the {self.name} graph runs without CUDA graphs: {reason}",
                  log)

    def _eager(self, args: Sequence[Any]) -> tuple:
        self.stats["eager"] += 1
        return self.run(args)

    def _report(self, recording: Recording) -> None:
        shapes = [k[0] for k in recording.key if k and k[0] != "value"]
        log.info("kiln cudagraphs: recorded the %s graph (#%d) for input sizes %s: private "
                 "pool %.2f MiB, static input buffers %.2f MiB (%d copied, %d read in place)",
                 self.name, self.num_recordings(), shapes, recording.pool_bytes / MiB,
                 recording.static_input_bytes / MiB, len(recording.copied),
                 len(recording.pinned))
        records.emit("cudagraphs", {"graph": self.name, "recordings": self.num_recordings(),
                                    "pool_bytes": recording.pool_bytes,
                                    "static_input_bytes": recording.static_input_bytes,
                                    "copied_inputs": len(recording.copied),
                                    "in_place_inputs": len(recording.pinned)})
