"""The DF-MP2 correlation energy, step by step, as plain functions of arrays.

    1. metric Cholesky   J_PQ = (P|Q) = L L^T
    2. AO->MO transform  (ia|P) = sum_mn C_mi C_na (mn|P)
    3. whitening         B_ia^Q = sum_P (ia|P) [L^-T]_PQ
    4. pair energies     (ia|jb) = sum_Q B_ia^Q B_jb^Q,  D_ijab = e_i + e_j - e_a - e_b
       restricted        E_os = sum_ijab (ia|jb)^2 / D_ijab
                         E_ss = sum_ijab (ia|jb) [(ia|jb) - (ib|ja)] / D_ijab
       unrestricted      E_os = sum_iJaB (ia|JB)^2 / D_iJaB              (alpha i, a; beta J, B)
                         E_ss = 1/2 sum_s sum_ijab (ia|jb) [(ia|jb) - (ib|ja)] / D   (s = aa, bb)
    ROHF-MBPT(2), on semicanonical orbitals: the unrestricted sums plus
                         E_singles = sum_s sum_ia |f_ia|^2 / (e_i - e_a)
Spin is a parameter of the one code path: steps 2-4 run per spin channel (a restricted
reference has one, an unrestricted two, sharing the metric and each (mn|P) block).
Every array operation goes through a backend from `dfmp2.kernels`; there is no device
branching here. Memory: all steps work in blocks sized from a budget; nothing is
O(nocc^2 nvir^2).
"""

from __future__ import annotations

import math
from collections import Counter
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .checkpoint import Checkpoint, array_digest, open_checkpoint, version_identity
from .errors import ComputationError, InputError, MemoryBudgetError
from .linalg import factor_metric, whiten
from .memory import MB, MemoryPlan, peak_resident_bytes, plan_for, release_freed_memory  # noqa: F401  (MB, MemoryPlan: re-exported)
from .settings import IF_ROOM, Settings, settings_from
from .storage import DiskStore, MemoryStore, remove_scratch

# ----------------------------------------------------------------------------- orbitals

def active_orbitals(mo_occ, frozen=None, spin=""):
    """Indices of active occupied and virtual orbitals of one spin channel.

    frozen: None/0, an int n (the n lowest orbitals), or a list of orbital indices.
    spin: 'alpha'/'beta' for the error messages of an unrestricted reference.
    Returns (occ_index, vir_index, nfrozen).
    """
    where = f" ({spin} spin)" if spin else ""
    mo_occ = np.asarray(mo_occ)
    nmo = mo_occ.size
    occupied = np.flatnonzero(mo_occ > 0)
    nocc = occupied.size
    if frozen is None:
        frozen_set = set()
    elif isinstance(frozen, (int, np.integer)) and not isinstance(frozen, bool):
        if frozen < 0 or frozen > nocc:
            raise InputError(f"frozen={frozen}: must be between 0 and the {nocc} occupied orbitals{where}")
        frozen_set = set(range(int(frozen)))
    else:
        try:
            frozen_set = {int(p) for p in frozen}
        except (TypeError, ValueError):
            raise InputError(f"frozen={frozen!r}: expected an int or a list of orbital indices") from None
        bad = sorted(p for p in frozen_set if p < 0 or p >= nmo)
        if bad:
            raise InputError(f"frozen orbital index {bad[0]} is outside 0..{nmo - 1}{where}")
    occ_index = np.array([p for p in occupied if p not in frozen_set], dtype=int)
    vir_index = np.array([p for p in np.flatnonzero(mo_occ == 0) if p not in frozen_set], dtype=int)
    if occ_index.size == 0:
        raise InputError(f"no active occupied orbitals left after freezing{where}")
    if vir_index.size == 0:
        raise InputError(f"no active virtual orbitals{where}: the basis has no virtual space")
    return occ_index, vir_index, len(frozen_set)


def frozen_per_spin(frozen, nspin):
    """PySCF's conventions for an unrestricted reference: None or an int n (the n lowest
    orbitals of each spin), a list of indices (the same for both spins), or a pair of lists
    [[alpha...], [beta...]]. Returns one `frozen` per spin channel."""
    if nspin == 1:
        return [frozen]
    if frozen is None or isinstance(frozen, (int, np.integer)):
        return [frozen, frozen]
    try:
        items = list(frozen)
    except TypeError:
        raise InputError(f"frozen={frozen!r}: expected an int, a list of indices or two lists") from None
    nested = [isinstance(item, (list, tuple, np.ndarray)) for item in items]
    if any(nested):
        if not all(nested) or len(items) != 2:
            raise InputError(f"frozen={frozen!r}: per-spin frozen orbitals are two lists, "
                             "[[alpha...], [beta...]]")
        return [list(items[0]), list(items[1])]
    return [items, items]


def spin_channels(mo_coeff, mo_energy, mo_occ):
    """Split a reference into spin channels [(C [nao, nmo], e [nmo], occ [nmo])]: one for a
    restricted reference (C 2-D), two (alpha, beta) for an unrestricted one (C [2, nao, nmo]
    or a pair of matrices, as PySCF's UHF holds them)."""
    if isinstance(mo_coeff, (list, tuple)) or np.asarray(mo_coeff).ndim == 3:
        return [(np.asarray(mo_coeff[s], dtype=np.float64), np.asarray(mo_energy[s], dtype=np.float64),
                 np.asarray(mo_occ[s], dtype=np.float64)) for s in range(2)]
    return [(np.asarray(mo_coeff, dtype=np.float64), np.asarray(mo_energy, dtype=np.float64),
             np.asarray(mo_occ, dtype=np.float64))]


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


