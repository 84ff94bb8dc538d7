"""dfmp2 as an ASE calculator (`dfmp2.ase.DFMP2Calculator`; needs ase, the `workflows` extra).

    from dfmp2.ase import DFMP2Calculator
    atoms.calc = DFMP2Calculator(basis="cc-pvdz", frozen_core=True)   # Settings fields
    atoms.get_potential_energy(), atoms.get_forces()                   # eV, eV/Angstrom

Parameters: the `Settings` fields as keyword arguments (checked when given). energy: E_total
(E_HF + E_corr; a double hybrid's with xc) in eV; forces: minus the analytic gradient in
eV/Angstrom (ase.units.Hartree and Bohr), computed when asked for. results["dfmp2"]: the last
run's DFMP2Result. Charge and 2S are the charge and spin parameters (ASE's initial charges and
magnetic moments are not read); periodic atoms are refused.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from ase.calculators.calculator import Calculator, all_changes
from ase.units import Bohr, Hartree

from .. import chem
from ..run.settings import Settings
from ..util.errors import InputError
from .driver import run_atoms


class DFMP2Calculator(Calculator):
    """ASE calculator: DF-MP2 energy (eV) and forces (eV/Angstrom) of a molecule (module docstring)."""

    implemented_properties = ["energy", "forces"]
    discard_results_on_any_change = True

    def set(self, **changes) -> dict:
        """Change parameters (Settings fields); an unknown name or a bad value is an InputError, at once."""
        settings(dict(self.parameters or {}, **changes))
        return super().set(**changes)

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        """One run_atoms at self.atoms (positions in Angstrom), with the gradient where forces are asked for."""
        super().calculate(atoms, properties, system_changes)
        if np.any(self.atoms.pbc):
            raise InputError("periodic atoms (pbc): dfmp2 computes molecules; set atoms.pbc = False")
        chosen = settings(self.parameters)
        molecule = [chem.Atom(chem.element_symbol(symbol), tuple(float(c) for c in xyz))
                    for symbol, xyz in zip(self.atoms.get_chemical_symbols(), self.atoms.positions)]
        result = run_atoms(molecule, chosen.replace(gradient=chosen.gradient or "forces" in properties))
        self.results = {"energy": float(result.e_tot) * Hartree, "dfmp2": result}
        if result.gradient is not None:
            self.results["forces"] = -np.asarray(result.gradient, dtype=np.float64) * (Hartree / Bohr)


def settings(parameters) -> Settings:
    """The Settings the parameters give (InputError naming an unknown one)."""
    unknown = sorted(set(parameters) - {field.name for field in fields(Settings)})
    if unknown:
        raise InputError(f"DFMP2Calculator: unknown parameter {unknown[0]!r} (its parameters are the Settings fields)")
    return Settings(**dict(parameters))
