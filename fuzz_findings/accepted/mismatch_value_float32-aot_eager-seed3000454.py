# kiln fuzz reproducer: mismatch:value | float32
# found by `python -m kiln fuzz --seed 3000454 --count 1 --backend aot_eager --device cpu`, then shrunk
# output 0 (torch.float32, (2, 4)): 8/8 elements differ, max abs diff 0.0161
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 3000454
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(3000454)
    return [make_tensor((1, 3, 2), 'bfloat16', 'contiguous', g, device), make_tensor((2, 4), 'float32', 'contiguous', g, device), make_tensor((3, 5), 'float16', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1, x2):
    t1 = torch.logsumexp(x0, dim=1, keepdim=False)
    s4 = t1.float().sum().item()
    t5 = x1 * s4
    return (t5,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
