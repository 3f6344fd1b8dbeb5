"""Compile every kernel of real models, at their real sizes, for the H200 — on a CPU machine.

  KILN_CROSS_COMPILE=cuda:90 python benchmarks/cross_compile_models.py \
      [--models seed_block,gpt2,resnet50] [--dtype bfloat16] [--train] [--batch N]

Each model's ATen graphs (inference, or forward and backward with --train) are captured the
way the kiln backend receives them, then lowered, scheduled and emitted by `compile_graph` at
the benchmark's sizes; every kernel is compiled by the installed Triton for the
`KILN_CROSS_COMPILE` target (kiln/runtime/cross_compile.py) and nothing runs. Kernel configs
follow the sizes (wide rows, 2-D tiles, many warps), which tiny test and fuzz programs never
reach. Prints one line per graph: kernels compiled, refusals (each with its kernel and Triton's
message). Exit status 1 when any kernel was refused.

Models: seed_block (the seed's TransformerBlock, d_model 1024, x [batch, 512, 1024]), gpt2 (HF
GPT-2, 128 tokens), and any timm model name (224 px; needs timm).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # the graphs compile; nothing launches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import kiln  # noqa: E402
import kiln.autograd  # noqa: E402
from kiln.runtime import compile_graph, cross_compile  # noqa: E402


def build(name: str, batch: int, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple]:
    gen = torch.Generator().manual_seed(0)
    if name == "seed_block":
        from kiln.tools.seed_model import TransformerBlock
        model = TransformerBlock(1024, 16)
        inputs = (torch.randn(batch, 512, 1024, generator=gen),)
    elif name == "gpt2":
        import transformers
        cfg = transformers.GPT2Config()
        cfg.use_cache = False
        model = transformers.GPT2LMHeadModel(cfg)
        inputs = (torch.randint(0, cfg.vocab_size, (batch, 128), generator=gen),)
    else:
        import timm
        model = timm.create_model(name, pretrained=False)
        inputs = (torch.randn(batch, 3, 224, 224, generator=gen),)
    model = model.to(dtype)
    return model, tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


def graphs_of(model: torch.nn.Module, inputs: tuple, train: bool) -> list[tuple]:
    """(gm, example inputs) of each ATen graph the backend would compile, run once eagerly."""
    found: list[tuple] = []

    def record(gm, example):
        found.append((gm, example))
        return gm.forward

    compiled = kiln.compile(model, backend=lambda gm, ex: kiln.autograd.aot_compile(
        gm, ex, fw_compiler=record, bw_compiler=record))
    model.train(train)
    if train:
        out = compiled(*inputs)
        out = getattr(out, "logits", out)  # transformers' output objects
        out.float().sum().backward()
    else:
        with torch.no_grad():
            compiled(*inputs)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="seed_block,gpt2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    if cross_compile.target() is None:
        raise SystemExit(f"set {cross_compile.ENV}=cuda:90 (the target to compile for)")
    cross_compile.collect = []
    dtype = getattr(torch, args.dtype)
    total = 0
    for name in args.models.split(","):
        model, inputs = build(name, args.batch, dtype)
        for i, (gm, example) in enumerate(graphs_of(model, inputs, args.train)):
            before, refused = len(cross_compile.compiled), len(cross_compile.collect)
            start = time.perf_counter()
            artifact = compile_graph(gm, example, name=f"{name}_{i}")
            compiled = len(cross_compile.compiled) - before
            total += compiled
            print(f"{name} graph {i}: {len(artifact.specs)} kernels, {compiled} compiled for "
                  f"{os.environ[cross_compile.ENV]}, {len(cross_compile.collect) - refused} "
                  f"refused ({time.perf_counter() - start:.1f} s)", flush=True)
    for refusal in cross_compile.collect:
        print(f"REFUSED {refusal}")
    print(f"{total} kernels compiled, {len(cross_compile.collect)} refused")
    return 1 if cross_compile.collect else 0


if __name__ == "__main__":
    sys.exit(main())
