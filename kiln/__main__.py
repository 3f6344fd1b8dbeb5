"""`python -m kiln demo`: the seed's TransformerBlock captured by kiln, checked against eager,
and its explain report (on the GPU when there is one, else at a small size on the CPU)."""
from __future__ import annotations

import argparse
import sys
import time

import torch

import kiln
from kiln.tools.seed_model import TransformerBlock, seed_sizes


def demo(args: argparse.Namespace) -> int:
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    d_model, nhead, shape = seed_sizes(device)
    torch.manual_seed(0)
    model = TransformerBlock(d_model, nhead).to(device)
    x = torch.randn(*shape, device=device)
    print(f"kiln {kiln.__version__} demo: the seed's TransformerBlock (d_model {d_model}, "
          f"{nhead} heads, input {list(shape)}) on {device}, torch {torch.__version__}\n")
    for phase, ctx in (("training", torch.enable_grad), ("inference", torch.no_grad)):
        model.train(phase == "training")
        with ctx():
            report = kiln.explain(model)(x)
            compiled = kiln.compile(model)
            start = time.perf_counter()
            out = compiled(x)
            first = time.perf_counter() - start
            same = torch.equal(out, model(x))
        print(f"== {phase}: {report.graph_count} graph(s), {report.graph_break_count} break(s), "
              f"{report.op_count} ops; output equal to eager: {same}; first call "
              f"{first * 1e3:.0f} ms (capture {report.compile_times.get('capture', 0) * 1e3:.0f} ms)")
        if args.verbose or phase == "inference":
            print(report)
        print()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln")
    sub = parser.add_subparsers(dest="command", required=True)
    run_demo = sub.add_parser("demo", help="capture the seed's TransformerBlock and explain it")
    run_demo.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    run_demo.add_argument("--verbose", action="store_true", help="print every report in full")
    args = parser.parse_args(argv)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
