# kiln sweep reproducer: raises:type:IndexError->RuntimeError (benchmarks/sweep_foreign.py,
# F.cross_entropy_oob_target, F.nll_loss_neg_target), written by hand in the fuzz reproducer format
# eager's nll_loss raises IndexError("Target 4 is out of bounds."); the autograd stage traces
# torch's decomposition of nll_loss_forward, whose gather raises RuntimeError("index 4 is out of
# bounds for dimension 1 with size 4"). torch.compile (aot_eager) raises the same RuntimeError.
# The kiln backend raises kiln's bounds-check error, which is both IndexError and RuntimeError.
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import torch
import torch.nn.functional as F


def make_inputs(device):
    g = torch.Generator().manual_seed(11)
    return [torch.randn(3, 4, generator=g).to(device), torch.tensor([0, 4, 1], device=device)]


def make_globals(device):
    return None


def fn(x0, x1):
    return (F.cross_entropy(x0, x1),)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
