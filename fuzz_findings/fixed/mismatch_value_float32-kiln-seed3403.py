# kiln fuzz reproducer: mismatch:value | float32
# found by `python -m kiln fuzz --seed 3403 --count 1 --backend kiln --device cuda` (H200, 1.2e-4), shrunk with `--shrink-file` through the Triton interpreter (fails there too)
# output 0 (torch.float32, (1,)): 1/1 elements differ, max abs diff 0.000119
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 3403
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(3403)
    return [make_tensor((1,), 'float16', 'contiguous', g, device), make_tensor((1,), 'float32', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1):
    t1 = torch.sigmoid(x0)
    t3 = t1.to(torch.float16)
    t4 = torch.where(t3 > 0, t3, x1)
    return (t4,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
