"""Processes for torch.distributed runs on one host: a free port for the rendezvous, and spawned
ranks killed after a deadline.

Used by the distributed tests (tests/distributed) and benchmarks/distributed_train.py. A rank
that stops in a collective while another has failed waits forever (gloo) or until NCCL's own
timeout; the deadline makes a hang a failure of the caller instead of a stuck run.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

__all__ = ["free_port", "spawn_ranks"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for MASTER_PORT / tcp:// init)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn: Callable[..., None], nprocs: int, args: tuple, deadline_s: float,
                env: dict[str, str] | None = None) -> None:
    """Run `fn(rank, *args)` in `nprocs` spawned processes and wait for all of them. A rank
    that raises or dies raises here (torch.multiprocessing's ProcessRaisedException /
    ProcessExitedException); past `deadline_s` the live ones are killed and TimeoutError is
    raised. `env`: the children's environment (spawned processes copy it at start)."""
    import torch.multiprocessing as mp
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False,
                                 start_method="spawn")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _join(ctx, nprocs, deadline_s)


def _join(ctx: Any, nprocs: int, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {nprocs} ranks ran past {deadline_s:.0f} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
