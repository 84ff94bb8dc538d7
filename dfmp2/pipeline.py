"""The DF-MP2 correlation energy, step by step, as plain functions of arrays.

    1. metric Cholesky   J_PQ = (P|Q) = L L^T
    2. AO->MO transform  (ia|P) = sum_mn C_mi C_na (mn|P)
    3. whitening         B_ia^Q = sum_P (ia|P) [L^-T]_PQ
    4. pair energies     (ia|jb) = sum_Q B_ia^Q B_jb^Q
                         E_os = sum_ijab (ia|jb)^2 / D_ijab
                         E_ss = sum_ijab (ia|jb) [(ia|jb) - (ib|ja)] / D_ijab
                         D_ijab = e_i + e_j - e_a - e_b
Every array operation goes through a backend from `dfmp2.kernels`; there is no device
branching here. Memory: all steps work in blocks sized from a budget; nothing is
O(nocc^2 nvir^2).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import ComputationError, InputError
from .linalg import factor_metric, whiten
from .storage import DiskStore, MemoryStore

MB = 1_000_000  # memory budgets are in MB = 10^6 bytes, as in PySCF
MIN_AUX_BLOCK = 32  # auxiliary functions per transform block, unless the budget forces fewer


# ----------------------------------------------------------------------------- orbitals

def active_orbitals(mo_occ, frozen=None):
    """Indices of active occupied and virtual orbitals.

    frozen: None/0, an int n (the n lowest orbitals), or a list of orbital indices.
    Returns (occ_index, vir_index, nfrozen).
    """
    mo_occ = np.asarray(mo_occ)
    nmo = mo_occ.size
    occupied = np.flatnonzero(mo_occ > 0)
    nocc = occupied.size
    if frozen is None:
        frozen_set = set()
    elif isinstance(frozen, (int, np.integer)) and not isinstance(frozen, bool):
        if frozen < 0 or frozen > nocc:
            raise InputError(f"frozen={frozen}: must be between 0 and the {nocc} occupied orbitals")
        frozen_set = set(range(int(frozen)))
    else:
        try:
            frozen_set = {int(p) for p in frozen}
        except (TypeError, ValueError):
            raise InputError(f"frozen={frozen!r}: expected an int or a list of orbital indices") from None
        bad = sorted(p for p in frozen_set if p < 0 or p >= nmo)
        if bad:
            raise InputError(f"frozen orbital index {bad[0]} is outside 0..{nmo - 1}")
    occ_index = np.array([p for p in occupied if p not in frozen_set], dtype=int)
    vir_index = np.array([p for p in np.flatnonzero(mo_occ == 0) if p not in frozen_set], dtype=int)
    if occ_index.size == 0:
        raise InputError("no active occupied orbitals left after freezing")
    if vir_index.size == 0:
        raise InputError("no active virtual orbitals: the basis has no virtual space")
    return occ_index, vir_index, len(frozen_set)


# ----------------------------------------------------------------------------- memory plan

@dataclass
class MemoryPlan:
    """Block sizes and storage chosen from a memory budget (bytes)."""

    budget: int
    aux_block: int  # auxiliary functions per AO->MO transform block
    occ_block: int  # occupied orbitals per whitening / pair-energy block
    storage: str  # 'memory' or 'disk' for the [nocc, nvir, naux] tensor
    minimum: int  # smallest budget that could run at all (bytes)


def plan_memory(budget, nao, nocc, nvir, naux, largest_shell, itemsize,
                preferred_aux_block_bytes=None, preferred_pair_rows=512,
                occ_block_limit=None, pair_scratch_bytes=None) -> MemoryPlan:
    """Choose block sizes so that the working set of each step fits `budget` bytes.

    itemsize: bytes per element of the stored (ia|P) / B. The backend's preferences:
    preferred_aux_block_bytes, the size of one block of unpacked (mn|P) (None: as large as
    fits); preferred_pair_rows, the (i, a) rows of one pair-energy GEMM (small blocks waste
    less on the diagonal blocks I = J, large ones keep a GPU busy); occ_block_limit, the most
    occupied orbitals one pair-energy kernel can hold (e.g. on-chip memory);
    pair_scratch_bytes(nb, nvir), the memory one pair-energy call needs beyond its B blocks
    (default: ~5 fp64 [nb, nvir, nb, nvir] temporaries).
    """
    fixed = 3 * naux * naux * 8 + 2 * nao * nao * 8  # (P|Q), its factor, C

    def transform_bytes(nP):  # fp64: packed + unpacked integrals, device copy, half/full transform
        return nP * 8 * (nao * (nao + 1) // 2 + 2 * nao * nao + 2 * nao * nocc + 2 * nocc * nvir)

    def pair_bytes(nb):  # two B blocks (+ host copies) and the backend's temporaries
        scratch = pair_scratch_bytes(nb, nvir) if pair_scratch_bytes else 5 * nb * nb * nvir * nvir * 8
        return 4 * nb * nvir * naux * itemsize + scratch

    def whiten_bytes(nb):
        return 4 * nb * nvir * naux * itemsize

    store = nocc * nvir * naux * itemsize
    least = fixed + max(transform_bytes(largest_shell), pair_bytes(1), whiten_bytes(1))
    if least > budget:
        raise InputError(
            f"needs at least {least / MB:.3g} MB even in the smallest blocks "
            f"(nao={nao}, nocc={nocc}, nvir={nvir}, naux={naux}); the memory budget is "
            f"{budget / MB:.3g} MB (--max-memory)")
    storage = "memory" if least + store <= budget else "disk"
    room = budget - fixed - (store if storage == "memory" else 0)

    aux_block = naux
    if preferred_aux_block_bytes:  # but at least MIN_AUX_BLOCK functions, to keep GEMMs efficient
        aux_block = min(naux, max(largest_shell, MIN_AUX_BLOCK, preferred_aux_block_bytes // (8 * nao * nao)))
    while aux_block > largest_shell and transform_bytes(aux_block) > room:
        aux_block = max(largest_shell, aux_block // 2)

    occ_block = min(nocc, occ_block_limit or nocc, max(1, -(-preferred_pair_rows // max(nvir, 1))))
    while occ_block > 1 and max(pair_bytes(occ_block), whiten_bytes(occ_block)) > room:
        occ_block -= 1
    return MemoryPlan(budget, aux_block, occ_block, storage, least)


def block_ranges(n, size):
    """[(start, stop)] covering range(n) in pieces of `size`."""
    return [(start, min(start + size, n)) for start in range(0, n, size)]


# ----------------------------------------------------------------------------- steps

def metric_cholesky(backend, metric):
    """Step 1: J = L L^T for the metric (P|Q) [naux, naux], fp64 (eigen fallback if singular)."""
    return factor_metric(backend, metric)


def transform_to_mo(backend, ao_block, c_occ, c_vir):
    """Step 2: (ia|P) = sum_mn C_mi C_na (mn|P) for one auxiliary block (the ao2mo kernel).

    ao_block [nP, nao, nao] (symmetric in m, n); c_occ [nao, nocc]; c_vir [nao, nvir]
    (device tensors). Returns [nocc, nvir, nP].
    """
    return backend.ao2mo(ao_block, c_occ, c_vir)


def whiten_three_center(backend, factor, iaP):
    """Step 3: B_ia^Q = sum_P (ia|P) [L^-T]_PQ for a block iaP [ni, nvir, naux] -> [ni, nvir, nkept]."""
    return whiten(backend, factor, iaP)


def pair_energies(backend, store, e_occ, e_vir, occ_block, naux, progress=None):
    """Step 4: (E_os, E_ss) over all active i, j, using e_ij = e_ji (blocks I >= J only).

    store holds B [nocc, nvir, naux]; e_occ [nocc], e_vir [nvir] (Eh) on the device.
    Off-diagonal block pairs count twice; sums are fp64.
    """
    blocks = block_ranges(e_occ.shape[0], occ_block)
    npairs = len(blocks) * (len(blocks) + 1) // 2
    e_os = e_ss = 0.0
    done = 0
    for bi, (i0, i1) in enumerate(blocks):
        b_i = store.read_occ(i0, i1, naux)
        for j0, j1 in blocks[: bi + 1]:
            b_j = b_i if j0 == i0 else store.read_occ(j0, j1, naux)
            os_block, ss_block = backend.pair_energy(b_i, b_j, e_occ[i0:i1], e_occ[j0:j1], e_vir)
            weight = 1.0 if j0 == i0 else 2.0
            e_os += weight * os_block
            e_ss += weight * ss_block
            done += 1
            if progress:
                progress("pair energies", done, npairs)
    return e_os, e_ss


# ----------------------------------------------------------------------------- driver

@dataclass
class CorrelationEnergy:
    """DF-MP2 correlation energy (Eh) with its sizes, timings (s) and what ran."""

    e_corr_os: float
    e_corr_ss: float
    nocc: int
    nvir: int
    naux: int
    nao: int
    nfrozen: int
    metric: str
    plan: MemoryPlan
    timings: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)

    @property
    def e_corr(self) -> float:
        return self.e_corr_os + self.e_corr_ss

    @property
    def e_scs(self) -> float:
        """Grimme's spin-component-scaled correlation energy: 6/5 E_os + 1/3 E_ss."""
        return 1.2 * self.e_corr_os + self.e_corr_ss / 3.0


