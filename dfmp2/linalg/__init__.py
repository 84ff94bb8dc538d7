"""The BLAS and solver layer on every backend (cpu and cuda torch, trn1/trn2/trn3 NKI): one API whose
calls run where the backend computes.

    gemm(backend, a, b)          C = A B
    syrk(backend, c, panel)      C - P P^T (its lower triangle at least)
    trsm(backend, lower, x)      X L^-T (right-side triangular solve)
    potrf(backend, a)            A = L L^T, blocked (below)
    metric.py                    the DF metric: factor_metric (fp64, pivot check, eigen fallback),
                                 whiten, fitting_coefficients, used by the SCF and MP2 steps

potrf is right-looking over 128-wide block columns k:
    L_kk = chol(A_kk)                       on the host in fp64 (a 128 x 128 block, 0.7 MFLOP)
    L_ik = A_ik L_kk^-T                     the backend's trsm (NKI: trsm_kernel)
    A_ij -= L_ik L_jk^T  (i, j > k)         the backend's syrk (NKI: syrk_kernel), else a gemm
so that on a NeuronCore everything but the diagonal blocks runs on the device, in fp32 (measured
error in tests/test_linalg.py). The pipeline still factorises the DF metric with `factor_metric` on
the host in fp64 (metric.py says why).
"""

from __future__ import annotations

import numpy as np

from ..util.errors import ComputationError
from .metric import CHOLESKY_PIVOT_RATIO, MetricFactor, factor_metric, fitting_coefficients, whiten  # noqa: F401

BLOCK = 128  # potrf's block columns (the NKI kernels' partition tile)


def gemm(backend, a, b):
    """C = A B on the backend: a [m, k], b [k, n] device tensors -> [m, n]."""
    return backend.gemm(a, b)


def syrk(backend, c, panel):
    """C - P P^T on the backend (at least its lower triangle): c [n, n], panel [n, w]."""
    if hasattr(backend, "syrk"):
        return backend.syrk(c, panel)
    return c - backend.gemm(panel, panel.transpose(0, 1))


def trsm(backend, lower, x):
    """X L^-T on the backend: x [rows, n], lower [n, n] lower triangular -> [rows, n]."""
    return backend.solve_lower_transposed(lower, x)


def potrf(backend, a, block: int = BLOCK):
    """Lower L with A = L L^T for a symmetric positive definite A [n, n] (host fp64 numpy), blocked
    right-looking (module docstring): the diagonal blocks on the host in fp64, the panels' trsm and
    the trailing updates' syrk on the backend, in its precision. -> L [n, n] host fp64 numpy.
    ComputationError where a diagonal block is not positive definite."""
    n = a.shape[0]
    lower = np.zeros((n, n))
    trailing = backend.to_device(np.ascontiguousarray(a[block:, block:])) if n > block else None
    diagonal = a[:min(block, n), :min(block, n)]
    below = a[block:, :block]
    for k0 in range(0, n, block):
        k1 = min(n, k0 + block)
        try:  # L_kk = chol(A_kk), fp64
            l_kk = np.linalg.cholesky(np.asarray(diagonal, dtype=np.float64))
        except np.linalg.LinAlgError:
            raise ComputationError(f"potrf: the diagonal block at {k0} is not positive definite") from None
        lower[k0:k1, k0:k1] = l_kk
        if k1 == n:
            break
        # L_ik = A_ik L_kk^-T
        panel = trsm(backend, backend.to_device(l_kk), backend.to_device(np.ascontiguousarray(below)))
        lower[k1:, k0:k1] = backend.to_host(panel)
        # A_ij -= L_ik L_jk^T over the trailing matrix
        trailing = syrk(backend, trailing, panel)
        width = min(block, n - k1)
        rest = backend.to_host(trailing[:, :width])
        diagonal, below = rest[:width], rest[width:]
        trailing = trailing[width:, width:] if n - k1 > width else None
    return lower
