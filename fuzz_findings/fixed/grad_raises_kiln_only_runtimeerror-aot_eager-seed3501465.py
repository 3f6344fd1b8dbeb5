# kiln fuzz reproducer: grad:raises:kiln_only:RuntimeError
# found by `python -m kiln fuzz --seed 3501465 --count 1 --backend aot_eager --device cpu --grow --grad`, then shrunk
# RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [5, 5]], which is output 0 of torch::autograd::CopyBackwards, is at version 1; expected version 0 instead. Hint: enable anomaly detection to find the operation that failed
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 3501465
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_number, make_tensor
_sink = io.StringIO()
GROWTH = (0, 1, 2)
GRADS = True

def make_inputs(device):
    g = torch.Generator().manual_seed(3501465)
    return [make_tensor((1, 3), 'float32', 'contiguous', g, device), make_tensor((1, 2, 4), 'bool', 'contiguous', g, device), make_number(-7, 'negint'), make_number(3, 'int')]

def make_globals(device):
    global m1
    m1 = torch.nn.LayerNorm(5)
    return None

def _ht4(a):
    print(a.shape, file=_sink)
    return a * 2 + 1

def fn(x0, x1, a0, a1):
    t2 = m1(x0)
    x0.clamp_(-1, 1)
    return (x0,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
