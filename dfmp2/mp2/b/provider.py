"""Where B comes from (steps 1-3 composed): made in this process, over the ranks of a team,
given by the caller, or found in the checkpoint; and steps 1-3 alone (`ovL_of_orbitals`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...run.checkpoint import NoCheckpoint
from ...run.context import context_from
from ...run.memory import plan_for
from .ranks import RankB, rows_from_columns
from ...run.ranks import Staging, aux_shares, block_owners
from ...run.settings import Settings, settings_from
from ...run.storage import MemoryStore, new_store
from ...util.blocks import block_ranges
from ...util.errors import InputError, MemoryBudgetError
from ...sparse.formats import ScreenedMNP
from ...util.system_memory import MB, release_freed_memory, released_after_each
from ..orbitals import active_spaces, device_channels, spin_channels
from ..run_state import CorrelationRun
from ..steps import factor_metric, transform_to_mo, whiten_iaP


class MetricFactorOnce:
    """Step 1, J = L L^T, made at most once per run (in the timer's "metric" step) and shared by whoever needs
    the factor: the whitening of B (steps 1-3) and the three-index density (step 5). metric [naux, naux] fp64
    (host), or None where B is given (no factor can be made then)."""

    def __init__(self, backend, metric, timer):
        self.backend, self.metric, self.timer, self._factor = backend, metric, timer, None

    @property
    def naux(self) -> int:
        return self.metric.shape[0]

    def __call__(self, out_of: str | None = None):
        """The factor (`linalg.MetricFactor`); out_of: the timer step this call runs inside."""
        if self._factor is None:
            with self.timer.step("metric", out_of=out_of):
                self._factor = factor_metric(self.backend, self.metric)  # 1. J = L L^T
        return self._factor


def b_provider(run):
    """Where B comes from and lives (`dfmp2.mp2.b.protocol`): given by the caller, over the ranks of
    the team, or made (or found in the checkpoint) in this process. run: the `CorrelationRun`
    (its metric_factor: step 1, shared with the densities)."""
    if run.given is not None:  # B made earlier (ao2mo, or PySCF's ovL)
        return given_b(run)
    if run.context.team is not None:
        return b_over_ranks(run)
    return local_b(run)


def make_iaP(run, aux_blocks, new_store_of, first=0):
    """Steps 1 and 2, the one place they are composed: (the metric's factor, stores[s] holding
    channel s's (ia|P) for the auxiliary functions of aux_blocks, at columns p - first).
    run: the `CorrelationRun` (its metric_factor: the run's `MetricFactorOnce`). new_store_of(channel):
    the store each channel's (ia|P) goes to (closed here on failure)."""
    factor = run.metric_factor()  # 1. J = L L^T
    stores = []
    try:
        for ch in run.channels:
            stores.append(new_store_of(ch))
        transform_aux_blocks(run, aux_blocks, stores, first=first)  # 2. (ia|P) = C_mi C_na (mn|P), each spin
    except BaseException:
        for store in stores:
            store.close()
        raise
    return factor, stores


def whiten_blocks(backend, factor, read_occ, occ_blocks, write, report=None):
    """Step 3 over occupied blocks [(i0, i1)]: B = (ia|P) L^-T of the rows read_occ(i0, i1)
    gives, handed to write(i0, i1, B) a block at a time (freed memory given back after each)."""
    for n, (i0, i1) in enumerate(occ_blocks):
        block = whiten_iaP(backend, factor, read_occ(i0, i1))
        write(i0, i1, block)
        del block
        release_freed_memory()
        if report is not None:
            report("whitening", n + 1, len(occ_blocks))


def local_b(run):
    """Steps 1-3 in this process (run: the `CorrelationRun`), B in memory or on disk as the plan
    says, or B the checkpoint holds. Out of core without a checkpoint, step 3 waits for step 4:
    each slab of (ia|P) is whitened when the pair stage reaches it (`LocalB`), so that it is read once."""
    backend, integrals, channels, plan, checkpoint, context = (run.backend, run.integrals, run.channels, run.plan,
                                                               run.checkpoint, run.context)
    timer, scratch = context.timer, run.settings.scratch
    shapes = [(ch.nocc, ch.nvir, integrals.naux) for ch in channels]
    held = checkpoint.held_b(backend, channels, shapes)
    if held:
        return LocalB(run, held, *checkpoint.held_b_label(), reused=True)
    factor, stores = make_iaP(
        run, integrals.aux_blocks(plan.aux_block), lambda ch: new_store(
            backend, (ch.nocc, ch.nvir, integrals.naux), plan.storage, scratch, checkpoint.b_path(ch),
            checkpoint.scratch_prefix, checkpoint.b_identity()))  # 1. and 2.
    provider = LocalB(run, stores, factor.nkept, factor.describe())
    try:
        if plan.storage == "disk" and not checkpoint.keeps_b:
            provider.factor = factor  # 3. inside step 4, slab by slab
        else:
            with timer.step("whiten"):  # 3. B = (ia|P) L^-T, each spin, in place
                for ch, store in zip(channels, stores):
                    whiten_blocks(backend, factor, store.read_occ, block_ranges(ch.nocc, plan.occ_block),
                                  store.write_occ, context.report)
            checkpoint.keep_b(channels, factor.nkept, factor.describe())
    except BaseException:
        provider.close()
        raise
    return provider


class LocalB:
    """The BProvider of one process (`dfmp2.mp2.b.protocol`): stores[s] (MemoryStore or
    DiskStore) hold channel s's B [nocc, nvir, nkept]. The pair stage reads B_I in slabs of
    plan.slab_rows occupied rows, once each, and streams the B_J blocks the slab's tasks need
    against it, read once per slab (a view when J lies inside the slab). With `factor` (out of
    core, no checkpoint) the stores still hold (ia|P) and each slab is whitened (step 3) when
    the pair stage reaches it, so that (ia|P) is read once in all; that time goes to the
    timer's "whiten", out of "pair_energies". run: the `CorrelationRun` (its backend, channels'
    nocc, plan's block sizes and timer)."""

    def __init__(self, run, stores, nkept=0, metric_label="", reused=False):
        self.backend, self.stores, self.nocc = run.backend, stores, [ch.nocc for ch in run.channels]
        self.occ_block, self.slab_rows = run.plan.occ_block, run.plan.slab_rows
        self.nkept, self.metric_label, self.timer, self.reused = nkept, metric_label, run.context.timer, reused
        self.layout = {"occ_block": run.plan.occ_block}
        self.factor = None

    def owned(self, tasks) -> list:
        return list(range(len(tasks)))

    def rows(self, s, i0, i1):
        return self.stores[s].read_occ(i0, i1, self.nkept)

    def _slab(self, s, i0, i1, inside="pair_energies"):
        """B rows [i0, i1) of channel s, whitened here first if the store holds (ia|P) there (that
        time the timer's "whiten", taken out of the step `inside`)."""
        store = self.stores[s]
        if self.factor is None or store.whitened(i0, i1):
            return store.read_occ(i0, i1, self.nkept)
        with self.timer.step("whiten", out_of=inside):
            slab = self.backend.zeros((i1 - i0, store.shape[1], self.nkept))

            def keep(b0, b1, block):  # in the store (read once) and in the slab the pair stage takes
                store.write_occ(i0 + b0, i0 + b1, block)
                self.backend.copy_into(slab[b0:b1], block)

            whiten_blocks(self.backend, self.factor, lambda b0, b1: store.read_occ(i0 + b0, i0 + b1),
                          block_ranges(i1 - i0, self.occ_block), keep)  # 3. B = (ia|P) L^-T
        return slab

    def pair_blocks(self, tasks, todo):
        """(k, task, B_I, B_J) of the tasks `todo`, by channel pair, I slab, then J block."""
        groups = {}
        for k in todo:
            groups.setdefault((tasks[k].s, tasks[k].t), []).append(k)
        for (s, t), members in groups.items():
            for si0, si1 in block_ranges(self.nocc[s], self.slab_rows):
                here = [k for k in members if si0 <= tasks[k].i0 < si1]
                if not here:
                    continue
                slab_i = self._slab(s, si0, si1)
                for j0, j1 in sorted({(tasks[k].j0, tasks[k].j1) for k in here}):
                    inside = s == t and j0 >= si0
                    b_j = slab_i[j0 - si0:j1 - si0] if inside else self.stores[t].read_occ(j0, j1, self.nkept)
                    for k in (k for k in here if tasks[k].j0 == j0):
                        task = tasks[k]
                        b_i = slab_i[task.i0 - si0:task.i1 - si0]
                        yield k, task, b_i, b_i if task.diagonal else b_j
                slab_i = b_i = b_j = None  # views keep a slab alive: drop them all before the next
                release_freed_memory()

    def held_blocks(self, s, occ_rows=None):
        """(i0, i1, B rows [i1 - i0, nvir, nkept]) of channel s, every row once: slabs of
        plan.slab_rows read (or whitened) once each, handed out as views of occ_rows (else the
        pair stage's occ_block) occupied orbitals."""
        for si0, si1 in block_ranges(self.nocc[s], self.slab_rows or self.nocc[s]):
            slab = self._slab(s, si0, si1, inside="laplace")
            for i0, i1 in block_ranges(si1 - si0, occ_rows or self.occ_block):
                yield si0 + i0, si0 + i1, slab[i0:i1]
            slab = None
            release_freed_memory()

    def sum_over_ranks(self, backend, tensor):
        return tensor

    def combine(self, sums):
        return sums

    def summary(self) -> dict:
        return {"io": {"bytes_written": sum(st.io()["bytes_written"] for st in self.stores),
                       "bytes_read": sum(st.io()["bytes_read"] for st in self.stores)},
                "distributed": None}

    def close(self):
        for store in self.stores:
            store.close()


def given_b(run) -> LocalB:
    """B given per channel (run.given of the `CorrelationRun`: [nocc * nvir, naux] arrays or HDF5
    datasets, PySCF's ovL layout; any whitening of the metric gives the same energies), read into
    memory in occupied blocks. InputError if a shape does not match the active orbitals."""
    backend, given, channels, plan = run.backend, run.given, run.channels, run.plan

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
        for i0, i1 in block_ranges(ch.nocc, plan.occ_block):
            rows = np.asarray(ovl[i0 * ch.nvir:i1 * ch.nvir], dtype=np.float64).reshape(i1 - i0, ch.nvir, naux)
            store.write_occ(i0, i1, backend.to_device(rows))
        stores.append(store)
    return LocalB(run, stores, naux, "given")


def b_over_ranks(run):
    """Steps 1-3 split over the ranks of run.context.team (run: the `CorrelationRun`): every rank
    factors the metric, transforms its share of the auxiliary blocks, receives its occupied blocks
    with every P (the all-to-all, a block at a time) and whitens them; or takes them from the
    checkpoint of an earlier run of the same layout. B and the transform's columns in memory or, as
    the plan says, in scratch files (under settings.scratch). Returns the RankB holding this rank's blocks."""
    backend, integrals, channels, plan, checkpoint, context = (run.backend, run.integrals, run.channels, run.plan,
                                                               run.checkpoint, run.context)
    team, scratch = context.team, run.settings.scratch
    naux, size, rank = run.metric_factor.naux, team.size, team.rank
    # blocks small enough to give every rank a share: >= 1 auxiliary block and ~4 occupied blocks
    shares = aux_shares(integrals.aux_blocks(min(plan.aux_block, -(-naux // size))), size)
    backend.prepare(replace(plan, aux_block=max(p1 - p0 for share in shares for p0, p1 in share)))
    occ_block = min(plan.occ_block, max(1, -(-max(ch.nocc for ch in channels) // (4 * size))))
    column_ranges = [(share[0][0], share[-1][1]) if share else (0, 0) for share in shares]
    blocks = [block_ranges(ch.nocc, occ_block) for ch in channels]
    owners = block_owners([len(b) for b in blocks], size)
    provider = RankB(run, blocks, owners, occ_block, Staging(backend, team), shares)
    held = checkpoint.held_rows(provider.layout, blocks, owners, channels) if checkpoint.keeps_b else None
    if held is not None:  # B of this layout, kept by an earlier run (every rank's)
        rows, provider.nkept, provider.metric_label = held
        provider.rows = []
        for s, channel_rows in enumerate(rows):
            provider.rows.append(provider.new_blocks(s))
            for b, block in channel_rows.items():
                provider.rows[s][b] = backend.to_device(block)
        provider.reused = True
        return provider
    c0, c1 = column_ranges[rank]  # 1. on every rank; 2. for this rank's P
    factor, columns = make_iaP(
        run, shares[rank], lambda ch: new_store(
            backend, (ch.nocc, ch.nvir, c1 - c0), plan.storage if c1 > c0 else "memory", scratch), first=c0)
    try:
        with context.timer.step("whiten"):
            provider.rows = []
            dtype = backend.zeros((1,)).dtype
            for s, ch in enumerate(channels):  # the all-to-all, then 3. B = (ia|P) L^-T on my rows
                provider.rows.append(provider.new_blocks(s))
                for b, block in rows_from_columns(team, columns[s], blocks[s], owners[s], column_ranges, naux,
                                                  provider.staging, dtype, ch.e_vir.device, ch.nvir):
                    if b is not None:
                        provider.rows[s][b] = whiten_iaP(backend, factor, block)
                    del block
                    release_freed_memory()
                provider.add_io(columns[s].io())
                columns[s].close()
            provider.nkept, provider.metric_label = factor.nkept, factor.describe()
            if checkpoint.keeps_b:
                checkpoint.keep_rows(channels, provider.rows, provider.nkept, provider.metric_label, provider.layout,
                                     backend.to_host)
    except BaseException:
        for store in columns:
            store.close()
        provider.close()
        raise
    return provider


def ovL_of_orbitals(backend, integrals, mo_coeff, mo_energy, mo_occ, settings: Settings | None = None,
                    out=None, context=None, **changes) -> list:
    """Steps 1-3 only: B_ia^Q = sum_P (ia|P) [L^-T]_PQ of each spin channel's active orbitals
    (settings.frozen) in PySCF's ovL layout [nocc * nvir, naux_kept]. Arguments as
    `dfmp2_energy`. Without `out`: host arrays, held in memory with (ia|P) (MemoryBudgetError if
    the budget cannot hold both). out(s, shape): where channel s's B goes (e.g. an HDF5
    dataset), written in occupied blocks; (ia|P) then lives where the budget puts it (memory or
    scratch). Returns the arrays (or what `out` gave)."""
    settings, context = settings_from(settings, **changes), context_from(context)
    refs = spin_channels(mo_coeff, mo_energy, mo_occ)
    selected = active_spaces(refs, settings.frozen)
    spaces = [(o.size, v.size) for o, v, _ in selected]
    # in memory, B is returned beside (ia|P): the plan holds the tensor twice
    plan = plan_for(backend, integrals, spaces if out is not None else spaces * 2, settings.max_memory)
    if out is None and plan.storage == "disk":
        raise MemoryBudgetError(f"(ia|P) and B do not both fit in the memory budget ({plan.budget / MB:.4g} MB) to be "
                                "returned in memory: give more memory, or write them to a file (ovL_to_save)")
    backend.prepare(plan)
    run = CorrelationRun(  # steps 1-3 only: no checkpoint, no B given
        backend=backend, integrals=integrals, selected=selected, channels=device_channels(backend, refs, selected),
        plan=plan, settings=settings, context=context, checkpoint=NoCheckpoint(),
        metric_factor=MetricFactorOnce(backend, integrals.metric(), context.timer))
    channels = run.channels
    factor, stores = make_iaP(
        run, integrals.aux_blocks(plan.aux_block),
        lambda ch: new_store(backend, (ch.nocc, ch.nvir, integrals.naux), plan.storage, settings.scratch))  # 1. and 2.
    try:
        results = []
        for s, (ch, store) in enumerate(zip(channels, stores)):  # 3. B = (ia|P) L^-T, to the caller's arrays
            shape = (ch.nocc * ch.nvir, factor.nkept)
            b = np.empty(shape) if out is None else out(s, shape)

            def to_b(i0, i1, block, b=b, nvir=ch.nvir):
                b[i0 * nvir:i1 * nvir] = backend.to_host(block).reshape(-1, factor.nkept)

            whiten_blocks(backend, factor, store.read_occ, block_ranges(ch.nocc, plan.occ_block), to_b)
            results.append(b)
    finally:
        for store in stores:
            store.close()
    return results


def transform_aux_blocks(run, aux_blocks, stores, first=0):
    """Step 2 over the auxiliary blocks [(p0, p1)]: (ia|P) = C_mi C_na (mn|P) of each spin
    channel of the `CorrelationRun` run, written to stores[s] at columns p - first (each (mn|P)
    block is made once and serves every channel). The run context's timer times it ("integrals",
    "transform"), its report tells the progress."""
    backend, integrals, channels, timer, report = (run.backend, run.integrals, run.channels, run.context.timer,
                                                   run.context.report)
    for n, (p0, p1) in enumerate(aux_blocks):
        with timer.step("integrals"):
            ao_block = integrals.block(p0, p1)
        with timer.step("transform"):
            ao_block = ao_block.on_device(backend) if isinstance(ao_block, ScreenedMNP) else \
                backend.to_device(ao_block, fp64=True)
            for ch, store in zip(channels, stores):
                store.write_aux(p0 - first, p1 - first, transform_to_mo(backend, ao_block, ch.c_occ, ch.c_vir))
            del ao_block
            release_freed_memory()
        report("AO->MO transform", n + 1, len(aux_blocks))


class LocalDensities:
    """How `mp2_densities` reaches B in one process (a `protocol.DensitySchedule`): rows(s, i0, i1)
    gives B rows [i1 - i0, nvir_s, nkept] of channel s on the device (the provider's); the k side in
    blocks of k_rows orbitals; the i side in slabs of slab_rows rows (None: all at once; B on disk: a slab
    at a time, so B is read once per block of k). `ranks.RankDensities` is the same over the ranks
    of a team. A block's temporaries go back to the system when the step asks for the next block (glibc
    keeps their pages otherwise: +70 MB on hexane)."""

    def __init__(self, rows, channels, k_rows, slab_rows=None, fit_rows=None):
        self.rows, self.channels, self.k_rows, self.slab_rows = rows, channels, k_rows, slab_rows
        self.fit_rows = fit_rows  # rows of G fitted at once after the loop (None: a held block at a time)

    def k_blocks(self, other):
        """The blocks (k0, k1) of channel `other`, in order."""
        nocc = self.channels[other].nocc
        yield from released_after_each(block_ranges(nocc, max(1, min(self.k_rows, nocc))))

    def held(self, s) -> list:
        """The row blocks (i0, i1) of channel s whose G this process holds and fits."""
        return block_ranges(self.channels[s].nocc, self.slab_rows or self.channels[s].nocc)

    def fit_blocks(self, s):
        """The row blocks of channel s whose G is fitted at once: the held blocks, cut to
        fit_rows rows (the fit's fp64 temporaries are a few times one block: the plan's)."""
        yield from released_after_each([(r0, r1) for i0, i1 in self.held(s) for r0, r1 in
                                        ((i0 + a, i0 + b) for a, b in block_ranges(i1 - i0, self.fit_rows or i1 - i0))])

    def slabs(self, s):
        """B of every i of channel s, as row blocks in order."""
        return (self.rows(s, i0, i1) for i0, i1 in self.held(s))

    @staticmethod
    def combine(array):
        """The sum over the processes that share the work (one here)."""
        return array
