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
    values["e_tot_scs"] = result.e_ref + result.e_scs
    return values


def fragment_charges(frame, charge: int | None, spin: int | None) -> list:
    """[(charge, 2S)] of each fragment of `frame`: as its file gives them, else neutral and the
    lowest spin its electrons allow (0 or 1). The whole's (charge, spin) given as well must be
    the fragments' sum (high-spin coupled); a charged whole needs each fragment's line."""
    found = []
    for k, fragment in enumerate(frame.fragments):
        if fragment.charge is not None:
            found.append((fragment.charge, fragment.multiplicity - 1))
            continue
        if charge:
            raise InputError(f"{frame.name}: charge {charge} for {len(frame.fragments)} fragments: give each fragment's "
                             "'charge multiplicity' line after its '--'")
        electrons = sum(chem.atomic_number(a.symbol) for a in frame.atoms[fragment.start:fragment.stop] if not a.ghost)
        found.append((0, electrons % 2))
    whole = (sum(c for c, _ in found), sum(s for _, s in found))
    if (charge is not None and charge != whole[0]) or (spin is not None and spin != whole[1]):
        raise InputError(f"{frame.name}: {option('charge')} {charge} / {option('spin')} {spin} disagree with the "
                         f"fragments' charge {whole[0]} and 2S {whole[1]} (their 'charge multiplicity' lines)")
    return found


def whole_charge_spin(frame, charge: int | None, spin: int | None) -> tuple:
    """(charge, 2S) of the whole frame: the fragments' sum where its file gives any fragment's
    'charge multiplicity' line (`fragment_charges`), else the given ones (None: 0)."""
    if all(f.charge is None for f in frame.fragments):
        return charge or 0, spin or 0
    found = fragment_charges(frame, charge, spin)
    return sum(c for c, _ in found), sum(s for _, s in found)


def is_composite(basis: str, bsse) -> bool:
    """Whether a run is several runs combined: interaction energies asked for, or a basis in
    Psi4's bracket notation (`expand_basis`, which checks it)."""
    return bool(bsse) or len(expand_basis(basis)) > 1


def counterpoise_systems(frame, bsse, charge=None, spin=None) -> list:
    """The systems of a counterpoise computation on the fragments of `frame`: the whole, each
    fragment in the whole's basis (the others ghosts; "cp"), each fragment alone ("nocp")."""
    if len(frame.fragments) < 2:
        raise InputError(f"{frame.name}: counterpoise needs fragments: separate them with a line '--' "
                         "(optionally followed by each fragment's 'charge multiplicity' line)")
    unknown = sorted(set(bsse) - set(BSSE_TYPES))
    if unknown or not bsse:
        raise InputError(f"--bsse {','.join(bsse)}: expected cp, nocp or cp,nocp")
    for k, fragment in enumerate(frame.fragments, start=1):
        if all(a.ghost for a in frame.atoms[fragment.start:fragment.stop]):
            raise InputError(f"{frame.name}: fragment {k} holds ghost atoms only: a fragment of a counterpoise "
                             "computation needs real atoms")
    charges = fragment_charges(frame, charge, spin)
    atoms = frame.atoms
    systems = [System("whole", atoms, sum(c for c, _ in charges), sum(s for _, s in charges))]
    for k, (fragment, (q, s)) in enumerate(zip(frame.fragments, charges), start=1):
        inside = range(fragment.start, fragment.stop)
        if "cp" in bsse:
            ghosted = tuple(a if i in inside else chem.Atom(a.symbol, a.xyz, True) for i, a in enumerate(atoms))
            systems.append(System(f"fragment {k} (whole basis)", ghosted, q, s))
        if "nocp" in bsse:
            systems.append(System(f"fragment {k} (own basis)", tuple(atoms[i] for i in inside), q, s))
    return systems


def interaction(energies: dict, bsse) -> dict:
    """{"cp"/"nocp": {component: E_int (Eh)}} from {system name: energies}."""
    whole = energies["whole"]
    found = {}
    for kind, label in (("cp", "whole basis"), ("nocp", "own basis")):
        if kind not in bsse:
            continue
        parts = [e for name, e in energies.items() if name.endswith(f"({label})")]
        found[kind] = {c: whole[c] - sum(p[c] for p in parts) for c in COMPONENTS}
    return found


def in_kcal_per_mol(values: dict) -> dict:
    return {name: value * KCAL_PER_HARTREE for name, value in values.items()}


def extrapolated(per_basis: list, scf_scheme: str) -> dict:
    """Components at the basis-set limit from [(X, energies)] (smallest X first): the reference
    energy by `scf_scheme`, each correlation part by Helgaker's X^-3 on the two largest bases."""
    found = {"e_ref": extrapolate_scf([(x, e["e_ref"]) for x, e in per_basis], scf_scheme)}
    for name in CORRELATION:
        found[name] = extrapolate_correlation([(x, e[name]) for x, e in per_basis])
    found["e_tot"] = found["e_ref"] + found["e_corr"]
    found["e_tot_scs"] = found["e_ref"] + found["e_scs"]
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


def run_composite(frame, settings: Settings, bsse=(), scf_extrapolation="highest", context_of=None,
                  on_run=None) -> CompositeResult:
    """Long (one loop over bases and systems, then the record): the counterpoise systems of
    `frame` (bsse: "cp", "nocp"; none: the frame as one system) in each basis of
    settings.basis (Psi4's bracket notation extrapolates). settings.charge/spin: None takes the
    file's. context_of(): a fresh RunContext per run; on_run(basis, system, result) after each."""
    bases = expand_basis(settings.basis)
    check_scf_scheme(scf_extrapolation)  # before any run
    if len(bases) > 1 and settings.xc is not None:
        raise InputError(f"basis-set extrapolation is of MP2's correlation energy: not with {option('xc')}")
    check_composite_settings(settings)
    if bsse:
        systems = counterpoise_systems(frame, bsse, settings.charge, settings.spin)
    else:
        systems = [System("whole", frame.atoms, *whole_charge_spin(frame, settings.charge, settings.spin))]
    per_basis, runs = [], {}
    for cardinal, basis in bases:
        energies, records = {}, {}
        for system in systems:
            result = run_atoms(list(system.atoms), settings.replace(basis=basis, charge=system.charge, spin=system.spin),
                               context_of() if context_of else None)
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
