# kiln fuzz reproducer: grad:raises:kiln_only:RuntimeError
# found by `python -m kiln fuzz --seed 3501758 --count 1 --backend aot_eager --device cpu --grow --grad`, then shrunk
# RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [5, 3]], an input of a kiln-compiled graph, is at version 1; expected version 0 instead. (inputs grown by 1)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 3501758
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_number, make_tensor
_sink = io.StringIO()
GROWTH = (0, 1, 2)
GRADS = True

def make_inputs(device):
    g = torch.Generator().manual_seed(3501758)
    return [make_tensor((1, 2), 'float32', 'contiguous', g, device), make_number(2, 'int')]

def make_globals(device):
    return None

def fn(x0, a0):
    t1 = torch.tanh(x0)
    s2 = t1.float().sum().item()
    x0[:, 1::2] = 2
    return (t1,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
