# kiln fuzz reproducer: mismatch:stride
# found by `python -m kiln fuzz --seed 5273 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# aliasing output 0: eager stride (2, 1) offset 0, kiln stride (1, 1) offset 0
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 5273
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(5273)
    return [make_tensor((1,), 'float32', 'contiguous', g, device), make_tensor((2, 1), 'float32', 'contiguous', g, device), make_tensor((1,), 'float32', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1, x2):
    v2 = x1.unsqueeze(0)
    t5 = torch.amax(v2, dim=2, keepdim=False)
    return (t5, t5)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
