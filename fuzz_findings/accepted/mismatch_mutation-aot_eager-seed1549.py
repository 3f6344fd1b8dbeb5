# kiln fuzz reproducer: mismatch:mutation
# found by `python -m kiln fuzz --seed 1549 --count 1 --backend aot_eager --device cpu` (cpu_codegen=eager), then shrunk
# input 0 after the call (torch.int64, (1, 2, 3)): 2/6 elements differ, max abs diff 4
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 1549
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(1549)
    return [make_tensor((1, 2, 3), 'int64', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0):
    v1 = x0.narrow(2, 0, 1)
    x0.add_(v1)
    t3 = v1
    acc5 = t3
    t6 = acc5
    return (t6,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
