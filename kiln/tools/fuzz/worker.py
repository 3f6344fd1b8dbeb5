"""A fuzz worker process: reads programs (one JSON line each) on stdin, checks each with the
oracle and writes one JSON verdict line per program on its protocol pipe.

Run by `pool` as `python -m kiln.tools.fuzz.worker BACKEND DEVICE CPU_CODEGEN`. The real stdout
is kept for the protocol and file descriptor 1 is pointed at stderr, so that whatever a program,
kiln or Triton prints cannot corrupt it. A crash (segfault, abort) ends the process; the pool
sees the pipe close and attributes the crash to the program it had sent.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import sys

__all__ = ["main"]


def main(argv: list[str]) -> int:
    backend, device, cpu_codegen = argv
    if cpu_codegen == "triton_interpret":
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    faulthandler.enable()
    import warnings

    from kiln.config import config
    from kiln.tools.fuzz.oracle import Verdict, check_source
    warnings.simplefilter("ignore")
    config.cpu_codegen = cpu_codegen
    # Tell the pool that imports are done: its per-program timeout starts after this line.
    protocol.write("ready\n")
    protocol.flush()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            verdict = check_source(job["source"], backend, device)
        except BaseException as exc:  # an error of the harness itself, reported as its class
            verdict = Verdict(f"harness:{type(exc).__name__}", str(exc)[:300])
        protocol.write(json.dumps({"id": job["id"], **dataclasses.asdict(verdict)}) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
