"""Frames capture gave up on: route their calls while that compiles something, else run as is.

A frame with no graph of its own runs its route-only copy (`breaks.route_only`), so the layers
it calls are still compiled. When runs of that copy make no compiled graph run anywhere beneath
them (`dispatch.GRAPH_RUNS` does not move) `QUIET_PROBES` times in a row, routing buys nothing: the
frame is *skipped* for that first argument (module instance), and its dispatcher calls the
original function directly, so nothing it calls is intercepted: eager's cost plus one dictionary
check. This is TorchDynamo's skipped code object, whose nested frames its C hook sees for free;
kiln's interception is Python, so it is dropped where it finds nothing.

A skip decision is guarded by the module version counter (`module_version`): after any module
changed (a submodule replaced, `train()`/`eval()`, hooks), the next call probes once more. A frame that
keeps moving the counter itself (HF Llama slices its ModuleList on every call: a new ModuleList
bumps it) is skipped for good after `config.recompile_limit` extra probes.
"""
from __future__ import annotations

import functools
import inspect
import types
import weakref
from typing import Any, Callable

import torch

from kiln.capture.dispatch import GRAPH_RUNS, dead_key
from kiln.capture.module_version import MODULE_VERSION, watch
from kiln.config import config

__all__ = ["QUIET_PROBES", "SkipDecisions"]

QUIET_PROBES = 2  # route-only runs without a graph beneath before the frame is skipped
# Calling these returns before their body runs, so a probe around the call sees nothing: they
# keep their route-only copy (their bodies route while they are iterated or awaited).
_LAZY_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class SkipDecisions:
    """Per compiled function: which calls (by `dispatch.dead_key`) run the original code.

    `dead[key]` is the module version the decision holds at, `settled` the keys skipped at any
    version, `live` the keys whose runs did run graphs (they keep routing): the generated
    dispatcher reads these three. `quiet[key]` counts route-only runs without a graph beneath;
    `probes[key]` the extra probes after a version change."""

    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.lazy = bool(code.co_flags & _LAZY_FLAGS)
        self.dead: dict[int, int] = {}
        self.quiet: dict[int, int] = {}
        self.live: set[int] = set()
        self.settled: set[int] = set()
        self.probes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}

    def run(self, values: tuple, routed: Callable[..., Any],
            original: Callable[..., Any]) -> Any:
        """Call the frame with positional `values`: `routed` (its route-only copy) while it is
        being probed or found to reach graphs, `original` once it is skipped."""
        key = dead_key(self.code, values)
        if key in self.live:
            return routed(*values)
        if self.lazy:
            self._watch(key, values)
            self.live.add(key)
            return routed(*values)
        if key in self.dead:
            if self.dead[key] == MODULE_VERSION[0] or key in self.settled:
                return original(*values)
            probes = self.probes[key] = self.probes.get(key, 0) + 1
            if probes > config.recompile_limit:  # the frame's own calls keep moving it
                self.settled.add(key)
                return original(*values)
        runs = GRAPH_RUNS[0]
        result = routed(*values)
        if GRAPH_RUNS[0] != runs:
            self._watch(key, values)
            self.live.add(key)
            self.dead.pop(key, None)
        else:
            quiet = self.quiet[key] = self.quiet.get(key, 0) + 1
            if quiet >= QUIET_PROBES:
                self._watch(key, values)
                _watch_tree(values[0] if key else None)
                self.dead[key] = MODULE_VERSION[0]  # after the run: it may move the counter
        return result

    def _watch(self, key: int, values: tuple) -> None:
        """Forget a module's decisions when it is freed (its id may be reused)."""
        if key and key not in self._refs:
            self._refs[key] = weakref.ref(values[0], functools.partial(self._forget, key))

    def _forget(self, key: int, _ref: Any) -> None:
        for table in (self.dead, self.quiet, self.probes, self._refs):
            table.pop(key, None)
        self.live.discard(key)
        self.settled.discard(key)


def _watch_tree(module: Any) -> None:
    """A skip decision holds until some module beneath the frame's changes (`model.inner =
    Capturable()` must probe again): every module of the tree moves the version from now on."""
    if isinstance(module, torch.nn.Module):
        for sub in module.modules():
            watch(sub)
