"""Composite energies from several DF-MP2 runs: counterpoise-corrected interaction energies of
fragments (Boys-Bernardi) and basis-set extrapolation (Psi4's `cbs()` formulas), alone or together.

Every system is one `run_atoms` run; what is combined are its energies (Hartree):
    E_int(CP)   = E_AB(AB basis) - sum_i E_i(AB basis)     (monomers with the partners' ghosts)
    E_int(noCP) = E_AB(AB basis) - sum_i E_i(own basis)
and, per energy component, E_CBS from the bases of `chem.extrapolation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import chem
from ..chem.extrapolation import (check_scf_scheme, expand_basis, extrapolate_correlation, extrapolate_scf,
                                  scheme_names)
from ..run.settings import Settings
from ..util.errors import InputError, option
from .checks import check_atoms
from .driver import run_atoms

KCAL_PER_HARTREE = 627.5094737775374  # Psi4's psi_hartree2kcalmol (physconst.h)
BSSE_TYPES = ("cp", "nocp")
# the energy components combined (Eh); e_scs: the SCS correlation energy, e_tot_scs = e_ref + e_scs
COMPONENTS = ("e_ref", "e_corr_os", "e_corr_ss", "e_corr_singles", "e_corr", "e_scs", "e_tot", "e_tot_scs")
CORRELATION = ("e_corr_os", "e_corr_ss", "e_corr_singles", "e_corr", "e_scs")


@dataclass(frozen=True)
class System:
    """One run of a composite: its name, atoms (ghosts included), charge and 2S."""
    name: str
    atoms: tuple
    charge: int
    spin: int


def energies_of(result) -> dict:
    """The components (COMPONENTS) of one run's result, Hartree."""
    values = {name: getattr(result, name) for name in COMPONENTS if name != "e_tot_scs"}
    values["e_tot_scs"] = _known(lambda: result.e_ref + result.e_scs, result.e_scs)
    return values


def _known(value, *parts):
    """value() where every part is known; None where one is not (SOS-MP2 through the Laplace path has
    no same-spin energy, and so no SCS energy: their combinations are None too)."""
    return None if any(part is None for part in parts) else value()


def is_composite(basis: str, bsse) -> bool:
    """Whether a run is several runs combined: interaction energies asked for, or a basis in
    Psi4's bracket notation (`expand_basis`, which checks it)."""
    return bool(bsse) or len(expand_basis(basis)) > 1


def counterpoise_systems(frame, bsse, charge=None, spin=None) -> list:
    """The systems of a counterpoise computation on the fragments of `frame`: the whole, each
    fragment in the whole's basis (the others ghosts; "cp"), each fragment alone ("nocp"), each
    at the charge and 2S `chem.charge_and_spin` gives it (InputError where the input leaves a
    fragment's state a guess)."""
    return _counterpoise(frame, bsse, charge, spin)[0]


def _counterpoise(frame, bsse, charge, spin) -> tuple:
    """(counterpoise_systems, the chem.ChargeSpin they were made from)."""
    if len(frame.fragments) < 2:
        raise InputError(f"{frame.name}: counterpoise needs fragments: separate them with a line '--' "
                         "(optionally followed by each fragment's 'charge multiplicity' line)")
    check_bsse(bsse)
    for k, fragment in enumerate(frame.fragments, start=1):
        if all(a.ghost for a in frame.atoms[fragment.start:fragment.stop]):
            raise InputError(f"{frame.name}: fragment {k} holds ghost atoms only: a fragment of a counterpoise "
                             "computation needs real atoms")
    found = chem.charge_and_spin(frame, charge, spin)
    if found.fragments is None:
        raise InputError(f"{found.undetermined} (counterpoise runs each fragment at its own charge and spin)")
    for k, (fragment, (q, _)) in enumerate(zip(frame.fragments, found.fragments), start=1):
        if sum(chem.atomic_number(a.symbol) for a in frame.atoms[fragment.start:fragment.stop] if not a.ghost) == q:
            raise InputError(f"{frame.name}: fragment {k} at charge {q} has no electrons (a bare nucleus): counterpoise "
                             "runs each fragment, and a fragment without electrons has no SCF")
    atoms = frame.atoms
    systems = [System("whole", atoms, found.charge, found.spin)]
    for k, (fragment, (q, s)) in enumerate(zip(frame.fragments, found.fragments), start=1):
        inside = range(fragment.start, fragment.stop)
        if "cp" in bsse:
            ghosted = tuple(a if i in inside else chem.Atom(a.symbol, a.xyz, True) for i, a in enumerate(atoms))
            systems.append(System(f"fragment {k} (whole basis)", ghosted, q, s))
        if "nocp" in bsse:
            systems.append(System(f"fragment {k} (own basis)", tuple(atoms[i] for i in inside), q, s))
    return systems, found


