"""passes: a stage's passes as one named, ordered list, each timed, dumpable and switchable off.

A ground-floor service: a stage declares its passes once (`PassList(stage, passes, printer)`),
and `run(state)` applies them in order. For every pass it

- times it (a `PassRecord` per pass, emitted to the `kiln.records` stream as `passes` and
  logged under `kiln.passes` at DEBUG; the stage's own time is still the caller's stage timer,
  so `timings.json`, explain and report are unchanged);
- under `KILN_DEBUG_DIR`, writes the state after it with the stage's printer into one folder
  per run, `<n>_<stage>_passes/`: `00_input.py` (the state before the first pass),
  `<i>_<pass>.py` after pass i (1-based; a pass that was off and has no stand-in writes
  nothing, so the gap shows it) and `passes.json` (each pass's status and seconds);
- switches it off when the stage entry's keyword named by `Pass.flag` is False
  (`schedule(split=False)`) or its name is in `config.disabled_passes`
  (`KILN_DISABLE_PASSES="gemm_merge,split"`); `Pass.off`, when set, runs instead (fusion off
  means one kernel per node).

Pass names are unique across stages, so a name alone says which pass. An unknown name, or the
name of a pass marked `required` (the stage's output is wrong or missing without it), is a
`KilnConfigError` listing the passes that can be switched off.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kiln import records
from kiln.config import config
from kiln.dump import new_dump_folder, write_dump
from kiln.errors import KilnConfigError

__all__ = ["Pass", "PassList", "PassRecord", "check_disabled_passes", "describe_passes",
           "disabled_passes", "known_passes"]

log = logging.getLogger("kiln.passes")

# stage → its passes, in the order the stages declared them (for validation and listing)
_DECLARED: dict[str, tuple[Pass, ...]] = {}


@dataclasses.dataclass(frozen=True)
class Pass:
    """One pass of a stage. name: what `KILN_DISABLE_PASSES` and the dumps call it. run:
    `state -> state` (may change the state in place and return it). doc: one line for listings.
    flag: the keyword of the stage entry that switches it off when False (None: none).
    required: the stage's output is wrong or missing without it; never switched off by name.
    off: `state -> state` to run instead while the pass is off (None: nothing runs)."""

    name: str
    run: Callable[[Any], Any]
    doc: str = ""
    flag: str | None = None
    required: bool = False
    off: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """What one pass did in one run: status "ran", "off" (skipped) or "off, stand-in ran"
    (`Pass.off` ran instead), and the seconds it took."""

    stage: str
    name: str
    status: str
    seconds: float


class PassList:
    """A stage's passes in order; see the module docstring. `printer(state) -> str` renders a
    state for the debug dump (readable text, runnable Python where the stage's IR prints so)."""

    def __init__(self, stage: str, passes: Iterable[Pass],
                 printer: Callable[[Any], str], *, declare: bool = True) -> None:
        self.stage = stage
        self.passes = tuple(passes)
        self.printer = printer
        if declare:
            _declare(stage, self.passes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def bind(self, **runs: Callable[[Any], Any]) -> PassList:
        """The same passes with the functions of the named ones replaced (for a run that needs
        a per-call function, e.g. one that remembers what it did); names stay as declared."""
        unknown = set(runs) - set(self.names)
        if unknown:
            raise ValueError(f"{self.stage} has no passes {sorted(unknown)}; it has {self.names}")
        passes = [dataclasses.replace(p, run=runs.get(p.name, p.run)) for p in self.passes]
        return PassList(self.stage, passes, self.printer, declare=False)

    def run(self, state: Any, *, flags: Mapping[str, bool] | None = None) -> Any:
        """Apply the passes in order to `state`; returns the final state."""
        disabled = disabled_passes()
        flags = flags or {}
        dump = _Dump.open(self.stage, self.printer)
        dump.write(0, "input", state)
        done = []
        for i, p in enumerate(self.passes, 1):
            on = p.name not in disabled and (p.flag is None or flags.get(p.flag, True))
            fn = p.run if on else p.off
            start = time.perf_counter()
            if fn is not None:
                state = fn(state)
            status = "ran" if on else "off" if fn is None else "off, stand-in ran"
            done.append(PassRecord(self.stage, p.name, status, time.perf_counter() - start))
            if fn is not None:
                dump.write(i, p.name, state)
        _report(done)
        dump.finish(done)
        return state

    def __repr__(self) -> str:
        return f"<PassList {self.stage}: {', '.join(self.names)}>"


def _declare(stage: str, passes: tuple[Pass, ...]) -> None:
    names = [p.name for p in passes]
    if len(set(names)) != len(names):
        raise ValueError(f"{stage}: pass names repeat: {names}")
    for other, theirs in _DECLARED.items():
        clash = set(names) & {p.name for p in theirs}
        if other != stage and clash:
            raise ValueError(f"{stage}: pass names {sorted(clash)} are already {other}'s")
    _DECLARED[stage] = passes


def known_passes() -> dict[str, tuple[str, ...]]:
    """Stage → its pass names in order, for every stage imported so far (importing `kiln`
    imports them all)."""
    return {stage: tuple(p.name for p in passes) for stage, passes in _DECLARED.items()}


def describe_passes() -> str:
    """One line per pass, stages in the order they were declared: `stage  name  doc`, with
    `(required)` on the passes that cannot be switched off."""
    width = max((len(p.name) for ps in _DECLARED.values() for p in ps), default=0)
    return "\n".join(f"{stage:<9} {p.name:<{width}}  {p.doc}"
                     + ("  (required)" if p.required else "")
                     for stage, passes in _DECLARED.items() for p in passes)


def _names(setting: Any) -> set[str]:
    if isinstance(setting, str):
        return {n.strip() for n in setting.split(",") if n.strip()}
    return {str(n).strip() for n in setting or ()}


def disabled_passes() -> frozenset[str]:
    """The names in `config.disabled_passes`, checked (see `check_disabled_passes`)."""
    names = _names(config.disabled_passes)
    check_disabled_passes(names)
    return frozenset(names)


def check_disabled_passes(names: Iterable[str]) -> None:
    """KilnConfigError for a name no stage declared, or for a required pass."""
    declared = {p.name: (stage, p) for stage, passes in _DECLARED.items() for p in passes}
    for name in sorted(names):
        if name not in declared:
            raise KilnConfigError(f"KILN_DISABLE_PASSES / config.disabled_passes: no pass is "
                                  f"named {name!r}", hint=f"the passes: {_listing(True)}")
        stage, p = declared[name]
        if p.required:
            raise KilnConfigError(f"KILN_DISABLE_PASSES / config.disabled_passes: pass {name!r} "
                                  f"cannot be switched off: the {stage} stage needs it for "
                                  f"correct results ({p.doc})",
                                  hint=f"passes that can be switched off: {_listing(False)}")


def _listing(with_required: bool) -> str:
    """'autograd: joint_attention; schedule: gemm_merge, ..., memory (required)'."""
    return "; ".join(
        f"{stage}: " + ", ".join(p.name + (" (required)" if p.required else "")
                                 for p in passes if with_required or not p.required)
        for stage, passes in _DECLARED.items())


def _report(done: list[PassRecord]) -> None:
    for record in done:
        records.emit("passes", record)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s passes: %s", done[0].stage if done else "?",
                  ", ".join(f"{r.name} {r.seconds * 1e3:.1f} ms ({r.status})" for r in done))


@dataclasses.dataclass
class _Dump:
    """One run's `<n>_<stage>_passes/` folder, or nothing when `KILN_DEBUG_DIR` is unset."""

    folder: str | None
    printer: Callable[[Any], str]

    @classmethod
    def open(cls, stage: str, printer: Callable[[Any], str]) -> _Dump:
        return cls(new_dump_folder(f"{stage}_passes"), printer)

    def write(self, index: int, name: str, state: Any) -> None:
        if self.folder is not None:
            write_dump(self.folder, {f"{index:02d}_{name}.py": self.printer(state)})

    def finish(self, done: list[PassRecord]) -> None:
        if self.folder is None:
            return
        rows = [{"pass": r.name, "status": r.status, "seconds": r.seconds} for r in done]
        write_dump(self.folder, {"passes.json": json.dumps(rows, indent=1) + "\n"})
