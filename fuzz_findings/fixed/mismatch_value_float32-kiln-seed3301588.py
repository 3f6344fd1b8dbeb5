# kiln fuzz reproducer: mismatch:value | float32
# found by `python -m kiln fuzz --seed 3301588 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret --grow`, then shrunk
# output 0 (torch.float32, (2, 3)): 6/6 elements differ, max abs diff 2.4 (inputs grown by 0)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 3301588
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_number, make_tensor
_sink = io.StringIO()
GROWTH = (0, 1, 2)

def make_inputs(device):
    g = torch.Generator().manual_seed(3301588)
    return [make_tensor((2, 2, 2), 'float32', 'contiguous', g, device), make_tensor((2, 3), 'float32', 'stepped', g, device), make_tensor((1,), 'float16', 'contiguous', g, device), make_number(-7, 'negint')]

def make_globals(device):
    global m5
    m5 = torch.nn.LayerNorm(3)
    return None

def fn(x0, x1, x2, a0):
    t6 = m5(x1)
    if t6.sum() > 0:
        t7 = t6 * 2
    else:
        t7 = t6 - 1
    return (t7,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
