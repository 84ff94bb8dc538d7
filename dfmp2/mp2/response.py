"""The orbital response of DF-MP2 (Z-vector): the relaxed one-particle density, RHF and UHF.

Per spin, from the unrelaxed correction P (pipeline, step 5) and the three-index two-particle
density G_jb^P (steps.mp2_densities), with i, j active occupied, f frozen, a, b virtual:

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

from contextlib import contextmanager

import numpy as np

from .. import chem
from ..run.budget import pyscf_max_memory
from ..util.system_memory import MB, release_freed_memory
from .steps import mp2_density_correction


def backend_gemm(backend, a, b) -> np.ndarray:
    """a [m, k] @ b [k, n] of host fp64 arrays in fp64 on `backend` (one with fp64:
    gradient.gemm_backend), back on the host; numpy without one."""
    if backend is None:
        return a @ b
    return backend.to_host(backend.gemm(backend.to_device(np.ascontiguousarray(a), fp64=True),
                                        backend.to_device(np.ascontiguousarray(b), fp64=True)))


def derivative_block(ao, g, c_act, c_vir, backend=None) -> tuple:
    """One auxiliary block's share of the orbital derivatives (AO rows), as GEMMs (backend_gemm):
    ao (mn|P) [nP, nao, nao] (symmetric in mn), g G_ia^P [nP, nact, nvir] ->
    (A [nao, nact], B [nao, nvir]):
      A_mi = sum_bP (mb|P) G_ib^P = sum_Pn (mn|P) H^P_ni,  H^P_ni = C_nb G_ib^P  (no (m b|P) formed)
      B_na = sum_iP (ni|P) G_ia^P"""
    n_p, nao, nact, nvir = ao.shape[0], ao.shape[1], c_act.shape[1], c_vir.shape[1]
    rows = ao.reshape(n_p * nao, nao)  # rows (P, n)
    ao_act = backend_gemm(backend, rows, c_act).reshape(n_p, nao, nact)  # (n i|P)
    h = backend_gemm(backend, c_vir, g.transpose(2, 0, 1).reshape(nvir, -1)).reshape(nao, n_p, nact)
    a_ao = backend_gemm(backend, rows.T, h.transpose(1, 0, 2).reshape(-1, nact))  # (mn|P) = (nm|P)
    b_ao = backend_gemm(backend, ao_act.transpose(1, 0, 2).reshape(nao, -1), g.reshape(-1, nvir))
    return a_ao, b_ao


def orbital_derivatives(integrals, gamma, coeff, act, vir, aux_block=128, backend=None) -> tuple:
    """(A [nmo, nact], B [nmo, nvir]) of one spin in the MO basis, in one pass over (mn|P) and
    G, one auxiliary block at a time (derivative_block, its GEMMs on `backend`):
        A_pi = sum_bP (pb|P) G_ib^P,  B_pa = sum_jP (jp|P) G_ja^P
    gamma: G_ia^P [nact, nvir, naux] in the auxiliary basis of `integrals` (host array or HDF5
    dataset: read by auxiliary slices)."""
    c_act, c_vir = coeff[:, act], coeff[:, vir]
    a_ao, b_ao = np.zeros((coeff.shape[0], len(act))), np.zeros((coeff.shape[0], len(vir)))
    for p0, p1 in integrals.aux_blocks(aux_block):
        g = np.ascontiguousarray(gamma[:, :, p0:p1].transpose(2, 0, 1))  # G [nP, nact, nvir]
        a_block, b_block = derivative_block(integrals.block(p0, p1), g, c_act, c_vir, backend)
        a_ao += a_block
        b_ao += b_block
        g = a_block = b_block = None
        release_freed_memory()
    return coeff.T @ a_ao, coeff.T @ b_ao


def orbital_gradient(a_mo, b_mo, occ_index, act_index, vir_index) -> tuple:
    """(L_vo [nvir, nocc], L_fo [nfrozen, nocc]) of one spin from its orbital derivatives
    (orbital_derivatives; every virtual orbital active): L_ao = B_oa - [o active] A_ao and
    L_fi = -A_fi; occ_index: every occupied orbital, act_index: the active ones; columns in
    occ_index's order."""
    position = {o: k for k, o in enumerate(act_index)}
    frozen = [o for o in occ_index if o not in position]
    l_vo, l_fo = b_mo[occ_index].T.copy(), np.zeros((len(frozen), len(occ_index)))
    for column, o in enumerate(occ_index):
        if o in position:
            l_vo[:, column] -= a_mo[vir_index, position[o]]
            l_fo[:, column] = -a_mo[frozen, position[o]]
    return l_vo, l_fo


