"""dfmp2 as an ASE calculator (`dfmp2.ase.DFMP2Calculator`; needs ase, the `workflows` extra).

    from dfmp2.ase import DFMP2Calculator
    atoms.calc = DFMP2Calculator(basis="cc-pvdz", frozen_core=True)   # Settings fields
    atoms.get_potential_energy(), atoms.get_forces()                   # eV, eV/Angstrom

Parameters: the `Settings` fields as keyword arguments (checked when given). energy: E_total
(E_HF + E_corr; a double hybrid's with xc) in eV, and free_energy the same (a molecular MP2 has
no electronic smearing, as ASE's molecular calculators report it); forces: minus the analytic
gradient in eV/Angstrom (ase.units.Hartree and Bohr), computed when asked for. results["dfmp2"]:
the last run's DFMP2Result. Charge and 2S are the charge and spin parameters (ASE's initial
charges and magnetic moments are not read); periodic atoms are refused.

A basis in Psi4's bracket notation (basis="cc-pv[dt]z") gives the energy at the basis-set limit
(`composite.run_composite`, as `dfmp2 run --basis cc-pv[dt]z`; HF from the largest basis):
energies only, so forces (and a gradient) are refused by name before anything runs (NoForcesError: an
InputError and ASE's PropertyNotImplementedError); results["dfmp2"] is then the CompositeResult.

Pickling (ASE's parallel workflows, multiprocessing) keeps the parameters, the atoms and the
energies and forces computed; results["dfmp2"] stays behind (the DFMP2Result holds PySCF's SCF
object, which does not pickle) until the next calculation.
"""

from __future__ import annotations

from dataclasses import fields

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
        if is_composite(chosen.basis, ()):
            self._extrapolated(molecule, chosen, properties)
            return
        result = run_atoms(molecule, chosen.replace(gradient=chosen.gradient or "forces" in properties))
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


def settings(parameters) -> Settings:
    """The Settings the parameters give (InputError naming an unknown one)."""
    unknown = sorted(set(parameters) - {field.name for field in fields(Settings)})
    if unknown:
        raise InputError(f"DFMP2Calculator: unknown parameter {unknown[0]!r} (its parameters are the Settings fields)")
    return Settings(**dict(parameters))
