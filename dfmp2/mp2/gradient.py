"""Analytic DF-MP2 nuclear gradients, RHF and UHF references: dE_total/dR_A [natm, 3], Eh/bohr.

From the pipeline's unrelaxed density and three-index two-particle density G_ia^P = dE/d(ia|P)
(steps.mp2_densities) and the relaxed density (response.relaxed_density), with the
Lagrangian's orbital terms, per atom A:

    dE/dR_A = V_nn' + sum h'_mn D_mn + 1/2 B'(D_HF, D_HF + 2 P)                 separable
              + sum_mnP G_mn^P (mn|P)' - 1/2 sum_PQ Gbar_PQ (P|Q)'               DF two-particle
              + sum S'_mn (I_mn - Z_mn - R_mn)                                  orbital (overlap) terms
    D = D_HF + P (P: the relaxed correlation density), G_mn^P = C_mi G_ia^P C_na,
    Gbar_PQ = sum_ia G_ia^P c_ia^Q (c = (ia|R) V^-1), B'(D1, D2): the derivative of the
    reference's two-electron energy bilinear form (its own J/K: density fitting or exact);
    I = C Imat C^T with Imat_pi = -1/2 sum_bP (pb|P) G_ib^P (i active), Imat_pa = -1/2 sum_jP
    (jp|P) G_ja^P, then Imat_ai = Imat_ia; Z = C (zeta * P) C^T + the reference's
    energy-weighted density, zeta_pq = (e_p + e_q)/2 (e_i in the occupied-virtual blocks);
    R = O V_eff[2 P] O, O = C_occ C_occ^T.
UHF: each orbital term per spin (C, e, P, G of that spin) and summed; D and P in B' per spin
(PySCF's [2, nao, nao]); R = 1/2 sum_s O_s V_eff^s[P_a + P_a^T, P_b + P_b^T] O_s.
"""

from __future__ import annotations

import numpy as np

from .. import chem
from ..chem.jk import metric_factor_of
from ..kernels import host_fp64_backend
from ..linalg import factor_metric, metric_solve
from ..run.context import Timer
from ..run.memory import free_bytes, gradient_aux_block, reference_arrays_bytes
from ..run.storage import ScratchArrays
from ..util.blocks import block_ranges
from ..util.errors import option
from ..util.system_memory import release_freed_memory
from .response import backend_gemm, orbital_derivatives, relaxed_density, response_mean_field


def gemm_backend(backend):
    """Where the gradient's four-index GEMMs run: `backend` where it has fp64 (cpu, cuda), else
    None (host numpy; trn1/trn2/trn3). They stay fp64 whatever the run's precision: in fp32 the
    gradient moves by 1e-5 (water) to 3e-4 Eh/bohr (benzene), the derivative contractions
    cancelling terms of O(100)."""
    return backend if backend is not None and backend.has_fp64 else None


def back_transformed(gammas, coeffs, spaces, backend=None):
    """G^P_mn = sum_s C_mi G_ia^P C_na of every spin channel, one auxiliary block at a time:
    a function (p0, p1) -> [p1-p0, nao, nao] (chem.mnP_derivative_contraction); gammas:
    G_ia^P [nact, nvir, naux] per channel; spaces: (active, virtual) indices per channel; the
    GEMMs on `backend` (backend_gemm)."""
    def block(p0, p1):
        out = 0.0
        for gamma, coeff, (act, vir) in zip(gammas, coeffs, spaces):
            n_p, nact, nao = p1 - p0, len(act), coeff.shape[0]
            g = gamma[:, :, p0:p1].transpose(2, 0, 1).reshape(n_p * nact, -1)  # rows (P, i)
            x = backend_gemm(backend, g, coeff[:, list(vir)].T).reshape(n_p, nact, nao)  # G C_vir^T
            y = backend_gemm(backend, coeff[:, list(act)], x.transpose(1, 0, 2).reshape(nact, -1))  # C_act (...)
            out = out + y.reshape(nao, n_p, nao).transpose(1, 0, 2)
        return out
    return block


