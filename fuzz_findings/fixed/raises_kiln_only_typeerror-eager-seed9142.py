# kiln fuzz reproducer: raises:kiln_only:TypeError | TypeError: fn.<locals>.<listcomp>() takes N positional argument but N were given
# found by `python -m kiln fuzz --seed 9142 --count 1 --backend eager --device cpu`, then shrunk
# TypeError: fn.<locals>.<listcomp>() takes 1 positional argument but 4 were given
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 9142
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(9142)
    return [make_tensor((1, 1), 'float32', 'contiguous', g, device), make_tensor((1, 1, 1), 'int64', 'contiguous', g, device), make_tensor((4, 3), 'bfloat16', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1, x2):
    c5 = {'a': x0, 'b': x0}
    t6 = c5['a'] + c5['b']
    t10 = x2[x2 > 0].sum()
    c13 = [t6 * k for k in (1, 2)]
    return (x1,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
