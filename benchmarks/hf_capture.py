"""Capture of tiny Hugging Face models: kiln.explain next to torch._dynamo.explain, per arch.

    python benchmarks/hf_capture.py [arch ...] [--no-dynamo] [--reasons]

For each arch of `kiln.tools.suite.hf.ARCHS`: kiln's graphs and breaks, Dynamo's, whether the
compiled output equals eager on fresh random inputs, and the first-call time (CPU). Prints a
table; `--reasons` also prints kiln's break reasons.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

import kiln
from kiln.tools.suite import hf


def _equal(a, b) -> bool:
    ta, tb = hf.tensors_of(a), hf.tensors_of(b)
    return len(ta) == len(tb) and len(ta) > 0 and all(
        x.shape == y.shape and torch.allclose(x, y, atol=1e-5, rtol=1e-4) for x, y in zip(ta, tb))


def measure(arch: hf.HFArch, dynamo: bool) -> dict:
    """One row: kiln graphs/breaks/reasons, Dynamo's, output equality, first-call seconds."""
    model = hf.build(arch)
    inputs = hf.make_inputs(arch, gen=torch.Generator().manual_seed(1))
    row = {"arch": arch.name}
    with torch.no_grad():
        expected = model(**inputs)
        start = time.perf_counter()
        try:
            out = kiln.explain(model)(**inputs)
            row.update(graphs=out.graph_count, breaks=out.graph_break_count,
                       reasons=[str(r).splitlines()[0] for r in out.break_reasons])
        except Exception as e:  # noqa: BLE001  (a crash is a row, not the end of the table)
            row.update(graphs="ERR", breaks="ERR", reasons=[f"{type(e).__name__}: {e}"[:300]])
        row["first_s"] = time.perf_counter() - start
        kiln.reset()
        compiled = kiln.compile(model, backend="eager")
        try:
            row["equal"] = _equal(compiled(**inputs), expected)
        except Exception as e:  # noqa: BLE001
            row["equal"] = f"ERR {type(e).__name__}: {str(e)[:200]}"
        kiln.reset()
        if dynamo:
            torch._dynamo.reset()
            d = torch._dynamo.explain(model)(**inputs)
            row.update(d_graphs=d.graph_count, d_breaks=d.graph_break_count)
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("archs", nargs="*")
    parser.add_argument("--no-dynamo", action="store_true")
    parser.add_argument("--reasons", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    archs = [hf.get(a) for a in args.archs] if args.archs else hf.ARCHS
    print(f"{'arch':16} {'kiln g/b':>9} {'dynamo g/b':>10} {'equal':>6} {'first s':>8}")
    for arch in archs:
        r = measure(arch, not args.no_dynamo)
        dyn = f"{r.get('d_graphs', '-')}/{r.get('d_breaks', '-')}"
        print(f"{r['arch']:16} {str(r['graphs']) + '/' + str(r['breaks']):>9} {dyn:>10} "
              f"{str(r['equal']):>6} {r['first_s']:8.2f}", flush=True)
        if args.reasons:
            for reason in r["reasons"]:
                print("    " + reason)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