def nuclear_gradient(mf, correlation, integrals, tol=1e-10, max_cycle=100, timer=None, backend=None,
                     with_density=False, arrays=None, aux_block=128, max_memory=None):
    """dE_total/dR [natm, 3] (Eh/bohr) of DF-MP2 on the RHF or UHF `mf`, from a finished run made
    with with_rdm1 and with_gamma (`correlation`); integrals: the MP2 fitting set's, dense.
    Per spin channel s (RHF: one, spin-summed; UHF: alpha and beta), every term of the module
    docstring is summed over s; the occupied-space response term is 1/nspin sum_s O_s V_s O_s.
    timer: a context.Timer that gets the parts (gradient_densities, gradient_cphf,
    gradient_reference, gradient_integrals, gradient_terms); backend: where the four-index GEMMs
    of the Lagrangian and the back-transformation run (backend_gemm; None: numpy fp64).
    with_density: -> (the gradient, the relaxed density in the MO basis as relaxed_density gives it).
    arrays: where the reference term's [naux, nao, nocc] arrays live (storage.ScratchArrays;
    default host memory); aux_block: auxiliary functions per block of every pass over (mn|P)
    and the derivative integrals, or a function () -> that number, asked again by each pass
    (memory.gradient_aux_block of what the budget leaves then: the response's J/K may keep
    integrals); max_memory: the budget (MB) the reference term's blocks are sized for (None: the
    default, `budget.memory_budget`)."""
    blocks_now = aux_block if callable(aux_block) else (lambda: aux_block)
    timer, backend = timer or Timer(), gemm_backend(backend)
    coeffs, occs = chem.per_spin_orbitals(mf)
    energies = [np.asarray(mf.mo_energy)] if len(coeffs) == 1 else list(np.asarray(mf.mo_energy))
    nspin = len(coeffs)
    terms = chem.SCFGradientTerms(mf)
    with timer.step("gradient_densities"):  # A_pi = sum_bP (pb|P) G_ib^P, B_pa = sum_jP (jp|P) G_ja^P
        blocks = [orbital_derivatives(integrals, gamma, coeff, list(act), list(vir), blocks_now(), backend)
                  for (act, vir, _, _), gamma, coeff in zip(correlation.rdm1_active, correlation.gamma, coeffs)]
    with timer.step("gradient_cphf"):
        relaxed, unrelaxed_potentials = relaxed_density(mf, correlation.rdm1_active, correlation.gamma, integrals,
                                                        tol=tol, max_cycle=max_cycle, derivatives=blocks,
                                                        with_potentials=True)
    density, relaxed = relaxed, np.reshape(relaxed, (nspin, *np.shape(relaxed)[-2:]))
    gamma_aux = correlation.gamma.gamma_aux  # Gbar_PQ = sum_ia G_ia^P c_ia^Q (steps.mp2_densities)
    lagrangian_ao, weighted_ao, p_aos, d_hfs, projectors, z_aos = _ao_densities(
        correlation.rdm1_active, blocks, relaxed, coeffs, occs, energies)
    with timer.step("gradient_reference"):
        reference = _reference_terms(terms, coeffs, occs, d_hfs, p_aos, arrays, blocks_now, max_memory)
    with timer.step("gradient_integrals"):
        spaces = [(act, vir) for act, vir, _, _ in correlation.rdm1_active]
        fitted = chem.mnP_derivative_contraction(integrals, back_transformed(correlation.gamma, coeffs, spaces, backend),
                                                          gamma_aux, blocks_now())
    with timer.step("gradient_terms"):
        # V_eff[P + P^T] = V_eff[Q + Q^T] (from the CPHF's right-hand side) + V_eff[Z + Z^T] (low rank)
        potentials = [v + w for v, w in zip(unrelaxed_potentials, terms.veff_per_spin([z + z.T for z in z_aos]))]
        response = sum(o @ v @ o for o, v in zip(projectors, potentials)) / nspin
        de = (reference + terms.core(sum(p_aos)) + fitted + terms.overlap(lagrangian_ao)
              - terms.overlap(weighted_ao) - terms.overlap(response))
    return (de, density) if with_density else de


