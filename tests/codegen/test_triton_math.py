"""The Triton forms of the math-op table's rows (`kiln.codegen.triton_math`).

Every row prints in every dtype it is tested in, typed by its result rule; every special form a
row names exists; every libdevice call a form prints has a stand-in in the interpreter's shim;
and every row's one-op kernel, run by Triton (the interpreter on CPU, ~1 ms per program),
matches eager and the IR evaluator. A new row is covered here without a new test.
"""
from __future__ import annotations

import re
import zlib

import pytest
import torch

pytest.importorskip("triton")

from kiln.codegen import CodegenError, TritonPrinter  # noqa: E402
from kiln.codegen.triton_build import run_graph  # noqa: E402
from kiln.codegen.triton_math import SPECIAL_FORMS  # noqa: E402
from kiln.codegen.triton_types import TV  # noqa: E402
from kiln.lower.evaluate import run_ir  # noqa: E402
from kiln.lower.op_table import LIBDEVICE, MATH_OPS, MathOp  # noqa: E402
from tests.lower.op_cases import dtypes_for, eager, one_op_graph, operands  # noqa: E402

ROWS = list(MATH_OPS.values())
HALF_AND_DOUBLE = (torch.float16, torch.bfloat16, torch.float64)
# Found by this file and fixed: tl.floor / tl.ceil take floats only (torch.floor of an integer
# tensor failed to compile; eager returns it unchanged).


def _cases(extra=()):
    for op in ROWS:
        dtypes = dtypes_for(op)
        if torch.float32 in dtypes:
            dtypes += tuple(extra)
        for dtype in dtypes:
            yield pytest.param(op, dtype, id=f"{op.name}-{str(dtype)[6:]}")


def _print(op: MathOp, dtype: torch.dtype | None) -> tuple[list[str], TV]:
    printer = TritonPrinter()
    value = printer.math(op.name, *[TV(f"v{i}", dtype) for i in range(op.arity)])
    return printer.lines, value


def test_special_forms_are_the_rows():
    named = {op.triton_special for op in ROWS if op.triton_special is not None}
    assert named == set(SPECIAL_FORMS)  # none missing, none left over


@pytest.mark.parametrize("op,dtype", list(_cases(HALF_AND_DOUBLE)))
def test_printer_renders_every_op(op: MathOp, dtype: torch.dtype) -> None:
    lines, value = _print(op, dtype)
    if not lines:  # an op that is the identity here (floor of an integer) returns its operand
        assert value.name == "v0" and not dtype.is_floating_point, (op.name, dtype)
    else:
        assert lines[-1].startswith(f"{value.name} = ")
    assert value.dtype == op.result_dtype(dtype)
    called = set(re.findall(r"libdevice\.(\w+)\(", "\n".join(lines)))
    assert called <= set(LIBDEVICE), f"no interpreter stand-in for {called - set(LIBDEVICE)}"


def test_interpreter_shim_has_every_libdevice_function():
    from kiln.codegen import _interp_libdevice as shim

    for name in LIBDEVICE:
        assert callable(getattr(shim, name)) and name in shim.__all__


@pytest.mark.parametrize("op", [op for op in ROWS if op.needs_dtype], ids=lambda op: op.name)
def test_unknown_operand_dtype_is_refused(op: MathOp) -> None:
    with pytest.raises(CodegenError, match=f"ops.{op.name} needs operand dtypes"):
        _print(op, None)


def test_unknown_op_names_the_table():
    with pytest.raises(CodegenError, match="ops.cbrt: not in kiln.lower.op_table.MATH_OPS"):
        TritonPrinter().math("cbrt", TV("v0", torch.float32))


@pytest.mark.parametrize("op,dtype", list(_cases()))
def test_kernel_matches_eager(op: MathOp, dtype: torch.dtype, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op.name}{dtype}".encode()))
    inputs = operands(op, dtype, gen, n=16, device=device)
    graph = one_op_graph(op, dtype, 16, device)
    (got,) = run_graph(graph, inputs)
    want = eager(op)(*inputs)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(got, run_ir(graph, inputs)[0], equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_pow_of_tensors_wraps_and_handles_negative_exponents_like_torch(
        dtype, device, generated_kernels):
    # libdevice.pow is float-only (int64 pow failed to compile on CUDA): integer pow is squaring
    # over the exponent's bits, with torch's rule for negative exponents (0 unless base is +-1)
    import kiln

    gen = torch.Generator().manual_seed(7)
    low = 0 if dtype == torch.uint8 else -3
    base = torch.randint(low, 9, (64,), generator=gen, dtype=dtype, device="cpu")
    base[:4] = torch.tensor([1, 0, 2, 3], dtype=dtype)
    if dtype != torch.uint8:
        base[4:6] = -1
    # drawn on the CPU (the CUDA suite's default device is cuda, the generator a CPU one)
    exp = torch.randint(low, 70, (64,), generator=gen, dtype=dtype, device="cpu")
    base, exp = base.to(device), exp.to(device)
    got = kiln.compile(lambda a, b: torch.pow(a, b) + 1, backend="kiln")(base, exp)
    torch.testing.assert_close(got, torch.pow(base, exp) + 1)
