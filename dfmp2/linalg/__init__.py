"""The BLAS and solver layer on every backend (cpu and cuda torch, trn1/trn2/trn3 NKI): one API whose
calls run where the backend computes. What it is, honestly: gemm, batched_gemm, syrk and trsm
forward to the backend's own kernels (torch's products, with the CPU library each one runs on chosen
by measuring in kernels/torch's dispatch, below this layer because every torch product goes through
it; the NKI kernels); what this layer itself implements is the composition above them: the blocked
potrf, the exact (Ozaki) product's use, and the DF metric (metric.py).

    gemm(backend, a, b)          C = A B
    batched_gemm(backend, a, b)  C_b = A_b B_b
    exact_product(backend, a, b) C = A^T B of fp64 operands to ~2^-35 of each column's largest
                                 product: Ozaki slices where the device has no fp64 (kernels/nki/ozaki.py)
    syrk(backend, c, panel)      C - P P^T (its lower triangle at least)
    trsm(backend, lower, x)      X L^-T (right-side triangular solve)
    potrf(backend, a)            A = L L^T, blocked (below)
    metric.py                    the DF metric: factor_metric (fp64, pivot check, eigen fallback),
                                 whiten, fitting_coefficients, metric_solve (V^-1 R), used by the SCF,
                                 the MP2 steps and the gradient's reference term

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
from .metric import (CHOLESKY_PIVOT_RATIO, MetricFactor, factor_metric, fitting_coefficients, metric_solve,  # noqa: F401
                     whiten)

BLOCK = 128  # potrf's block columns (the NKI kernels' partition tile)


def gemm(backend, a, b):
    """C = A B on the backend: a [m, k], b [k, n] device tensors -> [m, n]."""
    return backend.gemm(a, b)


def batched_gemm(backend, a, b):
    """C_b = A_b B_b: a [nb, m, k], b [nb, k, n] device tensors -> [nb, m, n]. torch: one batched
    matmul; NKI: one gemm_kernel launch per b (each ~1 ms of launch on a NeuronCore, MODEL)."""
    if backend.batches_gemm:
        return backend.gemm(a, b)
    import torch

    return torch.stack([backend.gemm(a[i], b[i]) for i in range(a.shape[0])])


def exact_product(backend, a, b):
    """C = A^T B [m, n] host fp64 from fp64 a [k, m], b [k, n] (host numpy). A backend with fp64
    (torch: cpu, cuda) multiplies in fp64; an NKI backend multiplies Ozaki slices (A as int8 digits
    with a power of two per column, B as fp32 slices, INPUT_SLICES of each: every slice product and
    its 512-term PSUM sums exact, exact_matmul_kernel), hi + lo summed on the host: C to about 2^-35
    of max_k |A_km| max_k |B_kn| sum_k 1 per element, where fp32 would lose 2^-24 of it."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return backend.exact_fp64_product(a, b)  # (no fp64 on the device: Ozaki slices)


def syrk(backend, c, panel):
    """C - P P^T on the backend (at least its lower triangle): c [n, n], panel [n, w] (torch: one gemm)."""
    return backend.syrk(c, panel)


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
