# kiln fuzz reproducer: mismatch:value | bool
# found by `python -m kiln fuzz --seed 120422 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# output 0 (torch.bool, (1, 3)): 1/3 elements differ, max abs diff 1
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 120422
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(120422)
    return [make_tensor((3, 3), 'float32', 'offset', g, device), make_tensor((1, 1), 'float16', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1):
    t1 = x0.index_select(0, torch.tensor([2, 2, 2], device=x0.device))
    t2 = t1.var(dim=0, keepdim=True, correction=0)
    t4 = t2 > 0
    return (t4,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
