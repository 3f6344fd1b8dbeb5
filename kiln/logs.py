"""Logging: standard `logging` under the `kiln` logger, silent by default.

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
    "output_code", "fusion", "perf_hints", "aot_graphs", "bytecode",
)
_ALL_ALIASES = {"all", "+kiln"}

log = logging.getLogger("kiln")
log.addHandler(logging.NullHandler())

_enabled: set[str] = set()
_handlers: dict[str, logging.Handler] = {}
_warned: set[Hashable] = set()


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
                              hint=f"valid names: {', '.join(ARTIFACTS)}, or 'all'")


def _parse(names: tuple[str, ...]) -> set[str]:
    chosen: set[str] = set()
    for raw in names:
        for name in (part.strip() for part in raw.split(",")):
            if not name:
                continue
            if name in _ALL_ALIASES:
                chosen.update(ARTIFACTS)
            else:
                _check(name)
                chosen.add(name)
    return chosen


def set_logs(*names: str) -> None:
    """Turn on exactly the artifacts named (each may be a comma list); `set_logs()` turns all off.
    An enabled artifact's logger gets a stderr handler at INFO and still propagates."""
    chosen = _parse(names)
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
