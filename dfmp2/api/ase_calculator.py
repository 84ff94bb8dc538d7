"""dfmp2 as an ASE calculator (`dfmp2.ase.DFMP2Calculator`; needs ase, the `workflows` extra).

    from dfmp2.ase import DFMP2Calculator
    atoms.calc = DFMP2Calculator(basis="cc-pvdz", frozen_core=True)   # Settings fields
    atoms.get_potential_energy(), atoms.get_forces()                   # eV, eV/Angstrom

Parameters: the `Settings` fields as keyword arguments (checked when given). energy: E_total
(E_HF + E_corr; a double hybrid's with xc) in eV, and free_energy the same (a molecular MP2 has
no electronic smearing, as ASE's molecular calculators report it); forces: minus the analytic
gradient in eV/Angstrom (ase.units.Hartree and Bohr), computed when asked for. results["dfmp2"]:
the last run's DFMP2Result. Periodic atoms are refused.

Charge and 2S (`charge_and_spin_of`): the charge is the sum of the atoms' initial charges
(atoms.set_initial_charges) and 2S the sum of their initial magnetic moments (set_initial_magnetic_moments,
in Bohr magnetons: the unpaired electrons), as ASE's Gaussian and Q-Chem calculators take them, each a
whole number to MOMENT_TOLERANCE (rounded to it; else refused); or the charge and spin parameters. A
parameter and the atoms' values that disagree are refused (neither silently wins); all-zero initial
values, ASE's default, give nothing. Given neither, the charge is 0 and 2S the lowest spin of the
electrons (a doublet for an odd count, as `dfmp2 run` takes a file without a `charge multiplicity`
line, with its note), by the one rule every input has (`chem.charge_and_spin`).

A basis in Psi4's bracket notation (basis="cc-pv[dt]z") gives the energy at the basis-set limit
(`composite.run_composite`, as `dfmp2 run --basis cc-pv[dt]z`; HF from the largest basis):
energies only, so forces (and a gradient) are refused by name before anything runs (NoForcesError: an
InputError and ASE's PropertyNotImplementedError); results["dfmp2"] is then the CompositeResult.

Pickling (ASE's parallel workflows, multiprocessing) keeps the parameters, the atoms and the
energies and forces computed; results["dfmp2"] stays behind (the DFMP2Result holds PySCF's SCF
object, which does not pickle) until the next calculation.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.units import Bohr, Hartree

from .. import chem
from ..run.settings import Settings
from ..util.errors import InputError
from .composite import is_composite, run_composite
from .driver import run_atoms

RECORD = "dfmp2"  # results[RECORD]: the last run's DFMP2Result (or CompositeResult)


class NoForcesError(InputError, PropertyNotImplementedError):
    """Forces asked of an extrapolated basis: bad input (dfmp2's InputError, exit 2) and ASE's
    PropertyNotImplementedError (what ASE code catches for a property a calculator lacks)."""


class DFMP2Calculator(Calculator):
    """ASE calculator: DF-MP2 energy (eV) and forces (eV/Angstrom) of a molecule (module docstring)."""

    implemented_properties = ["energy", "free_energy", "forces"]
    discard_results_on_any_change = True

    def set(self, **changes) -> dict:
        """Change parameters (Settings fields); an unknown name or a bad value is an InputError, at once."""
        settings(dict(self.parameters or {}, **changes))
        return super().set(**changes)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        """One run_atoms at self.atoms (positions in Angstrom), with the gradient where forces are
        asked for; an extrapolated basis: run_composite, energies only."""
        super().calculate(atoms, properties, system_changes)
        if np.any(self.atoms.pbc):
            raise InputError("periodic atoms (pbc): dfmp2 computes molecules; set atoms.pbc = False")
        chosen = settings(self.parameters)
        molecule = [chem.Atom(chem.element_symbol(symbol), tuple(float(c) for c in xyz))
                    for symbol, xyz in zip(self.atoms.get_chemical_symbols(), self.atoms.positions)]
        found = charge_and_spin_of(self.atoms, self.parameters, molecule)
        chosen = chosen.replace(charge=found.charge, spin=found.spin)
        if is_composite(chosen.basis, ()):
            self._extrapolated(molecule, chosen, properties)
            return
        result = run_atoms(molecule, chosen.replace(gradient=chosen.gradient or "forces" in properties),
                           notes=found.notes)
        energy = float(result.e_tot) * Hartree
        self.results = {"energy": energy, "free_energy": energy, RECORD: result}
        if result.gradient is not None:
            self.results["forces"] = -np.asarray(result.gradient, dtype=np.float64) * (Hartree / Bohr)

    def _extrapolated(self, molecule, chosen, properties) -> None:
        """The basis-set limit's energy (run_composite); forces refused before anything runs."""
        if "forces" in properties or chosen.gradient:
            raise NoForcesError(
                f"forces with basis {chosen.basis!r}: an extrapolated basis gives the energy only (dfmp2 has no "
                "gradient of a composite); use one basis for forces and optimisations")
        frame = chem.Frame.whole(molecule, "atoms")
        composite = run_composite(frame, chosen)
        energy = float(composite.record["energies"]["whole"]["e_tot"]) * Hartree
        self.results = {"energy": energy, "free_energy": energy, RECORD: composite}

    def __getstate__(self) -> dict:
        """The calculator without results[RECORD] (PySCF's SCF object does not pickle)."""
        state = self.__dict__.copy()
        state["results"] = {k: v for k, v in self.results.items() if k != RECORD}
        return state


MOMENT_TOLERANCE = 0.01  # a sum of initial charges or moments this close to a whole number is that number


def charge_and_spin_of(atoms, parameters, molecule) -> chem.ChargeSpin:
    """The charge and 2S of ASE `atoms` (module docstring): the charge and spin `parameters`, or
    the sums of the atoms' initial charges and magnetic moments, through `chem.charge_and_spin` on
    `molecule` ([chem.Atom]); InputError for a sum that is no whole number, a parameter that
    disagrees with the atoms' values, or a state the electrons cannot have."""
    moments = np.asarray(atoms.get_initial_magnetic_moments(), dtype=np.float64)
    if moments.ndim == 2 and moments.any():
        raise InputError("non-collinear initial magnetic moments (3 per atom): dfmp2 computes collinear spins "
                         "(give one moment per atom: its unpaired electrons)")
    charge = _chosen("charge", parameters, _whole_sum(atoms.get_initial_charges(), "initial charges"))
    spin = _chosen("spin", parameters, _whole_sum(moments, "initial magnetic moments"))
    notes = ()
    if spin is not None and spin < 0 and parameters.get("spin") is None:  # moments down: the same multiplet
        notes, spin = (f"2S {-spin}: the initial magnetic moments sum to {spin} (dfmp2's unpaired electrons are "
                       "alpha: the same state, M_S = S)",), -spin
    from_atoms = parameters.get("charge") is None and charge is not None
    found = chem.charge_and_spin(chem.Frame.whole(molecule, "atoms"), charge, spin,
                                 "the initial charges' sum" if from_atoms else "charge",
                                 "spin or the initial magnetic moments")
    return replace(found, notes=tuple(found.notes) + notes)


def _whole_sum(values, what):
    """The whole number the per-atom `values` sum to, or None where all are 0 (ASE's default)."""
    values = np.asarray(values, dtype=np.float64)
    if not values.any():
        return None
    total = float(values.sum())
    if not np.isfinite(total) or abs(total - round(total)) > MOMENT_TOLERANCE:
        raise InputError(f"the atoms' {what} sum to {total:g}: not a whole number (the molecule's "
                         f"{'charge' if what == 'initial charges' else '2S, its unpaired electrons'})")
    return int(round(total))


def _chosen(name, parameters, from_atoms):
    """The calculator's parameter `name` (charge or spin) where given, else the atoms' value
    (None: neither); InputError where both are given and differ (its kind: Settings', at `set`)."""
    given = parameters.get(name)
    if given is None or from_atoms is None:
        return from_atoms if given is None else int(given)
    if (abs(from_atoms) if name == "spin" else from_atoms) != given:  # (moments down: the same 2S)
        what = "initial charges" if name == "charge" else "initial magnetic moments"
        raise InputError(f"DFMP2Calculator({name}={given}) disagrees with the atoms' {what} (sum {from_atoms}): "
                         "give one of them")
    return int(given)


def settings(parameters) -> Settings:
    """The Settings the parameters give (InputError naming an unknown one)."""
    unknown = sorted(set(parameters) - {field.name for field in fields(Settings)})
    if unknown:
        raise InputError(f"DFMP2Calculator: unknown parameter {unknown[0]!r} (its parameters are the Settings fields)")
    try:
        return Settings(**dict(parameters))
    except InputError as error:  # (Settings' one check of each kind, named as the calculator's)
        raise InputError(f"DFMP2Calculator: {error}") from None
