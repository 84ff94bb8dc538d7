"""GEMMs on torch whose result is known to be symmetric: the exchange K = X^T diag(w) X of one
density (X = L^T B^P, the same half transform on both sides).

    K = A^T B,  B = A diag(w) (per row of the contraction)  ->  K symmetric
    lower block rows   K[a0:a1, :a1] = A[:, a0:a1]^T B[:, :a1]      (the blocks on and below the diagonal)
    mirror             K[:a0, a0:a1] = K[a0:a1, :a0]^T

With two block rows the products are 3/4 of the full GEMM's flops; measured on an AMD EPYC (Zen 4,
2 threads, the SCF builds' shapes, 200-730 functions) the product takes 0.80-0.87 of the full
GEMM's time in fp32 and fp64 (three or four block rows gain no more there).
"""

from __future__ import annotations

import torch

from . import cpu_gemm

SYMMETRIC_MIN_SIZE = 128  # below this many output rows one GEMM (the blocks would be too thin)
SYMMETRIC_BLOCK_ROWS = 2  # block rows of the output


def symmetric_product(left, right, block_rows=SYMMETRIC_BLOCK_ROWS):
    """K = left^T right [n, n] for left, right [k, n] (any strides a GEMM takes) whose product
    is symmetric (right = left scaled per contraction row): the lower block rows, then the mirror."""
    n = left.shape[1]
    if n < SYMMETRIC_MIN_SIZE or block_rows < 2:
        return cpu_gemm.matmul("exchange", left.transpose(0, 1), right)
    out = torch.empty((n, n), dtype=torch.result_type(left, right), device=left.device)
    edges = [n * b // block_rows for b in range(block_rows + 1)]
    for a0, a1 in zip(edges, edges[1:]):
        # K[a0:a1, :a1] = A[:, a0:a1]^T B[:, :a1]
        cpu_gemm.matmul("exchange", left[:, a0:a1].transpose(0, 1), right[:, :a1], out=out[a0:a1, :a1])
    for a0, a1 in zip(edges[1:], edges[2:]):
        # K[:a0, a0:a1] = K[a0:a1, :a0]^T
        out[:a0, a0:a1].copy_(out[a0:a1, :a0].transpose(0, 1))
    return out
