"""The MP2 density's spin cases, in one place for every backend (kernels.torch.backend.density_block,
kernels.nki.backend's density and gamma kernels):

  t = (ia|kb) / D,  X = x_w t - x_u t^T,  Y = y_w t - y_u t^T   (t^T: a and b swapped)
  P_ij += -w sum_kab X_ik^ab Y_jk^ab,  P_ab += w sum_ikc X_ik^ac Y_ik^bc,  G_kb^Q += g sum_ia Y_ik^ab B_ia^Q

closed shell (restricted): X = t, Y = (c_os + c_ss) t - c_ss t^T (T = 2 t - t^T for MP2), w = 2, g = 4;
same spin (one spin of an unrestricted reference): X = Y = t - t^T, w = c_ss / 2, g = 2 c_ss;
opposite spin (k the other spin): X = Y = t, w = c_os, g = 2 c_os.
(c_os, c_ss): (1, 1) for MP2, the SCS weights for the SCS-MP2 density.
The pair denominators D_ijab = e_i + e_j - e_a - e_b of t = (ia|jb) / D: `pair_denominators`, the
host definition every backend's host path uses (kernels.torch.backend, the NKI host references); the device
kernels (kernels.nki.kernels' pair, density and gamma kernels, kernels.torch.cuda_pair) form the same sum on chip.
"""

def pair_denominators(e_i, e_j, e_vir, e_vir_j=None):
    """D_ijab = e_i + e_j - e_a - e_b [ni, nvir, nj, nvir_j] (torch tensors) in fp64, as (e_i - e_a) +
    (e_j - e_b); e_vir_j: j's virtual energies when j is the other spin (None: e_vir)."""
    import torch

    e_ia = (e_i[:, None] - e_vir[None, :]).to(torch.float64)
    e_jb = (e_j[:, None] - (e_vir if e_vir_j is None else e_vir_j)[None, :]).to(torch.float64)
    return torch.add(e_ia[:, :, None, None], e_jb[None, None, :, :])


def density_weights(scaling, spin_case) -> tuple:
    """((x_w, x_u), (y_w, y_u), w, g) of the module docstring for scaling (c_os, c_ss) and
    spin_case "closed", "same" or "opposite"."""
    c_os, c_ss = (float(c) for c in scaling)
    return {"closed": ((1.0, 0.0), (c_os + c_ss, c_ss), 2.0, 4.0),
            "same": ((1.0, 1.0), (1.0, 1.0), 0.5 * c_ss, 2.0 * c_ss),
            "opposite": ((1.0, 0.0), (1.0, 0.0), c_os, 2.0 * c_os)}[spin_case]


def combine_amplitudes(t, t_swapped, weights):
    """c_w t - c_u t^T for weights (c_w, c_u) and t^T = t_swapped (a view): t itself for (1, 0),
    t - t^T for (1, 1) (no products by 1: the same bits as written out)."""
    c_w, c_u = weights
    if c_u == 0.0:
        return t if c_w == 1.0 else c_w * t
    if (c_w, c_u) == (1.0, 1.0):
        return t - t_swapped
    return c_w * t - c_u * t_swapped
