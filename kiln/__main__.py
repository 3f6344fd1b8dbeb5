"""`python -m kiln demo`: the seed's TransformerBlock captured by kiln, checked against eager,
and its explain report (on the GPU when there is one, else at a small size on the CPU).

`python -m kiln bench`: the built-in suite under eager, kiln and torch.compile
(`kiln.tools.bench`; `--report` also writes the HTML report of the first model).
`python -m kiln explain TARGET`: the explain report for a user's code (`kiln.tools.explain_cli`).
`python -m kiln report [TARGET]`: the HTML report (`kiln.tools.report`).
`python -m kiln fuzz`: a differential fuzzing campaign, eager vs a kiln backend
(`kiln.tools.fuzz`, `docs/fuzzing.md`)."""
from __future__ import annotations

import argparse
import sys

import torch

import kiln
from kiln.config import config as kiln_config
from kiln.tools.bench_report import execution_note
from kiln.tools.compile_time import first_call_line, timed_first_call
from kiln.tools.seed_model import TransformerBlock, seed_sizes


def demo(args: argparse.Namespace) -> int:
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    d_model, nhead, shape = seed_sizes(device)
    torch.manual_seed(0)
    model = TransformerBlock(d_model, nhead).to(device)
    x = torch.randn(*shape, device=device)
    print(f"kiln {kiln.__version__} demo: the seed's TransformerBlock (d_model {d_model}, "
          f"{nhead} heads, input {list(shape)}) on {device}, torch {torch.__version__}")
    print(f"what runs: {execution_note(device, kiln_config.default_backend)}\n")
    for phase, ctx in (("training", torch.enable_grad), ("inference", torch.no_grad)):
        model.train(phase == "training")
        with ctx():
            report = kiln.explain(model)(x)
            compiled = kiln.compile(model)
            out, first_s, stages = timed_first_call(lambda: compiled(x))
            same = torch.equal(out, model(x))
        print(f"== {phase}: {report.graph_count} graph(s), {report.graph_break_count} break(s), "
              f"{report.op_count} ops; output equal to eager: {same}\n   "
              f"{first_call_line(first_s, stages)}")
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
    from kiln.tools import bench_report, explain_cli
    from kiln.tools.report import cli as report_cli
    run_bench = sub.add_parser("bench", help="eager vs kiln (vs torch.compile) on the model suite",
                               description=bench_report.DESCRIPTION,
                               epilog=bench_report.models_help(),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_report.add_arguments(run_bench)
    run_explain = sub.add_parser("explain", help="print kiln's explain report for your code",
                                 description=explain_cli.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    explain_cli.add_arguments(run_explain)
    run_report = sub.add_parser("report", help="one self-contained HTML report: breaks, "
                                "recompiles, fusion, kernels vs the machine's ceilings",
                                description=report_cli.DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    report_cli.add_arguments(run_report)
    from kiln.tools.fuzz import cli as fuzz_cli
    run_fuzz = sub.add_parser("fuzz", help="differential fuzzing: random programs, eager vs kiln",
                              description=fuzz_cli.__doc__)
    fuzz_cli.add_arguments(run_fuzz)
    args = parser.parse_args(argv)
    if args.command == "fuzz":
        return fuzz_cli.fuzz_command(args)
    if args.command == "bench":
        return bench_report.bench_command(args)
    if args.command == "explain":
        return explain_cli.explain_command(args)
    if args.command == "report":
        return report_cli.report_command(args)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