def relaxed_density(mf, rdm1_active, gammas, integrals, aux_block=128, tol=1e-10, max_cycle=100, derivatives=None,
                    with_potentials=False):
    """The relaxed DF-MP2 one-particle density in the MO basis: RHF [nmo, nmo], UHF [2, nmo, nmo],
    reference occupations included. rdm1_active: per spin (active occupied indices, virtual
    indices, P_oo, P_vv) (pipeline); gammas: per spin G [nact, nvir, naux]; integrals: the MP2
    fitting set's three-center integrals (dense); tol, max_cycle: the CPHF solver's;
    derivatives: per spin (A, B) of orbital_derivatives when the caller has them (else made here).
    with_potentials: also the response potentials V_eff^s[Q + Q^T] (AO, per spin) of the density
    before its occupied-virtual part Q (the unrelaxed and frozen-core blocks), which the CPHF's
    right-hand side needed anyway: -> (density, potentials)."""
    coeffs, occs = chem.per_spin_orbitals(mf)
    energies = [np.asarray(mf.mo_energy)] if len(coeffs) == 1 else list(np.asarray(mf.mo_energy))
    corrections, gradients = [], []
    for s, ((act, vir, p_oo, p_vv), gamma, coeff, occ, e) in enumerate(zip(rdm1_active, gammas, coeffs, occs,
                                                                              energies)):
        occ_index = np.flatnonzero(occ > 0)
        vir_all = np.flatnonzero(occ == 0)
        if len(vir) != len(vir_all):
            raise NotImplementedError("relaxed densities with frozen virtual orbitals are not implemented")
        dm = mp2_density_correction(len(occ), act, vir, p_oo, p_vv)
        a_mo, b_mo = derivatives[s] if derivatives is not None else orbital_derivatives(
            integrals, gamma, coeff, list(act), list(vir), aux_block)
        l_vo, l_fo = orbital_gradient(a_mo, b_mo, occ_index, list(act), vir_all)
        frozen = [o for o in occ_index if o not in set(act)]
        for row, f in enumerate(frozen):  # P_fi = L_fi / (2 (e_f - e_i))
            for col, i in enumerate(occ_index):
                if i in set(act):
                    dm[f, i] += 0.5 * l_fo[row, col] / (e[f] - e[i])
                    dm[i, f] = dm[f, i]
        corrections.append(dm)
        gradients.append(l_vo)
    responses, potentials = chem.fock_response_vo(mf, corrections, with_potentials=True)  # L_ai <- L_ai - R_ai[P]
    z = chem.solve_cphf(mf, [-(l - r) for l, r in zip(gradients, responses)], tol=tol, max_cycle=max_cycle)
    dms = []
    for dm, z_s, occ in zip(corrections, z, occs):
        occ_index, vir_all = np.flatnonzero(occ > 0), np.flatnonzero(occ == 0)
        dm[np.ix_(vir_all, occ_index)] += 0.5 * z_s
        dm[np.ix_(occ_index, vir_all)] += 0.5 * z_s.T
        dms.append(dm + np.diag(occ.astype(np.float64)))
    density = dms[0] if len(dms) == 1 else np.array(dms)
    return (density, potentials) if with_potentials else density


