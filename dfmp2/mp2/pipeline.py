"""The DF-MP2 correlation energy: the steps of `dfmp2.mp2.steps`, composed with providers and policies.

    refs, active orbitals        dfmp2.mp2.orbitals (spin channels: one restricted, two unrestricted)
    memory plan                  dfmp2.run.memory (block sizes from the budget)
    B: made or found             a BProvider (dfmp2.mp2.b): one process (memory, disk,
                                 out of core), several ranks, or given by the caller
    pair energies                steps.pair_energies over the tasks the provider streams
    density, singles             steps.mp2_densities, steps.singles_energy
    the result                   assembled once (`CorrelationEnergy`)
Around them, the run's policies: the checkpoint's resume policy (dfmp2.run.checkpoint: B and the
finished pair tasks), the ranks (dfmp2.run.ranks, through the provider) and the timer and
progress of the run context (dfmp2.run.context). The steps never branch on a device, a storage or
a rank; those choices are made once, here: the plan (`plan_run`: memory or disk, t2), the
provider (`b_provider`) and the checkpoint policy (`open_run_checkpoint`). What a run shares is
one object, the per-run state (`run_state.CorrelationRun`), made once in `correlation_energy` and
handed to the provider and the stages.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from ..run.checkpoint import open_run_checkpoint, pipeline_identity
from ..run.context import context_from
from ..run.memory import MemoryPlan, plan_for
from ..run.settings import IF_ROOM, SOS_C_OS, Settings, settings_from
from ..run.storage import ThreeIndexDensity
from ..util.errors import ComputationError, InputError, MemoryBudgetError, option
from ..util.system_memory import MB
from .orbitals import active_spaces, device_channels, spin_channels
from .steps import combine_pair_sums, mp2_densities, pair_energies, pair_tasks, singles_energy, t2_arrays
from .b import LocalDensities, MetricFactorOnce, RankDensities, b_provider
from .run_state import CorrelationRun
from .laplace_energy import check_method_request, laplace_opposite_spin, laplace_request, opposite_spin_only, sos_energy


SCS_OS, SCS_SS = 1.2, 1.0 / 3.0  # Grimme's spin-component scaling (c_os, c_ss) of SCS-MP2


def sos_scaling(settings) -> float | None:
    """SOS-MP2's c_os (settings.c_os, default SOS_C_OS); None for method mp2."""
    if settings.method != "sos-mp2":
        return None
    return SOS_C_OS if settings.c_os is None else float(settings.c_os)


def scs_correlation(e_os: float, e_ss: float, e_singles: float = 0.0) -> float:
    """Grimme's SCS-MP2 correlation energy (Eh): E = 6/5 E_os + 1/3 E_ss (+ the ROHF singles, unscaled, as
    Psi4 and PySCF's DFROMP2 count them). E_ss is divided by 3, as it always was (its bits)."""
    return SCS_OS * e_os + e_ss / 3.0 + e_singles


@dataclass
class CorrelationEnergy:
    """DF-MP2 correlation energy (Eh) with its sizes, timings (s) and what ran. nocc, nvir and
    nfrozen are ints for a restricted reference, (alpha, beta) tuples for an unrestricted one."""

    e_corr_os: float
    e_corr_ss: float | None  # None where only E_os was computed (the Laplace path)
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
    # with_rdm1: the unrelaxed MP2 density correction on the active orbitals, fp64, per spin
    # channel: [(occ_index, vir_index, P_oo, P_vv)] with indices into the reference's MOs
    rdm1_active: list | None = None
    # with_gamma: the three-index two-particle density per spin channel [nocc_s, nvir_s, naux], fp64
    # (steps.mp2_densities), for the orbital response (dfmp2.mp2.response)
    gamma: list | None = None
    # with_t2: t_ij^ab [nocc, nocc, nvir, nvir] of the active orbitals (restricted), or for an
    # unrestricted reference (t2aa, t2ab, t2bb), same-spin ones antisymmetrised (PySCF's t2)
    t2: object = None
    singles_included: bool = True  # include_singles: False leaves the ROHF singles out (e_corr_singles 0)
    notes: list = field(default_factory=list)  # announcements (e.g. t2 not kept for lack of memory)
    io: dict = field(default_factory=dict)  # scratch traffic: bytes_written, bytes_read, tensor_bytes
    checkpoint: dict | None = None  # --checkpoint: its directory and what this run reused from it
    distributed: dict | None = None  # several ranks: their number, backend and per-rank summaries (rank 0)

    method: str = "mp2"  # mp2, or sos-mp2 (e_corr = c_os E_os + singles)
    c_os: float | None = None  # sos-mp2: the opposite-spin scaling
    laplace: dict | None = None  # E_os through the Laplace transform: the quadrature and its bound (else None)

    @property
    def e_corr(self) -> float:
        """MP2: E_os + E_ss (+ singles); SOS-MP2: c_os E_os (+ singles, unscaled)."""
        if self.method == "sos-mp2":
            return sos_energy(self.e_corr_os, self.c_os, self.e_corr_singles)
        return self.e_corr_os + self.e_corr_ss + self.e_corr_singles

    @property
    def e_scs(self) -> float | None:
        """Grimme's spin-component-scaled correlation energy (`scs_correlation`); None without E_ss."""
        if self.e_corr_ss is None:
            return None
        return scs_correlation(self.e_corr_os, self.e_corr_ss, self.e_corr_singles)


