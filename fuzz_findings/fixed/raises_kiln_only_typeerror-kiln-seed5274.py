# kiln fuzz reproducer: raises:kiln_only:TypeError | TypeError: fn.<locals>.<listcomp>() takes N positional argument but N were given
# found by `python -m kiln fuzz --seed 5274 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# TypeError: fn.<locals>.<listcomp>() takes 1 positional argument but 4 were given
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 5274
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(5274)
    return [make_tensor((1, 1, 1), 'float32', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0):
    t1 = x0[x0 > 0].sum()
    c4 = [t1 * k for k in (1, 2)]
    return (x0,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