def _ao_densities(rdm1_active, blocks, relaxed, coeffs, occs, energies) -> tuple:
    """The AO matrices of the gradient's terms from each spin's relaxed density P [nmo, nmo] and
    derivative blocks (A, B): (the energy-weighted Lagrangian sum_s C Imat C^T, sum_s C (zeta * P) C^T,
    P_s in the AO basis, the reference densities D_s, the occupied projectors, the CPHF parts Z_s)."""
    lagrangian_ao, weighted_ao, p_aos, d_hfs, projectors, z_aos = 0.0, 0.0, [], [], [], []
    for (act, vir, _, _), (a_mo, b_mo), p_full, coeff, occ, e in zip(rdm1_active, blocks, relaxed, coeffs, occs,
                                                                     energies):
        occ_index, vir_all = np.flatnonzero(occ > 0), np.flatnonzero(occ == 0)
        p_mo = p_full - np.diag(occ.astype(np.float64))
        # Imat_pi = -A_pi / 2 (i active), Imat_pa = -B_pa / 2, then the virtual-occupied block mirrored
        imat = np.zeros_like(p_mo)
        imat[:, list(act)] = -0.5 * a_mo
        imat[:, list(vir)] = -0.5 * b_mo
        imat[np.ix_(vir_all, occ_index)] = imat[np.ix_(occ_index, vir_all)].T
        # zeta_pq = (e_p + e_q) / 2, e_i in the occupied-virtual blocks
        zeta = 0.5 * (e[:, None] + e[None, :])
        zeta[np.ix_(vir_all, occ_index)] = e[occ_index][None, :]
        zeta[np.ix_(occ_index, vir_all)] = e[occ_index][:, None]
        lagrangian_ao = lagrangian_ao + coeff @ imat @ coeff.T
        weighted_ao = weighted_ao + coeff @ (zeta * p_mo) @ coeff.T
        p_aos.append(coeff @ p_mo @ coeff.T)
        d_hfs.append(coeff @ np.diag(occ.astype(np.float64)) @ coeff.T)
        projectors.append(coeff[:, occ_index] @ coeff[:, occ_index].T)
        z_mo = np.zeros_like(p_mo)  # the CPHF's occupied-virtual part of P
        z_mo[np.ix_(vir_all, occ_index)] = p_mo[np.ix_(vir_all, occ_index)]
        z_mo[np.ix_(occ_index, vir_all)] = p_mo[np.ix_(occ_index, vir_all)]
        z_aos.append(coeff @ z_mo @ coeff.T)
    return lagrangian_ao, weighted_ao, p_aos, d_hfs, projectors, z_aos


REFERENCE_BLOCK_BYTES = 64_000_000  # L read (and Y d written) this much at a time in reference_fitting_densities


def _per_spin_array(mats) -> np.ndarray:
    """RHF: the one spin-summed [nao, nao]; UHF: [2, nao, nao] (PySCF's density conventions)."""
    return mats[0] if len(mats) == 1 else np.array(mats)


