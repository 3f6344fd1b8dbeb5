import os
os.environ.setdefault("TRITON_INTERPRET", "1")
# kiln fuzz reproducer: mismatch:alias
# found by `python -m kiln fuzz --seed 66139 --count 1 --backend kiln --device cuda`, then shrunk
# output 0 shares storage with ['output 1'] in eager, nothing in kiln
# an oracle rule: the two outputs share a storage in eager but no element (FINDINGS.md, accepted)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 66139
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(66139)
    return [make_tensor((3,), 'float32', 'contiguous', g, device), make_tensor((1, 3, 3), 'float32', 'contiguous', g, device), make_tensor((3, 3, 2), 'float32', 'contiguous', g, device)]

def make_globals(device):
    return None

def _ht1(a):
    return a * 2 + 1

def fn(x0, x1, x2):
    t1 = _ht1(x0)
    v2 = t1[0::3]
    v3 = t1[2]
    return (v3, v2)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = "triton_interpret"
    verdict = check_source(open(__file__).read(), "kiln", "cpu")
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
