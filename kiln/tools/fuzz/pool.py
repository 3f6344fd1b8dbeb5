"""Worker subprocesses that check programs with a per-program timeout and crash attribution.

Each worker slot is a thread that owns one `worker` process. A program that makes its worker
die (segfault, abort, CUDA fault) or run past the timeout gets a `crash:*` or `timeout` verdict,
and the slot starts a fresh worker for the next program; so does a worker whose CUDA context a
program poisoned.
"""
from __future__ import annotations

import json
import logging
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from kiln.tools.fuzz.oracle import Verdict

__all__ = ["WorkerPool"]

log = logging.getLogger("kiln.tools.fuzz")

# Importing torch, kiln (and Triton) in a fresh worker can take many seconds on a loaded machine;
# that time is not the program's.
_STARTUP_TIMEOUT = 300.0


class _Worker:
    def __init__(self, args: list[str]) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "kiln.tools.fuzz.worker", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], _STARTUP_TIMEOUT)
        self.started = bool(ready) and self.proc.stdout.readline() == "ready\n"
        self.timed_out = not ready

    def check(self, job_id: int, source: str, timeout: float) -> Verdict | None:
        """The verdict, or None when the worker died or timed out (then `dead_verdict`)."""
        if not self.started:
            return None
        try:
            self.proc.stdin.write(json.dumps({"id": job_id, "source": source}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        self.timed_out = not ready
        line = self.proc.stdout.readline() if ready else ""
        try:
            reply = json.loads(line)
        except ValueError:  # end of file (the worker died) or a torn line
            return None
        reply.pop("id")
        return Verdict(**reply)

    def dead_verdict(self, timeout: float) -> Verdict:
        if self.timed_out:
            self.proc.kill()
            self.proc.wait()
            return Verdict("timeout", f"no verdict within {timeout:.0f} s")
        try:  # the pipe closes a moment before the process is reaped
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        what = (f"signal:{signal.Signals(-code).name}" if code < 0 else f"exit:{code}")
        return Verdict(f"crash:{what}", " | ".join(tail)[-400:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


class WorkerPool:
    """Up to `workers` worker processes checking programs with `backend` on `device`. Workers
    are kept between calls of `check_all` (starting one imports torch and kiln: seconds), and
    `check_all` may be called from several threads at once (the shrinker does). `close()` ends
    them; the pool is also a context manager."""

    def __init__(self, backend: str, device: str, cpu_codegen: str = "eager", workers: int = 1,
                 timeout: float = 60.0) -> None:
        self.args = [backend, device, cpu_codegen]
        self.workers, self.timeout = max(1, workers), timeout
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def check(self, source: str, job_id: int = 0) -> Verdict:
        """The verdict on one program (blocking)."""
        ((_, verdict),) = self.check_all([(job_id, source)])
        return verdict

    def check_all(self, jobs: Iterable[tuple[int, str]],
                  deadline: float | None = None) -> Iterator[tuple[int, Verdict]]:
        """Verdicts for (id, source) jobs, in completion order. Jobs are drawn lazily (the
        generator runs while workers check); none is started after `deadline`
        (time.perf_counter() seconds)."""
        source = iter(jobs)
        lock = threading.Lock()
        done: queue.Queue = queue.Queue()

        def next_job() -> tuple[int, str] | None:
            with lock:
                if deadline is not None and time.perf_counter() > deadline:
                    return None
                return next(source, None)

        threads = [threading.Thread(target=self._slot, args=(next_job, done), daemon=True)
                   for _ in range(self.workers)]
        for thread in threads:
            thread.start()
        running = len(threads)
        while running:
            item = done.get()
            if item is None:
                running -= 1
            else:
                yield item
        for thread in threads:
            thread.join()

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Worker(self.args)

    def _slot(self, next_job: Callable[[], tuple[int, str] | None], done: queue.Queue) -> None:
        try:
            self._serve(next_job, done)
        finally:  # check_all counts these: it must get one even if this thread fails
            done.put(None)

    def _serve(self, next_job: Callable[[], tuple[int, str] | None], done: queue.Queue) -> None:
        worker = None
        while (job := next_job()) is not None:
            job_id, source = job
            worker = worker or self._take()
            verdict = worker.check(job_id, source, self.timeout)
            if verdict is None or verdict.poisoned:  # dead, hung, or its CUDA context is gone
                verdict = verdict or worker.dead_verdict(self.timeout)
                log.info("worker for program %s replaced: %s", job_id, verdict.failure)
                worker.close()
                worker = None
            done.put((job_id, verdict))
        if worker is not None:
            with self._lock:
                self._idle.append(worker)
