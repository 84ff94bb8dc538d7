"""A small readable DF-MP2: the energy and the unrelaxed density of `steps.py`'s equations, dense,
in numpy fp64, one line per equation, with no blocks, backend, storage or ranks. The tests take it
as the reference the pipeline must match (tests/test_oracle.py); it is checked there against
PySCF's DF-MP2 itself. Spin is a parameter: a list of channels (C_occ [nao, no], C_vir [nao, nv],
e_occ [no], e_vir [nv]) in Hartree, one channel for RHF (both spins then the same), two for UHF.
"""

from __future__ import annotations

import numpy as np


def dfmp2_oracle(mnP, metric, channels) -> dict:
    """E_os, E_ss, E_corr (Eh) and per spin the unrelaxed correction (P_oo [no, no], P_vv [nv, nv])
    from (mn|P) [naux, nao, nao] and the metric (P|Q) [naux, naux]."""
    spins = list(channels) * (2 if len(channels) == 1 else 1)  # RHF: alpha and beta the same channel
    L = np.linalg.cholesky(metric)  # (P|Q) = L L^T
    iaP = [np.einsum("Pmn,mi,na->Pia", mnP, co, cv) for co, cv, _, _ in spins]  # (ia|P) = sum_mn C_mi C_na (mn|P)
    B = [np.linalg.solve(L, x.reshape(len(L), -1)).reshape(x.shape) for x in iaP]  # B_ia^Q = sum_P [L^-1]_QP (ia|P)
    K = [[np.einsum("Qia,Qjb->iajb", B[s], B[t]) for t in (0, 1)] for s in (0, 1)]  # (ia|jb) = sum_Q B_ia^Q B_jb^Q
    D = [[eo_s[:, None, None, None] - ev_s[None, :, None, None] + eo_t[None, None, :, None] - ev_t[None, None, None, :]
          for _, _, eo_t, ev_t in spins] for _, _, eo_s, ev_s in spins]  # D_iajb = e_i - e_a + e_j - e_b
    T = [[(K[s][t] - (K[s][t].transpose(0, 3, 2, 1) if s == t else 0)) / D[s][t] for t in (0, 1)]
         for s in (0, 1)]  # t_iajb = [(ia|jb) - delta_st (ib|ja)] / D_iajb
    e_os = np.sum(K[0][1] * T[0][1])  # E_os = sum_iajb (ia|JB)^2 / D
    e_ss = 0.5 * sum(np.sum(K[s][s] * T[s][s]) for s in (0, 1))  # E_ss = 1/2 sum_s sum (ia|jb) t_iajb
    P = [(-0.5 * np.einsum("iakb,jakb->ij", T[s][s], T[s][s]) - np.einsum("iakb,jakb->ij", T[s][1 - s], T[s][1 - s]),
          0.5 * np.einsum("iajc,ibjc->ab", T[s][s], T[s][s]) + np.einsum("iajc,ibjc->ab", T[s][1 - s], T[s][1 - s]))
         for s in (0, 1)]  # P_ij = -sum t_ik t_jk, P_ab = sum t_ac t_bc (1/2 within a spin)
    return {"e_os": float(e_os), "e_ss": float(e_ss), "e_corr": float(e_os + e_ss),
            "densities": P[:len(channels)]}
