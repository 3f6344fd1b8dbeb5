"""kiln's one exception hierarchy. Every error names its stage, the user location when known, and
one concrete hint:

    [kiln.<stage>] <message>
      File "model.py", line 12, in forward
        y = float(t)
      hint: <hint>
"""

from __future__ import annotations

from kiln.diagnostics import Unsupported, UserLocation

__all__ = [
    "BackendCompilerFailed",
    "CodegenError",
    "InternalError",
    "InvalidArgument",
    "KilnConfigError",
    "KilnError",
    "UnsupportedError",
]


class KilnError(Exception):
    """Base of all kiln errors. `stage` is a pipeline stage or "api"/"config"."""

    stage: str = "kiln"

    def __init__(self, msg: str, *, location: UserLocation | None = None,
                 hint: str | None = None, stage: str | None = None) -> None:
        if stage is not None:
            self.stage = stage
        self.msg = msg
        self.location = location
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"[kiln.{self.stage}] {self.msg}"]
        if self.location is not None:
            lines.append(self.location.render())
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


class KilnConfigError(KilnError):
    """A bad setting (environment variable or config value)."""

    stage = "config"


class UnsupportedError(KilnError):
    """A graph break that fullgraph=True turned into an error; `.record` holds the diagnostic."""

    stage = "capture"

    def __init__(self, record: Unsupported) -> None:
        self.record = record
        super().__init__(record.message, location=record.location,
                         hint=record.hints[0] if record.hints else None)

    def render(self) -> str:
        return (f"[kiln.{self.stage}] {self.record.render()}\n"
                "  (fullgraph=True turns graph breaks into errors; "
                "use fullgraph=False to run this part eagerly)")


class BackendCompilerFailed(KilnError):
    """The backend raised while compiling a captured graph; the original is chained as __cause__."""

    stage = "backend"

    def __init__(self, backend_name: str, original: BaseException, *,
                 location: UserLocation | None = None) -> None:
        self.backend_name = backend_name
        self.original = original
        super().__init__(
            f"backend {backend_name!r} failed: {type(original).__name__}: {original}",
            location=location,
            hint="try backend='eager' to check capture alone; "
                 "set KILN_SUPPRESS_ERRORS=1 to fall back to eager")
        self.__cause__ = original


class CodegenError(KilnError, NotImplementedError):
    """The code generator cannot print a kernel for a group (an op, dtype or loop shape it does
    not handle yet). Still a NotImplementedError, as it was before it joined the hierarchy."""

    stage = "codegen"


class InvalidArgument(KilnError, ValueError):
    """A public API was called with a bad argument."""

    stage = "api"


class InternalError(KilnError):
    """A bug in kiln itself."""

    stage = "internal"

    def __init__(self, msg: str, *, location: UserLocation | None = None,
                 stage: str | None = None) -> None:
        super().__init__(msg, location=location, stage=stage,
                         hint="this is a kiln bug: please report it with the output of "
                              "KILN_LOGS=all and a small repro")
