"""kiln's differential fuzzer: random small programs, eager vs a kiln backend.

generate (`gen` over the op tables of `ops`, `views`, `effects`, `pyops`; inputs from `inputs`)
→ Python source text of one program → run it in a worker subprocess
(`pool`, `worker`) under the oracle (`oracle`: eager on fresh inputs vs kiln on other fresh
inputs: values, dtypes, shapes, aliasing, input mutations, exceptions) → group failures by class
(`classify`) → shrink one program per class to a minimal reproducer (`shrink`) → write it as a
standalone .py file (`cli`, `python -m kiln fuzz`; see docs/fuzzing.md).

Every program is source text, so a failure is its own reproducer: the file runs alone with
`python repro.py`. The fuzzer never fixes or hides a failure; the CLI reports each class.
"""
from __future__ import annotations

from kiln.tools.fuzz.gen import Program, generate_program
from kiln.tools.fuzz.oracle import Verdict, check_source

__all__ = ["Program", "Verdict", "check_source", "generate_program"]
