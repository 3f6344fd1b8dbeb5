# kiln fuzz reproducer: raises:eager_only:RuntimeError
# found by `python -m kiln fuzz --seed 1208 --count 1 --backend aot_eager --device cpu` (cpu_codegen=eager), then shrunk
# eager raised RuntimeError: unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.; kiln returned
# run it: python THIS_FILE.py  (prints the oracle's verdict; exit 1 while failing)
# kiln fuzz program, seed 1208
import io
import torch
import torch.nn.functional as F
from kiln.tools.fuzz.inputs import make_tensor
_sink = io.StringIO()

def make_inputs(device):
    g = torch.Generator().manual_seed(1208)
    return [make_tensor((3, 3), 'bfloat16', 'contiguous', g, device)]

def make_globals(device):
    return None

def fn(x0):
    v1 = x0.transpose(1, 0)
    v1.add_(x0)
    t2 = x0
    t4 = t2
    return (t4,)


if __name__ == '__main__':
    import sys
    from kiln.config import config
    from kiln.tools.fuzz.oracle import check_source
    config.cpu_codegen = 'eager'
    verdict = check_source(open(__file__).read(), 'aot_eager', 'cpu')
    print(verdict)
    sys.exit(0 if verdict.ok else 1)