@contextmanager
def response_mean_field(mf, settings):
    """The mean field as the orbital response (CPHF, and the gradient's response terms) sees it:
    for a density-fitted reference, a copy of `mf` whose J and K come from dfmp2's builds on
    settings' backend in its fitting set, every build in the exact kind (fp64 on cpu and cuda,
    exact-product slices on trn1/trn2/trn3); `mf` itself is untouched and the builds are released on
    exit. A reference with exact integrals, a backend without builds, or --scf-backend pyscf
    (settings.scf_backend: the SCF's J/K were PySCF's, and so are the response's; they also
    go out of core where dfmp2's builds would need more than the budget): `mf` (PySCF's J/K)."""
    from ..chem.jk import EXACT_ONLY, FittedCoulombExchange, metric_factor_of
    from ..kernels import backend_for
    from ..kernels.protocol import FittedBuildsBackend

    jk = chem.reference_fitting_integrals(mf)
    backend = backend_for(settings) if jk is not None and settings.scf_backend != "pyscf" else None
    if not isinstance(backend, FittedBuildsBackend):
        with _pyscf_budget(mf, settings.max_memory, jk):
            yield mf
        return
    builds = FittedCoulombExchange(backend, jk, EXACT_ONLY, settings.max_memory, settings.scratch,
                                   metric_factor_of(chem.fitted_builds_of(mf), jk))  # the SCF's factor, if any
    try:
        yield chem.copy_with_builds(mf, builds)
    finally:
        builds.close()


@contextmanager
def _pyscf_budget(mf, max_memory, jk):
    """PySCF's J/K for the response under the run's budget. PySCF's DF object builds its
    integrals in core where 0.9 of max_memory less what is resident holds them, but that build
    peaks at about twice them (its buffers, the metric and its factor: 150-180 MB above the
    resident set for the 71 MB of hexane/cc-pVDZ's JK-fit integrals, 522 MB at a 500 MB budget):
    its max_memory is the budget less the integrals, the metric twice and 8 MB, so that it builds
    them in core only where that peak fits (else out of core, in buffers of what is left); the
    integrals are released on the way out (as the SCF's are: chem.release_integrals). The budget
    is the run's by the one rule (`budget.pyscf_max_memory`): not PySCF's own default."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None or jk is None:
        yield
        return
    max_memory = pyscf_max_memory(max_memory)
    saved = (mf.max_memory, with_df.max_memory)
    nao = jk.nao
    margin = jk.naux * nao * (nao + 1) // 2 * 8 + 2 * jk.naux * jk.naux * 8 + 8 * MB
    mf.max_memory = with_df.max_memory = max(1.0, max_memory - margin / MB)
    try:
        yield
    finally:
        mf.max_memory, with_df.max_memory = saved
        chem.release_integrals(mf)
        release_freed_memory()


PROPERTIES = ("dipole",)  # what relaxed_properties computes


def relaxed_properties(mf, correlation, settings, density=None) -> dict:
    """The one-electron properties settings.properties asks for, from the relaxed DF-MP2
    density of a finished run (made with with_rdm1 and with_gamma), or the given `density` (its
    MO-basis relaxed density, from a gradient): {"dipole": [x, y, z]}, the dipole moment in atomic
    units (e a0; nuclei included), about the origin of the input frame."""
    dm = density
    if dm is None:
        integrals = chem.MNPIntegrals(mf.mol, settings.auxbasis)
        with response_mean_field(mf, settings) as response_mf:
            dm = relaxed_density(response_mf, correlation.rdm1_active, correlation.gamma, integrals)
    coeffs, _ = chem.per_spin_orbitals(mf)
    total_ao = sum(c @ d @ c.T for c, d in zip(coeffs, dm.reshape(-1, *dm.shape[-2:])))
    return {"dipole": [float(x) for x in chem.dipole_moment(mf.mol, total_ao)]}


