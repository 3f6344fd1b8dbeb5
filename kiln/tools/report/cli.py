"""`python -m kiln report`: the HTML report from the shell (`add_arguments`, `report_command`).

  python -m kiln report [TARGET] [-o report.html] [--debug-dir DIR] [--backend NAME]
                        [--mode MODE] [--device cpu|cuda] [--no-torch-compile] [--no-profile]
  python -m kiln report --from-debug-dir DIR [-o report.html]

TARGET is as for `kiln explain` (script.py:make, module:make, suite:NAME; default
suite:seed_block, full size on CUDA and small on the CPU). The first form compiles and runs it
with the backend writing its per-graph artifacts under DIR (a temporary folder by default); the
second rebuilds the report from an existing debug dir alone.
"""
from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any, Callable, Sequence

import torch

__all__ = ["DESCRIPTION", "add_arguments", "report_command", "report_for_target"]

DESCRIPTION = """\
Write one self-contained HTML file (no network, no scripts) about how kiln compiled your code:
where the time goes next to eager and torch.compile (kernel by kernel, under torch.profiler),
graph breaks ranked by cost, recompiles and the guards that failed, fusion decisions, each
generated kernel against the machine's measured ceilings (roofline), and compile time by stage.

  python -m kiln report [TARGET] [-o report.html]
  python -m kiln report --from-debug-dir DIR [-o report.html]

TARGET is script.py:make, module:make or suite:NAME (default suite:seed_block, full size on
CUDA, small on the CPU). The first form compiles and runs it; the second rebuilds the report
from a KILN_DEBUG_DIR folder alone. On the CPU kiln generates no kernels by default, so the
kernel sections say why they are empty."""

DEFAULT_TARGET = "suite:seed_block"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", default=DEFAULT_TARGET,
                        help="script.py:make, module:make or suite:NAME "
                        f"(default {DEFAULT_TARGET})")
    parser.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    parser.add_argument("--debug-dir", help="write the backend's artifacts here (default: a new "
                        "temporary folder)")
    parser.add_argument("--from-debug-dir", metavar="DIR",
                        help="build the report from this existing debug dir; run nothing")
    parser.add_argument("--backend", default=None,
                        help="kiln backend (default: kiln.config.default_backend)")
    parser.add_argument("--mode", default=None, choices=("default", "max-autotune"),
                        help="compile mode passed to the backend")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available")
    parser.add_argument("--size", choices=("small", "full"), default=None,
                        help="suite model size (default: full on CUDA, small on the CPU)")
    parser.add_argument("--train", action="store_true", help="suite models in training mode")
    parser.add_argument("--arg-shapes", nargs="+", metavar="SHAPE",
                        help="TARGET is the function itself, called on random tensors of these "
                        "shapes (e.g. 2x16x64 8)")
    parser.add_argument("--calls", type=int, default=3, help="profiled calls per kernel time")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="leave torch.compile out of the profile section (it compiles the "
                        "target a second time, with Inductor)")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the profile section (eager, torch.compile and kiln side by "
                        "side under torch.profiler)")


def _to_device(value: Any, device: str) -> Any:
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def report_for_target(target: str, *, backend: str, mode: str | None, device: str,
                      size: str, debug_dir: str | None = None, train: bool = False,
                      arg_shapes: list[str] | None = None, calls: int = 3,
                      variants: Sequence[str] | None = None) -> Any:
    """Load TARGET (as `kiln explain` does), move it to `device` and collect its ReportData.
    Suite models run in inference (no_grad), or with `train` a whole training step: forward,
    the suite's loss and backward. `variants` are profiled side by side (default: eager,
    torch.compile and kiln)."""
    from kiln.tools.explain_cli import load_target
    from kiln.tools.report.collect import collect_report
    from kiln.tools.report.variants import VARIANTS
    fn, args = load_target(target, arg_shapes, train, size)
    fn, args = _to_device(fn, device), _to_device(tuple(args), device)
    suite = target.startswith("suite:")
    after = _training_step(target, size, device) if suite and train else None
    ctx = torch.no_grad() if suite and not train else contextlib.nullcontext()
    with ctx:
        return collect_report(fn, args, target=target, backend=backend, mode=mode,
                              device=device, debug_dir=debug_dir, calls=calls, after=after,
                              variants=VARIANTS if variants is None else variants)


def _training_step(target: str, size: str, device: str) -> Callable[[Any], Any]:
    """output -> the suite's loss on a fresh batch's target, then backward."""
    from kiln.tools.suite.model_registry import get
    spec = get(target[len("suite:"):])
    target_tensor = spec.make_batch(size).to(device, torch.float32).target
    return lambda output: spec.loss(output, target_tensor).backward()


def write_report(data: Any, output: str) -> str:
    from kiln.tools.report.render import render_html
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        f.write(render_html(data))
    return os.path.abspath(output)


def report_command(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    from kiln.config import config
    from kiln.tools.report.data import from_debug_dir
    from kiln.tools.report.render_profile import profile_lines
    if args.from_debug_dir:
        data = from_debug_dir(args.from_debug_dir)
    else:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("kiln report: --device cuda but torch.cuda.is_available() is False "
                             "(hint: use --device cpu)")
        data = report_for_target(args.target, backend=args.backend or config.default_backend,
                                 mode=args.mode, device=device,
                                 size=args.size or ("full" if device == "cuda" else "small"),
                                 debug_dir=args.debug_dir, train=args.train,
                                 arg_shapes=args.arg_shapes, calls=args.calls,
                                 variants=_variants(args))
    path = write_report(data, args.output)
    echo(f"kiln report: {data.graph_count} graph(s), {len(data.breaks)} break(s), "
         f"{len(data.kernels)} kernel(s); artifacts in {data.debug_dir}")
    for line in profile_lines(data.profile):
        echo(line)
    echo(f"wrote {path}")
    return 0


def _variants(args: argparse.Namespace) -> tuple[str, ...]:
    from kiln.tools.report.variants import VARIANTS
    if args.no_profile:
        return ()
    return tuple(v for v in VARIANTS if v != "torch.compile" or not args.no_torch_compile)
