"""Derivative integrals and the SCF's gradient terms."""

from __future__ import annotations

import numpy as np

from ..util.errors import InputError
from ..util.system_memory import release_freed_memory
from .cphf import response_potentials
from .reference import is_kohn_sham
from .scf import reference_fitting_integrals


class SCFGradientTerms:
    """The mean field's own derivative terms, per atom [natm, 3] (Eh/bohr), from PySCF's SCF
    gradient object (its density fitting, or exact integrals): nuclear repulsion, and for AO
    matrices the core-Hamiltonian and overlap derivatives (PySCF's -d/dr convention: ip1)."""

    def __init__(self, mf):
        self.mf, self.mol = mf, mf.mol
        self.grad = mf.nuc_grad_method()
        self.hcore = self.grad.hcore_generator(self.mol)
        self.s1 = self.grad.get_ovlp(self.mol)  # [3, nao, nao]
        self.slices = self.mol.aoslice_by_atom()[:, 2:]

    def nuclear(self) -> np.ndarray:
        return np.asarray(self.grad.grad_nuc())

    def core(self, dm) -> np.ndarray:
        """sum_mn dh_mn/dR_A D_nm per atom."""
        return np.array([np.einsum("xij,ji->x", self.hcore(a), dm) for a in range(self.mol.natm)])

    def overlap(self, w) -> np.ndarray:
        """sum_mn dS_mn/dR_A W_mn per atom (W need not be symmetric), -d/dr convention as PySCF's s1."""
        out = np.zeros((self.mol.natm, 3))
        for a, (p0, p1) in enumerate(self.slices):
            out[a] = np.einsum("xij,ij->x", self.s1[:, p0:p1], w[p0:p1]) + np.einsum("xji,ij->x", self.s1[:, p0:p1],
                                                                                   w[:, p0:p1])
        return out

    def two_electron(self, dm) -> np.ndarray:
        """d/dR_A of 1/2 sum D V_eff[D] with D fixed (the SCF's two-electron gradient for the
        density D: RHF the total [nao, nao], J - K/2; UHF per spin [2, nao, nao]; its density
        fitting with the auxiliary response)."""
        vhf = self.grad.get_veff(self.mol, dm)
        spin = "s" if np.ndim(dm) == 3 else ""
        out = np.array([2.0 * np.einsum(f"{spin}xij,{spin}ij->x", vhf[..., p0:p1, :], dm[..., p0:p1, :])
                        for p0, p1 in self.slices])
        if getattr(self.grad, "auxbasis_response", False):  # a DF reference: its fitting set's own derivative
            out += np.asarray(vhf.aux)  # (PySCF's DF gradients always attach it; missing would be an error)
        return out

    def fitting_integrals(self):
        """The reference's own fitting set (reference_fitting_integrals), or None."""
        return reference_fitting_integrals(self.mf)

    def energy_weighted_hf(self) -> np.ndarray:
        """The reference's energy-weighted density sum_i n_i e_i C_mi C_ni, summed over spins."""
        w = np.asarray(self.grad.make_rdm1e(self.mf.mo_energy, self.mf.mo_coeff, self.mf.mo_occ))
        return w.sum(axis=0) if w.ndim == 3 else w

    def veff_per_spin(self, dms) -> list:
        """The reference's Fock response to symmetric densities given per spin (RHF: [the total];
        UHF: [alpha, beta]), one [nao, nao] per spin (response_potentials)."""
        return response_potentials(self.mf, dms)

    def reference_gradient(self) -> np.ndarray:
        """The reference's own energy gradient [natm, 3] (PySCF's: a Kohn-Sham one's with its XC
        on the SCF's grid, no grid response; a DF reference's with its auxiliary response)."""
        return np.asarray(self.grad.kernel())

    def exchange_fraction(self) -> float:
        """a_x, the exact-exchange fraction of the reference (1 for HF); range separation refused."""
        if not is_kohn_sham(self.mf):
            return 1.0
        omega, _, hyb = self.mf._numint.rsh_and_hybrid_coeff(self.mf.xc, spin=self.mol.spin)
        if omega:
            raise InputError(f"gradients of range-separated functionals ({self.mf.xc}) are not implemented")
        return float(hyb)

    def coulomb_exchange_pair(self, ds, ps, k_scale) -> np.ndarray:
        """d/dR of J(D_t, P_t) - k_scale sum_s K(D_s, P_s) with the AO matrices fixed (symmetric,
        given per spin: RKS one spin-summed each, k_scale a_x/2; UKS alpha and beta, k_scale a_x),
        through the reference's exact integrals, per atom [natm, 3]:
            2 sum_(m on A) (vj[P_t] D_t + vj[D_t] P_t - k_scale sum_s (vk[P_s] D_s + vk[D_s] P_s))_mn"""
        n = len(ds)
        vj, vk = self.grad.get_jk(self.mol, np.array([*ds, *ps]))  # [2n, 3, nao, nao] each
        vj, vk = np.reshape(vj, (2 * n, 3, *vj.shape[-2:])), np.reshape(vk, (2 * n, 3, *vk.shape[-2:]))
        d_t, p_t, vj_d, vj_p = sum(ds), sum(ps), vj[:n].sum(axis=0), vj[n:].sum(axis=0)
        pairs = [(vj_p, d_t), (vj_d, p_t)] + [(-k_scale * vk[n + s], ds[s]) for s in range(n)] + \
            [(-k_scale * vk[s], ps[s]) for s in range(n)]
        return np.array([2.0 * sum(np.einsum("xij,ij->x", v[:, p0:p1], m[p0:p1]) for v, m in pairs)
                         for p0, p1 in self.slices])

    def xc_response(self, ds, ps) -> np.ndarray:
        """The exchange-correlation part of d/dR sum_s sum_mn P_s,mn V^xc_s,mn[rho_D] with the AO
        matrices fixed, given per spin (RKS: one spin-summed each; UKS: alpha and beta): the basis
        functions' motion in V^xc's matrix elements, and in rho_D under the kernel f_xc rho_P
        (PySCF's TDDFT-gradient contractions, tdrks/tduks, the SCF's grid, no grid response):
        2 sum_s sum_(m on A) (v1_s P_s + f1_s D_s)_mn per atom [natm, 3]."""
        from types import SimpleNamespace

        from pyscf.grad import tdrks, tduks

        holder = SimpleNamespace(mol=self.mol, base=SimpleNamespace(_scf=self.mf))
        if len(ps) == 1:  # tdrks takes half the spin-summed density
            f1, _, v1, _ = tdrks._contract_xc_kernel(holder, self.mf.xc, 0.5 * ps[0], None, True, False)
            f1, v1 = f1[None], v1[None]
        else:
            f1, _, v1, _ = tduks._contract_xc_kernel(holder, self.mf.xc, tuple(ps), None, True, False)
        return np.array([2.0 * sum(np.einsum("xij,ij->x", v1[s, 1:, p0:p1], ps[s][p0:p1])
                                   + np.einsum("xij,ij->x", f1[s, 1:, p0:p1], ds[s][p0:p1]) for s in range(len(ps)))
                         for p0, p1 in self.slices])


