"""Logging: standard `logging` under the `kiln` logger.

Warnings reach users by default, as torch.compile's do: a backend that failed (and the fallback
taken), the recompile limit, a refused cache folder, capture that fell back to eager, inputs the
backend cannot compile. They go through `logging`: when the application configured handlers
(on the root logger or a `kiln` one) those show them; otherwise a handler of kiln's prints them
to stderr. `KILN_LOGS=-kiln` (or `set_logs("-kiln")`) silences them. Ordinary graph breaks are
not warnings (`KILN_LOGS=graph_breaks` shows them).

Artifacts (like TORCH_LOGS) are named loggers `kiln.<artifact>` that print to stderr when enabled:
`KILN_LOGS=graph_breaks,recompiles` (read at import through kiln.config), or `set_logs(...)`.
`all` or `+kiln` enables every artifact. Library code never prints; it logs, and warns once per site.
"""

from __future__ import annotations

import logging
import sys
from typing import Hashable

from kiln.config import config
from kiln.errors import KilnConfigError

__all__ = [
    "ARTIFACTS",
    "artifact_enabled",
    "artifact_logger",
    "log",
    "reset_warnings",
    "info_once",
    "set_logs",
    "warn_once",
]

ARTIFACTS: tuple[str, ...] = (
    "graph_breaks", "recompiles", "guards", "graph_code",
    "output_code", "fusion", "perf_hints", "aot_graphs", "bytecode", "ddp_graphs",
)
_ALL_ALIASES = {"all", "+kiln"}
QUIET = "-kiln"  # in KILN_LOGS: no warnings from kiln (errors still raise)

log = logging.getLogger("kiln")

_enabled: set[str] = set()
_handlers: dict[str, logging.Handler] = {}
_warned: set[Hashable] = set()


class _DefaultWarnings(logging.Handler):
    """kiln's warnings on stderr unless the application shows them itself: a record also
    propagates to the application's handlers, so this one stays quiet when there are any (or
    when an enabled artifact's own handler already printed it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not _shown_elsewhere(record, self):
            sys.stderr.write(self.format(record) + "\n")

    def handleError(self, record: logging.LogRecord) -> None:  # a closed stderr: stay quiet
        pass


def _shown_elsewhere(record: logging.LogRecord, ours: logging.Handler) -> bool:
    mine = {ours, *_handlers.values()}
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(h not in mine and not isinstance(h, logging.NullHandler) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent  # type: ignore[assignment]
    return record.name in {f"kiln.{name}" for name in _handlers}


log.addHandler(_DefaultWarnings())


def artifact_logger(name: str) -> logging.Logger:
    """The logger for artifact `name`: `kiln.<name>`."""
    _check(name)
    return logging.getLogger(f"kiln.{name}")


def artifact_enabled(name: str) -> bool:
    """True when artifact `name` is on; cheap enough to guard building an expensive message."""
    return name in _enabled


def _check(name: str) -> None:
    if name not in ARTIFACTS:
        raise KilnConfigError(f"unknown log artifact {name!r}",
                              hint=f"valid names: {', '.join(ARTIFACTS)}, or 'all' "
                                   f"('{QUIET}' silences kiln's warnings)")


def _parse(names: tuple[str, ...]) -> set[str]:
    chosen: set[str] = set()
    for raw in names:
        for name in (part.strip() for part in raw.split(",")):
            if not name:
                continue
            if name == QUIET:
                chosen.add(QUIET)
            elif name in _ALL_ALIASES:
                chosen.update(ARTIFACTS)
            else:
                _check(name)
                chosen.add(name)
    return chosen


def set_logs(*names: str) -> None:
    """Turn on exactly the artifacts named (each may be a comma list); `set_logs()` turns all off.
    An enabled artifact's logger gets a stderr handler at INFO and still propagates. `-kiln`
    silences kiln's warnings."""
    chosen = _parse(names)
    log.setLevel(logging.ERROR if QUIET in chosen else logging.NOTSET)
    chosen.discard(QUIET)
    for name in _enabled - chosen:
        logger = logging.getLogger(f"kiln.{name}")
        logger.removeHandler(_handlers.pop(name))
        logger.setLevel(logging.NOTSET)
    for name in chosen - _enabled:
        handler = logging.StreamHandler(_Stderr())
        handler.setFormatter(logging.Formatter(f"[kiln:{name}] %(message)s"))
        logger = logging.getLogger(f"kiln.{name}")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        _handlers[name] = handler
    _enabled.clear()
    _enabled.update(chosen)


class _Stderr:
    """Writes to whatever sys.stderr is at the time (so redirection and pytest capture work)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def warn_once(key: Hashable, msg: str, logger: logging.Logger | None = None) -> bool:
    """Log `msg` as a warning the first time `key` is seen; returns whether it was logged."""
    if key in _warned:
        return False
    _warned.add(key)
    (logger or log).warning(msg)
    return True


def info_once(key: Hashable, msg: str, logger: logging.Logger | None = None) -> bool:
    """Log `msg` at INFO the first time `key` is seen (a choice the user may want to know
    about, not a problem); returns whether it was logged."""
    if key in _warned:
        return False
    _warned.add(key)
    (logger or log).info(msg)
    return True


def reset_warnings() -> None:
    """Forget which warn_once / info_once keys were seen (part of kiln.reset())."""
    _warned.clear()


try:
    set_logs(config.logs)
except KilnConfigError as err:
    raise KilnConfigError(f"KILN_LOGS={config.logs!r}: {err.msg}", hint=err.hint) from None
