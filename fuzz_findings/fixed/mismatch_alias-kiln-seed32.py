# kiln fuzz reproducer: mismatch:alias (found on the H200: python -m kiln fuzz --seed 32 --backend kiln --device cuda)
# an expanded view returned with its base: the base must be the dense one (lower/build.py _outputs)
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(32)
    return [make_tensor((1, 2, 3), 'int64', 'contiguous', g, device), make_tensor((2, 2), 'float32', 'contiguous', g, device)]

def make_globals(device):
    torch.manual_seed(32)
    return None

def fn(x0, x1):
    t1 = torch.gather(x0, 1, torch.tensor([1, 1, 1], device=x0.device).view(1, 1, 3))
    v2 = t1.expand(1, 2, 3)
    return (v2, t1)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