def check_bsse(bsse) -> list:
    """bsse, if it lists BSSE_TYPES each once; InputError naming what it holds otherwise."""
    unknown = [kind for kind in bsse if kind not in BSSE_TYPES]
    if unknown or not bsse:
        shown = ",".join(bsse)
        raise InputError(f"{option('bsse')} {shown!r}: expected cp, nocp or cp,nocp" if shown else
                         f"{option('bsse')} is empty: expected cp, nocp or cp,nocp")
    return list(bsse)


def interaction(energies: dict, bsse) -> dict:
    """{"cp"/"nocp": {component: E_int (Eh)}} from {system name: energies}."""
    whole = energies["whole"]
    found = {}
    for kind, label in (("cp", "whole basis"), ("nocp", "own basis")):
        if kind not in bsse:
            continue
        parts = [e for name, e in energies.items() if name.endswith(f"({label})")]
        found[kind] = {c: _known(lambda c=c: whole[c] - sum(p[c] for p in parts), whole[c], *(p[c] for p in parts))
                       for c in COMPONENTS}
    return found


def in_kcal_per_mol(values: dict) -> dict:
    return {name: _known(lambda value=value: value * KCAL_PER_HARTREE, value) for name, value in values.items()}


def extrapolated(per_basis: list, scf_scheme: str) -> dict:
    """Components at the basis-set limit from [(X, energies)] (smallest X first): the reference
    energy by `scf_scheme`, each correlation part by Helgaker's X^-3 on the two largest bases."""
    found = {"e_ref": extrapolate_scf([(x, e["e_ref"]) for x, e in per_basis], scf_scheme)}
    for name in CORRELATION:
        found[name] = _known(lambda name=name: extrapolate_correlation([(x, e[name]) for x, e in per_basis]),
                             *(e[name] for _, e in per_basis))
    found["e_tot"] = found["e_ref"] + found["e_corr"]
    found["e_tot_scs"] = _known(lambda: found["e_ref"] + found["e_scs"], found["e_scs"])
    return found


@dataclass
class CompositeResult:
    """A composite's record: each run's result record by basis and system, the energies, the
    interaction energies (Eh and kcal/mol) and, for several bases, their extrapolation."""
    record: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return self.record


def check_composite_settings(settings: Settings) -> None:
    """InputError for what a composite cannot do (before anything runs)."""
    if settings.checkpoint is not None:
        raise InputError(f"{option('checkpoint')} keeps one run; a counterpoise or extrapolated energy is several")
    if settings.with_rdm1 or settings.gradient or settings.properties:
        raise InputError("counterpoise and extrapolated energies are energies only here (no gradient, density or "
                         "properties)")


