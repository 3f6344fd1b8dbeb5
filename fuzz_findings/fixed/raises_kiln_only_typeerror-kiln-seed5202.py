# kiln fuzz reproducer: raises:kiln_only:TypeError | TypeError: fn.<locals>.<genexpr>() takes N positional argument but N were given
# found by `python -m kiln fuzz --seed 5202 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# TypeError: fn.<locals>.<genexpr>() takes 1 positional argument but 4 were given
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 5202
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(5202)
    return [make_tensor((1, 1), 'float32', 'contiguous', g, device), make_tensor((1, 1), 'float32', 'contiguous', g, device), make_tensor((1,), 'float16', 'contiguous', g, device)]

def make_globals(device):
    return None

def _ht3(a):
    return a * 2 + 1

def fn(x0, x1, x2):
    t2 = x1[x1 > 0].sum()
    t4 = sum((t2 * k for k in range(3)))
    return (x1,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
