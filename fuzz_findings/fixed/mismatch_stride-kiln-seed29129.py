# kiln fuzz reproducer: mismatch:stride
# found by `python -m kiln fuzz --seed 29129 --count 1 --backend kiln --device cuda`, then shrunk
# aliasing output 0: eager stride (1,) offset 1, kiln stride (1,) offset 0
# found on the H200 (2026-12-01); runs on the CPU through the Triton interpreter
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 29129
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(29129)
    return [make_tensor((2, 1), 'bool', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0):
    t1 = x0 | x0
    v3 = t1[1]
    return (v3, v3)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
