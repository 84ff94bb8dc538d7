"""Linear algebra of the DF metric, written once on top of the kernel dispatch.

    J = L L^T                 (Cholesky, fp64)
    B = X L^-T                (whitening, right-side triangular solve)

If J is numerically singular (Cholesky breaks down or leaves a pivot at rounding level), J is eigen-decomposed instead,
J = U s U^T, eigenvalues below `drop_threshold` are dropped, and X U_k s_k^-1/2 is the
whitened tensor (so that B B^T = X J^+ X^T). The fallback is part of the result, never silent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ComputationError

log = logging.getLogger("dfmp2")

LINEAR_DEPENDENCY_THRESHOLD = 1e-9  # Eh; eigenvalues of (P|Q) below this are dropped
CHOLESKY_PIVOT_RATIO = 1e-14  # smallest accepted pivot^2 / largest diagonal element of (P|Q)


@dataclass
class MetricFactor:
    """Factor of the Coulomb metric. kind 'cholesky': `matrix` is L [naux, naux] (lower);
    kind 'eigen': `matrix` is U_k s_k^-1/2 [naux, nkept]."""

    kind: str
    matrix: object
    naux: int
    nkept: int

    @property
    def ndropped(self) -> int:
        return self.naux - self.nkept

    def describe(self) -> str:
        if self.kind == "cholesky":
            return "cholesky"
        return (f"eigen-decomposition (Cholesky failed; dropped {self.ndropped} of {self.naux} "
                f"eigenvalues below {LINEAR_DEPENDENCY_THRESHOLD:g})")


def factor_metric(backend, metric, drop_threshold: float = LINEAR_DEPENDENCY_THRESHOLD) -> MetricFactor:
    """Factor (P|Q) [naux, naux] (fp64 tensor on the backend's device)."""
    naux = metric.shape[0]
    lower, ok = backend.cholesky(metric)
    # accept L only if every pivot is well above rounding noise of the largest diagonal element
    if ok and float(lower.diagonal().min()) ** 2 > CHOLESKY_PIVOT_RATIO * float(metric.diagonal().max()):
        return MetricFactor("cholesky", lower, naux, naux)
    eigenvalues, vectors = backend.symmetric_eigh(metric)
    keep = eigenvalues > drop_threshold
    nkept = int(keep.sum())
    if nkept == 0:
        raise ComputationError("the auxiliary metric (P|Q) has no eigenvalue above "
                               f"{drop_threshold:g}: the auxiliary basis is unusable")
    projector = vectors[:, keep] / eigenvalues[keep].sqrt()
    factor = MetricFactor("eigen", projector, naux, nkept)
    log.warning("metric (P|Q) is not positive definite: using %s", factor.describe())
    return factor


def whiten(backend, factor: MetricFactor, x):
    """B = X L^-T (Cholesky) or X U_k s_k^-1/2 (eigen) for X [n, naux] -> [n, nkept]."""
    matrix = factor.matrix.to(x.dtype)
    if factor.kind == "cholesky":
        return backend.solve_lower_transposed(matrix, x)
    return backend.gemm(x, matrix)
