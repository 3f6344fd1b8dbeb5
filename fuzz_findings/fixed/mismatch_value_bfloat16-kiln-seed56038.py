# kiln fuzz reproducer: mismatch:value | bfloat16
# found by `python -m kiln fuzz --seed 56038 --count 1 --backend kiln --device cuda`, then shrunk
# output 0 (torch.bfloat16, (3, 3)): 1/9 elements differ, max abs diff 0.0156
# found on the H200 (2026-12-01, final campaign); fails on the CPU through the Triton interpreter too
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 56038
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(56038)
    return [make_tensor((3, 3), 'float16', 'transposed', g, device), make_tensor((3, 3, 3), 'float32', 'contiguous', g, device), make_tensor((3, 2), 'bfloat16', 'transposed', g, device)]

def make_globals(device):
    torch.manual_seed(56038)
    return None

def fn(x0, x1, x2):
    t2 = x1.to(torch.bfloat16)
    acc4 = torch.zeros_like(t2[0])
    for i in range(3):
        acc4 = acc4 + t2[i] * (i + 1)
    return (acc4,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
