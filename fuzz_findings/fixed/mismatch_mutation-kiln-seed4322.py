# kiln fuzz reproducer: mismatch:mutation
# found by `python -m kiln fuzz --seed 4322 --count 1 --backend kiln --device cuda`, then shrunk
# input 2 after the call (torch.float32, (2, 2, 3)): 8/12 elements differ, max abs diff 0.000488
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 4322
import io

import torch
import torch.nn.functional as F

from kiln.tools.fuzz.inputs import make_tensor

_sink = io.StringIO()


def make_inputs(device):
    g = torch.Generator().manual_seed(4322)
    return [
        make_tensor((2, 3), 'float16', 'stepped', g, device),
        make_tensor((2, 2, 2), 'float32', 'contiguous', g, device),
        make_tensor((2, 2, 3), 'float32', 'contiguous', g, device),
    ]


def make_globals(device):
    torch.manual_seed(4322)
    return None


def fn(x0, x1, x2):
    v1 = x1[1::3]
    t2 = x0 * 1.5
    acc3 = torch.zeros_like(x1[0])
    for i in range(2):
        acc3 = acc3 + x1[i] * (i + 1)
    x2.copy_(t2)
    return (acc3,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'kiln', 'cuda')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
