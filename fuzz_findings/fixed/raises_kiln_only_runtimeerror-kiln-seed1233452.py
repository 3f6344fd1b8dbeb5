# kiln fuzz reproducer: raises:kiln_only:RuntimeError | RuntimeError: Output N of Slice is a view and is being modified inplace. This view is the output of a function that retu
# found by `python -m kiln fuzz --seed 1233452 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# RuntimeError: Output 0 of Slice is a view and is being modified inplace. This view is the output of a function that returns multiple views. Such functions do not allow the output views to be modified inplace. You should replace the inplace operation by an out-of-place one.
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 1233452
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(1233452)
    return [make_tensor((3,), 'float32', 'contiguous', g, device), make_tensor((1, 1, 1), 'bfloat16', 'contiguous', g, device)]

def make_globals(device):
    global m1
    m1 = torch.nn.Linear(3, 2)
    return None

def fn(x0, x1):
    t2 = m1(x0)
    v3 = t2.unsqueeze(1)
    t4 = x1[x1 > 0].sum()
    s5 = v3
    t2[1::1] = 2
    return (t2,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