def pair_energies(backend, stores, channels, tasks, todo, naux, slab_rows, record, load_slab=None, t2=None):
    """Step 4 for the tasks `todo` (indices into `tasks`): record(k, E_os part, E_ss part) of
    each, fp64 (module docstring: the per-task sums; `combine_pair_sums` adds them up).
    stores[s] holds B of channel s [nocc_s, nvir_s, naux]; channels[s] has its e_occ, e_vir
    (Eh) on the device. B_I is read in slabs of `slab_rows` occupied rows, once each; the B_J
    blocks the slab's tasks need are streamed against it, read once per slab (a view when J
    lies inside the slab). load_slab(s, i0, i1): B_I of a slab when it must be made first (out
    of core, whitening each slab as the pair stage reaches it); default: read from the store.
    t2: {(s, t): host array} (`t2_arrays`) that each task's amplitudes go to, as they are formed
    (an off-diagonal block of one channel also fills its mirror, t_ji^ba = t_ij^ab)."""
    groups = {}
    for k in todo:
        groups.setdefault((tasks[k].s, tasks[k].t), []).append(k)
    for (s, t), members in groups.items():
        e_vir_j = None if s == t else channels[t].e_vir  # another spin's virtuals: no exchange
        for si0, si1 in block_ranges(channels[s].nocc, slab_rows):
            here = [k for k in members if si0 <= tasks[k].i0 < si1]
            if not here:
                continue
            slab_i = load_slab(s, si0, si1) if load_slab else stores[s].read_occ(si0, si1, naux)
            for j0, j1 in sorted({(tasks[k].j0, tasks[k].j1) for k in here}):
                inside = s == t and j0 >= si0
                b_j = slab_i[j0 - si0:j1 - si0] if inside else stores[t].read_occ(j0, j1, naux)
                for k in (k for k in here if tasks[k].j0 == j0):
                    task = tasks[k]
                    b_i = slab_i[task.i0 - si0:task.i1 - si0]
                    t_out = None if t2 is None else t2[s, t][task.i0:task.i1, j0:j1]
                    e_os, e_ss = backend.pair_energy(
                        b_i, b_i if task.diagonal else b_j, channels[s].e_occ[task.i0:task.i1],
                        channels[t].e_occ[j0:j1], channels[s].e_vir, e_vir_j, t_out,
                        antisymmetrize=s == t and len(channels) == 2)
                    if t_out is not None and s == t and not task.diagonal:
                        t2[s, t][j0:j1, task.i0:task.i1] = t_out.transpose(1, 0, 3, 2)
                    record(k, e_os, e_ss)
            slab_i = b_i = b_j = None  # views keep a slab alive: drop them all before the next
            release_freed_memory()


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


def given_three_center(backend, given, channels, occ_block):
    """Stores holding B given per channel ([nocc * nvir, naux] arrays or HDF5 datasets, PySCF's
    ovL layout; any whitening of the metric gives the same energies), read in occupied blocks.
    Returns (stores, naux); InputError if a shape does not match the active orbitals."""
    if len(given) != len(channels):
        raise InputError(f"given (ia|P) integrals for {len(given)} spin channel(s); this reference has {len(channels)}")
    naux = {int(ovl.shape[-1]) for ovl in given}
    for ovl, ch in zip(given, channels):
        if len(ovl.shape) != 2 or ovl.shape[0] != ch.nocc * ch.nvir or len(naux) != 1:
            raise InputError(f"given (ia|P) integrals have shape {tuple(ovl.shape)}, not [nocc * nvir, naux] = "
                             f"[{ch.nocc} * {ch.nvir}, naux] of the active orbitals{f' ({ch.name})' if ch.name else ''}"
                             ": were they made with other orbitals or frozen orbitals?")
    naux = naux.pop()
    stores = []
    for ovl, ch in zip(given, channels):
        store = MemoryStore(backend, (ch.nocc, ch.nvir, naux))
        for i0, i1 in block_ranges(ch.nocc, occ_block):
            rows = np.asarray(ovl[i0 * ch.nvir:i1 * ch.nvir], dtype=np.float64).reshape(i1 - i0, ch.nvir, naux)
            store.write_occ(i0, i1, backend.to_device(rows))
        stores.append(store)
    return stores, naux


