"""A stand-in for Triton's CompiledKernel on a machine without a GPU: it records what a bound
launch (kiln.runtime.launcher) hands the C launcher, for tests of the generated launch code."""
from __future__ import annotations


class FakeCompiledKernel:
    """Records what a bound launch hands the C launcher."""

    function = 0xF00
    packed_metadata = ("metadata",)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, *args):
        raise AssertionError("launch metadata is only computed for launch hooks")
