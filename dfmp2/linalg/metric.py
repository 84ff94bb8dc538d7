"""Linear algebra of the DF metric, written once on top of the kernel dispatch.

    J = L L^T                 Cholesky (fp64)
    B = X L^-T                whitening (right-side triangular solve)

The backend factorises J in fp64 (`Backend.cholesky`): torch as one LAPACK / cuSOLVER potrf
on its device; a backend without fp64 (NKI: trn1, trn2, trn3) on the host, from the fp64 (P|Q)
PySCF computed: fp32 arithmetic would round a metric whose condition number reaches 1e10
with diffuse auxiliary sets, moving small eigenvalues by ~1e-5 and possibly making one
negative. Only L (in the device's precision) goes to an NKI device, for the whitening.

If J is numerically singular (the factorisation fails, or a pivot is at rounding
level), J is eigen-decomposed on the host in fp64, J = U s U^T, eigenvalues below
`drop_threshold` are dropped, and X U_k s_k^-1/2 is the whitened tensor (so B B^T = X J^+ X^T).
The fallback is logged and recorded in the result, never silent.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from ..util.errors import ComputationError
from ..util.log import log


LINEAR_DEPENDENCY_THRESHOLD = 1e-9  # Eh; eigenvalues of (P|Q) below this are dropped
# smallest accepted pivot^2 / largest diagonal element of (P|Q): a pivot must stand well above
# the rounding level of the (fp64) arithmetic that produced it
CHOLESKY_PIVOT_RATIO = 100 * float(np.finfo(np.float64).eps)


@dataclass
class MetricFactor:
    """Factor of the Coulomb metric. kind 'cholesky': `matrix` is L [naux, naux] (lower);
    kind 'eigen': `matrix` is U_k s_k^-1/2 [naux, nkept]."""

    kind: str
    matrix: object
    naux: int
    nkept: int
    _cast: dict = field(default_factory=dict, repr=False)

    @property
    def ndropped(self) -> int:
        return self.naux - self.nkept

    def matrix_as(self, dtype):
        """The factor in `dtype`, converted once."""
        if self.matrix.dtype == dtype:
            return self.matrix
        if dtype not in self._cast:
            self._cast[dtype] = self.matrix.to(dtype)
        return self._cast[dtype]

    def host_fp64(self) -> np.ndarray:
        """The factor as a host fp64 array (for the host's solves)."""
        return self.matrix.detach().cpu().numpy().astype(np.float64)

    def describe(self) -> str:
        if self.kind == "cholesky":
            return "cholesky"
        return (f"eigen-decomposition (Cholesky failed; dropped {self.ndropped} of {self.naux} "
                f"eigenvalues below {LINEAR_DEPENDENCY_THRESHOLD:g})")


def _is_tensor(x) -> bool:
    """x is a torch tensor (without importing torch: the driver's modules load before it, so that
    the JK-fit integrals' early thread overlaps its import, `chem.EarlyIntegrals`)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def factor_metric(backend, metric, drop_threshold: float = LINEAR_DEPENDENCY_THRESHOLD) -> MetricFactor:
    """Factor (P|Q) [naux, naux], given in fp64 as PySCF computed it (numpy array), or as a
    device tensor where a GPU integral engine made it."""
    if not _is_tensor(metric):
        metric = np.asarray(metric, dtype=np.float64)
    naux = metric.shape[0]
    lower = backend.cholesky(metric)
    # accept L only if every pivot is well above rounding noise of the largest diagonal element
    if lower is not None and \
            float(lower.diagonal().min()) ** 2 > CHOLESKY_PIVOT_RATIO * float(metric.diagonal().max()):
        log.debug("metric (P|Q) [%d, %d]: Cholesky (smallest pivot^2 %.3g of the largest diagonal element, "
                  "accepted above %g)", naux, naux, float(lower.diagonal().min()) ** 2 / float(metric.diagonal().max()),
                  CHOLESKY_PIVOT_RATIO)
        return MetricFactor("cholesky", lower, naux, naux)
    backend.count("host:eigh")
    eigenvalues, vectors = np.linalg.eigh(metric.cpu().numpy() if _is_tensor(metric) else metric)
    keep = eigenvalues > drop_threshold
    nkept = int(keep.sum())
    if nkept == 0:
        raise ComputationError("the auxiliary metric (P|Q) has no eigenvalue above "
                               f"{drop_threshold:g}: the auxiliary basis is unusable")
    projector = backend.to_device(vectors[:, keep] / np.sqrt(eigenvalues[keep]), fp64=True)
    factor = MetricFactor("eigen", projector, naux, nkept)
    log.warning("metric (P|Q) is not positive definite: using %s", factor.describe())
    return factor


def fitting_coefficients(factor: MetricFactor, x: np.ndarray) -> np.ndarray:
    """c = X W^T for whitened X [..., nkept] (W: the whitening, B = (ia|P) W) -> [..., naux], host
    fp64: c = X L^-1 (Cholesky, W = L^-T) or X (U_k s_k^-1/2)^T (eigen). For X = B, c = (ia|Q) V^-1."""
    import scipy.linalg

    matrix = factor.host_fp64()
    rows = x.reshape(-1, x.shape[-1])
    if factor.kind == "cholesky":  # c L = X
        out = scipy.linalg.solve_triangular(matrix, rows.T, trans="T", lower=True).T
    else:
        out = rows @ matrix.T
    return out.reshape(*x.shape[:-1], factor.naux)


def metric_solve(factor: MetricFactor, rhs: np.ndarray) -> np.ndarray:
    """c = V^-1 R for R [naux, ...] (host fp64) through the factor: L^-T L^-1 R (Cholesky, LAPACK's
    potrs) or U_k s_k^-1 U_k^T R (eigen: the pseudo-inverse on the kept eigenvalues) -> [naux, ...]."""
    import scipy.linalg

    matrix = factor.host_fp64()
    columns = np.asarray(rhs, dtype=np.float64).reshape(factor.naux, -1)
    if factor.kind == "cholesky":  # L L^T c = R
        out = scipy.linalg.cho_solve((matrix, True), columns)
    else:
        out = matrix @ (matrix.T @ columns)
    return out.reshape(rhs.shape)


def whiten(backend, factor: MetricFactor, x):
    """B = X L^-T (Cholesky) or X U_k s_k^-1/2 (eigen) for X [..., naux] -> [..., nkept]."""
    matrix = factor.matrix_as(x.dtype)
    if factor.kind == "cholesky":
        return backend.solve_lower_transposed(matrix, x)
    rows = x.reshape(-1, x.shape[-1])
    return backend.gemm(rows, matrix).view(*x.shape[:-1], factor.nkept)
