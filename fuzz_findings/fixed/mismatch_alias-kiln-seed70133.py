import os
os.environ.setdefault("TRITON_INTERPRET", "1")
# kiln fuzz reproducer: mismatch:alias
# found on the H200 (2026-12-01 late, commit ed49a63), fails in the CPU interpreter too
# found by `python -m kiln fuzz --seed 70133 --count 1 --backend kiln --device cuda`, then shrunk
# outputs 0 and 1 share other elements in eager (strides (12, 4, 1, 2), (4, 1, 2)) than in kiln (strides (6, 2, 1, 1), (2, 1, 1))
# fixed: the intermediate both outputs view is realized at eager's geometry (lower/driver.py)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 70133
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(70133)
    return [make_tensor((3, 2, 2), 'bfloat16', 'transposed', g, device)]

def make_globals(device):
    return None

def fn(x0):
    t2 = x0 * x0
    v5 = t2[:, :, 1::1]
    v6 = v5.unsqueeze(0)
    return (v6, v5)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = "triton_interpret"
    verdict = check_source(open(__file__).read(), "kiln", "cpu")
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
