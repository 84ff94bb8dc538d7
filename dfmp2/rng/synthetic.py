"""Synthetic DF-MP2 problems for benchmarks: the same pipeline input as a molecule, made from
(nbasis, nocc, naux, seed) with Philox streams, so a given seed is the same problem everywhere.

    metric        J = A A^T / naux + I                      SPD, eigenvalues in [1, ~5]
    three-center  (mn|P) = s * sum_k U_mk U_nk W_kP         symmetric in m, n; rank <= R per P
    orbitals      C_mp ~ N(0, 1/nbasis)
    energies      e_i in [-1.5, -0.3] (occupied), e_a in [0.2, 2.5] (virtual): a gap of 0.5 Eh
Every block of (mn|P) is built from its own columns of W, so blocks are independent of how
the auxiliary index is split. s is chosen so that e_corr is of a molecule's size (about
-0.03 Eh per occupied orbital).
"""

from __future__ import annotations

import numpy as np
import torch

from .philox import normal, uniform

SHAPES = {  # nbasis, nocc, naux: the sibling libraries' published benchmark shapes
    "small": (128, 16, 384),
    "medium": (512, 64, 1536),
    "large": (768, 96, 2304),
}
RANK = 64  # R: rank of each (mn|P) slice
STREAM_METRIC, STREAM_U, STREAM_W, STREAM_C, STREAM_EOCC, STREAM_EVIR = range(1, 7)


class SyntheticIntegrals:
    """A seeded synthetic IntegralProvider (`dfmp2.run.providers`): nao, naux, auxbasis, metric(),
    aux_blocks(limit), block(p0, p1) -> [nP, nao, nao], largest_shell(). device: None (blocks are
    host arrays) or a GPU's torch device (the metric and blocks are made on the GPU from the same
    Philox streams, drawn there, as a GPU integral engine would leave them: no upload)."""

    fitting = None  # no basis set
    atoms = None  # no molecule
    screenable = False  # never screened
    screening = None
    screening_record = None

    def __init__(self, nbasis: int, nocc: int, naux: int, seed: int = 0, device=None):
        self.nao, self.naux, self.seed = nbasis, naux, seed
        self.auxbasis = f"synthetic(seed={seed})"
        self.rank = min(RANK, nbasis)
        nvir = nbasis - nocc
        self._device = device  # where the variates are drawn (None: the host)
        self._u = normal(seed, STREAM_U, 0, nbasis * self.rank, self._device).reshape(nbasis, self.rank)
        self._w = None  # W_kP, the same stream elements whichever blocks are asked for
        # (ia|P) ~ s sqrt(R) and (ia|jb) ~ s^2 R sqrt(naux); aim for (ia|jb)^2 ~ 0.1 / (nocc nvir^2),
        # so that sum (ia|jb)^2 / |D| ~ 0.03 nocc
        self._scale = (0.1 / (nocc * nvir * nvir * naux)) ** 0.25 / self.rank ** 0.5

    # The products below use torch's BLAS, not numpy's: mixing numpy's OpenBLAS thread pool
    # (which spins after each call) with torch's slowed the benchmark 2x on 2 cores.

    def metric(self):
        """A A^T / naux + 1 [naux, naux] for A of standard normals: a host array, made in row
        blocks (the variates' temporaries would otherwise be ~4x the metric, outside the memory
        plan), or on a GPU (device) a tensor there, drawn there at once."""
        n = self.naux
        if self._device is not None:
            a = normal(self.seed, STREAM_METRIC, 0, n * n, self._device).reshape(n, n)
            metric = a @ a.T / n
            metric.diagonal().add_(1.0)
            return metric
        a = np.empty((n, n))
        for r0 in range(0, n, 64):
            r1 = min(r0 + 64, n)
            a[r0:r1] = normal(self.seed, STREAM_METRIC, r0 * n, (r1 - r0) * n).reshape(r1 - r0, n)
        a = torch.from_numpy(a)
        metric = (a @ a.T / n).numpy()
        metric[np.diag_indices(n)] += 1.0
        return metric

    def largest_shell(self) -> int:
        return 1

    def aux_blocks(self, limit: int) -> list:
        return [(p0, min(p0 + limit, self.naux)) for p0 in range(0, self.naux, limit)]

    def block(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) for P in [p0, p1): [p1 - p0, nao, nao], fp64 (a host array, or a tensor on the
        GPU of device)."""
        if self._w is None:  # W [naux, R] drawn once, at the first block (one draw: each is ~350 launches on a GPU)
            self._w = normal(self.seed, STREAM_W, 0, self.naux * self.rank, self._device).reshape(self.naux, self.rank)
        w = self._w[p0:p1]
        u = torch.as_tensor(self._u, device=self._device)
        scaled = u[None, :, :] * torch.as_tensor(self._scale * w, device=self._device)[:, None, :]  # s U_mk W_kP
        block = torch.matmul(scaled, u.T)
        return block.numpy() if self._device is None else block


def synthetic_orbitals(nbasis: int, nocc: int, seed: int = 0):
    """C [nbasis, nbasis], orbital energies [nbasis] (ascending within each space), occupations."""
    coeff = normal(seed, STREAM_C, 0, nbasis * nbasis).reshape(nbasis, nbasis) / np.sqrt(nbasis)
    e_occ = np.sort(-1.5 + 1.2 * uniform(seed, STREAM_EOCC, 0, nocc))
    e_vir = np.sort(0.2 + 2.3 * uniform(seed, STREAM_EVIR, 0, nbasis - nocc))
    occupations = np.zeros(nbasis)
    occupations[:nocc] = 2.0
    return coeff, np.concatenate([e_occ, e_vir]), occupations
