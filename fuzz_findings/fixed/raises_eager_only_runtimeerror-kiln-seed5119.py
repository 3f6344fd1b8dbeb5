# kiln fuzz reproducer: raises:eager_only:RuntimeError | eager raised RuntimeError: index N is out of bounds for dimension N with size N
# found by `python -m kiln fuzz --seed 5119 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# eager raised RuntimeError: index 2 is out of bounds for dimension 1 with size 1; kiln returned
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 5119
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(5119)
    return [make_tensor((1, 1, 1), 'float32', 'contiguous', g, device), make_tensor((2, 1, 2), 'int64', 'contiguous', g, device), make_tensor((1, 1), 'float32', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1, x2):
    t1 = torch.gather(x1, 1, torch.tensor([2, 2, 2, 2, 2, 2, 2, 2], device=x1.device).view(2, 2, 2))
    return (t1,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