def plan_keeping_t2(backend, integrals, selected, max_memory, plan, on_disk, insist) -> tuple:
    """(plan, note): the memory plan with t2 (fp64 on the host, PySCF's layout) held beside the run's
    arrays, its blocks sized for what is left, and no note. Where t2 does not fit (or would push
    (ia|P) out of core), `plan` unchanged and the note saying so; MemoryBudgetError instead when t2
    is insisted on."""
    spaces = [(o.size, v.size) for o, v, _ in selected]
    pairs = [o * v for o, v in spaces]
    t2_bytes = 8 * (sum(n * n for n in pairs) + (2 * pairs[0] * pairs[1] if len(pairs) == 2 else 0))
    try:
        kept = plan_for(backend, integrals, spaces, max_memory, on_disk=on_disk, growth=t2_bytes)
    except MemoryBudgetError:
        kept = None
    if kept is not None and (insist or kept.storage == plan.storage):
        return kept, None
    store = sum(pairs) * integrals.naux * backend.itemsize if plan.storage == "memory" else 0
    message = (f"t2 needs {t2_bytes / MB:.4g} MB, more than the memory budget leaves ({max(0, plan.budget - plan.minimum - store) / MB:.4g} "
               f"MB of {plan.budget / MB:.4g} MB after the process, {'(ia|P) and ' if store else ''}the energy's "
               "smallest blocks)")
    if insist:
        raise MemoryBudgetError(f"with_t2: {message}; run without it (energies and densities need no t2)")
    return plan, f"t2 not kept: {message}; the energy is complete (give more memory to keep t2)"


def check_request(settings: Settings, nspin: int, ranks: int, given=None, semicanonical=False) -> None:
    """Refuse, before any work, what a run asks for that dfmp2 does not do (InputError); once per
    run: here for `dfmp2_energy`'s callers, in `api.checks` (before the SCF) for the driver's. nspin: spin channels of the reference; ranks:
    processes of the run; given: B given by the caller; semicanonical: an ROHF reference."""
    if settings.with_rdm1 and semicanonical:
        raise InputError("MP2 densities and natural orbitals of ROHF references are not implemented (RHF and UHF "
                         "are): use a UHF reference")
    if settings.with_gamma and (given is not None or not settings.with_rdm1):
        raise InputError("the three-index two-particle density (relaxed densities) needs with_rdm1 and the "
                         "three-center integrals (not given (ia|P))")
    if ranks > 1 and (settings.with_t2 is True or given is not None):
        raise InputError("with several ranks, t2 and given (ia|P) are not available yet: run them in one process")
    if given is not None and settings.checkpoint is not None:
        raise InputError("given (ia|P) integrals (eris=) and a checkpoint do not go together: the checkpoint "
                         "keeps its own")
    check_method_request(settings)


