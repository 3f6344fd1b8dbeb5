# kiln fuzz reproducer: raises:kiln_only:RuntimeError | RuntimeError: Output N of CompiledFunction is a view and is being modified inplace. This view was created inside a custo
# found by `python -m kiln fuzz --seed 1666 --count 1 --backend aot_eager --device cpu` (cpu_codegen=eager), then shrunk
# RuntimeError: Output 0 of CompiledFunction is a view and is being modified inplace. This view was created inside a custom Function (or because an input was returned as-is) and the autograd logic to handle view+inplace would override the custom backward associated with the custom Function, leading to
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 1666
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(1666)
    return [make_tensor((1, 3, 2), 'float32', 'contiguous', g, device), make_tensor((4, 2), 'float16', 'contiguous', g, device), make_tensor((3, 3), 'float32', 'contiguous', g, device)]

def make_globals(device):
    global m1, m4, m7
    m1 = torch.nn.Linear(2, 4)
    return None

def fn(x0, x1, x2):
    t2 = m1(x0)
    t5 = t2
    t8 = t2
    if t8.sum() > 0:
        t9 = t8 * 2
    else:
        t9 = t8 - 1
    t8.add_(t9)
    return (t5,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
