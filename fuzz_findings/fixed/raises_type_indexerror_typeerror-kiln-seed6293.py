# kiln fuzz reproducer: raises:type:IndexError->TypeError | eager IndexError: index N is out of bounds for dimension N with size N; kiln TypeError: fn.<locals>.<genexpr>() takes N 
# found by `python -m kiln fuzz --seed 6293 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# eager IndexError: index 1 is out of bounds for dimension 0 with size 1; kiln TypeError: fn.<locals>.<genexpr>() takes 1 positional argument but 4 were given
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 6293
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(6293)
    return [make_tensor((1, 1), 'float32', 'contiguous', g, device), make_tensor((1, 1, 1), 'bool', 'contiguous', g, device), make_tensor((1,), 'float32', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1, x2):
    t1 = sum((x2 * k for k in range(3)))
    t5 = x0[1] + 0
    return (t5,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
