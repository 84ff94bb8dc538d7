"""The orbital response of DF-MP2 (Z-vector): the relaxed one-particle density, RHF and UHF.

Per spin, from the unrelaxed correction P (pipeline, step 5) and the three-index two-particle
density G_jb^P (steps.three_index_density), with i, j active occupied, f frozen, a, b virtual:

    L_ao = sum_jP (oj|P) G_ja^P - [o active] sum_bP G_ob^P (ba|P)   the orbital gradient of the
                                                                     two-electron part (o: occupied)
    L_fi = - sum_bP G_ib^P (bf|P)                                    frozen-active
    P_fi = P_if = L_fi / (2 (e_f - e_i))                             frozen-core relaxation
    L_ai <- L_ai - R_ai[P]                                           R: chem.fock_response_vo
    (e_i - e_a) z_ai - R_ai[z] = -L_ai                               the CPHF (Z-vector) equations
    P_ai = P_ia = z_ai / 2

then the reference occupations are added (PySCF dfmp2_native's and dfump2_native's algorithm
and conventions). L is formed from (mn|P) one auxiliary block at a time, fp64 on the host.
"""

from __future__ import annotations

import numpy as np

from . import chem


def orbital_gradient(integrals, gamma, coeff, occ_index, act_index, vir_index, aux_block) -> tuple:
    """(L_vo [nvir, nocc], L_fo [nfrozen, nocc]) of one spin: gamma [nact, nvir, naux] (the
    auxiliary basis of `integrals`), coeff [nao, nmo]; occ_index: every occupied orbital, act_index:
    the active ones (a subset), vir_index: the virtual ones; columns in occ_index's order."""
    c_occ, c_act, c_vir = coeff[:, occ_index], coeff[:, act_index], coeff[:, vir_index]
    frozen = [k for k, o in enumerate(occ_index) if o not in set(act_index)]
    active = [k for k, o in enumerate(occ_index) if o in set(act_index)]
    c_frozen = c_occ[:, frozen]
    l_vo, l_fo = np.zeros((len(vir_index), len(occ_index))), np.zeros((len(frozen), len(occ_index)))
    for p0, p1 in integrals.aux_blocks(aux_block):
        ao = integrals.block(p0, p1)  # (mn|P) [nP, nao, nao]
        g = gamma[:, :, p0:p1]
        # (oj|P) = C_mo C_nj (mn|P)                        [nP, nocc, nact]
        oj = np.matmul(np.matmul(c_occ.T, ao), c_act)
        # L_ao += sum_jP (oj|P) G_ja^P
        l_vo += np.einsum("Poj,jaP->ao", oj, g, optimize=True)
        # X_im = sum_bPn G_ib^P C_nb (mn|P)
        g_ao = np.einsum("ibP,nb->iPn", g, c_vir, optimize=True)
        x = np.einsum("iPn,Pmn->im", g_ao, ao, optimize=True)
        l_vo[:, active] -= (x @ c_vir).T
        l_fo[:, active] -= (x @ c_frozen).T
    return l_vo, l_fo


def relaxed_density(mf, rdm1_active, gammas, integrals, aux_block=128, tol=1e-10, max_cycle=100):
    """The relaxed DF-MP2 one-particle density in the MO basis: RHF [nmo, nmo], UHF [2, nmo, nmo],
    reference occupations included. rdm1_active: per spin (active occupied indices, virtual
    indices, P_oo, P_vv) (pipeline); gammas: per spin G [nact, nvir, naux]; integrals: the MP2
    fitting set's three-center integrals (dense); tol, max_cycle: the CPHF solver's."""
    coeffs, occs = chem._per_spin(mf)
    energies = [np.asarray(mf.mo_energy)] if len(coeffs) == 1 else list(np.asarray(mf.mo_energy))
    corrections, gradients = [], []
    for (act, vir, p_oo, p_vv), gamma, coeff, occ, e in zip(rdm1_active, gammas, coeffs, occs, energies):
        occ_index = np.flatnonzero(occ > 0)
        vir_all = np.flatnonzero(occ == 0)
        if len(vir) != len(vir_all):
            raise NotImplementedError("relaxed densities with frozen virtual orbitals are not implemented")
        dm = np.zeros((len(occ), len(occ)))
        dm[np.ix_(act, act)] += p_oo
        dm[np.ix_(vir, vir)] += p_vv
        l_vo, l_fo = orbital_gradient(integrals, gamma, coeff, occ_index, list(act), vir_all, aux_block)
        frozen = [o for o in occ_index if o not in set(act)]
        for row, f in enumerate(frozen):  # P_fi = L_fi / (2 (e_f - e_i))
            for col, i in enumerate(occ_index):
                if i in set(act):
                    dm[f, i] += 0.5 * l_fo[row, col] / (e[f] - e[i])
                    dm[i, f] = dm[f, i]
        corrections.append(dm)
        gradients.append(l_vo)
    responses = chem.fock_response_vo(mf, corrections)  # L_ai <- L_ai - R_ai[P]
    z = chem.solve_cphf(mf, [-(l - r) for l, r in zip(gradients, responses)], tol=tol, max_cycle=max_cycle)
    dms = []
    for dm, z_s, occ in zip(corrections, z, occs):
        occ_index, vir_all = np.flatnonzero(occ > 0), np.flatnonzero(occ == 0)
        dm[np.ix_(vir_all, occ_index)] += 0.5 * z_s
        dm[np.ix_(occ_index, vir_all)] += 0.5 * z_s.T
        dms.append(dm + np.diag(occ.astype(np.float64)))
    return dms[0] if len(dms) == 1 else np.array(dms)


PROPERTIES = ("dipole",)  # what relaxed_properties computes


def relaxed_properties(mf, correlation, settings) -> dict:
    """The one-electron properties settings.properties asks for, from the relaxed DF-MP2
    density of a finished run (made with with_rdm1 and with_gamma): {"dipole": [x, y, z]}, the
    dipole moment in atomic units (e a0; nuclei included), about the origin of the input frame."""
    integrals = chem.ThreeCenterIntegrals(mf.mol, settings.auxbasis)
    dm = relaxed_density(mf, correlation.rdm1_active, correlation.gamma, integrals)
    coeffs, _ = chem._per_spin(mf)
    total_ao = sum(c @ d @ c.T for c, d in zip(coeffs, dm.reshape(-1, *dm.shape[-2:])))
    return {"dipole": [float(x) for x in chem.dipole_moment(mf.mol, total_ao)]}


def nuclear_gradient(mf, correlation, settings):
    """dE_total/dR [natm, 3] (Eh/bohr) of a finished RHF run made with with_rdm1 and with_gamma
    (`dfmp2.gradient`), in the MP2 fitting set of settings.auxbasis."""
    from .gradient import rhf_gradient

    return rhf_gradient(mf, correlation, chem.ThreeCenterIntegrals(mf.mol, settings.auxbasis))
