# kiln fuzz reproducer: mismatch:value | int64
# found by `python -m kiln fuzz --seed 3302347 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret --grow`, then shrunk
# output 1 (torch.int64, (3, 3, 4)): 4/36 elements differ, max abs diff 1.15e+03 (inputs grown by 1)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 3302347
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_number, make_tensor
_sink = io.StringIO()
GROWTH = (0, 1, 2)

def make_inputs(device):
    g = torch.Generator().manual_seed(3302347)
    return [make_tensor((2, 2, 2), 'float32', 'contiguous', g, device), make_number(-7, 'negint')]

def make_globals(device):
    return None

def fn(x0, a0):
    s1 = x0.float().sum().item()
    t2 = x0 * s1
    t3 = torch.exp(t2)
    t4 = (t3 * 3).long()
    return (t4,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
