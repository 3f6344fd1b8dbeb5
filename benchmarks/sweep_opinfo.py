"""Sweep of torch's own operator test corpus (OpInfo, `op_db` in torch.testing) through kiln:
every operator's sample inputs, compiled and compared with eager.

  python benchmarks/sweep_opinfo.py [--backend kiln,aot_eager,kiln_train] [--only REGEX]
                                    [--samples 0,-1] [--dtype float32] [--inplace]
                                    [--json PATH] [--timeout SEC] [--list]

Needs `expecttest` beside torch (torch.testing's internals import it; not a kiln dependency:
`pip install expecttest`). The samples are torch's, written by torch's authors for its own
operator tests, so they reach arguments and shapes nobody at kiln chose.

Each case is one sample of one operator: a generated function takes the sample's tensors as
arguments and calls the operator with the sample's other arguments as constants (the source is
printed by --list --verbose). `--inplace` adds the operator's in-place variant (the mutated first
argument is returned). The runner, verdicts and tolerances are benchmarks/sweep_foreign.py's:
fresh random inputs per call (the sample regenerated under another seed), eager raising means
kiln must raise the same type, `ok(fp64)` when kiln is no farther than eager from a float64 run.
Random and uninitialized-output operators are left out (`SKIP`).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_foreign  # noqa: E402
from sweep_foreign import Case  # noqa: E402

# random draws, uninitialized memory, or kiln-irrelevant (sparse, nested, meta) operators
SKIP = re.compile(r"(^|\.)(rand|randn|randint|normal|uniform|bernoulli|multinomial|cauchy|"
                  r"exponential|geometric|log_normal)(_like)?$|dropout|rrelu|fractional_max_pool|"
                  r"lowrank|^empty|^new_empty|sparse|^to_sparse|nested|^_|^item$|^tolist$|"
                  r"^nonzero_static$|^chalf$|^resize_|^bfloat16$|^cuda|^native_dropout")


def _constant(value: Any, consts: dict) -> str:
    """Source text of a non-tensor argument; anything without an exact literal goes in globals."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else _global(value, consts)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        inner = ", ".join(_constant(v, consts) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    return _global(value, consts)


def _global(value: Any, consts: dict) -> str:
    name = f"C{len(consts)}"
    consts[name] = value
    return name


def _arg_source(value: Any, tensors: list, consts: dict) -> str:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return f"a{len(tensors) - 1}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        inner = ", ".join(_arg_source(v, tensors, consts) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner},)"
    return _constant(value, consts)


def make_function(op: Callable, sample, inplace: bool) -> tuple[Callable, list, str]:
    """(a function of the sample's tensors calling `op`, those tensors, its source)."""
    tensors: list = []
    consts: dict = {"OP": op}
    parts = [_arg_source(sample.input, tensors, consts)]
    parts += [_arg_source(a, tensors, consts) for a in sample.args]
    parts += [f"{k}={_arg_source(v, tensors, consts)}" for k, v in sample.kwargs.items()]
    params = ", ".join(f"a{i}" for i in range(len(tensors)))
    body = f"    OP({', '.join(parts)})\n    return a0" if inplace and tensors else \
        f"    return OP({', '.join(parts)})"
    source = f"def sample_fn({params}):\n{body}\n"
    namespace = dict(consts)
    exec(compile(source, "<opinfo sample>", "exec"), namespace)
    return namespace["sample_fn"], tensors, source


REFERENCE_INPUTS = False  # --reference: OpInfo's larger reference_inputs instead of sample_inputs


def _sample(op, dtype: torch.dtype, index: int):
    make = op.reference_inputs if REFERENCE_INPUTS else op.sample_inputs
    samples = list(make("cpu", dtype, requires_grad=False))
    if not samples:
        return None
    return samples[index if index < 0 else min(index, len(samples) - 1)]


def _draws_random_numbers(sample_fn: Callable, tensors: list) -> bool:
    """Eager gives other values under another seed (dropout inside a sample's arguments)."""
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        try:
            outs.append(sweep_foreign._leaves(
                sample_fn(*sweep_foreign._clone_inputs(list(tensors), False))))
        except Exception:
            return False
    return any(isinstance(a, torch.Tensor) and a.dtype.is_floating_point
               and not (a.isnan() | b.isnan()).any() and not torch.equal(a, b)
               for a, b in zip(*outs))


def opinfo_cases(dtype: torch.dtype, sample_indices: list[int], inplace: bool,
                 only: str) -> list[Case]:
    from torch.testing._internal.common_methods_invocations import op_db
    cases = []
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if SKIP.search(op.name) or not re.search(only, name):
            continue
        if dtype not in op.supported_dtypes("cpu"):
            continue
        variants = [("", op.op)]
        if inplace and op.inplace_variant is not None:
            variants.append(("_", op.inplace_variant))
        seen = set()
        for index in sample_indices:
            for suffix, fn in variants:
                case = _case(op, fn, name + suffix, dtype, index, bool(suffix))
                if case is not None and case.name not in seen:
                    seen.add(case.name)
                    cases.append(case)
    return cases


