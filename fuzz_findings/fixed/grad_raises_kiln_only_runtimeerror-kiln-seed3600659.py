# kiln fuzz reproducer: grad:raises:kiln_only:RuntimeError
# found by `python -m kiln fuzz --seed 3600659 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret --grow --grad`, then shrunk
# RuntimeError: A view was created in no_grad mode and its base or another view of its base has been modified inplace with grad mode enabled. Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by moving both the view and the inplace either both inside the
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 3600659
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_number, make_tensor
_sink = io.StringIO()
GROWTH = (0, 1, 2)
GRADS = True

def make_inputs(device):
    g = torch.Generator().manual_seed(3600659)
    return [make_tensor((1, 2), 'bfloat16', 'contiguous', g, device), make_tensor((1, 1), 'float32', 'contiguous', g, device), make_number(-2, 'negint')]

def make_globals(device):
    return None

def fn(x0, x1, a0):
    x0[0] = 1
    return (x0,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