def dfmp2_energy(backend, integrals, mo_coeff, mo_energy, mo_occ, frozen=None,
                 max_memory=None, scratch=None, progress=None) -> CorrelationEnergy:
    """DF-MP2 correlation energy of a closed-shell reference.

    integrals: provider with nao, naux, metric(), aux_blocks(limit), block(p0, p1), largest_shell().
    mo_coeff [nao, nmo], mo_energy [nmo] (Eh), mo_occ [nmo]; frozen as in `active_orbitals`.
    max_memory: budget in MB (default: 80% of available RAM, or of free GPU memory).
    """
    occ_index, vir_index, nfrozen = active_orbitals(mo_occ, frozen)
    nocc, nvir = occ_index.size, vir_index.size
    nao, naux = integrals.nao, integrals.naux
    plan = plan_for(backend, integrals, nocc, nvir, max_memory)
    backend.expect_blocks(plan.aux_block, plan.occ_block)
    timings = {}

    def lap(name, start):
        backend.synchronize()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        return time.perf_counter()

    clock = time.perf_counter()
    metric = integrals.metric()
    clock = lap("integrals", clock)
    factor = metric_cholesky(backend, metric)  # 1. J = L L^T
    clock = lap("metric", clock)

    # the transform and the orbital energies stay fp64 in every precision: rounding (mn|P) to
    # fp32 before the transform costs ~2e-6 Eh on benzene/cc-pVTZ (see README, precision)
    c_occ = backend.to_device(np.asarray(mo_coeff)[:, occ_index], fp64=True)
    c_vir = backend.to_device(np.asarray(mo_coeff)[:, vir_index], fp64=True)
    e_occ = backend.to_device(np.asarray(mo_energy)[occ_index], fp64=True)
    e_vir = backend.to_device(np.asarray(mo_energy)[vir_index], fp64=True)

    shape = (nocc, nvir, naux)
    store = MemoryStore(backend, shape) if plan.storage == "memory" else \
        DiskStore(backend, shape, scratch)
    try:
        aux_blocks = integrals.aux_blocks(plan.aux_block)
        for n, (p0, p1) in enumerate(aux_blocks):  # 2. (ia|P) = C_mi C_na (mn|P)
            ao_block = integrals.block(p0, p1)
            clock = lap("integrals", clock)
            ao_block = backend.to_device(ao_block, fp64=True)
            store.write_aux(p0, p1, transform_to_mo(backend, ao_block, c_occ, c_vir))
            del ao_block
            clock = lap("transform", clock)
            if progress:
                progress("AO->MO transform", n + 1, len(aux_blocks))

        occ_blocks = block_ranges(nocc, plan.occ_block)
        for n, (i0, i1) in enumerate(occ_blocks):  # 3. B = (ia|P) L^-T
            store.write_occ(i0, i1, whiten_three_center(backend, factor, store.read_occ(i0, i1)))
            if progress:
                progress("whitening", n + 1, len(occ_blocks))
        clock = lap("whiten", clock)

        e_os, e_ss = pair_energies(backend, store, e_occ, e_vir, plan.occ_block,  # 4. energies
                                   factor.nkept, progress)
        lap("pair_energies", clock)
    finally:
        store.close()

    for name, value in (("opposite-spin", e_os), ("same-spin", e_ss)):
        if not np.isfinite(value):
            raise ComputationError(f"the {name} MP2 energy is not finite ({value})")
    return CorrelationEnergy(
        e_corr_os=e_os, e_corr_ss=e_ss, nocc=nocc, nvir=nvir, naux=naux, nao=nao,
        nfrozen=nfrozen, metric=factor.describe(), plan=plan, timings=timings,
        kernels=dict(backend.calls))


def plan_for(backend, integrals, nocc, nvir, max_memory) -> MemoryPlan:
    """The memory plan of a run with `nocc` active occupied and `nvir` virtual orbitals."""
    return plan_memory(_budget_bytes(backend, max_memory), integrals.nao, nocc, nvir,
                       integrals.naux, integrals.largest_shell(), backend.itemsize,
                       backend.preferred_aux_block_bytes, backend.preferred_pair_rows,
                       backend.occ_block_limit(nvir, integrals.naux), backend.pair_scratch_bytes)


def _budget_bytes(backend, max_memory):
    """Memory budget in bytes: --max-memory MB, capped by free GPU memory on a GPU."""
    if max_memory is not None:
        if max_memory <= 0:
            raise InputError(f"--max-memory must be positive, got {max_memory}")
        budget = int(max_memory * MB)
    else:
        budget = int(0.8 * available_ram_bytes())
    device_free = backend.memory_limit_bytes()
    if device_free is not None:
        budget = min(budget, int(0.9 * device_free))
    return budget


def available_ram_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the physical memory size."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
