# kiln fuzz reproducer: raises:eager_only:IndexError
# found by `python -m kiln fuzz --seed 1144 --count 1 --backend aot_eager --device cpu` (cpu_codegen=eager), then shrunk
# eager raised IndexError: index out of range in self; kiln returned
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 1144
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(1144)
    return [make_tensor((1, 1), 'float32', 'contiguous', g, device), make_tensor((1, 1), 'int64', 'contiguous', g, device), make_tensor((1,), 'bool', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1, x2):
    t1 = x0.index_select(0, torch.tensor([4, 4], device=x0.device))
    return (x0,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
