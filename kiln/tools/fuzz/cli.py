"""`python -m kiln fuzz`: a differential fuzzing campaign, eager vs a kiln backend.

Generates COUNT programs from seeds SEED, SEED+1, ... (or as many as fit in --time-budget),
checks each in worker processes (a crash or a timeout is attributed to its program), groups the
failures by class (`classify`), shrinks the first program of each class to a minimal reproducer
and, with --out, writes it there as a standalone .py file, plus summary.json.
`--shrink-file FILE` re-checks and shrinks one program file instead.
Exit status: 0 when every program passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import logging
import os
import time

from kiln.tools.fuzz.classify import (class_key, program_of, reproducer_text, slug,
                                      warning_key, write_reproducer)
from kiln.tools.fuzz.gen import SIZES, generate_program
from kiln.tools.fuzz.oracle import Verdict
from kiln.tools.fuzz.pool import WorkerPool
from kiln.tools.fuzz.shrink import shrink_source

__all__ = ["add_arguments", "fuzz_command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="first program seed")
    parser.add_argument("--count", type=int, default=100, help="number of programs")
    parser.add_argument("--backend", default="aot_eager", choices=("eager", "aot_eager", "kiln"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--out", help="folder for reproducers and summary.json")
    parser.add_argument("--size", default=None, choices=tuple(SIZES),
                        help="program size (default: tiny for Triton kernels, else small)")
    parser.add_argument("--cpu-codegen", default="eager", choices=("eager", "triton_interpret"),
                        help="the kiln backend on CPU: torch ops, or Triton's interpreter")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per program")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="start no new program after this many seconds")
    parser.add_argument("--shrink-budget", type=int, default=150,
                        help="checks per shrunk class (0: do not shrink)")
    parser.add_argument("--shrink-time", type=float, default=600.0,
                        help="seconds for shrinking all classes together")
    parser.add_argument("--grow", action="store_true",
                        help="check each program again at larger input sizes (dynamic shapes)")
    parser.add_argument("--grad", action="store_true",
                        help="float inputs require grad; compare gradients too")
    parser.add_argument("--shrink-file", help="re-check and shrink this program file instead")


def _say(text: str) -> None:
    print(text, flush=True)


def _size(args: argparse.Namespace) -> str:
    kernels = args.backend == "kiln" and (args.device == "cuda" or
                                          args.cpu_codegen == "triton_interpret")
    return args.size or ("tiny" if kernels else "small")


def fuzz_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    with WorkerPool(args.backend, args.device, args.cpu_codegen, args.workers,
                    args.timeout) as pool:
        if args.shrink_file:
            with open(args.shrink_file) as handle:
                return _shrink_one(pool, args, program_of(handle.read()))
        return _campaign(pool, args, _size(args))


class _Tally:
    """Failures of a campaign by class: counts and the first (seed, verdict) of each; kiln
    warnings of passing programs (eager fallbacks) by class: counts and the first seed with
    the whole text of its first warning (a compile failure seen only on the GPU is rerun and
    diagnosed from these)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.first: dict[str, tuple[int, Verdict]] = {}
        self.warnings: collections.Counter = collections.Counter()
        self.first_warning: dict[str, tuple[int, str]] = {}
        self.ran = self.fallbacks = 0

    def add(self, seed: int, verdict: Verdict) -> None:
        self.ran += 1
        self.fallbacks += verdict.fallbacks > 0
        if verdict.ok and verdict.fallbacks:
            key = warning_key(verdict)
            self.warnings[key] += 1
            self.first_warning.setdefault(key, (seed, verdict.detail))
        if not verdict.ok:
            key = class_key(verdict)
            self.counts[key] += 1
            self.first.setdefault(key, (seed, verdict))
            _say(f"seed {seed}: {key}: {verdict.detail[:200]}")


