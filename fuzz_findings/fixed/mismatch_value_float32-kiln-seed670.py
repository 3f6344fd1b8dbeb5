# kiln fuzz reproducer: mismatch:value | float32
# found by `python -m kiln fuzz --seed 670 --count 1 --backend kiln --device cuda`, then shrunk
# output 0 (torch.float32, (2, 2, 1)): 3/4 elements differ, max abs diff 5.29e-05
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 670
import io

import torch
import torch.nn.functional as F

from kiln.tools.fuzz.inputs import make_tensor

_sink = io.StringIO()


def make_inputs(device):
    g = torch.Generator().manual_seed(670)
    return [
        make_tensor((2, 2, 1), 'float32', 'contiguous', g, device),
    ]


def make_globals(device):
    torch.manual_seed(670)
    global m2
    m2 = torch.nn.LayerNorm(1)
    m2.to(device)
    return None


def fn(x0):
    t1 = x0 * 3
    t3 = m2(t1)
    t4 = t1 * t3
    return (t4, x0,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'kiln', 'cuda')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