def plan_run(backend, integrals, selected, settings, context, given) -> tuple:
    """(memory plan, notes, keep t2?) of a run with the active spaces `selected`: B in memory
    or on disk (a checkpoint or force_outcore keep it on disk; ranks keep their share in
    memory or on disk as the tightest rank's plan says, with its block sizes: `ranks.Team.tightest_plan`),
    and t2 when asked for and the budget holds it. The notes include a --max-memory above a hard
    limit found (`budget.memory_budget`)."""
    spaces = [(o.size, v.size) for o, v, _ in selected]
    team = context.team
    on_disk = given is None and (settings.force_outcore or (team is None and settings.checkpoint is not None))
    plan = plan_for(backend, integrals, spaces, settings.max_memory, on_disk=on_disk, ranks=context.ranks,
                    gamma=settings.with_gamma)
    if team is not None:  # one plan for the team: the tightest rank's (their budgets and baselines differ)
        plan = team.tightest_plan(plan)
    if settings.with_rdm1 and team is not None and not backend.streams_densities:
        raise InputError(f"the {backend.device_name} density kernels take all of (ia|P) at once, which no rank "
                         f"holds: run densities and gradients over ranks with {option('device', 'cpu')} or cuda, or in one process")
    if settings.with_rdm1 and plan.storage == "disk" and plan.slab_rows < max(o.size for o, _, _ in selected) \
            and not backend.streams_densities:
        raise MemoryBudgetError(
            f"the {backend.device_name} density kernels take all of (ia|P) at once, which the budget "
            f"({plan.budget / MB:.4g} MB, {plan.budget_source}) does not hold: give more memory, or run the "
            f"densities with {option('device', 'cpu')} or cuda (out of core)")
    if given is not None and plan.storage == "disk":
        raise MemoryBudgetError(f"given (ia|P) integrals (eris=) are read into memory, which the budget "
                                f"({plan.budget / MB:.4g} MB, {plan.budget_source}) does not hold: give more "
                                "memory, or let dfmp2 make them (out of core)")
    notes, with_t2 = [], settings.with_t2
    if with_t2 and team is not None:
        notes.append("t2 not kept: with several ranks t2 is not available yet (run in one process to keep it)")
    elif with_t2 == IF_ROOM and settings.checkpoint is not None:
        notes.append("t2 not kept: a checkpoint's finished pair blocks are reused, and t2 would need every block "
                     "formed again (with_t2=True does that)")
    elif with_t2 == IF_ROOM and not backend.forms_amplitudes:
        notes.append(f"t2 not kept: the {backend.device_name} kernels do not form the amplitudes (the energy is "
                     "complete; device cpu or cuda keeps t2)")
    elif with_t2 == IF_ROOM and laplace_request(settings) is not None:
        notes.append(f"t2 not kept: the Laplace path forms no amplitudes (the energy is complete; {option('laplace', 'off')} "
                     "keeps t2)")
    elif with_t2:
        plan, note = plan_keeping_t2(backend, integrals, selected, settings.max_memory, plan, on_disk, with_t2 is True)
        notes += [note] if note else []
    keep_t2 = bool(with_t2) and team is None and not notes
    return plan, notes + ([plan.budget_note] if plan.budget_note else []), keep_t2


def pair_stage(run, provider, tasks) -> tuple:
    """Step 4 over the tasks this process owns, those in the checkpoint's journal taken from it
    (none when t2 is kept, run.keep_t2: every task forms its amplitudes). run: the
    `CorrelationRun`. Returns (sums [ntasks, 2] of every task, fp64, t2 or None)."""
    checkpoint, context, with_t2 = run.checkpoint, run.context, run.keep_t2
    owned = provider.owned(tasks)
    finished, sums = checkpoint.resume_pairs(len(tasks), provider.layout, owned)
    t2, t2_blocks = t2_arrays(run.channels) if with_t2 else (None, None)
    if with_t2:
        finished = set()
        checkpoint.forget_reused()

    def record(k, e_os, e_ss):
        sums[k] = (e_os, e_ss)
        checkpoint.record(k, e_os, e_ss)
        finished.add(k)
        context.report("pair energies", len(finished), len(owned))

    try:
        pair_energies(run.backend, provider.pair_blocks(tasks, [k for k in owned if k not in finished]),
                      run.channels, record, t2_blocks)
    finally:
        checkpoint.close_journal()
    return provider.combine(sums), t2


