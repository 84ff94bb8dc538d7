"""The coupled-perturbed SCF: the Fock response and PySCF's CPHF solvers."""

from __future__ import annotations

import numpy as np

from .reference import per_spin_orbitals


def fock_response_vo(mf, dms_mo, full=True, with_potentials=False):
    """The orbital-response Fock terms of densities given in the MO basis, virtual-occupied
    block per spin, through the mean field's own J/K (its density fitting or exact integrals):
    RHF  R_ai = [4 (ai|pq) - (ap|iq) - (aq|ip)] D_pq = C_a^T 2 V_eff[D + D^T] C_i
    UHF  R_ai^s = C_a^T V_eff^s[D + D^T] C_i  (both spins' densities together)
    dms_mo: per spin [nmo, nmo] (full) or [nvir_s, nocc_s] (full=False). Returns [[nvir_s, nocc_s]],
    with_potentials also the AO potentials V_eff^s[D + D^T] [nao, nao] per spin (response_potentials)."""
    coeffs, occs = per_spin_orbitals(mf)
    dms_ao = []
    for dm, coeff, occ in zip(dms_mo, coeffs, occs):
        c_occ, c_vir = coeff[:, occ > 0], coeff[:, occ == 0]
        dm_ao = coeff @ dm @ coeff.T if full else c_vir @ dm @ c_occ.T
        dms_ao.append(dm_ao + dm_ao.T)
    potentials = response_potentials(mf, dms_ao)
    scale = 2.0 if len(coeffs) == 1 else 1.0
    vo = [scale * coeff[:, occ == 0].T @ r @ coeff[:, occ > 0] for r, coeff, occ in zip(potentials, coeffs, occs)]
    return (vo, potentials) if with_potentials else vo


def response_potentials(mf, dms_ao) -> list:
    """The first-order change of the reference's Fock matrix for symmetric AO density changes
    given per spin (RHF: [the total]; UHF: [alpha, beta]), PySCF's gen_response (hermi=1):
    HF: V_eff (J - K/2 of the total; UHF J[Da + Db] - K[Ds]); Kohn-Sham: J - a_x K/2 plus the XC
    kernel f_xc on the SCF's grid. One [nao, nao] per spin."""
    response = mf.gen_response(hermi=1)
    if len(dms_ao) == 1:
        return [np.asarray(response(dms_ao[0]))]
    return list(np.asarray(response(np.array(dms_ao))))


def solve_cphf(mf, rhs_vo, tol=1e-10, max_cycle=100) -> list:
    """z per spin [nvir_s, nocc_s] with (e_i - e_a) z_ai - R_ai[z] = rhs_ai (PySCF's CPHF/UCPHF
    solvers, R: fock_response_vo of z as a virtual-occupied density)."""
    from pyscf.scf import cphf, ucphf

    coeffs, occs = per_spin_orbitals(mf)
    if len(coeffs) == 1:
        shape = rhs_vo[0].shape

        def response(z):
            return fock_response_vo(mf, [z.reshape(shape)], full=False)[0]

        return [cphf.solve(response, mf.mo_energy, mf.mo_occ, rhs_vo[0], max_cycle=max_cycle, tol=tol)[0]]
    sizes = [r.size for r in rhs_vo]

    def response_both(zflat):
        za, zb = zflat[0, :sizes[0]].reshape(rhs_vo[0].shape), zflat[0, sizes[0]:].reshape(rhs_vo[1].shape)
        ra, rb = fock_response_vo(mf, [za, zb], full=False)
        return np.hstack([ra.reshape(1, -1), rb.reshape(1, -1)])

    z = ucphf.solve(response_both, mf.mo_energy, mf.mo_occ, list(rhs_vo), max_cycle=max_cycle, tol=tol)[0]
    return [np.asarray(z[0]), np.asarray(z[1])]
