"""From a molecule or a PySCF mean field to a DF-MP2 result, the flow: checks (`checks`, before any
expensive step; a team's ranks then agree on them, `agreement`) -> SCF -> correlation
(`pipeline.correlation_energy`) -> gradient and properties -> `DFMP2Result`. Each check, the
timer's wrap (`_synchronized`) and the checkpoint's open (`open_run_checkpoint`) happen once per run, here.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from dataclasses import replace

from .. import chem
from ..chem.jk import early_integrals_fit, scf_builds_for
from ..kernels import backend_for, device_screens, flush_subnormals_first, runs_torch
from ..mp2.b import ovL_of_orbitals
from ..mp2.gradient import nuclear_gradient_of_run
from ..mp2.orbitals import spin_channels
from ..mp2.pipeline import correlation_energy
from ..mp2.response import relaxed_properties
from ..run.checkpoint import SCF_RECORD, open_run_checkpoint, version_identity
from ..run.context import context_from
from ..run.settings import Settings, settings_from
from ..sparse import screen_integrals
from ..util.errors import option
from ..util.start_up import SCF_GROWTH, check_start_up, stages_to_come
from ..util.system_memory import peak_resident_bytes
from .agreement import agree_on_run, agreed_mean_field
from .checks import (check_budget, check_mean_field_request, molecule_of, occupied_orbitals, offered_precision,
                     with_frozen_core, with_properties)
from .result import DFMP2Result
from .scf_record import kept_scf_record, run_scf_record, scf_record


def run_mean_field(mf, settings: Settings | None = None, integrals=None, context=None, given=None, notes=(),
                   **changes) -> DFMP2Result:
    """DF-MP2 on a converged PySCF RHF, UHF or ROHF object `mf`, or RKS/UKS/ROKS (density-fitted
    or not; molecular, or periodic at the gamma point). `settings` (keyword `changes` applied on
    top): its correlation, hardware and resource groups are used; allow_non_aufbau accepts
    occupied orbitals above virtual ones. integrals: the three-center provider (default:
    chem.MNPIntegrals in settings.auxbasis). context: the run's team, progress and timer
    (`dfmp2.run.context`). given: B per spin channel (`pipeline.dfmp2_energy`). notes: the caller's
    announcements, last in the result's."""
    settings, context = settings_from(settings, **changes), context_from(context)
    with context.agreeing(), ExitStack() as run_scope:  # the run's scratch: entered once the ranks agree
        return _run_mean_field(mf, settings, integrals, context, given, run_scope, notes)


def _run_mean_field(mf, settings, integrals, context, given, run_scope, extra_notes) -> DFMP2Result:
    check_start_up(stages_to_come(scf=False), 0)  # an rlimit too small: refused before torch loads
    backend = backend_for(offered_precision(settings))
    context = _synchronized(context, backend)
    mf = agreed_mean_field(context, mf, settings, integrals, backend)  # over ranks: rank 0's orbitals
    run_scope.enter_context(chem.run_scratch(settings, context.team))  # --checkpoint locked, PySCF's files
    reference, integrals = _orbitals_and_integrals(mf, settings, integrals)
    screening = {"mp2": _screened(settings, integrals, backend).screening_record}
    notes = ["non-aufbau reference accepted (allow_non_aufbau=True)"] if settings.allow_non_aufbau else []
    refs = spin_channels(reference.mo_coeff, reference.mo_energy, reference.mo_occ)  # made once per run
    check_mean_field_request(settings, len(refs), reference.fock_mo is not None, context.ranks, given)
    checkpoint = run_scope.enter_context(open_run_checkpoint(settings, context.team))
    fields = _correlate(backend, mf, reference, refs, integrals, settings, context, checkpoint,
                        chem.basis_name(mf.mol), notes, {"mp2": integrals.fitting}, given)
    fields["notes"] = fields["notes"] + list(extra_notes)
    return DFMP2Result(**fields, ecp=chem.ecp_record(mf.mol),  # whatever ECPs the user's molecule carries
                       screening=screening, scf_record=scf_record(chem.fitted_builds_of(mf), mf))