def _campaign(pool: WorkerPool, args: argparse.Namespace, size: str) -> int:
    start = time.perf_counter()
    deadline = start + args.time_budget if args.time_budget else None
    tally, tags = _Tally(), {}

    def jobs():
        for seed in range(args.seed, args.seed + args.count):
            program = generate_program(seed, args.device, size, args.grow, args.grad)
            tags[seed] = program.tags
            yield seed, program.source

    for seed, verdict in pool.check_all(jobs(), deadline):
        tally.add(seed, verdict)
        if tally.ran % 100 == 0:
            _say(f"[{tally.ran}/{args.count}] {sum(tally.counts.values())} failing, "
                 f"{time.perf_counter() - start:.0f} s")
    elapsed = time.perf_counter() - start
    failed = sum(tally.counts.values())
    _say(f"\n{tally.ran} programs ({size}), backend {args.backend} on {args.device} (cpu_codegen "
         f"{args.cpu_codegen}), {args.workers} worker(s): {tally.ran - failed} passed, {failed} "
         f"failed, {tally.fallbacks} with kiln warnings (eager fallbacks), {elapsed:.0f} s")
    for key, n in tally.counts.most_common():
        _say(f"  {n:5d}  {key}  (first: seed {tally.first[key][0]})")
    for key, n in tally.warnings.most_common():
        seed, message = tally.first_warning[key]
        _say(f"  {n:5d}  passed with a kiln warning: {key}  (first: seed {seed})")
        _say("".join(f"           | {line}\n" for line in message.splitlines()).rstrip("\n"))
    if args.out:
        _report(pool, args, size, tally, tags, elapsed)
    return 1 if failed else 0


def _report(pool: WorkerPool, args: argparse.Namespace, size: str, tally: _Tally, tags: dict,
            elapsed: float) -> None:
    deadline = time.perf_counter() + args.shrink_time
    entries = {key: {"class": key, "count": n, "seed": tally.first[key][0],
                     "detail": tally.first[key][1].detail,
                     "tags": list(tags.get(tally.first[key][0], ()))}
               for key, n in tally.counts.most_common()}
    # Classes shrink side by side, one worker each: a shrink is a chain of dependent checks.
    with concurrent.futures.ThreadPoolExecutor(args.workers) as shrinkers:
        paths = {key: shrinkers.submit(_write, pool, args, seed, key, verdict, deadline)
                 for key, (seed, verdict) in tally.first.items()}
    for key, future in paths.items():
        entries[key]["reproducer"] = future.result()
        _say(f"reproducer for {key}: {entries[key]['reproducer']}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump({"backend": args.backend, "device": args.device, "size": size,
                   "cpu_codegen": args.cpu_codegen, "seed": args.seed, "ran": tally.ran,
                   "seconds": round(elapsed), "fallbacks": tally.fallbacks,
                   "warnings": {key: {"count": n, "first_seed": tally.first_warning[key][0],
                                      "first_message": tally.first_warning[key][1]}
                                for key, n in tally.warnings.most_common()},
                   "failures": list(entries.values())}, handle, indent=1)


def _shrunk(pool: WorkerPool, source: str, key: str, budget: int, deadline: float) -> str:
    def still_fails(candidate: str) -> bool:
        if time.perf_counter() > deadline:  # out of shrinking time: keep what we have
            return False
        verdict = pool.check(candidate)
        return not verdict.ok and class_key(verdict) == key
    return shrink_source(source, still_fails, budget) if budget else source


def _write(pool: WorkerPool, args: argparse.Namespace, seed: int, key: str, verdict: Verdict,
           deadline: float) -> str:
    source = generate_program(seed, args.device, _size(args), args.grow, args.grad).source
    small = _shrunk(pool, source, key, args.shrink_budget, deadline)
    final = pool.check(small)
    verdict = final if not final.ok else verdict
    text = reproducer_text(small, key, verdict, args.backend, args.device, args.cpu_codegen, seed)
    return write_reproducer(args.out, f"{slug(key)}-{args.backend}-seed{seed}", text)


def _shrink_one(pool: WorkerPool, args: argparse.Namespace, source: str) -> int:
    verdict = pool.check(source)
    if verdict.ok:
        _say("the program passes: nothing to shrink")
        return 0
    key = class_key(verdict)
    _say(f"{key}: {verdict.detail[:200]}")
    small = _shrunk(pool, source, key, args.shrink_budget, time.perf_counter() + args.shrink_time)
    if args.out:
        text = reproducer_text(small, key, verdict, args.backend, args.device, args.cpu_codegen,
                               args.seed)
        _say(write_reproducer(args.out, f"{slug(key)}-{args.backend}-shrunk", text))
    else:
        _say(small)
    return 1
