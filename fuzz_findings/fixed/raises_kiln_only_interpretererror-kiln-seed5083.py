# kiln fuzz reproducer: raises:kiln_only:InterpreterError | InterpreterError: TypeError('…')
# found by `python -m kiln fuzz --seed 5083 --count 1 --backend kiln --device cpu --cpu-codegen triton_interpret`, then shrunk
# InterpreterError: TypeError("ufunc 'bitwise_or' not supported for the input types, and the inputs could not be safely coerced to any supported types according to the casting rule ''safe''")
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
import os
os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton loads
# kiln fuzz program, seed 5083
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(5083)
    return [make_tensor((1, 1, 1), 'float16', 'contiguous', g, device), make_tensor((2,), 'float16', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0, x1):
    v1 = x1[1::3]
    x1.clamp_(-1, 1)
    c2 = {'a': v1, 'b': v1}
    t3 = c2['a'] + c2['b']
    return (t3,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'triton_interpret'
    verdict = check_source(open(__file__).read(), 'kiln', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