def _reference_terms(terms, coeffs, occs, d_hfs, p_aos, arrays=None, aux_block=lambda: 128,
                     max_memory=None) -> np.ndarray:
    """The reference's share of the gradient per atom [natm, 3], with P (the relaxed correlation
    density) in its Fock matrix:
      HF:          V_nn' + h'(D_HF) - S'(W_HF) + 1/2 B'(D_HF, D_HF + 2P)      B = J - K/2 (UHF: J - sum_s K_s)
      Kohn-Sham:   dE_KS/dR (PySCF's) + B_x'(D_HF, P) + XC'(D_HF, P)        B_x = J - a_x K/2 (RKS; UKS J - a_x sum_s K_s)
    B' of a density-fitted reference through its own fitting set (reference_fitting_densities and
    the three-center derivative contraction); of an exact one through PySCF's derivative
    integrals (HF: polarization of its quadratic form; KS: its J/K derivative matrices)."""
    jk = terms.fitting_integrals()
    known = metric_factor_of(chem.fitted_builds_of(terms.mf), jk) if jk is not None else None  # the response's
    occupied = [(c[:, o > 0], o[o > 0].astype(np.float64)) for c, o in zip(coeffs, occs)]
    if chem.is_kohn_sham(terms.mf):
        a_x = terms.exchange_fraction()
        if jk is not None:  # 1/2 B_x'(D, 2P) = B_x'(D, P)
            g_ao, g_aux = reference_fitting_densities(jk, occupied, [2.0 * p for p in p_aos], aux_block(), a_x, arrays,
                                                      max_memory, known)
            pair = chem.mnP_derivative_contraction(jk, g_ao, g_aux, aux_block())
        else:  # K's weight: a_x/2 on the spin-summed RKS densities, a_x per spin (UKS)
            pair = terms.coulomb_exchange_pair(d_hfs, p_aos, a_x * (0.5 if len(coeffs) == 1 else 1.0))
        return terms.reference_gradient() + pair + terms.xc_response(d_hfs, p_aos)
    fixed = terms.nuclear() + terms.core(sum(d_hfs)) - terms.overlap(terms.energy_weighted_hf())
    if jk is None:
        d_hf, p_ao = _per_spin_array(d_hfs), _per_spin_array(p_aos)
        d_plus = d_hf + 2.0 * p_ao
        return fixed + (terms.two_electron(d_hf + d_plus) - terms.two_electron(d_hf - d_plus)) / 4.0
    g_ao, g_aux = reference_fitting_densities(jk, occupied, [d + 2.0 * p for d, p in zip(d_hfs, p_aos)], aux_block(),
                                              arrays=arrays, max_memory=max_memory, metric_factor=known)
    return fixed + chem.mnP_derivative_contraction(jk, g_ao, g_aux, aux_block())


