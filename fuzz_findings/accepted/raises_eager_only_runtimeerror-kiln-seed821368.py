# kiln fuzz reproducer: raises:eager_only:RuntimeError | eager raised RuntimeError: index N is out of bounds for dimension N with size N
# found by `python -m kiln fuzz --seed 821368 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# eager raised RuntimeError: index 3 is out of bounds for dimension 2 with size 1; kiln returned
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 821368
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(821368)
    return [make_tensor((3, 1, 1), 'bool', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0):
    v1 = x0.unsqueeze(0)
    t2 = torch.gather(v1, 2, torch.tensor([3, 3, 3], device=v1.device).view(1, 3, 1, 1))
    t2[:, :, :, 0::1] = 2
    return (t2,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
