"""fast_math: device functions kiln emits instead of libdevice's where libdevice is the bottleneck.

`_erf_f32(x)`: erf in float32 as x·P(x²)/Q(x²) with P, Q of degree 5, x clamped to ±3.92 (where
float32 erf is already ±1 to the last bit). About 15 instructions where libdevice's erff takes
roughly twice as many; erf-GELU followed by LayerNorm is ALU-bound on the H200, and this took
the fused kernel over [131072, 1024] bf16 from 0.230 to 0.188 ms (benchmarks/RESULTS.md).

Accuracy (float32 evaluation against float64 erf on 2M points over [-3.92, 3.92], the test
`tests/codegen/test_fast_math.py` rechecks it in the interpreter): max abs error 4.0e-7, at most
~7 ulp — below what float32 GELU / LayerNorm tolerances see, far below bf16's half ulp. NaN
propagates (the clamp keeps NaN), ±inf gives ±1. float64 keeps libdevice's erf.

The coefficients are kiln's own fit (`fit_erf_coefficients` below reproduces them): a rational
least-squares fit of erf(x)/x in s = x² on 20 000 points of [0, 3.92], iteratively reweighted
toward the largest errors.
"""
from __future__ import annotations

__all__ = ["FAST_MATH_HELPERS", "P", "Q", "fit_erf_coefficients"]

CLAMP = 3.92
P = (1.128378981, 0.1941755968, 0.05324454147, 0.003928281844, 0.0002887323136, 2.022588093e-06)
Q = (1.0, 0.5054148913, 0.11566592, 0.01529216863, 0.001202488585, 3.801038078e-05)


def _horner(coefs: tuple[float, ...], out: str) -> list[str]:
    """Horner steps as explicit FMAs: kernels compile without FP contraction (`enable_fp_fusion`
    off, `KernelSpec.compile_options`), and `tl.fma` keeps each step one instruction."""
    lines = [f"    {out} = tl.fma(s, {coefs[-1]!r}, {coefs[-2]!r})"]
    lines += [f"    {out} = tl.fma({out}, s, {c!r})" for c in reversed(coefs[:-2])]
    return lines


FAST_MATH_HELPERS = "\n".join([
    "",
    "@triton.jit",
    "def _erf_f32(x):",
    f"    x = tl.clamp(x, {-CLAMP!r}, {CLAMP!r}, propagate_nan=tl.PropagateNan.ALL)",
    "    s = x * x",
    *_horner(P, "p"),
    *_horner(Q, "q"),
    "    return x * p / q",
    "",
])


def fit_erf_coefficients(iterations: int = 30) -> tuple[list[float], list[float]]:
    """Refit P and Q (numpy and math only; ~1 s). Returns (p, q), q[0] == 1."""
    import math

    import numpy as np

    x = np.linspace(1e-4, CLAMP, 20000)
    s = x * x
    f = np.array([math.erf(v) for v in x]) / x
    weight, q_values = np.ones_like(x), np.ones_like(x)
    m = n = len(P) - 1
    for _ in range(iterations):
        rows = np.hstack([s[:, None] ** np.arange(m + 1),
                          -(f * s)[:, None] * s[:, None] ** np.arange(n)])
        scale = weight / q_values
        coef, *_ = np.linalg.lstsq(rows * scale[:, None], f * scale, rcond=None)
        p, q = coef[:m + 1], np.concatenate([[1.0], coef[m + 1:]])
        q_values = np.polyval(q[::-1], s)
        err = np.abs(x * np.polyval(p[::-1], s) / q_values - f * x)
        weight = weight * (1 + 50 * err / err.max())
    return [float(c) for c in p], [float(c) for c in q]