def density_stage(run, provider) -> tuple:
    """Step 5: (rdm1 [(occ_index, vir_index, P_oo, P_vv)] per channel, and with_gamma the
    three-index density `storage.ThreeIndexDensity` (in memory, or on disk with B) with its
    Gbar, else None). run: the `CorrelationRun`; its metric_factor is the factor B was whitened
    with. B out of core is read a slab of plan.slab_rows rows at a time. Over the
    ranks of a team: blocks of k per rank in lockstep (`b.ranks.RankDensities`), P and Gbar on
    every rank, G on rank 0 only (None elsewhere)."""
    backend, channels, plan, settings, team = run.backend, run.channels, run.plan, run.settings, run.context.team
    gamma, factor = None, run.metric_factor(out_of="density") if settings.with_gamma else None
    if factor is not None:
        gamma = ThreeIndexDensity([(ch.nocc, ch.nvir, factor.naux) for ch in channels], plan.storage,
                                  settings.scratch)
    if team is not None:
        schedule = RankDensities(provider)
    else:  # rows of k: the amplitudes of all i against them about one pair block (the backend's
        # preferred size: small on a CPU, where larger blocks ran slower, memory-bound)
        schedule = LocalDensities(provider.rows, channels, max(1, plan.occ_block * plan.occ_block // max(
            ch.nocc for ch in channels)), plan.slab_rows if plan.storage == "disk" else None, plan.occ_block)
    try:
        densities, gamma_aux = mp2_densities(backend, schedule, channels, settings.rdm1_scaling, factor, gamma)
        if team is not None and gamma is not None:
            schedule.gather_on_root(gamma)
            if not team.is_root:
                gamma.close()
                gamma = None
    except BaseException:
        if gamma is not None:
            gamma.close()
        raise
    if gamma is not None:
        gamma.gamma_aux = gamma_aux
    return [(occ, vir, p_oo, p_vv) for (occ, vir, _), (p_oo, p_vv) in zip(run.selected, densities)], gamma


def dfmp2_energy(backend, integrals, mo_coeff, mo_energy, mo_occ, settings: Settings | None = None,
                 fock_mo=None, context=None, given=None, **changes) -> CorrelationEnergy:
    """DF-MP2 correlation energy of a restricted or unrestricted reference.

    integrals: an IntegralProvider (`dfmp2.run.providers`). Restricted: mo_coeff [nao, nmo],
    mo_energy [nmo] (Eh), mo_occ [nmo] (0/2). Unrestricted: each of them per spin
    ([2, nao, nmo], [2, nmo], [2, nmo], occupations 0/1). fock_mo: per spin, the Fock matrix in
    the (semicanonical) MO basis [nmo, nmo] of a non-canonical reference (ROHF), for the
    singles; None for canonical orbitals. settings (keyword `changes` on top): frozen,
    max_memory (MB), scratch, checkpoint, with_rdm1 (RHF or UHF: the unrelaxed density;
    rdm1_scaling), with_t2 (True, False or IF_ROOM), include_singles, force_outcore.
    context: the run's team, progress and timer (`dfmp2.run.context`; default: one process).
    given: B per spin channel ([nocc * nvir, naux] arrays or HDF5 datasets of the active
    orbitals, PySCF's ovL layout): steps 1-3 are skipped.
    """
    settings, context = settings_from(settings, **changes), context_from(context)
    refs = spin_channels(mo_coeff, mo_energy, mo_occ)
    check_request(settings, len(refs), context.ranks, given, semicanonical=fock_mo is not None)
    context = replace(context, timer=context.timer.synchronized_with(backend.synchronize))  # (the caller's: unchanged)
    with open_run_checkpoint(settings, context.team) as checkpoint:
        return correlation_energy(backend, integrals, refs, settings, fock_mo, context, checkpoint, given)