def ovL_of_mean_field(mf, settings: Settings | None = None, integrals=None, out=None, context=None,
                               **changes) -> list:
    """Steps 1-3 only on the mean field `mf` (as run_mean_field): B_ia^Q of the active orbitals
    per spin channel [nocc * nvir, naux] (PySCF's ovL layout), host arrays, or written to what
    out(s, shape) gives (`b.provider.ovL_of_orbitals`)."""
    settings = offered_precision(settings_from(settings, **changes))
    with chem.pyscf_scratch(settings.scratch):
        reference, integrals = _orbitals_and_integrals(mf, settings, integrals)
        backend = backend_for(settings)
        return ovL_of_orbitals(backend, _screened(settings, integrals, backend), reference.mo_coeff,
                               reference.mo_energy, reference.mo_occ, settings, out=out, context=context)


def _orbitals_and_integrals(mf, settings, integrals=None) -> tuple:
    """(the reference's orbitals, `chem.mean_field_orbitals`; the integral provider: `integrals`,
    or PySCF's three-center integrals in settings.auxbasis)."""
    reference = chem.mean_field_orbitals(mf, settings.allow_non_aufbau)
    return reference, integrals if integrals is not None else chem.MNPIntegrals(mf.mol, settings.auxbasis)


def run_xyz(path, settings: Settings | None = None, context=None, **changes) -> DFMP2Result:
    """Read an XYZ file of one molecule (Angstrom; fragments, ghosts and `charge multiplicity`
    lines as `dfmp2 run` reads them) and run it (`run_atoms`). The charge and 2S are the file's
    (`chem.charge_and_spin`) unless `settings` or the keywords give them: as on the command line."""
    frame = chem.read_frames(path, max_frames=1)[0]
    chosen = settings_from(settings, **changes)
    if settings is None:  # neither given as keywords: the file's lines decide (else neutral, lowest spin)
        chosen = chosen.replace(charge=changes.get("charge"), spin=changes.get("spin"))
    chosen, notes = frame_settings(frame, chosen)
    return run_atoms(list(frame.atoms), chosen, context, notes=notes)


def frame_settings(frame, settings: Settings) -> tuple:
    """(settings with the charge and 2S of `frame` (a chem.Frame) by `chem.charge_and_spin`:
    settings.charge/spin where given, None taking the frame's lines, then neutral at the lowest
    spin; the notes of the defaults taken). The one place a run of one frame gets its charge and spin."""
    found = chem.charge_and_spin(frame, settings.charge, settings.spin)
    return settings.replace(charge=found.charge, spin=found.spin), found.notes


def run_atoms(atoms, settings: Settings | None = None, context=None, notes=(), **changes) -> DFMP2Result:
    """atoms: [chem.Atom] (Angstrom). Run the SCF (settings.reference rhf/uhf/rohf, default RHF for spin 0 and
    UHF otherwise; settings.scf 'df' or 'exact'), then DF-MP2. settings.xc: a double hybrid
    (`functionals`; a custom PySCF xc string with c_os and c_ss): the KS-SCF with its hybrid part,
    then E = E_KS + c_os E_os + c_ss E_ss from DF-MP2 on the KS orbitals. Keyword `changes` are
    applied on top of `settings` (default Settings()); context: the run's team, progress and
    timer (`dfmp2.run.context`; default: one process); notes: the caller's announcements, last in
    the result's. Every input is checked before the SCF."""
    settings, context = settings_from(settings, **changes), context_from(context)
    with context.agreeing(), ExitStack() as run_scope:  # the run's scratch, entered once its input is checked (_run_atoms)
        return _run_atoms(atoms, with_properties(offered_precision(settings)), context, run_scope, notes)