def composite_runs(frame, settings: Settings, bsse=(), scf_extrapolation="highest") -> tuple:
    """The one check of a composite before anything runs: ({basis spec: [(System, its run's
    Settings)]}, notes). Every system in every basis goes through `checks.check_atoms` (what
    run_atoms checks before its SCF: charge and spin, ECPs, basis and fitting sets, frozen core),
    so that a system that cannot run is found before the first one runs, named with its basis."""
    bases = expand_basis(settings.basis)
    check_scf_scheme(scf_extrapolation)
    if len(bases) > 1 and settings.xc is not None:
        raise InputError(f"basis-set extrapolation is of MP2's correlation energy: not with {option('xc')}")
    check_composite_settings(settings)
    if bsse:
        systems, found = _counterpoise(frame, bsse, settings.charge, settings.spin)
    else:
        found = chem.charge_and_spin(frame, settings.charge, settings.spin)
        systems = [System("whole", frame.atoms, found.charge, found.spin)]
    named_ecp = settings.ecp is not None and str(settings.ecp).strip().lower() not in ("auto", "none")
    if named_ecp:  # an ECP library named for the whole: refused here if it covers none of its elements (ghosts too)
        chem.choose_ecp([a.symbol for a in frame.atoms], settings.basis, settings.ecp)
    # a fragment alone whose elements the named library does not cover runs all-electron, as under it
    ecps = ["none" if named_ecp and _covers_nothing(system, settings.ecp) else settings.ecp for system in systems]
    planned = {}
    for _, basis in bases:
        planned[basis] = []
        for system, ecp in zip(systems, ecps):
            chosen = settings.replace(basis=basis, charge=system.charge, spin=system.spin, ecp=ecp)
            try:
                check_atoms(list(system.atoms), chosen)
            except InputError as error:
                where = f"{system.name}" + (f" in {basis}" if len(bases) > 1 else "")
                raise InputError(f"{frame.name}: {where}: {error}") from None
            planned[basis].append((system, chosen))
    return planned, found.notes


def _covers_nothing(system, ecp) -> bool:
    """Whether the ECP library named `ecp` covers none of `system`'s elements (ghosts included)."""
    try:
        chem.choose_ecp([a.symbol for a in system.atoms], "", ecp)
    except InputError:
        return True
    return False


def run_composite(frame, settings: Settings, bsse=(), scf_extrapolation="highest", context_of=None,
                  on_run=None) -> CompositeResult:
    """The counterpoise systems of `frame` (bsse: "cp", "nocp"; none: the frame as one system) in
    each basis of settings.basis (Psi4's bracket notation extrapolates). settings.charge/spin:
    None takes the file's. context_of(): a fresh RunContext per run; on_run(basis, system, result)
    after each. Every system is checked in every basis (`composite_runs`) before the first runs."""
    planned, notes = composite_runs(frame, settings, bsse, scf_extrapolation)
    bases = expand_basis(settings.basis)
    systems = [system for system, _ in planned[bases[0][1]]]
    per_basis, runs = [], {}
    for cardinal, basis in bases:
        energies, records = {}, {}
        for system, system_settings in planned[basis]:
            result = run_atoms(list(system.atoms), system_settings, context_of() if context_of else None)
            energies[system.name], records[system.name] = energies_of(result), result.as_dict()
            if on_run is not None:
                on_run(basis, system, result)
        runs[basis] = {"cardinal": cardinal, "energies": energies, "runs": records}
        if bsse:
            runs[basis]["interaction"] = interaction(energies, bsse)
        per_basis.append((cardinal, energies))
    record = {"workflow": [w for w in ("counterpoise" if bsse else "", "extrapolation" if len(bases) > 1 else "") if w],
              "basis": settings.basis, "bases": [b for _, b in bases], "per_basis": runs,
              "systems": [{"name": s.name, "charge": s.charge, "spin": s.spin,
                           "atoms": [[a.label, *a.xyz] for a in s.atoms]} for s in systems]}
    if bsse:
        record["bsse"] = list(bsse)
    record["notes"] = list(notes)
    final = runs[bases[-1][1]]
    if len(bases) > 1:
        limit = {name: extrapolated([(x, runs[b]["energies"][name]) for x, b in bases], scf_extrapolation)
                 for name in final["energies"]}
        record["extrapolation"] = {"scheme": scheme_names(scf_extrapolation, len(bases)), "energies": limit}
        if bsse:
            record["extrapolation"]["interaction"] = interaction(limit, bsse)
        energies, inter = limit, record["extrapolation"].get("interaction")
    else:
        energies, inter = final["energies"], final.get("interaction")
    record["energies"] = energies
    if inter is not None:
        record["interaction"] = inter
        record["interaction_kcal_mol"] = {kind: in_kcal_per_mol(values) for kind, values in inter.items()}
    return CompositeResult(record)