def _case(op, fn, name: str, dtype: torch.dtype, index: int, inplace: bool) -> Case | None:
    torch.manual_seed(0)
    try:
        sample = _sample(op, dtype, index)
    except Exception:
        return None
    if sample is None:
        return None
    sample_fn, tensors, source = make_function(fn, sample, inplace)
    if not tensors or _draws_random_numbers(sample_fn, tensors):
        return None

    def build():
        torch.manual_seed(0)
        return make_function(fn, _sample(op, dtype, index), inplace)[0]

    def inputs():  # the same sample drawn under the runner's seed: fresh values
        return tuple(make_function(fn, _sample(op, dtype, index), inplace)[1])

    train = op.supports_autograd and dtype.is_floating_point and not inplace
    case = Case(f"{name}#{index}", build, inputs, train=train, infer=True)
    case.source = source  # type: ignore[attr-defined]
    return case


# -- torch.nn modules: ModuleInfo (`module_db` in torch.testing) ---------------------------------

class _CalledWith(torch.nn.Module):
    """A module called with a sample's non-tensor keyword arguments bound."""

    def __init__(self, inner: torch.nn.Module, kwargs: dict) -> None:
        super().__init__()
        self.inner, self.kwargs = inner, kwargs

    def forward(self, *args: Any) -> Any:
        return self.inner(*args, **self.kwargs)


def module_cases(dtype: torch.dtype, sample_indices: list[int], only: str) -> list[Case]:
    from torch.testing._internal.common_modules import module_db
    cases = []
    for info in module_db:
        if SKIP.search(info.name.lower()) or not re.search(only, info.name):
            continue
        try:
            count = len(_module_samples(info, dtype))
        except Exception:
            continue
        seen = set()
        for index in sample_indices:
            index = index % count if count else 0
            if count and index not in seen:
                seen.add(index)
                case = _module_case(info, dtype, index)
                if case is not None:
                    cases.append(case)
    return cases


def _module_samples(info, dtype: torch.dtype) -> list:
    return list(info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False,
                                        training=False))


def _module_case(info, dtype: torch.dtype, index: int) -> Case | None:
    torch.manual_seed(0)
    sample = _module_samples(info, dtype)[index]
    kwargs = sample.forward_input.kwargs
    if any(isinstance(v, torch.Tensor) for v in sweep_foreign._leaves(kwargs)):
        return None

    def build():
        torch.manual_seed(0)
        chosen = _module_samples(info, dtype)[index]
        c = chosen.constructor_input
        module = info.module_cls(*c.args, **c.kwargs).to(dtype)
        module = _CalledWith(module, dict(chosen.forward_input.kwargs)) if kwargs else module
        if _is_lazy(module):  # parameters drawn at the first call: draw them once, here
            with torch.no_grad():
                module(*chosen.forward_input.args)
        return module

    def inputs():
        return tuple(_module_samples(info, dtype)[index].forward_input.args)

    try:
        module, args = build(), inputs()
        if not any(isinstance(t, torch.Tensor) for t in sweep_foreign._leaves(args)):
            return None
        train = not _module_draws_random_numbers(module, args)
    except Exception:
        return None
    return Case(f"{info.name}#{index}", build, inputs, train=train, infer=True)


def _is_lazy(module: torch.nn.Module) -> bool:
    from torch.nn.modules.lazy import LazyModuleMixin
    return any(isinstance(m, LazyModuleMixin) for m in module.modules())


def _module_draws_random_numbers(module: torch.nn.Module, args: tuple) -> bool:
    module.train()
    return _draws_random_numbers(lambda *a: module(*a), list(args))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="kiln")
    ap.add_argument("--only", default="", help="regex on operator names")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--samples", default="0,-1", help="sample indices per operator")
    ap.add_argument("--inplace", action="store_true", help="also the in-place variants")
    ap.add_argument("--reference", action="store_true",
                    help="OpInfo's reference inputs (more, and more varied: strides, "
                         "broadcasting, extremal values) instead of its sample inputs")
    ap.add_argument("--modules", action="store_true",
                    help="torch.nn modules (ModuleInfo) instead of operators (OpInfo)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    global REFERENCE_INPUTS
    REFERENCE_INPUTS = args.reference
    indices = [int(i) for i in args.samples.split(",") if i]
    cases = module_cases(dtype, indices, args.only) if args.modules else \
        opinfo_cases(dtype, indices, args.inplace, args.only)
    if args.list:
        for c in cases:
            print(c.name)
            if args.verbose:
                print(c.source)  # type: ignore[attr-defined]
        return 0
    backends = [b for b in args.backend.split(",") if b]
    return sweep_foreign.run_cases(cases, backends, args.timeout, args.verbose, (1, 2), args.json)


if __name__ == "__main__":
    sys.exit(main())