def _run_atoms(atoms, settings, context, run_scope, extra_notes=()) -> DFMP2Result:
    flush = runs_torch(settings.device)  # the torch backend's thread pool flushes fp32 subnormals
    if flush and "torch" in sys.modules:  # torch loaded: PySCF's OpenMP regions in this thread share its pool,
        flush_subnormals_first()  # so flag the thread before they start one (`flush_subnormals_first`)
    chem.check_geometry(atoms)
    molecule = molecule_of(atoms, settings, context.ranks)
    reference, dh, ecp, mol, jk_fitting = (molecule.reference, molecule.dh, molecule.ecp, molecule.mol,
                                           molecule.jk_fitting)
    check_start_up(stages_to_come(scf=True), SCF_GROWTH)  # an rlimit too small: refused before torch, the SCF
    jk_integrals = _early_jk_integrals(settings, context, mol, jk_fitting, dh)  # while torch loads (below)
    if flush:  # (torch not loaded before: PySCF's libraries came first and keep their own OpenMP runtime)
        flush_subnormals_first()
    backend = backend_for(settings)
    context = _synchronized(context, backend)
    integrals = _screened(settings, chem.MNPIntegrals(mol, settings.auxbasis), backend)
    spins = occupied_orbitals(mol, settings, reference)
    settings = with_frozen_core(settings, mol, spins)
    check_budget(backend, integrals, spins, settings, context, mol, jk_fitting, jk_integrals)
    agree_on_run(context, mol, settings, integrals, backend, jk_fitting)  # over ranks, before any work
    # --checkpoint locked (in use: one line), then PySCF's files; every scratch directory named by the run
    run_scope.enter_context(chem.run_scratch(settings, context.team))
    builds = _scf_builds(settings, backend, mol, jk_fitting, dh, jk_integrals)

    def run_scf():
        return chem.run_scf(mol, settings.scf, max_cycle=settings.scf_max_cycle, reference=reference,
                            jk_auxbasis=jk_fitting.basis if jk_fitting is not None else None,
                            xc=dh.xc if dh else None, progress=context.progress, builds=builds)

    with open_run_checkpoint(settings, context.team) as checkpoint:  # the run's resume policy, opened once
        with context.timer.step("scf"):
            mf, reused_scf = _reference_scf(run_scf, checkpoint, context, _run_identity(atoms, settings, reference, ecp),
                                            lambda made: kept_scf_record(builds, made))
            scf_here = not isinstance(mf, dict)  # else SCF arrays (a checkpoint's, or rank 0's)
            held = mf.get(SCF_RECORD) if reused_scf else None  # what made the checkpoint's SCF
            if not scf_here:
                mf = chem.restored_scf(mol, mf, settings.scf, reference, jk_fitting.basis if jk_fitting else None,
                                       dh.xc if dh else None)
        try:
            orbitals = chem.mean_field_orbitals(mf)  # (ROHF's semicanonical Fock still builds J and K)
        finally:
            if builds is not None:
                builds.close()
        chem.release_integrals(mf)
        refs = spin_channels(orbitals.mo_coeff, orbitals.mo_energy, orbitals.mo_occ)  # made once per run
        fields = _correlate(backend, mf, orbitals, refs, integrals, settings, context, checkpoint, settings.basis,
                            [f"ECPs off ({option('ecp', 'none')}): {el} all-electron in {settings.basis}, a basis made for its "
                             f"{label} ECP" for el, label in sorted(ecp.off.items())],
                            {"scf": jk_fitting, "mp2": integrals.fitting})
    corr = fields["correlation"]
    if settings.checkpoint is not None:
        corr.checkpoint["reused_scf"] = reused_scf  # (the correlation's record, before the result is made)
    scf_fields, scf_screening, scf_notes = run_scf_record(builds, mf if scf_here else None, held, settings.checkpoint)
    fields.update(scf_record=scf_fields,  # the SCF's builds (before the gradient's), or the reused SCF's
                  screening={**screening_records(mp2=integrals), **({"scf": scf_screening} if scf_screening else {})},
                  double_hybrid=dh, mean_field=mf, ecp=dict(ecp.record))
    fields.update(_gradient_and_properties(mf, corr, settings, context),
                  timings=dict(context.timer.timings),  # with the gradient's parts
                  peak_rss_bytes=peak_resident_bytes())  # the whole run's, the gradient and properties included
    fields["notes"] = fields["notes"] + scf_notes + list(extra_notes)
    return DFMP2Result(**fields)