def correlation_energy(backend, integrals, refs, settings, fock_mo, context, checkpoint, given=None) -> CorrelationEnergy:
    """`dfmp2_energy`'s steps, for a caller that has made its run's decisions once (the driver):
    refs (`orbitals.spin_channels`) of a request `check_request` passed, context's timer draining
    backend's queue (`Timer.synchronized_with`), the run's open checkpoint policy
    (`checkpoint.policy.open_run_checkpoint`); the caller closes it. The run's state
    (`CorrelationRun`) is made once here, after the plan and the metric factor."""
    before = dict(context.timer.timings)  # the run's steps so far (the SCF): not this call's
    selected = active_spaces(refs, settings.frozen)
    plan, notes, with_t2 = plan_run(backend, integrals, selected, settings, context, given)
    backend.prepare(plan)
    timer = context.timer
    with timer.step("integrals"):
        metric = None if given is not None else integrals.metric()  # (given B needs no metric)
    run = CorrelationRun(
        backend=backend, integrals=integrals, selected=selected, channels=device_channels(backend, refs, selected, fock_mo),
        plan=plan, settings=settings, context=context, checkpoint=checkpoint,
        metric_factor=MetricFactorOnce(backend, metric, timer),  # step 1, once per run
        given=given, notes=tuple(notes), keep_t2=with_t2)
    checkpoint.claim_pipeline(lambda: pipeline_identity(backend, refs, selected, fock_mo, metric, integrals.nao,
                                                        integrals.screening))
    provider = b_provider(run)
    try:
        tasks = pair_tasks([ch.nocc for ch in run.channels], provider.occ_block)
        request = laplace_request(settings)
        if request is None:  # 4. the pair loop
            if opposite_spin_only(settings) and settings.laplace is None:
                run = replace(run, notes=run.notes + (
                    "E_os through the canonical pair loop (exact): the densities, gradient or t2 asked for need the "
                    "amplitudes, which the Laplace path does not form",))
            with timer.step("pair_energies"):
                sums, t2 = pair_stage(run, provider, tasks)
            pair_energy = (*combine_pair_sums(tasks, sums, len(run.channels)), None)
        else:  # 4. E_os through Z(t), no pair loop (no E_ss)
            with timer.step("laplace"):
                e_os, laplace, laplace_notes = laplace_opposite_spin(run, provider, request)
            pair_energy, t2 = (e_os, None, laplace), None
            run = replace(run, notes=run.notes + tuple(laplace_notes))
        rdm1 = gamma = None
        if settings.with_rdm1:  # 5. unrelaxed density, same (ia|kb)
            with timer.step("density"):
                rdm1, gamma = density_stage(run, provider)
        try:
            return assemble_result(run, provider, pair_energy, densities=(rdm1, gamma), t2=t2,
                                   checkpoint=checkpoint.summary(provider.reused, len(tasks)),
                                   timings={name: seconds - before.get(name, 0.0) for name, seconds in
                                            timer.timings.items() if seconds != before.get(name)})
        except BaseException:
            if gamma is not None:
                gamma.close()
            raise
    finally:
        provider.close()


def assemble_result(run, provider, pair_energy, *, densities, t2, checkpoint, timings) -> CorrelationEnergy:
    """The result record, made once: (E_os, E_ss, laplace) = pair_energy (from the Laplace path E_ss
    None and its record `laplace`; from the pair loop laplace None), the ROHF singles added
    (run.settings.include_singles; else 0, as PySCF's include_singles=False), every energy
    checked to be finite, and what ran (the kernels of every rank, on rank 0). run: the
    `CorrelationRun` (its plan's notes; its settings' method and c_os); densities: (rdm1, gamma)
    of `density_stage`, or (None, None); checkpoint: the checkpoint's summary; timings: this
    call's steps (s)."""
    backend, channels, integrals, include_singles = run.backend, run.channels, run.integrals, run.settings.include_singles
    rdm1, gamma = densities
    e_os, e_ss, laplace = pair_energy
    done = provider.summary()  # (ranks: every rank's kernels, gathered before the host's singles)
    e_singles = 0.0
    if include_singles and any(ch.f_ov is not None for ch in channels):
        e_singles = singles_energy(channels)
        backend.count("host:singles")  # fp64 on the host: nocc x nvir per spin
    for name, value in (("opposite-spin", e_os), ("same-spin", e_ss), ("singles", e_singles)):
        if value is not None and not np.isfinite(value):
            raise ComputationError(f"the {name} MP2 energy is not finite ({value})")
    per_rank = (done["distributed"] or {}).get("per_rank")
    kernels = dict(sum((Counter(r["kernels"]) for r in per_rank), Counter())) if per_rank else dict(backend.calls)

    def per_spin(values):
        return values[0] if len(values) == 1 else tuple(values)

    return CorrelationEnergy(
        e_corr_os=e_os, e_corr_ss=e_ss, e_corr_singles=e_singles,
        nocc=per_spin([ch.nocc for ch in channels]), nvir=per_spin([ch.nvir for ch in channels]),
        naux=integrals.naux, nao=integrals.nao, nfrozen=per_spin([ch.nfrozen for ch in channels]),
        metric=provider.metric_label, plan=run.plan, timings=dict(timings), kernels=kernels,
        rdm1_active=rdm1, gamma=gamma, t2=t2, checkpoint=checkpoint, distributed=done["distributed"],
        io={**done["io"], "tensor_bytes": sum(ch.nocc * ch.nvir * integrals.naux for ch in channels)
            * backend.itemsize},
        singles_included=include_singles, notes=list(run.notes), method=run.settings.method,
        c_os=sos_scaling(run.settings), laplace=laplace)
