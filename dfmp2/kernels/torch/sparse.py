"""Block-sparse three-center operations on torch (cpu, cuda): the row panels of
`dfmp2.sparse.ScreenedMNP`, one GEMM per row block, nothing densified.

    half transform   X_(m, P, r) = sum_(n in cols_M) (mn|P) F_(n r)       [nao, nP, r]
    AO->MO           (ia|P) = sum_n C_(n a) X_(n, P, i)   with F = C_occ    [nocc, nvir, nP]
    exchange         K_mn = sum_(P, r) X_(m, P, r) w_r Z_(n, P, r)         one GEMM [nao, nP r] x [nP r, nao]
    fitted density   rho_P = sum_(mn kept) (mn|P) D_mn                     [nset, nP]   } from LowerPanels:
    Coulomb          J_mn = sum_P rho_P (mn|P) on the kept blocks          [nset, nao, nao] } each pair once
"""

from __future__ import annotations

import torch

from . import cpu_gemm
from .products import symmetric_product


class PanelIndex:
    """Device index tensors of a pattern's panel columns, made once per (pattern, device)."""

    def __init__(self):
        self._held = {}

    def columns(self, pattern, device, lower=False) -> list:
        """[the AO indices of panel m's columns] (lower: of the LowerPanels' columns)."""
        key = (id(pattern), str(device), lower)
        if key not in self._held:
            self._held[key] = (pattern, [torch.as_tensor(pattern.columns(m, lower), device=device)
                                         for m in range(len(pattern.rows))])
        return self._held[key][1]


def half_transform(index, screened, factor):
    """X [nao, nP, r] = sum_n (mn|P) F_(n r) over the kept blocks; factor [nao, r] in the
    panels' dtype."""
    pattern, nP, r = screened.pattern, screened.naux, factor.shape[1]
    out = torch.empty((pattern.nao, nP, r), dtype=factor.dtype, device=factor.device)
    for m, (panel, cols) in enumerate(zip(screened.panels, index.columns(pattern, factor.device))):
        a0, a1 = pattern.blocks[m][:2]
        # X_(m, P, r) = sum_n (mn|P) F_(n r)     [nP * nM, ncols] x [ncols, r]
        half = cpu_gemm.matmul("half", panel.reshape(nP * (a1 - a0), -1), factor.index_select(0, cols))
        out[a0:a1] = half.view(nP, a1 - a0, r).transpose(0, 1)
    return out


def ao2mo(index, screened, c_occ, c_vir):
    """(ia|P) = sum_mn C_mi C_na (mn|P) over the kept blocks -> [nocc, nvir, nP] (a view)."""
    x = half_transform(index, screened, c_occ)  # [nao, nP, nocc]
    nao, nP, nocc = x.shape
    # (ia|P) = sum_n C_na X_(n, P, i)      [nvir, nao] x [nao, nP * nocc]
    full = cpu_gemm.matmul("transform", c_vir.transpose(0, 1), x.view(nao, nP * nocc))
    return full.view(-1, nP, nocc).permute(2, 0, 1)


def exchange_product(x, z, weights=None):
    """K_mn = sum_(P, r) X_(m, P, r) w_r Z_(n, P, r) for x, z [nao, nP, r] -> [nao, nao] (on a CPU,
    z is x: its lower block rows, kernels.torch.products.symmetric_product)."""
    nao, symmetric = x.shape[0], z is x and x.device.type == "cpu"
    if weights is not None:
        z = z * weights
    left, right = x.reshape(nao, -1), z.reshape(nao, -1)
    if symmetric:
        return symmetric_product(left.transpose(0, 1), right.transpose(0, 1))
    return cpu_gemm.matmul("exchange", left, right.transpose(0, 1))


def fit_density(index, lower, dms):
    """rho_P = sum_(mn kept) (mn|P) D_mn from each kept block pair once (a LowerPanels on the
    device): rho_P = sum_(M, N <= M) <(MN|P), D_MN + D_NM^T>, the diagonal blocks <(MM|P), D_MM>.
    dms [nset, nao, nao] (device, the panels' dtype) -> [nset, nP]."""
    pattern, nset = lower.pattern, dms.shape[0]
    both = dms + dms.transpose(1, 2)
    rho = torch.zeros((nset, lower.naux), dtype=dms.dtype, device=dms.device)
    for m, (panel, cols) in enumerate(zip(lower.panels, index.columns(pattern, dms.device, lower=True))):
        a0, a1 = pattern.blocks[m][:2]
        d = both[:, a0:a1].index_select(2, cols)  # [nset, nM, nlow]; the last nM columns: block M itself
        d[:, :, -(a1 - a0):] = dms[:, a0:a1, a0:a1]
        rho += cpu_gemm.matmul("fit", d.reshape(nset, -1), panel.reshape(lower.naux, -1).transpose(0, 1))
    return rho


def coulomb(index, lower, rho):
    """J_mn = sum_P rho_P (mn|P) on the kept blocks (zero elsewhere) from each kept block pair
    once: J_MN for N <= M, then J = J_low + J_low^T - the diagonal blocks once.
    rho [nset, nP] -> [nset, nao, nao]."""
    pattern, nset = lower.pattern, rho.shape[0]
    half = torch.zeros((nset, pattern.nao, pattern.nao), dtype=rho.dtype, device=rho.device)
    for m, (panel, cols) in enumerate(zip(lower.panels, index.columns(pattern, rho.device, lower=True))):
        a0, a1 = pattern.blocks[m][:2]
        j = cpu_gemm.matmul("coulomb", rho, panel.reshape(lower.naux, -1)).view(nset, a1 - a0, -1)
        half[:, a0:a1].index_copy_(2, cols, j)
    vj = half + half.transpose(1, 2)
    for a0, a1, _, _ in pattern.blocks:
        vj[:, a0:a1, a0:a1] -= half[:, a0:a1, a0:a1]
    return vj