def _synchronized(context, backend):
    """The run's context whose timer drains `backend`'s queue at the end of each step (the SCF, the
    correlation, the gradient's parts), so that a step's time is its own; the caller's is unchanged."""
    return replace(context, timer=context.timer.synchronized_with(backend.synchronize))


def _gradient_and_properties(mf, corr, settings, context) -> dict:
    """The result's gradient, gradient_jk and properties where settings ask for them (over ranks:
    on rank 0, which holds G; the others wait in the closing barrier); the three-index density is
    closed afterwards (its scratch, B out of core, removed)."""
    if context.team is not None and not context.team.is_root:
        return {}
    out, relaxed = {}, None  # a gradient's relaxed density serves the properties too (one CPHF)
    try:
        if settings.gradient:
            out["gradient"], out["gradient_jk"], relaxed = nuclear_gradient_of_run(mf, corr, settings, context.timer)
        out["properties"] = relaxed_properties(mf, corr, settings, relaxed) if settings.properties else {}
    finally:
        if corr.gamma is not None:
            corr.gamma.close()
    return out


def _early_jk_integrals(settings, context, mol, jk_fitting, dh):
    """The SCF's JK-fit integrals, started on a thread (`chem.EarlyIntegrals`) to overlap the backend's
    start-up (run_xyz calls it before loading it), where this process will surely build J and K with
    them: a density-fitted SCF on dfmp2's builds (not --scf-backend pyscf, no range-separated exchange),
    one process, no checkpoint (whose SCF may be reused), and room in the budget once the backend is
    loaded (`jk.early_integrals_fit`). Else None (the SCF's set-up computes them, as it always did)."""
    if settings.scf != "df" or settings.scf_backend == "pyscf" or context.team is not None or \
            settings.checkpoint is not None or chem.is_range_separated(dh.xc if dh else None):
        return None
    integrals = _screened(settings, chem.jk_fitting_integrals(mol, jk_fitting.basis, early=True), step="scf")
    return integrals.start() if early_integrals_fit(integrals, settings.max_memory) else None


def _screened(settings, integrals, backend=None, step="mp2"):
    """`integrals` of `step` ("mp2", "scf") with settings.screening applied
    (`sparse.screen_integrals`; for the backend, or before it is loaded, for settings.device's);
    the choice in integrals.screening_record."""
    screens, name = (backend.screens, backend.name) if backend is not None else \
        (device_screens(settings.device), settings.device)
    integrals.screening_record = screen_integrals(settings.screening, integrals, screens, name, step)
    if step == "mp2" and backend is not None and integrals.screening is not None:
        integrals.screening_record["kernel_layout"] = backend.screened_layout(integrals.screening)
    return integrals


def screening_records(**providers) -> dict:
    """The result's "screening": kind ("mp2", "scf") -> the choice its integral provider recorded."""
    return {kind: p.screening_record for kind, p in providers.items()
            if p is not None and p.screening_record is not None}


def _scf_builds(settings, backend, mol, jk_fitting, dh, jk_integrals=None):
    """dfmp2's Coulomb/exchange builds for run_xyz's SCF, or None for PySCF's (`jk.scf_builds_for`);
    jk_integrals: the JK-fit integrals where they were started early (`_early_jk_integrals`)."""
    return scf_builds_for(settings, backend,
                          lambda: jk_integrals if jk_integrals is not None else
                          _screened(settings, chem.jk_fitting_integrals(mol, jk_fitting.basis), backend, "scf"),
                          chem.is_range_separated(dh.xc if dh else None))