def unrelaxed_density(backend, store, channel, occ_block, naux, scaling=(1.0, 1.0)):
    """Unrelaxed MP2 density of a closed-shell reference in the active space, fp64 (host):
    P_ij = -2 sum_kab t_ik^ab T_jk^ab, P_ab = 2 sum_ijc t_ij^ac T_ij^bc, T = (c_os + c_ss) t - c_ss t^T
    (MP2: scaling (c_os, c_ss) = (1, 1), T = 2 t_ij^ab - t_ij^ba; SCS-MP2: the density of
    c_os E_os + c_ss E_ss), from the same (ia|kb) as the energy, formed for all i against a block
    of k at a time (t2 is never stored). Returns (P_oo [nocc, nocc], P_vv [nvir, nvir])."""
    nocc, nvir = channel.nocc, channel.nvir
    b_occ = store.read_occ(0, nocc, naux)
    k_block = max(1, min(nocc, occ_block * occ_block // max(nocc, 1)))  # nocc x nk ~ one pair block
    p_oo, p_vv = np.zeros((nocc, nocc)), np.zeros((nvir, nvir))
    for k0, k1 in block_ranges(nocc, k_block):
        oo, vv = backend.density_block(b_occ, b_occ[k0:k1], channel.e_occ, channel.e_occ[k0:k1], channel.e_vir,
                                       scaling)
        p_oo += backend.to_host(oo)
        p_vv += backend.to_host(vv)
    return p_oo, p_vv


def natural_orbitals(rdm1_mo, mo_coeff):
    """Eigen-decomposition of an MO-basis 1-RDM: (occupations in descending order [nmo],
    natural orbitals as AO coefficients [nao, nmo])."""
    occupations, vectors = np.linalg.eigh(rdm1_mo)
    return occupations[::-1], mo_coeff @ vectors[:, ::-1]


def singles_energy(channels):
    """ROHF-MBPT(2) singles: sum_s sum_ia |f_ia|^2 / (e_i - e_a) over active i, a, fp64 (Eh);
    0 for canonical references (f_ia = 0)."""
    return float(sum(np.sum(ch.f_ov ** 2 / (ch.e_occ_host[:, None] - ch.e_vir_host[None, :]))
                     for ch in channels if ch.f_ov is not None))


# ----------------------------------------------------------------------------- driver

@dataclass
class SpinChannel:
    """One spin channel's active orbitals: C_occ [nao, nocc], C_vir [nao, nvir] and e_occ,
    e_vir (Eh) on the device; the same energies on the host (fp64), and f_ov [nocc, nvir], the
    occupied-virtual Fock block of non-canonical (ROHF semicanonical) orbitals, or None."""

    name: str  # '' (restricted), 'alpha' or 'beta'
    c_occ: object
    c_vir: object
    e_occ: object
    e_vir: object
    e_occ_host: np.ndarray
    e_vir_host: np.ndarray
    f_ov: np.ndarray | None
    nfrozen: int

    @property
    def nocc(self):
        return self.e_occ_host.size

    @property
    def nvir(self):
        return self.e_vir_host.size


@dataclass
class CorrelationEnergy:
    """DF-MP2 correlation energy (Eh) with its sizes, timings (s) and what ran. nocc, nvir and
    nfrozen are ints for a restricted reference, (alpha, beta) tuples for an unrestricted one."""

    e_corr_os: float
    e_corr_ss: float
    nocc: object
    nvir: object
    naux: int
    nao: int
    nfrozen: object
    metric: str
    plan: MemoryPlan
    timings: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    e_corr_singles: float = 0.0  # ROHF-MBPT(2) singles (0 for canonical references)
    # with_rdm1 (restricted): the unrelaxed MP2 density correction on the active orbitals, fp64:
    # (occ_index, vir_index, P_oo, P_vv) with indices into the reference's MOs
    rdm1_active: tuple | None = None
    # with_t2: t_ij^ab [nocc, nocc, nvir, nvir] of the active orbitals (restricted), or for an
    # unrestricted reference (t2aa, t2ab, t2bb), same-spin ones antisymmetrised (PySCF's t2)
    t2: object = None
    singles_included: bool = True  # include_singles: False leaves the ROHF singles out (e_corr_singles 0)
    notes: list = field(default_factory=list)  # announcements (e.g. t2 not kept for lack of memory)
    io: dict = field(default_factory=dict)  # scratch traffic: bytes_written, bytes_read, tensor_bytes
    checkpoint: dict | None = None  # --checkpoint: its directory and what this run reused from it
    distributed: dict | None = None  # several ranks: their number, backend and per-rank summaries (rank 0)

    @property
    def e_corr(self) -> float:
        return self.e_corr_os + self.e_corr_ss + self.e_corr_singles

    @property
    def e_scs(self) -> float:
        """Grimme's spin-component-scaled correlation energy: 6/5 E_os + 1/3 E_ss (+ the ROHF
        singles, as Psi4 counts them)."""
        return 1.2 * self.e_corr_os + self.e_corr_ss / 3.0 + self.e_corr_singles


def active_spaces(refs, frozen) -> list:
    """[(occ_index, vir_index, nfrozen)] of each spin channel of `refs` (`spin_channels`) with
    `frozen` as `active_orbitals` and `frozen_per_spin` take it."""
    names = [""] if len(refs) == 1 else ["alpha", "beta"]
    return [active_orbitals(occ, f, name) for (_, _, occ), f, name
            in zip(refs, frozen_per_spin(frozen, len(refs)), names)]


def device_channels(backend, refs, selected, fock_mo=None) -> list:
    """The SpinChannel of each (C, e, occ) in `refs` with its active orbitals `selected`
    [(occ_index, vir_index, nfrozen)], on the device. The transform and the orbital energies
    stay fp64 in every precision: rounding (mn|P) to fp32 before the transform costs ~2e-6 Eh
    on benzene/cc-pVTZ (see README, precision)."""
    names = [""] if len(refs) == 1 else ["alpha", "beta"]
    channels = []
    for s, ((coeff, energy, _), (occ_index, vir_index, nfrozen)) in enumerate(zip(refs, selected)):
        f_ov = None if fock_mo is None else np.asarray(fock_mo[s], dtype=np.float64)[np.ix_(occ_index, vir_index)]
        channels.append(SpinChannel(
            name=names[s],
            c_occ=backend.to_device(coeff[:, occ_index], fp64=True),
            c_vir=backend.to_device(coeff[:, vir_index], fp64=True),
            e_occ=backend.to_device(energy[occ_index], fp64=True),
            e_vir=backend.to_device(energy[vir_index], fp64=True),
            e_occ_host=energy[occ_index], e_vir_host=energy[vir_index], f_ov=f_ov, nfrozen=nfrozen))
    return channels


def three_center_mo(backend, integrals, mo_coeff, mo_energy, mo_occ, settings: Settings | None = None,
                    out=None, **changes) -> list:
    """Steps 1-3 only: B_ia^Q = sum_P (ia|P) [L^-T]_PQ of each spin channel's active orbitals
    (settings.frozen) in PySCF's ovL layout [nocc * nvir, naux_kept]. Arguments as
    `dfmp2_energy`. Without `out`: host arrays, held in memory with (ia|P) (MemoryBudgetError if
    the budget cannot hold both). out(s, shape): where channel s's B goes (e.g. an HDF5
    dataset), written in occupied blocks; (ia|P) then lives where the budget puts it (memory or
    scratch). Returns the arrays (or what `out` gave)."""
    settings = settings_from(settings, **changes)
    refs = spin_channels(mo_coeff, mo_energy, mo_occ)
    selected = active_spaces(refs, settings.frozen)
    spaces = [(o.size, v.size) for o, v, _ in selected]
    # in memory, B is returned beside (ia|P): the plan holds the tensor twice
    plan = plan_for(backend, integrals, spaces if out is not None else spaces * 2, settings.max_memory)
    if out is None and plan.storage == "disk":
        raise MemoryBudgetError(f"(ia|P) and B do not both fit in the memory budget ({plan.budget / MB:.4g} MB) to be "
                                "returned in memory: give more memory, or write them to a file (ovL_to_save)")
    backend.prepare(plan)
    channels = device_channels(backend, refs, selected)
    factor = metric_cholesky(backend, integrals.metric())  # 1. J = L L^T
    shapes = [(ch.nocc, ch.nvir, integrals.naux) for ch in channels]
    stores = [MemoryStore(backend, shape) if plan.storage == "memory" else DiskStore(backend, shape, settings.scratch)
              for shape in shapes]
    try:
        transform_aux_blocks(backend, integrals, integrals.aux_blocks(plan.aux_block), channels, stores,
                             lambda name, clock: clock, 0.0, settings.progress)  # 2. (ia|P)
        results = []
        for s, (ch, store) in enumerate(zip(channels, stores)):  # 3. B = (ia|P) L^-T
            shape = (ch.nocc * ch.nvir, factor.nkept)
            b = np.empty(shape) if out is None else out(s, shape)
            for i0, i1 in block_ranges(ch.nocc, plan.occ_block):
                block = whiten_three_center(backend, factor, store.read_occ(i0, i1))
                b[i0 * ch.nvir:i1 * ch.nvir] = backend.to_host(block).reshape(-1, factor.nkept)
                del block
                release_freed_memory()
            results.append(b)
    finally:
        for store in stores:
            store.close()
    return results


def plan_keeping_t2(backend, integrals, selected, max_memory, plan, on_disk, insist, notes) -> MemoryPlan:
    """The memory plan with t2 (fp64 on the host, PySCF's layout) held beside the run's arrays,
    its blocks sized for what is left. Where t2 does not fit (or would push (ia|P) out of core),
    `plan` unchanged and a note in `notes`; MemoryBudgetError instead when t2 is insisted on."""
    spaces = [(o.size, v.size) for o, v, _ in selected]
    pairs = [o * v for o, v in spaces]
    t2_bytes = 8 * (sum(n * n for n in pairs) + (2 * pairs[0] * pairs[1] if len(pairs) == 2 else 0))
    try:
        kept = plan_for(backend, integrals, spaces, max_memory, on_disk=on_disk, growth=t2_bytes)
    except MemoryBudgetError:
        kept = None
    if kept is not None and (insist or kept.storage == plan.storage):
        return kept
    store = sum(pairs) * integrals.naux * backend.itemsize if plan.storage == "memory" else 0
    message = (f"t2 needs {t2_bytes / MB:.4g} MB, more than the memory budget leaves ({max(0, plan.budget - plan.minimum - store) / MB:.4g} "
               f"MB of {plan.budget / MB:.4g} MB after the process, {'(ia|P) and ' if store else ''}the energy's "
               "smallest blocks)")
    if insist:
        raise MemoryBudgetError(f"with_t2: {message}; run without it (energies and densities need no t2)")
    notes.append(f"t2 not kept: {message}; the energy is complete (give more memory to keep t2)")
    return plan


def dfmp2_energy(backend, integrals, mo_coeff, mo_energy, mo_occ, settings: Settings | None = None,
                 fock_mo=None, **changes) -> CorrelationEnergy:
    """DF-MP2 correlation energy of a restricted or unrestricted reference.

    integrals: provider with nao, naux, metric(), aux_blocks(limit), block(p0, p1), largest_shell().
    Restricted: mo_coeff [nao, nmo], mo_energy [nmo] (Eh), mo_occ [nmo] (0/2). Unrestricted:
    each of them per spin ([2, nao, nmo], [2, nmo], [2, nmo], occupations 0/1). fock_mo: per
    spin, the Fock matrix in the (semicanonical) MO basis [nmo, nmo] of a non-canonical
    reference (ROHF), for the singles; None for canonical orbitals.
    settings (keyword `changes` on top): frozen (as in `active_orbitals`; unrestricted:
    `frozen_per_spin`), max_memory (MB; default 80% of available RAM, or of free GPU memory),
    scratch, checkpoint (a directory keeping B and the finished pair tasks: a run with the same
    inputs resumes from them), progress, with_rdm1 (restricted: also the unrelaxed MP2 density,
    `unrelaxed_density`; rdm1_scaling), with_t2 (True, False or IF_ROOM), include_singles,
    force_outcore, three_center (B given: steps 1-3 skipped).
    """
    settings = settings_from(settings, **changes)
    frozen, max_memory, progress = settings.frozen, settings.max_memory, settings.progress
    with_rdm1, with_t2, given = settings.with_rdm1, settings.with_t2, settings.three_center
    refs = spin_channels(mo_coeff, mo_energy, mo_occ)
    if with_rdm1 and len(refs) != 1:
        raise InputError("MP2 densities of unrestricted (UHF/ROHF) references are not implemented yet")
    selected = active_spaces(refs, frozen)
    nao, naux = integrals.nao, integrals.naux
    team = settings.team if settings.team is not None and settings.team.size > 1 else None
    if team is not None and (with_rdm1 or with_t2 is True or given is not None):
        raise InputError("with several ranks, densities, t2 and given (ia|P) are not available yet: run them "
                         "in one process")
    if given is not None and settings.checkpoint is not None:
        raise InputError("given (ia|P) integrals (eris=) and a checkpoint do not go together: the checkpoint "
                         "keeps its own")
    on_disk = team is None and given is None and (settings.checkpoint is not None or settings.force_outcore)
    plan = plan_for(backend, integrals, [(o.size, v.size) for o, v, _ in selected], max_memory,
                    on_disk=on_disk, ranks=team.size if team is not None else 1)  # ranks keep B in memory
    if team is not None:  # every rank uses rank 0's block sizes (their budgets and baselines differ)
        plan = team.broadcast_object(plan)
    if with_rdm1 and settings.force_outcore:
        raise InputError("force_outcore keeps (ia|P) on disk, and the MP2 density needs it in memory (out-of-core "
                         "densities are not implemented): leave force_outcore off for densities")
    if with_rdm1 and plan.storage == "disk":  # unrelaxed_density holds all of B at once
        raise MemoryBudgetError(
            f"the MP2 density needs (ia|P) in memory, which the budget ({plan.budget / MB:.4g} MB, --max-memory) "
            f"does not hold{' with --checkpoint' if settings.checkpoint else ''}: give more memory (out-of-core "
            "densities are not implemented)")
    if given is not None and plan.storage == "disk":
        raise MemoryBudgetError(f"given (ia|P) integrals (eris=) are read into memory, which the budget "
                                f"({plan.budget / MB:.4g} MB) does not hold: give more memory, or let dfmp2 make "
                                "them (out of core)")
    notes = []
    if with_t2 and team is not None:
        notes.append("t2 not kept: with several ranks t2 is not available yet (run in one process to keep it)")
    elif with_t2 == IF_ROOM and settings.checkpoint is not None:
        notes.append("t2 not kept: a checkpoint's finished pair blocks are reused, and t2 would need every block "
                     "formed again (with_t2=True does that)")
    elif with_t2 == IF_ROOM and not backend.forms_amplitudes:
        notes.append(f"t2 not kept: the {backend.device_name} kernels do not form the amplitudes (the energy is "
                     "complete; device cpu or cuda keeps t2)")
    elif with_t2:
        plan = plan_keeping_t2(backend, integrals, selected, max_memory, plan, on_disk, with_t2 is True, notes)
    with_t2 = bool(with_t2) and team is None and not notes
    backend.prepare(plan)
    timings = {}

    def lap(name, start):
        backend.synchronize()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        return time.perf_counter()

    clock = time.perf_counter()
    metric = None if given is not None else integrals.metric()  # (given B needs no metric)
    clock = lap("integrals", clock)

    channels = device_channels(backend, refs, selected, fock_mo)

    checkpoint = None
    try:
        if settings.checkpoint is not None:  # this run's identity; B and finished pair tasks if held
            identity = _pipeline_identity(backend, refs, selected, fock_mo, metric, nao)
            if team is None:
                checkpoint = open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files)
                checkpoint.claim("pipeline", identity)
            else:  # rank 0 reads, decides and writes for every rank, which must all see its directory
                opened = []
                try:
                    stamp = team.on_root(lambda: shared_checkpoint(opened, settings, identity))
                finally:
                    checkpoint = opened[0] if opened else Checkpoint(settings.checkpoint)
                team.agree(checkpoint.sees_stamp(stamp), f"--checkpoint {settings.checkpoint}: not every rank "
                           "sees the directory rank 0 writes (several ranks need one directory on a shared file "
                           "system)")
        if team is not None:  # steps 1-4 over the ranks (dfmp2.distributed)
            e_os, e_ss, nkept, metric_label, per_rank, reused = energy_over_ranks(
                backend, integrals, metric, channels, plan, team, progress, lap, checkpoint)
            result = _correlation_energy(backend, channels, e_os, e_ss, naux, nao, metric_label, plan, timings,
                                         None, None, {"bytes_written": 0, "bytes_read": 0, "tensor_bytes": sum(
                                             ch.nocc * ch.nvir * naux for ch in channels) * backend.itemsize},
                                         None if checkpoint is None else {"directory": checkpoint.directory, **reused,
                                                                          "notes": list(checkpoint.notes)},
                                         {"ranks": team.size, "backend": team.backend, "per_rank": per_rank},
                                         notes, settings.include_singles)
            if per_rank:  # rank 0: the kernels of the whole job
                result.kernels = dict(sum((Counter(r["kernels"]) for r in per_rank), Counter()))
            return result
        stores, journal, load_slab = [], None, None
        fused_seconds = [0.0]  # whitening done inside the pair stage (out of core)
        reused = {"B": False, "pair_tasks": 0}
        try:
            if checkpoint is not None:  # scratch a killed run of this checkpoint left behind goes first
                remove_scratch(settings.scratch, f"dfmp2-{checkpoint.tag}-")
            b_files = [None] * len(channels)  # where B is kept: a checkpoint's files
            if given is not None:  # B made earlier (ao2mo, or PySCF's ovL)
                stores, nkept = given_three_center(backend, given, channels, plan.occ_block)
                metric_label = "given"
            elif checkpoint is not None:
                b_files = [checkpoint.b_name(ch.name) + ".h5" for ch in channels]
                stores = held_b(backend, checkpoint, b_files, [(ch.nocc, ch.nvir, naux) for ch in channels])
                if not stores:  # none, another layout's (ranks), a killed run's or a damaged one
                    checkpoint.reset("B")
                    checkpoint.register("B", *b_files)
            if stores and given is None:
                nkept, metric_label = checkpoint.manifest["B"]["nkept"], checkpoint.manifest["B"]["metric"]
                reused["B"] = True
            elif given is None:
                factor = metric_cholesky(backend, metric)  # 1. J = L L^T
                clock = lap("metric", clock)
                prefix = "dfmp2-" if checkpoint is None else f"dfmp2-{checkpoint.tag}-"
                for ch, kept in zip(channels, b_files):
                    shape = (ch.nocc, ch.nvir, naux)
                    stores.append(MemoryStore(backend, shape) if plan.storage == "memory" else DiskStore(
                        backend, shape, settings.scratch, kept and checkpoint.path(kept), prefix))
                clock = transform_aux_blocks(backend, integrals, integrals.aux_blocks(plan.aux_block), channels,
                                             stores, lap, clock, progress)  # 2. (ia|P), each spin

                # out of core (no checkpoint) each I slab is whitened when the pair stage reaches it,
                # so that (ia|P) is read once in all: step 3 then runs inside step 4 (load_slab)
                fused = plan.storage == "disk" and checkpoint is None
                for ch, store in zip(channels, [] if fused else stores):  # 3. B = (ia|P) L^-T, each spin
                    occ_blocks = block_ranges(ch.nocc, plan.occ_block)
                    for n, (i0, i1) in enumerate(occ_blocks):
                        store.write_occ(i0, i1, whiten_three_center(backend, factor, store.read_occ(i0, i1)))
                        release_freed_memory()
                        if progress:
                            progress("whitening", n + 1, len(occ_blocks))
                clock = lap("whiten", clock)
                nkept, metric_label = factor.nkept, factor.describe()
                if fused:
                    def whitened_slab(s, i0, i1):  # 3. B = (ia|P) L^-T for the rows of one I slab
                        start = time.perf_counter()
                        if stores[s].whitened(i0, i1):
                            return stores[s].read_occ(i0, i1, nkept)
                        slab = backend.zeros((i1 - i0, channels[s].nvir, nkept))
                        for b0, b1 in block_ranges(i1 - i0, plan.occ_block):
                            block = whiten_three_center(backend, factor, stores[s].read_occ(i0 + b0, i0 + b1))
                            stores[s].write_occ(i0 + b0, i0 + b1, block)
                            backend.copy_into(slab[b0:b1], block)
                            del block
                            release_freed_memory()
                        fused_seconds[0] += time.perf_counter() - start
                        return slab
                    load_slab = whitened_slab
                if checkpoint is not None:  # each file's size and digest, then the section that vouches
                    for name in b_files:
                        checkpoint.vouch(name)
                    checkpoint.claim("B", {"nkept": nkept, "metric": metric_label})

            # 4. pair energies, task by task (finished tasks of an interrupted run are kept)
            tasks = pair_tasks([ch.nocc for ch in channels], plan.occ_block)
            sums = np.zeros((len(tasks), 2))
            finished = set()
            if checkpoint is not None:
                checkpoint.claim_pairs({"occ_block": plan.occ_block, "ntasks": len(tasks)}, [checkpoint.journal_name()])
                journal = checkpoint.journal(len(tasks))
                done, damaged = journal.restore(sums)
                if damaged:
                    checkpoint.damaged(checkpoint.journal_name(), f"had {damaged} damaged record(s)",
                                       "those pair blocks were")
                finished = set(done)
                reused["pair_tasks"] = len(finished)

            t2, t2_blocks = t2_arrays(channels) if with_t2 else (None, None)
            if with_t2:  # every task forms its amplitudes: none is taken from the journal
                finished, reused["pair_tasks"] = set(), 0

            def record(k, e_os, e_ss):
                sums[k] = (e_os, e_ss)
                if journal is not None:
                    journal.record(k, e_os, e_ss)
                finished.add(k)
                if progress:
                    progress("pair energies", len(finished), len(tasks))

            pair_energies(backend, stores, channels, tasks, [k for k in range(len(tasks)) if k not in finished],
                          nkept, plan.slab_rows, record, load_slab, t2_blocks)
            e_os, e_ss = combine_pair_sums(tasks, sums, len(channels))
            clock = lap("pair_energies", clock)
            timings["pair_energies"] -= fused_seconds[0]
            timings["whiten"] = timings.get("whiten", 0.0) + fused_seconds[0]
            rdm1 = None
            if with_rdm1:  # 5. unrelaxed density, same (ia|kb)
                rdm1 = (selected[0][0], selected[0][1],
                        *unrelaxed_density(backend, stores[0], channels[0], plan.occ_block, nkept,
                                           settings.rdm1_scaling))
                clock = lap("density", clock)
        finally:
            io = {"bytes_written": sum(st.io()["bytes_written"] for st in stores),
                  "bytes_read": sum(st.io()["bytes_read"] for st in stores),
                  "tensor_bytes": sum(ch.nocc * ch.nvir * naux for ch in channels) * backend.itemsize}
            if journal is not None:
                journal.close()
            for store in stores:
                store.close()
        return _correlation_energy(backend, channels, e_os, e_ss, naux, nao, metric_label, plan, timings, rdm1, t2, io,
                                   None if checkpoint is None else {
                                       "directory": checkpoint.directory, "reused_B": reused["B"],
                                       "reused_pair_tasks": reused["pair_tasks"], "pair_tasks": len(tasks),
                                       "notes": list(checkpoint.notes)}, None, notes, settings.include_singles)
    finally:
        if checkpoint is not None:
            checkpoint.close()


def _correlation_energy(backend, channels, e_os, e_ss, naux, nao, metric_label, plan, timings, rdm1, t2, io,
                        checkpoint, distributed=None, notes=(), include_singles=True) -> CorrelationEnergy:
    """The result record, with the ROHF singles added (include_singles: else 0, as PySCF's
    include_singles=False), the run's notes, and every energy checked to be finite."""
    e_singles = 0.0
    if include_singles and any(ch.f_ov is not None for ch in channels):
        e_singles = singles_energy(channels)
        backend.calls["host:singles"] += 1  # fp64 on the host: nocc x nvir per spin

    for name, value in (("opposite-spin", e_os), ("same-spin", e_ss), ("singles", e_singles)):
        if not np.isfinite(value):
            raise ComputationError(f"the {name} MP2 energy is not finite ({value})")

    def per_spin(values):
        return values[0] if len(values) == 1 else tuple(values)

    return CorrelationEnergy(
        e_corr_os=e_os, e_corr_ss=e_ss, e_corr_singles=e_singles,
        nocc=per_spin([ch.nocc for ch in channels]), nvir=per_spin([ch.nvir for ch in channels]),
        naux=naux, nao=nao, nfrozen=per_spin([ch.nfrozen for ch in channels]),
        metric=metric_label, plan=plan, timings=timings, kernels=dict(backend.calls),
        rdm1_active=rdm1, t2=t2, io=io, checkpoint=checkpoint, distributed=distributed,
        singles_included=include_singles, notes=list(notes))


def transform_aux_blocks(backend, integrals, aux_blocks, channels, stores, lap, clock, progress, first=0):
    """Step 2 for the auxiliary blocks [(p0, p1)]: (ia|P) = C_mi C_na (mn|P) of each spin channel,
    written to stores[s] at columns p - first. Returns the clock after the last lap."""
    for n, (p0, p1) in enumerate(aux_blocks):
        ao_block = integrals.block(p0, p1)
        clock = lap("integrals", clock)
        ao_block = backend.to_device(ao_block, fp64=True)
        for ch, store in zip(channels, stores):
            store.write_aux(p0 - first, p1 - first, transform_to_mo(backend, ao_block, ch.c_occ, ch.c_vir))
        del ao_block
        release_freed_memory()
        clock = lap("transform", clock)
        if progress:
            progress("AO->MO transform", n + 1, len(aux_blocks))
    return clock


def energy_over_ranks(backend, integrals, metric, channels, plan, team, progress, lap, checkpoint=None):
    """Steps 1-4 split over the ranks of `team` (dfmp2.distributed's module docstring): each
    rank transforms a share of the auxiliary blocks, the all-to-all gives it B rows of the
    occupied blocks it owns, it whitens them and computes the pair tasks of its blocks I with
    every B_J passing by on the ring; the per-task sums are all-reduced (fp64) and added in the
    canonical order. With a checkpoint each rank keeps its B blocks and a journal of its
    finished tasks there (dfmp2.checkpoint); a rerun with as many ranks and the same blocks
    reuses them. Returns (E_os, E_ss, nkept, metric label, per-rank summaries on rank 0,
    {"reused_B", "reused_pair_tasks", "pair_tasks"})."""
    from .distributed import Staging, aux_shares, block_owners, pass_blocks, rows_from_columns

    clock = time.perf_counter()
    naux, size, rank = metric.shape[0], team.size, team.rank
    # blocks small enough to give every rank a share: >= 1 auxiliary block and ~4 occupied blocks
    shares = aux_shares(integrals.aux_blocks(min(plan.aux_block, -(-naux // size))), size)
    backend.prepare(replace(plan, aux_block=max(p1 - p0 for share in shares for p0, p1 in share)))
    occ_block = min(plan.occ_block, max(1, -(-max(ch.nocc for ch in channels) // (4 * size))))
    column_ranges = [(share[0][0], share[-1][1]) if share else (0, 0) for share in shares]
    c0, c1 = column_ranges[rank]
    blocks = [block_ranges(ch.nocc, occ_block) for ch in channels]
    owners = block_owners([len(b) for b in blocks], size)
    layout = {"ranks": size, "occ_block": occ_block}  # what a checkpoint's B and journals depend on
    staging = Staging(backend, team)  # gloo moves host memory: device blocks go through the host

    held = held_rows(team, checkpoint, layout, blocks, owners, channels) if checkpoint is not None else None
    reused_b = held is not None
    if reused_b:  # B of this layout, kept by an earlier run (every rank's)
        rows, nkept, metric_label = held
        rows = [{b: backend.to_device(block) for b, block in channel_rows.items()} for channel_rows in rows]
    else:
        factor = metric_cholesky(backend, metric)  # 1. J = L L^T, on every rank
        clock = lap("metric", clock)
        columns = [MemoryStore(backend, (ch.nocc, ch.nvir, c1 - c0)) for ch in channels]  # this rank's P
        clock = transform_aux_blocks(backend, integrals, shares[rank], channels, columns, lap, clock, progress,
                                     first=c0)  # 2. (ia|P) = C_mi C_na (mn|P)
        rows = []
        for s, ch in enumerate(channels):  # the all-to-all, then 3. B = (ia|P) L^-T on my rows
            mine = rows_from_columns(team, columns[s].data, blocks[s], owners[s], column_ranges, naux, staging)
            columns[s].close()
            rows.append({b: whiten_three_center(backend, factor, block) for b, block in mine.items()})
            release_freed_memory()
        nkept, metric_label = factor.nkept, factor.describe()
        if checkpoint is not None:  # rank 0 lists every rank's files, each rank writes its own, then
            # rank 0 records their digests and the section that vouches for them
            names = [checkpoint.b_name(ch.name, r) for r in range(size) for ch in channels]
            team.on_root(lambda: checkpoint.register("B", *[n for name in names
                                                            for n in (f"{name}.h5", f".{name}.h5.partial")]))
            digests = {f"{checkpoint.b_name(ch.name, rank)}.h5": checkpoint.save_blocks(
                checkpoint.b_name(ch.name, rank), rows[s], backend.to_host) for s, ch in enumerate(channels)}
            every = team.gather_objects(digests)

            def vouch_for_every_rank():
                for rank_digests in every:
                    for name, digest in rank_digests.items():
                        checkpoint.vouch(name, digest)
                checkpoint.claim("B", {"nkept": nkept, "metric": metric_label, **layout})
            team.on_root(vouch_for_every_rank)
        clock = lap("whiten", clock)

    tasks = pair_tasks([ch.nocc for ch in channels], occ_block)
    sums = np.zeros((len(tasks), 2))
    mine = [k for k, task in enumerate(tasks) if owners[task.s][task.i0 // occ_block] == rank]
    finished, journal = set(), None
    if checkpoint is not None:  # rank 0 makes the pairs section this task list's (journals of others go)
        team.on_root(lambda: checkpoint.claim_pairs({"occ_block": occ_block, "ntasks": len(tasks), **layout},
                                                    [checkpoint.journal_name(r) for r in range(size)]))
        journal = checkpoint.journal(len(tasks), rank)
        journaled = np.zeros_like(sums)
        done, damaged = journal.restore(journaled)
        every = team.gather_objects(damaged)
        if team.is_root:
            for r, count in enumerate(every):
                if count:
                    checkpoint.damaged(checkpoint.journal_name(r), f"had {count} damaged record(s)",
                                       "those pair blocks were")
        finished = set(done) & set(mine)  # each task's sums from its owner only
        kept = sorted(finished)
        sums[kept] = journaled[kept]
    reused_tasks = len(finished)
    b_dtype = backend.zeros((1,)).dtype
    start = time.perf_counter()
    try:
        for s, t in dict.fromkeys((task.s, task.t) for task in tasks):  # channel pairs, canonical order
            e_vir_j = None if s == t else channels[t].e_vir
            visiting = dict(rows[t])  # 4. B_J of rank (rank - k) at ring step k
            for k in range(size):
                source = (rank - k) % size
                if k:
                    arriving = [b for b, owner in enumerate(owners[t]) if owner == source]
                    visiting = pass_blocks(team, visiting, arriving, lambda b: (
                        blocks[t][b][1] - blocks[t][b][0], channels[t].nvir, nkept),
                        b_dtype, channels[t].e_vir.device, staging)
                for n in mine:
                    task = tasks[n]
                    j = task.j0 // occ_block
                    if (task.s, task.t) != (s, t) or owners[t][j] != source or n in finished:
                        continue
                    b_i = rows[s][task.i0 // occ_block]
                    sums[n] = backend.pair_energy(b_i, b_i if task.diagonal else visiting[j],
                                                  channels[s].e_occ[task.i0:task.i1],
                                                  channels[t].e_occ[task.j0:task.j1], channels[s].e_vir, e_vir_j)
                    if journal is not None:
                        journal.record(n, *sums[n])
                    finished.add(n)
                    if progress:
                        progress("pair energies", len(finished), len(mine))
            visiting = None
    finally:
        if journal is not None:
            journal.close()
    pair_seconds = time.perf_counter() - start
    sums = team.all_reduce_sum(sums)  # every task's sums, each from exactly one rank
    reused = {"reused_B": reused_b, "pair_tasks": len(tasks),
              "reused_pair_tasks": int(team.all_reduce_sum(np.array([reused_tasks]))[0])}
    lap("pair_energies", clock)
    summary = {"rank": rank, "pair_tasks": len(mine), "occ_block": occ_block, "pair_seconds": pair_seconds,
               "occupied_blocks": [sum(1 for o in owner if o == rank) for owner in owners],
               "aux_functions": c1 - c0, "bytes_sent": team.bytes_sent, "bytes_received": team.bytes_received,
               "staged_through_host": staging.staged, "neuron_cores": team.neuron_cores,
               "peak_rss_mb": peak_resident_bytes() / MB, "kernels": dict(backend.calls)}
    per_rank = team.gather_objects(summary)
    e_os, e_ss = combine_pair_sums(tasks, sums, len(channels))
    return e_os, e_ss, nkept, metric_label, per_rank, reused


def shared_checkpoint(opened, settings, identity) -> str:
    """Rank 0: open the checkpoint (appended to `opened`), claim its pipeline section
    (InputError if it is another run's) and stamp it; returns the stamp every rank must then
    read."""
    opened.append(open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files))
    opened[0].claim("pipeline", identity)
    return opened[0].stamp()


def held_b(backend, checkpoint, names, shapes) -> list:
    """The stores of the complete B files `names` (shapes [nocc, nvir, naux]) of one process
    that the checkpoint's manifest vouches for (size and sha256 checked), or [] if there are
    none or any is not usable (a damaged or missing one is announced in checkpoint.notes)."""
    if "ranks" in checkpoint.manifest.get("B", {"ranks": None}):  # none, or several ranks' blocks
        return []
    reasons = [checkpoint.check(name) for name in names]
    stores = [DiskStore.reopen(backend, checkpoint.path(name), shape) if reason is None else None
              for name, shape, reason in zip(names, shapes, reasons)]
    if all(store is not None for store in stores):
        return stores
    for name, store, reason in zip(names, stores, reasons):
        if store is None:
            checkpoint.damaged(name, reason or "unreadable", "B (transform and whitening) was")
        else:
            store.close()
    return []


def held_rows(team, checkpoint, layout, blocks, owners, channels):
    """This rank's whitened blocks as an earlier run of the same layout kept them in the
    checkpoint (each file checked against rank 0's manifest record: size and sha256):
    ([{b: host array} per channel], nkept, metric label), or None on every rank unless every
    rank holds all of its blocks (then rank 0 resets the B section, and notes a damaged file)."""
    held, files = team.on_root(lambda: (checkpoint.manifest.get("B"), {
        name: entry for name, entry in checkpoint.manifest["files"].items() if entry.get("section") == "B"}))
    if held is not None and all(held.get(key) == value for key, value in layout.items()):
        loaded = [(name, *checkpoint.load_blocks(name, {
            b: (i1 - i0, ch.nvir, held["nkept"]) for b, (i0, i1) in enumerate(blocks[s])
            if owners[s][b] == team.rank}, files.get(name + ".h5")))
            for s, ch in enumerate(channels) for name in [checkpoint.b_name(ch.name, team.rank)]]
        failures = [(name + ".h5", reason) for name, rows, reason in loaded if rows is None]
        if not team.all_reduce_sum(np.array([float(bool(failures))]))[0]:
            return [rows for _, rows, _ in loaded], held["nkept"], held["metric"]
        every = team.gather_objects(failures)
        if team.is_root:
            for name, reason in (f for rank_failures in every for f in rank_failures):
                checkpoint.damaged(name, reason, "B (transform and whitening) was")
    team.on_root(lambda: checkpoint.reset("B"))
    return None


def _pipeline_identity(backend, refs, selected, fock_mo, metric, nao) -> dict:
    """What a checkpoint's B and pair sums belong to: the orbitals (hashed), the active spaces,
    the auxiliary metric (hashed), the backend's arithmetic and the dfmp2 version."""
    return {**version_identity(), "nao": nao, "naux": int(metric.shape[0]),
            "orbitals": array_digest(*[a for ref in refs for a in ref],
                                     *(fock_mo if fock_mo is not None else [None])),
            "active": array_digest(*[a for occ, vir, _ in selected for a in (occ, vir)]),
            "spaces": [[int(o.size), int(v.size)] for o, v, _ in selected],
            "metric": array_digest(np.asarray(metric)), "device": backend.device_name,
            "backend": backend.name, "precision": backend.precision, "transform": backend.transform,
            "nki_api": getattr(backend, "nki_api", None)}