def reference_fitting_densities(jk, occupied, y_dms, aux_block=128, exchange=1.0, arrays=None,
                                max_memory=None, metric_factor=None) -> tuple:
    """(G^P_mn one auxiliary block at a time: a function (p0, p1) -> [p1-p0, nao, nao], Gbar_PQ
    [naux, naux]) of 1/2 B'(X, Y) for a reference whose
    two-electron energy is density fitted in `jk` (chem.MNPIntegrals; M = (P|Q)^-1):
        B(X, Y) = J(X_t, Y_t) - w sum_s K(X_s, Y_s)       w: 1/2 RHF (one spin-summed channel), 1 UHF,
                                                          times `exchange` (a hybrid's a_x)
        J(X, Y) = sum X_mn (mn|P) M_PQ (Q|ls) Y_ls,    K(X, Y) = sum X_mn Y_ls (ml|P) M_PQ (Q|ns)
    with X_s = C_s n_s C_s^T (occupied: per channel (C_s [nao, nocc_s], n_s occupations)) and
    Y_s symmetric (y_dms, AO). With c(X) = M (P|ls) X_ls, L^P_ni = (nm|P) C_mi, d = M L:
        J: G^P = X c(Y)_P + Y c(X)_P,          Gbar = c(X) c(Y)^T + c(Y) c(X)^T
        K: G^P_lm = 2 (Y d^P)_li n_i C_mi,     Gbar_PQ = 2 sum_li d^P_li n_i (Y d^Q)_li
    (K's G given transposed: the contraction uses G^P + G^P^T only), so that
    sum G (mn|P)' - 1/2 sum Gbar (P|Q)' is the derivative (chem.mnP_derivative_contraction).
    One [naux, nao, nocc_s] array per spin in `arrays` (storage.ScratchArrays: on disk with the
    energy's B out of core; default host memory; on disk too where the budget, max_memory MB,
    does not hold them beside the smallest blocks): L, written by auxiliary blocks, then d and Y d
    formed a block of occupied orbitals at a time (at most REFERENCE_BLOCK_BYTES of L, and a
    quarter of what the budget leaves: the block's four copies), Y d written over L. metric_factor: the
    factor of jk's metric the run's J/K builds made (linalg.MetricFactor; None: factorised here)."""
    naux, nao, weight = jk.naux, jk.nao, exchange * (0.5 if len(occupied) == 1 else 1.0)
    arrays = arrays if arrays is not None else ScratchArrays("memory")
    x_total = sum((c * n) @ c.T for c, n in occupied)
    y_total = sum(y_dms)
    rho_x, rho_y = np.zeros(naux), np.zeros(naux)
    orbital = 8 * naux * nao  # bytes of one occupied orbital's share of L
    spill = reference_arrays_bytes(naux, nao, [c.shape[1] for c, _ in occupied]) + 2 * naux * naux * 8 + \
        4 * orbital > free_bytes(max_memory)
    half = [arrays.new((naux, nao, c.shape[1]), chunks=(min(naux, 64), nao, 1), on_disk=spill) for c, _ in occupied]
    for p0, p1 in jk.aux_blocks(aux_block):
        ao = jk.block(p0, p1)  # (mn|P) [nP, nao, nao]
        flat = ao.reshape(p1 - p0, -1)
        rho_x[p0:p1], rho_y[p0:p1] = flat @ x_total.ravel(), flat @ y_total.ravel()
        for (c, _), l_s in zip(occupied, half):
            l_s[p0:p1] = (ao.reshape(-1, nao) @ c).reshape(p1 - p0, nao, -1)  # L^P_ni = (nm|P) C_mi
        ao = flat = None
        release_freed_memory()
    factor = metric_factor or factor_metric(host_fp64_backend(), jk.metric())  # V = L L^T, fallback: eigen
    c_x, c_y = metric_solve(factor, rho_x), metric_solve(factor, rho_y)  # c(X) = V^-1 rho(X)
    g_aux = 0.5 * (np.outer(c_x, c_y) + np.outer(c_y, c_x))
    exchange_parts = []
    rows = max(1, min(REFERENCE_BLOCK_BYTES, free_bytes(max_memory) // 4) // orbital)
    for (c, n), l_s, y in zip(occupied, half, y_dms):
        for i0, i1 in block_ranges(c.shape[1], rows):
            d = metric_solve(factor, np.asarray(l_s[:, :, i0:i1]))  # d^P = V^-1 L^P (a Fortran copy)
            d = np.ascontiguousarray(d).reshape(naux, nao, -1)
            yd = np.matmul(y, d)  # (Y d^P)_li = M L, then Y on the left
            d *= n[i0:i1]
            g_aux -= weight * d.reshape(naux, -1) @ yd.reshape(naux, -1).T
            l_s[:, :, i0:i1] = yd
            d = yd = None
            release_freed_memory()
        exchange_parts.append((l_s, weight * c * n))

    def block(p0, p1):  # J: 1/2 (X c(Y)_P + Y c(X)_P); K: 1/2 of 2 (Y d^P)_li n_i C_mi, transposed
        out = 0.5 * (c_y[p0:p1, None, None] * x_total + c_x[p0:p1, None, None] * y_total)
        for yd, weighted in exchange_parts:
            out -= np.matmul(np.asarray(yd[p0:p1]), weighted.T)
        return out
    return block, g_aux


def nuclear_gradient_of_run(mf, correlation, settings, timer=None) -> tuple:
    """(dE_total/dR [natm, 3] (Eh/bohr), the record of the J/K builds its orbital response ran on,
    the relaxed density in the MO basis (relaxed_density's; for relaxed_properties)) of a finished
    RHF or UHF run made with with_rdm1 and with_gamma (`dfmp2.mp2.gradient`), in the MP2 fitting set
    of settings.auxbasis. The reference term's large arrays go where the run's B went (memory,
    or HDF5 under settings.scratch, removed on the way out)."""
    from ..kernels import backend_for
    from ..run.storage import ScratchArrays

    with response_mean_field(mf, settings) as response_mf, \
            ScratchArrays(correlation.gamma.kind, settings.scratch) as arrays:  # on disk with B out of core
        de, density = nuclear_gradient(response_mf, correlation,
                                                chem.MNPIntegrals(mf.mol, settings.auxbasis), timer=timer,
                                                backend=backend_for(settings), with_density=True, arrays=arrays,
                                                aux_block=lambda: gradient_aux_block(settings.max_memory, mf.mol.nao),
                                                max_memory=settings.max_memory)
        builds = chem.fitted_builds_of(response_mf) if response_mf is not mf else None
        record = builds.record.as_dict() if builds is not None else {
            "scf_backend": "pyscf",
            "why": option("scf_backend", "pyscf") if settings.scf_backend == "pyscf" and chem.reference_fitting_integrals(mf)
            is not None else "a reference with exact integrals, or a backend without builds"}
    return de, record, density