def _reference_scf(run_scf, checkpoint, context, identity, record_of) -> tuple:
    """(the SCF, or the arrays of one: a checkpoint's, or rank 0's for the other ranks; reused
    from the checkpoint?). One process runs its SCF; a team runs one SCF on rank 0 and
    broadcasts its arrays. The run's checkpoint policy (`checkpoint.policy.open_run_checkpoint`; over
    a team, rank 0's own `RunCheckpoint` inside it) decides whether the SCF is taken from it
    (another run's checkpoint is refused before the SCF); it keeps record_of(mf) with an SCF it
    keeps (`scf_record.kept_scf_record`) and gives it back as SCF_RECORD."""
    def on_this_process():
        return getattr(checkpoint, "local", checkpoint).resume_scf(identity, run_scf, chem.scf_arrays, record_of)

    if context.team is None:
        return on_this_process()

    def arrays_on_root():
        mf, reused = on_this_process()
        return (mf if reused else chem.scf_arrays(mf)), reused
    return context.team.on_root(arrays_on_root)


def _run_identity(atoms, settings, reference, ecp) -> dict:
    """What a checkpoint's SCF belongs to: the molecule and the chemistry settings."""
    chemistry = ("basis", "auxbasis", "jk_auxbasis", "cartesian", "charge", "spin", "scf", "xc", "c_os", "c_ss",
                 "frozen_core", "frozen")
    return {**version_identity(), "reference": reference,
            "atoms": [[a.label, *map(float, a.xyz)] for a in atoms],
            "ecp": ecp.record,
            **{name: getattr(settings, name) for name in chemistry}}


def _correlate(backend, mf, reference, refs, integrals, settings, context, checkpoint, basis, notes, fittings,
               given=None) -> dict:
    """The MP2 steps on `reference` and its spin channels `refs` (`orbitals.spin_channels`; the
    request checked, context's timer synchronized, the run's open `checkpoint` policy): the
    DFMP2Result fields they give (the CorrelationEnergy in "correlation");
    fittings: {"scf"/"mp2": FittingSet or None} (where each element's auxiliary set came from)."""
    fittings = {kind: fitting for kind, fitting in fittings.items() if fitting is not None}
    generated = {kind: fitting.generated for kind, fitting in fittings.items()}
    with context.timer.step("mp2"):
        corr = correlation_energy(backend, integrals, refs, settings, reference.fock_mo, context, checkpoint, given)
    ran = backend.record()
    return dict(
        e_ref=reference.e_ref, correlation=corr, reference=reference.reference,
        spin_square=reference.spin_square, xc=reference.xc,
        auxbasis_generated={k: list(v) for k, v in generated.items() if v}, basis=basis,
        auxbasis_sources={kind: dict(fitting.sources) for kind, fitting in fittings.items()},
        auxbasis=integrals.auxbasis, scf=chem.scf_mode(mf),
        scf_auxbasis=fittings["scf"].describe() if "scf" in fittings else chem.scf_auxbasis_name(mf),
        ran=ran, formula=chem.formula(mf.mol), timings=dict(context.timer.timings),
        notes=list(ran.notes) + notes + list(corr.notes)
        + list((corr.checkpoint or {}).get("notes", [])) + [
            f"no named {kind} auxiliary set in PySCF for {', '.join(elements)}: PySCF's generated "
            "even-tempered set (aug_etb) used for " + ("it" if len(elements) == 1 else "them")
            for kind, elements in (("JK-fit (SCF)", generated.get("scf")), ("MP2-fit", generated.get("mp2")))
            if elements],
        peak_rss_bytes=peak_resident_bytes())