DERIVATIVE_BLOCK_BYTES = 96 * 10**6  # int3c2e_ip1 of one auxiliary block: 3 nao^2 nP fp64 at most this


def mnP_derivative_contraction(integrals, gamma_blocks, gamma_aux, aux_block=None) -> np.ndarray:
    """The DF energy's explicit derivative through the fitting integrals, per atom [natm, 3]:
      sum_mnP G^P_mn d(mn|P)/dR_A - 1/2 sum_PQ Gbar_PQ d(P|Q)/dR_A
    gamma_blocks(p0, p1) -> G^P_mn [p1-p0, nao, nao] of one auxiliary block (only S^P = G^P + G^P^T
    enters; an array [naux, nao, nao] is taken too), gamma_aux [naux, naux] (Gbar, symmetric);
    integrals: chem.MNPIntegrals (their auxmol). One auxiliary block at a time (G is never
    held whole): int3c2e_ip1 (all mn, the derivative on m) and int2c2e_ip1 of the block's functions.
    The auxiliary function's own derivative needs no int3c2e_ip2: by translational invariance
    (mn|P') = -(m'n|P) - (mn'|P), so 1/2 sum_mn S^P_mn (mn|P') = -sum_mn S^P_mn (m'n|P), from the
    same ip1 block (PySCF's ip1 is -d/dR of the function on that atom). aux_block: at most this
    many auxiliary functions per block (and at most DERIVATIVE_BLOCK_BYTES of ip1)."""
    from pyscf import df

    mol, auxmol = integrals.mol, integrals.auxmol
    if not callable(gamma_blocks):
        whole = gamma_blocks
        gamma_blocks = lambda p0, p1: whole[p0:p1]  # noqa: E731
    nao = mol.nao
    ao_atom = np.zeros(nao, dtype=int)
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        ao_atom[p0:p1] = a
    aux_atom = np.zeros(integrals.naux, dtype=int)
    for a, (_, _, q0, q1) in enumerate(auxmol.aoslice_by_atom()):
        aux_atom[q0:q1] = a
    per_ao, per_aux = np.zeros((3, nao)), np.zeros((3, integrals.naux))
    for p0, p1 in integrals.aux_blocks(min(aux_block or integrals.naux,
                                           max(1, DERIVATIVE_BLOCK_BYTES // (24 * nao * nao)))):
        shells = (0, mol.nbas, 0, mol.nbas, *integrals.aux_shells(p0, p1))
        block = gamma_blocks(p0, p1)
        symmetric = block + block.transpose(0, 2, 1)  # S^P [nP, nao, nao]
        # w_x,mP = sum_n (m'n|P) S^P_mn: the AO m's share, and (summed over m) the auxiliary P's
        ip1 = df.incore.aux_e2(mol, auxmol, "int3c2e_ip1", comp=3, aosym="s1", shls_slice=shells)
        ip1 = ip1.reshape(3, nao, nao, p1 - p0)
        ip1 *= symmetric.transpose(1, 2, 0)[None]
        weighted = ip1.sum(axis=2)  # [3, nao, nP]
        del ip1
        per_ao -= weighted.sum(axis=2)
        per_aux[:, p0:p1] += weighted.sum(axis=1)
        # (dP|Q): -1/2 sum_Q Gbar_PQ (P'|Q) twice (P or Q on the atom), Gbar symmetric
        v1 = auxmol.intor("int2c2e_ip1", comp=3, shls_slice=(shells[4], shells[5], 0, auxmol.nbas))
        per_aux[:, p0:p1] += np.einsum("xPQ,PQ->xP", v1, gamma_aux[p0:p1] + gamma_aux[:, p0:p1].T) * 0.5
        block = symmetric = weighted = v1 = None
        release_freed_memory()
    out = np.zeros((mol.natm, 3))
    np.add.at(out, ao_atom, per_ao.T)
    np.add.at(out, aux_atom, per_aux.T)
    return out
