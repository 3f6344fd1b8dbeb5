# kiln sweep reproducer: raises:eager_only:RuntimeError (benchmarks/sweep_foreign.py, int_div_zero_raises)
# written by hand from the sweep case, in the fuzz reproducer format
# eager (CPU) raises RuntimeError: ZeroDivisionError for an integer division by a zero element;
# kiln's generated kernel divides without a check and returns a value (CUDA eager does not check
# either; torch.compile's Inductor does not raise). aot_eager runs aten ops and raises.
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch


def make_inputs(device):
    g = torch.Generator().manual_seed(7)
    x = torch.randint(1, 9, (3,), generator=g).to(device)
    return [x, torch.tensor([1, 0, 2], device=device)]


def make_globals(device):
    return None


def fn(x0, x1):
    return (x0 // x1,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
