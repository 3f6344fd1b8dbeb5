"""Dynamic shapes on real models (issue 15): one compile for many sequence lengths, beside
torch.compile, in one process on the GPU.

  python benchmarks/dynamic_sweep.py [--models gpt2,llama] [--lens 64,96,...] [--json PATH]

Per model (HF GPT-2 and an 8-layer Llama, bf16 inference, batch 1, random weights):
- kiln default (automatic dynamic): one `kiln.compile`, called at each length in turn. Counted:
  captured graphs, autograd traces (symbolic = once for every size; per-size = one per length)
  and pipeline compiles (each compiled ATen graph), from kiln's records; `max_rel_err`: the
  logits' largest relative error against eager over the lengths (bf16 rounding is ~1e-2).
- kiln again with `config.symbolic_bound_launch` off (symbolic kernels launched through
  `fn[grid]` instead of the default bound route): `kiln_dynamic_fn_grid`.
- kiln static: a fresh `kiln.compile(dynamic=False)` at each length.
- torch.compile (dynamic=None, its automatic dynamic) over the same lengths: unique graphs.
- torch.compile static (dynamic=False) at the lengths of `--torch-static`.
- eager.
Each per-call time is the median of `triton.testing.do_bench`; the table gives each dynamic
time over the static one of its own compiler at that length.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import triton.testing

import kiln
from kiln import records
from kiln.config import config

LENS = (64, 96, 128, 192, 256, 320, 384, 512)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")


def build(name: str):
    import transformers as T

    if name == "gpt2":
        cfg = T.GPT2Config()
        model = T.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = T.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                            num_attention_heads=16, num_key_value_heads=8, vocab_size=32000)
        model = T.LlamaForCausalLM(cfg)
    else:
        raise SystemExit(f"unknown model {name!r}: gpt2 or llama")
    model.config.use_cache = False
    return model.cuda().eval().to(torch.bfloat16), cfg.vocab_size


def tokens(vocab: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (1, seq), device="cuda")


def kiln_dynamic(model, vocab, lens):
    kiln.reset()
    recorder = records.Recorder()
    records.active_recorders().append(recorder)
    compiled = kiln.compile(model)
    first_s, errors = {}, {}
    try:
        for seq in lens:
            x = tokens(vocab, seq)
            start = time.perf_counter()
            out = compiled(x)
            torch.cuda.synchronize()
            first_s[seq] = round(time.perf_counter() - start, 2)
            errors[seq] = rel_err(out.logits, model(x).logits)
    finally:
        records.active_recorders().remove(recorder)
    traces = recorder.autograd_traces
    counts = dict(graphs=sum(1 for g in recorder.graphs if g.graph is not None),
                  symbolic_traces=sum(t.symbolic for t in traces),
                  per_size_traces=sum(not t.symbolic for t in traces),
                  pipeline_compiles=len(recorder.pipeline_timings),
                  recompiles=[str(r)[:200] for r in recorder.recompiles],
                  max_rel_err=max(errors.values()))
    return per_length(compiled, vocab, lens), counts, first_s


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """The output's error against eager's (bf16: ~1e-2 is rounding), as a number for the row."""
    got, want = got.float(), want.float()
    return float(f"{((got - want).norm() / want.norm()).item():.2e}")


def per_length(compiled, vocab, lens) -> dict[int, float]:
    """Median ms of `compiled` at each length (already compiled for them)."""
    times = {}
    for seq in lens:
        x = tokens(vocab, seq)
        times[seq] = bench(lambda: compiled(x))
    return times


def static_at(compiled, vocab, seq) -> float:
    """Median ms of a fresh static compile at one length (its first call compiles)."""
    x = tokens(vocab, seq)
    compiled(x)
    return bench(lambda: compiled(x))


def kiln_static(model, vocab, seq):
    kiln.reset()
    return static_at(kiln.compile(model, dynamic=False), vocab, seq)


def torch_dynamic(model, vocab, lens):
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(model)
    start = time.perf_counter()
    for seq in lens:
        compiled(tokens(vocab, seq))
    torch.cuda.synchronize()
    compile_s = round(time.perf_counter() - start, 1)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    return per_length(compiled, vocab, lens), graphs, compile_s


def torch_static(model, vocab, seq):
    torch._dynamo.reset()
    return static_at(torch.compile(model, dynamic=False), vocab, seq)


def sweep(name: str, lens, torch_static_lens, kiln_static_lens, rows: list) -> None:
    def emit(row):
        row = dict(model=name, **row)
        print(json.dumps(row), flush=True)
        rows.append(row)

    torch.manual_seed(0)
    model, vocab = build(name)
    with torch.no_grad():
        eager = {s: bench(lambda x=tokens(vocab, s): model(x)) for s in lens}
        k_dyn, counts, first_s = kiln_dynamic(model, vocab, lens)
        emit(dict(mode="kiln_dynamic", **counts, first_call_s=first_s))
        config.symbolic_bound_launch = False
        try:
            k_fn_grid, counts, first_s = kiln_dynamic(model, vocab, lens)
        finally:
            config.symbolic_bound_launch = True
        emit(dict(mode="kiln_dynamic_fn_grid", **counts, first_call_s=first_s))
        k_static = {s: kiln_static(model, vocab, s) for s in kiln_static_lens}
        t_dyn, t_graphs, t_compile_s = torch_dynamic(model, vocab, lens)
        emit(dict(mode="inductor_dynamic", unique_graphs=t_graphs, compile_s_total=t_compile_s))
        t_static = {s: torch_static(model, vocab, s) for s in torch_static_lens}
    for s in lens:
        emit(dict(seq=s, eager_ms=round(eager[s], 3), kiln_dynamic_ms=round(k_dyn[s], 3),
                  kiln_dynamic_fn_grid_ms=round(k_fn_grid[s], 3),
                  kiln_static_ms=round(k_static[s], 3) if s in k_static else None,
                  kiln_dyn_over_static=round(k_dyn[s] / k_static[s], 3) if s in k_static else None,
                  kiln_fn_grid_over_static=round(k_fn_grid[s] / k_static[s], 3)
                  if s in k_static else None,
                  inductor_dynamic_ms=round(t_dyn[s], 3),
                  inductor_static_ms=round(t_static[s], 3) if s in t_static else None,
                  inductor_dyn_over_static=round(t_dyn[s] / t_static[s], 3)
                  if s in t_static else None))
    del model
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--lens", default=",".join(map(str, LENS)))
    ap.add_argument("--torch-static", default="128,512",
                    help="lengths at which torch.compile also compiles static (each costs a "
                         "full compile)")
    ap.add_argument("--kiln-static", default=None,
                    help="lengths at which kiln also compiles static (default: all of --lens)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lens = [int(s) for s in args.lens.split(",")]
    torch_static_lens = [int(s) for s in args.torch_static.split(",") if s]
    kiln_static_lens = lens if args.kiln_static is None else [
        int(s) for s in args.kiln_static.split(",") if s]
    rows: list = []
    for name in args.models.split(","):
        sweep(name, lens, torch_static_lens, kiln_static_lens, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
