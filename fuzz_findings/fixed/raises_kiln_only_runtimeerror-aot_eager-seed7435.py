# kiln fuzz reproducer: raises:kiln_only:RuntimeError | RuntimeError: Output N of Slice is a view and is being modified inplace. This view was created inside a custom Function 
# found by `python -m kiln fuzz --seed 7435 --count 1 --backend aot_eager --device cpu`, then shrunk
# RuntimeError: Output 0 of Slice is a view and is being modified inplace. This view was created inside a custom Function (or because an input was returned as-is) and the autograd logic to handle view+inplace would override the custom backward associated with the custom Function, leading to incorrect 
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 7435
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(7435)
    return [make_tensor((2,), 'float32', 'transposed', g, device)]

def make_globals(device):
    global m3
    m3 = torch.nn.Linear(2, 4)
    return None

def fn(x0):
    t1 = torch.amax(x0, dim=0, keepdim=True)
    t4 = m3(x0)
    t7 = torch.logsumexp(t4, dim=0, keepdim=True)
    c8 = {'a': t1, 'b': t7}
    t9 = c8['a'] + c8['b']
    t4[3::2] = t1
    return (t9,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
