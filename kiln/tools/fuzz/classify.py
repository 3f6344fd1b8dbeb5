"""Failure classes and reproducer files.

A verdict's `failure` names what differed: `mismatch:{value,dtype,shape,alias,stride,mutation,
count,device}`, `raises:kiln_only:<Type>` (kiln raised, eager did not), `raises:eager_only:<Type>`
(eager raised, kiln returned), `raises:type:<Eager>-><Kiln>`, `crash:signal:<SIG>` /
`crash:exit:<N>` / `crash:cuda_error`, `timeout`, `harness:<Type>` (the fuzzer itself failed).
The class key adds, for exceptions and crashes, the message with numbers and names blurred, so
two different errors of one type stay apart while one error seen at many sites groups together.
"""
from __future__ import annotations

import os
import re

from kiln.tools.fuzz.oracle import Verdict

__all__ = ["class_key", "program_of", "reproducer_text", "slug", "warning_key",
           "write_reproducer"]


def class_key(verdict: Verdict) -> str:
    if verdict.failure.startswith(("raises:", "crash:", "harness:")):
        message = _blur(verdict.detail.removesuffix("; kiln returned"))
        return f"{verdict.failure} | {message[:120]}"
    dtype = re.search(r"\(torch\.(\w+),", verdict.detail)
    if verdict.failure == "mismatch:value" and dtype:  # a bf16 rounding bug is not an fp32 one
        return f"{verdict.failure} | {dtype.group(1)}"
    return verdict.failure


def warning_key(verdict: Verdict) -> str:
    """The first line of the first kiln warning of a passing program, blurred like exception
    messages and cut short (the campaign keeps the whole text of its first occurrence)."""
    if not verdict.fallbacks:
        return ""
    return _blur((verdict.detail.splitlines() or [""])[0])[:120]


def _blur(message: str) -> str:
    message = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", message)
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    return re.sub(r"\b[tvscmx]N\b|\baccN\b", "VAR", message).strip()


def slug(key: str) -> str:
    kind, _, rest = key.partition(" | ")
    suffix = rest if kind == "mismatch:value" else ""
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{kind} {suffix}").strip("_").lower()


def reproducer_text(source: str, key: str, verdict: Verdict, backend: str, device: str,
                    cpu_codegen: str, seed: int) -> str:
    env = ("import os\nos.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads\n"
           if cpu_codegen == "triton_interpret" else "")
    flag = f" --cpu-codegen {cpu_codegen}" if cpu_codegen != "eager" else ""
    flag += " --grow" if "\nGROWTH = " in source else ""
    flag += " --grad" if "\nGRADS = True" in source else ""
    return (f"# kiln fuzz reproducer: {key}\n"
            f"# found by `python -m kiln fuzz --seed {seed} --count 1 --backend {backend} "
            f"--device {device}{flag}`, then shrunk\n"
            f"# {verdict.detail[:300]}\n"
            f"# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)\n"
            f"{env}{source.rstrip()}\n\n\n"
            "if __name__ == '__main__':\n"
            "    import sys\n"
            "    from kiln.config import config\n"
            "    from kiln.tools.fuzz.oracle import check_source\n"
            f"    config.cpu_codegen = {cpu_codegen!r}\n"
            f"    verdict = check_source(open(__file__).read(), {backend!r}, {device!r})\n"
            "    print(verdict)\n"
            "    sys.exit(0 if verdict.ok else 1)\n")


_TRAILER = "\n\nif __name__ == '__main__':"


def program_of(text: str) -> str:
    """The program inside a reproducer file (header comments, environment lines and the
    `__main__` trailer written by `reproducer_text` removed); other text is returned as is."""
    if not text.startswith("# kiln fuzz reproducer"):
        return text
    lines = text.split(_TRAILER)[0].splitlines()[4:]
    while lines and (lines[0] == "import os" or lines[0].startswith("os.environ")):
        lines.pop(0)
    return "\n".join(lines) + "\n"


def write_reproducer(out: str, name: str, text: str) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.py")
    with open(path, "w") as handle:
        handle.write(text)
    return path
