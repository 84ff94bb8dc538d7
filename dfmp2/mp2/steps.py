"""The equations of DF-MP2, one function each, on arrays and blocks (no storage, rank or
checkpoint decisions here: those are the providers and policies of `dfmp2.mp2.pipeline`).

    1. metric Cholesky   J_PQ = (P|Q) = L L^T                        factor_metric
    2. AO->MO transform  (ia|P) = sum_mn C_mi C_na (mn|P)            transform_to_mo
    3. whitening         B_ia^Q = sum_P (ia|P) [L^-T]_PQ             whiten_iaP
    4. pair energies     (ia|jb) = sum_Q B_ia^Q B_jb^Q,  D_ijab = e_i + e_j - e_a - e_b
       restricted        E_os = sum_ijab (ia|jb)^2 / D_ijab
                         E_ss = sum_ijab (ia|jb) [(ia|jb) - (ib|ja)] / D_ijab
       unrestricted      E_os = sum_iJaB (ia|JB)^2 / D_iJaB              (alpha i, a; beta J, B)
                         E_ss = 1/2 sum_s sum_ijab (ia|jb) [(ia|jb) - (ib|ja)] / D   (s = aa, bb)
                                                                     pair_energies, combine_pair_sums
    5. unrelaxed density P_ij, P_ab (and the three-index density G_ia^P)
       from the same (ia|kb)                                         mp2_densities
    ROHF-MBPT(2), on semicanonical orbitals: the unrestricted sums plus
                         E_singles = sum_s sum_ia |f_ia|^2 / (e_i - e_a)      singles_energy
Every array operation goes through a backend from `dfmp2.kernels`; spin is a parameter (each
step takes one spin channel, `dfmp2.mp2.orbitals.SpinChannel`, or the task's pair of them).
The same equations dense, one line each, with nothing else: `dfmp2/mp2/oracle.py` (the tests'
reference, itself checked against PySCF's DF-MP2 in tests/test_oracle.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..util.blocks import block_ranges
from ..linalg import factor_metric, fitting_coefficients, whiten
from ..sparse import ScreenedMNP, ao2mo as screened_ao2mo

__all__ = ["factor_metric", "transform_to_mo", "whiten_iaP", "PairTask", "pair_tasks", "pair_energies",
           "combine_pair_sums", "t2_arrays", "mp2_densities", "mp2_density_correction",
           "singles_energy"]


# ----------------------------------------------------------------------------- steps 1-3

def transform_to_mo(backend, ao_block, c_occ, c_vir):
    """Step 2: (ia|P) = sum_mn C_mi C_na (mn|P) for one auxiliary block (the ao2mo kernel).

    ao_block [nP, nao, nao] (symmetric in m, n), or its kept pair blocks only (a screened
    `dfmp2.sparse.ScreenedMNP`: the sum runs over them); c_occ [nao, nocc]; c_vir
    [nao, nvir] (device tensors). Returns [nocc, nvir, nP].
    """
    if isinstance(ao_block, ScreenedMNP):
        return screened_ao2mo(backend, ao_block, c_occ, c_vir)
    return backend.ao2mo(ao_block, c_occ, c_vir)


def whiten_iaP(backend, factor, iaP):
    """Step 3: B_ia^Q = sum_P (ia|P) [L^-T]_PQ for a block iaP [ni, nvir, naux] -> [ni, nvir, nkept]."""
    return whiten(backend, factor, iaP)


# ----------------------------------------------------------------------------- step 4

@dataclass(frozen=True)
class PairTask:
    """One block pair of step 4: occupied rows [i0, i1) of channel s against rows [j0, j1) of
    channel t (within a channel J <= I, an off-diagonal block standing for (I, J) and (J, I))."""

    s: int
    t: int
    i0: int
    i1: int
    j0: int
    j1: int

    @property
    def diagonal(self) -> bool:
        return self.s == self.t and self.i0 == self.j0

    @property
    def weight(self) -> float:
        return 2.0 if self.s == self.t and not self.diagonal else 1.0


def pair_tasks(nocc, occ_block) -> list:
    """The pair tasks of channels with nocc[s] active occupied orbitals, in their canonical
    order: channel pairs (0, 0), (1, 1), then (0, 1) (no exchange between spins); I, then J."""
    channel_pairs = [(s, s) for s in range(len(nocc))] + ([(0, 1)] if len(nocc) == 2 else [])
    return [PairTask(s, t, i0, i1, j0, j1)
            for s, t in channel_pairs
            for i0, i1 in block_ranges(nocc[s], occ_block)
            for j0, j1 in block_ranges(nocc[t], occ_block) if s != t or j0 <= i0]


def pair_energies(backend, blocks, channels, record, t2=None):
    """Step 4 on the blocks a provider streams: for each (k, task, B_I, B_J) of `blocks` (B_J is
    B_I itself for a diagonal task), (ia|jb) = sum_Q B_ia^Q B_jb^Q and the task's sums
    record(k, E_os part, E_ss part), fp64 (`combine_pair_sums` adds them up). channels[s]: e_occ,
    e_vir (Eh) on the device; a task across spins (s != t) has no exchange. t2: {(s, t): host
    array} (`t2_arrays`) that each task's amplitudes go to as they are formed (an off-diagonal
    block of one channel also fills its mirror, t_ji^ba = t_ij^ab)."""
    for k, task, b_i, b_j in blocks:
        s, t = task.s, task.t
        t_out = None if t2 is None else t2[s, t][task.i0:task.i1, task.j0:task.j1]
        e_os, e_ss = backend.pair_energy(
            b_i, b_j, channels[s].e_occ[task.i0:task.i1], channels[t].e_occ[task.j0:task.j1],
            channels[s].e_vir, None if s == t else channels[t].e_vir, t_out,
            antisymmetrize=s == t and len(channels) == 2)
        if t_out is not None and s == t and not task.diagonal:
            t2[s, t][task.j0:task.j1, task.i0:task.i1] = t_out.transpose(1, 0, 3, 2)
        b_i = b_j = None  # the provider may free a slab before it hands out the next
        record(k, e_os, e_ss)


def combine_pair_sums(tasks, sums, nchannels):
    """(E_os, E_ss) from the per-task sums [ntasks, 2] (fp64), each added exactly once and
    correctly rounded (math.fsum): the same energy whatever order, budget or number of
    processes computed the tasks. Restricted: E_os = sum w (ia|jb)^2/D, E_ss = sum w
    (ia|jb)[(ia|jb) - (ib|ja)]/D; unrestricted: E_os from (alpha, beta) blocks,
    E_ss = 1/2 (alpha-alpha + beta-beta)."""
    def total(column, s, t):
        return math.fsum(task.weight * sums[k, column] for k, task in enumerate(tasks)
                         if (task.s, task.t) == (s, t))

    if nchannels == 1:
        return total(0, 0, 0), total(1, 0, 0)
    return total(0, 0, 1), 0.5 * (total(1, 0, 0) + total(1, 1, 1))


def t2_arrays(channels) -> tuple:
    """(t2, {(s, t): the array pair task blocks of channels s, t fill}): PySCF's t2 on the host,
    fp64, uninitialised: restricted [nocc, nocc, nvir, nvir]; unrestricted (t2aa, t2ab, t2bb)
    (alpha i, a; beta J, B in t2ab [nocca, noccb, nvira, nvirb])."""
    def empty(s, t):
        return np.empty((channels[s].nocc, channels[t].nocc, channels[s].nvir, channels[t].nvir))

    if len(channels) == 1:
        t2 = empty(0, 0)
        return t2, {(0, 0): t2}
    t2 = (empty(0, 0), empty(0, 1), empty(1, 1))
    return t2, {(0, 0): t2[0], (0, 1): t2[1], (1, 1): t2[2]}


# ----------------------------------------------------------------------------- 5 and singles

def spin_case(nchannels: int, s: int, other: int) -> str:
    """How the pairs of spin `other` meet spin `s` in the density kernels: "closed" (one,
    restricted channel), "same" or "opposite" (an unrestricted reference)."""
    return "closed" if nchannels == 1 else ("same" if other == s else "opposite")


def mp2_densities(backend, schedule, channels, scaling=(1.0, 1.0), factor=None, gamma_out=None):
    """The unrelaxed MP2 density per spin channel in the active space, and with the metric's `factor`
    (`linalg.MetricFactor`) the three-index two-particle density and its auxiliary contraction, fp64, from the
    same (ia|kb) as the energy: for each block of orbitals k, the amplitudes of every i against it serve all
    three (t2 is never stored; backend.density_block). Restricted (one channel): P_ij = -2 sum_kab t_ik^ab
    T_jk^ab, P_ab = 2 sum_ijc t_ij^ac T_ij^bc, T = (c_os + c_ss) t - c_ss t^T G_ia^P = sum_kb c_kb^P 4 T_ik^ab
    (c_kb^P = sum_Q (kb|Q) [V^-1]_QP) Unrestricted (two channels), for spin s, with u = t - t^T the same-spin
    amplitudes: P_ij^s = -c_ss/2 sum_kab u_ik^ab u_jk^ab - c_os sum_KaB t_iK^aB t_jK^aB P_ab^s = c_ss/2
    sum_ikc u_ik^ac u_ik^bc + c_os sum_iKC t_iK^aC t_iK^bC (K, B, C: the other spin) G_ia^P,s = sum_kb c_kb^P
    2 c_ss u_ik^ab + sum_KB c_KB^P 2 c_os t_iK^aB and Gbar_PQ = sum_s sum_ia G_ia^P,s c_ia^Q,s (the metric-
    derivative term of the gradient), from the whitened G~ (G = G~ W^T, c = B W^T: Gbar = W (sum_ia G~_ia^T
    B_ia) W^T). scaling (c_os, c_ss): (1, 1) for MP2, SCS weights for the density of c_os E_os + c_ss E_ss.
    schedule: where B comes from and which blocks of k this process takes (a `b.protocol.DensitySchedule`:
    `b.provider.LocalDensities`, or `b.ranks.RankDensities` over ranks: P and Gbar are then summed over
    the ranks, and each rank's G holds the rows of its blocks of k). gamma_out: per channel a writable [nocc_s,
    nvir_s, naux] array (host or HDF5 dataset) that receives G~ per block of k, then G in one pass over the
    held rows (and over B, for Gbar) after the backend's loop. Returns ([(P_oo [nocc_s, nocc_s], P_vv [nvir_s,
    nvir_s]) per channel] (PySCF dfmp2_native / dfump2_native's conventions; G is their Gamma, whose layout is
    [j, P, b]), Gbar [naux, naux] or None)."""
    densities = [(np.zeros((ch.nocc, ch.nocc)), np.zeros((ch.nvir, ch.nvir))) for ch in channels]
    for other, partner in enumerate(channels):  # the spin of k; the i of each spin against its blocks
        for k0, k1 in schedule.k_blocks(other):
            whitened = 0.0
            b_k = schedule.rows(other, k0, k1)
            for s, channel in enumerate(channels):
                oo, vv, g = backend.density_block(schedule.slabs(s), b_k, channel.e_occ, partner.e_occ[k0:k1],
                                                  channel.e_vir, scaling, spin_case(len(channels), s, other),
                                                  None if other == s else partner.e_vir, with_gamma=factor is not None)
                densities[s][0][...] += backend.to_host(oo)
                densities[s][1][...] += backend.to_host(vv)
                if g is not None:
                    whitened = whitened + np.asarray(backend.to_host(g), dtype=np.float64)
            if factor is not None:  # G~ of the block, fitted below (host BLAS kept out of the backend's loop)
                gamma_out[other][k0:k1, :, :factor.nkept] = whitened
            b_k = whitened = None
    densities = [(schedule.combine(oo), schedule.combine(vv)) for oo, vv in densities]
    if factor is None:
        return densities, None
    contracted = np.zeros((factor.nkept, factor.nkept))  # sum_ia G~_ia^T B_ia
    for s, channel in enumerate(channels):  # G = G~ W^T, and sum_ia G~_ia^T B_ia, a block of held rows at a time
        for i0, i1 in schedule.fit_blocks(s):
            whitened = np.asarray(gamma_out[s][i0:i1, :, :factor.nkept])
            flat = whitened.reshape(-1, factor.nkept)
            contracted += backend.rows_gram_fp64(flat, schedule.rows(s, i0, i1))
            gamma_out[s][i0:i1] = fitting_coefficients(factor, whitened)
            whitened = flat = None
    contracted = schedule.combine(contracted)
    return densities, fitting_coefficients(factor, fitting_coefficients(factor, contracted).T).T


def mp2_density_correction(nmo, occ_index, vir_index, p_oo, p_vv) -> np.ndarray:
    """One spin's unrelaxed MP2 correction to the 1-RDM in the MO basis [nmo, nmo]: P_oo on the
    active occupied block, P_vv on the active virtual block, zero elsewhere."""
    dm = np.zeros((nmo, nmo))
    dm[np.ix_(occ_index, occ_index)] += p_oo  # P_ij
    dm[np.ix_(vir_index, vir_index)] += p_vv  # P_ab
    return dm


def singles_energy(channels):
    """ROHF-MBPT(2) singles: sum_s sum_ia |f_ia|^2 / (e_i - e_a) over active i, a, fp64 (Eh);
    0 for canonical references (f_ia = 0)."""
    return float(sum(np.sum(ch.f_ov ** 2 / (ch.e_occ_host[:, None] - ch.e_vir_host[None, :]))
                     for ch in channels if ch.f_ov is not None))
