# kiln fuzz reproducer: grad:raises:kiln_only:NameError
# found by `python -m kiln fuzz --seed 3600249 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret --grow --grad`, then shrunk
# NameError: name 's87' is not defined (inputs grown by 1)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 3600249
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_number, make_tensor
_sink = io.StringIO()
GROWTH = (0, 1, 2)
GRADS = True

def make_inputs(device):
    g = torch.Generator().manual_seed(3600249)
    return [make_tensor((1, 1), 'float32', 'contiguous', g, device), make_tensor((1,), 'float32', 'contiguous', g, device), make_number(5, 'int')]

def make_globals(device):
    return None

def fn(x0, x1, a0):
    k3 = a0 * 2 - 1
    t2 = x1 * k3
    return (t2,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
