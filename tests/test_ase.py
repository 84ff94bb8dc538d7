"""The ASE calculator (dfmp2/ase.py -> dfmp2/api/ase_calculator.py): units against run_atoms and
ASE's own finite differences, and an ASE BFGS optimisation against dfmp2's geomeTRIC one."""

import numpy as np
import pytest
from ase import Atoms  # the `workflows` extra, which `test` installs (not skipped: CI runs these)
from ase.calculators.fd import calculate_numerical_forces
from ase.optimize import BFGS
from ase.units import Bohr, Hartree

import dfmp2
from dfmp2 import chem
from dfmp2.app.optimize import optimize_atoms
from dfmp2.ase import DFMP2Calculator
from dfmp2.run.settings import Settings

DISTORTED_WATER = [("O", (0.0, 0.0, 0.1)), ("H", (0.0, 0.8, -0.45)), ("H", (0.0, -0.75, -0.5))]  # Angstrom
PARAMETERS = {"basis": "cc-pvdz", "frozen_core": True}


def _atoms():
    return Atoms([s for s, _ in DISTORTED_WATER], positions=[x for _, x in DISTORTED_WATER])


def test_energy_and_forces_in_ase_units():
    """energy = run_atoms' E_total * Hartree (eV, 1e-10 Eh), forces = -gradient * Hartree/Bohr
    (eV/Angstrom, 1e-10 Eh/bohr); the forces are ASE's central differences of the energies (2e-4
    Angstrom) to 2e-5 eV/Angstrom (4e-7 Eh/bohr; measured 1.9e-6); results["dfmp2"] is the record."""
    atoms = _atoms()
    atoms.calc = DFMP2Calculator(**PARAMETERS)
    forces, energy = atoms.get_forces(), atoms.get_potential_energy()
    ours = dfmp2.run_atoms([chem.Atom(s, x) for s, x in DISTORTED_WATER], gradient=True, **PARAMETERS)
    assert abs(energy / Hartree - ours.e_tot) < 1e-10
    assert np.abs(-forces * Bohr / Hartree - np.asarray(ours.gradient)).max() < 1e-10
    result = atoms.calc.results["dfmp2"]
    assert result.e_tot == ours.e_tot and result.as_dict()["nfrozen"] == 1
    numeric = calculate_numerical_forces(atoms, eps=2e-4)
    assert np.abs(numeric - forces).max() < 2e-5


def test_parameters_are_settings_fields():
    with pytest.raises(dfmp2.InputError, match="unknown parameter 'bassis'"):
        DFMP2Calculator(bassis="cc-pvdz")
    calc = DFMP2Calculator(basis="sto-3g")
    with pytest.raises(dfmp2.InputError, match="frozen"):
        calc.set(frozen="1")
    atoms = _atoms()
    atoms.pbc = True
    atoms.cell = [10, 10, 10]
    atoms.calc = calc
    with pytest.raises(dfmp2.InputError, match="periodic"):
        atoms.get_potential_energy()


def _internal(coords):
    """(r(O-H1), r(O-H2), r(H1-H2)) in Angstrom: the shape, whatever the frame."""
    return np.array([np.linalg.norm(coords[1] - coords[0]), np.linalg.norm(coords[2] - coords[0]),
                     np.linalg.norm(coords[2] - coords[1])])


def _aligned_rms(a, b):
    """RMS distance (Angstrom) of b onto a after the best translation and rotation (Kabsch)."""
    a, b = a - a.mean(axis=0), b - b.mean(axis=0)
    u, _, vt = np.linalg.svd(b.T @ a)
    d = np.sign(np.linalg.det(u @ vt))
    rotation = u @ np.diag([1.0, 1.0, d]) @ vt
    return float(np.sqrt(((b @ rotation - a) ** 2).sum(axis=1).mean()))


def test_ase_bfgs_reaches_the_geometry_optimize_atoms_finds():
    """ASE's BFGS (fmax 1e-4 eV/Angstrom) on the calculator and dfmp2's optimize_atoms (geomeTRIC)
    with the same settings, from the same distorted water: the same bonds and H-H distance to 1e-4
    Angstrom, aligned RMS below 1e-4 Angstrom, the same energy to 1e-8 Eh (measured: distances
    6e-6 A, aligned RMS 2.8e-6 A, angle 4.5e-4 degree, energy 1e-11 Eh; 6 BFGS and 4 geomeTRIC steps)."""
    atoms = _atoms()
    atoms.calc = DFMP2Calculator(**PARAMETERS)
    optimizer = BFGS(atoms, logfile=None)
    assert optimizer.run(fmax=1e-4, steps=100)
    found = optimize_atoms([chem.Atom(s, x) for s, x in DISTORTED_WATER], Settings(**PARAMETERS))
    assert found.converged
    theirs = np.array([a.xyz for a in found.atoms])
    assert np.abs(_internal(atoms.positions) - _internal(theirs)).max() < 1e-4
    assert _aligned_rms(atoms.positions, theirs) < 1e-4
    assert abs(atoms.get_potential_energy() / Hartree - found.steps[found.final_step].energy) < 1e-8


# ----------------------------------------------------------------------------- issue 60

def test_pickled_calculator_computes_the_same_energy():
    """A calculator survives pickling (ASE's parallel workflows, multiprocessing): a pickled fresh
    one computes the same energy as the original (1e-10 Eh); a pickled used one keeps its energy
    and forces (not the DFMP2Result, which holds PySCF's SCF object) and computes the same
    energies again; free_energy is the energy (force_consistent=True)."""
    import pickle

    atoms = _atoms()
    atoms.calc = DFMP2Calculator(**PARAMETERS)
    energy = atoms.get_potential_energy()
    assert atoms.get_potential_energy(force_consistent=True) == energy == atoms.calc.results["free_energy"]
    forces = atoms.get_forces()
    used = pickle.loads(pickle.dumps(atoms.calc))
    assert used.results["energy"] == energy and np.array_equal(used.results["forces"], forces)
    assert "dfmp2" not in used.results and used.parameters == atoms.calc.parameters
    other = _atoms()
    other.calc = pickle.loads(pickle.dumps(DFMP2Calculator(**PARAMETERS)))
    assert abs(other.get_potential_energy() - energy) / Hartree < 1e-10
    other.positions[0, 2] += 0.01
    other.calc = used
    moved = other.get_potential_energy()
    assert used.results["dfmp2"].e_tot * Hartree == moved and abs(moved - energy) > 1e-6


def test_extrapolated_basis_gives_the_limit_energy_and_refuses_forces():
    """basis="cc-pv[dt]z": the energy is E_HF(TZ) + (27 E_c(TZ) - 8 E_c(DZ)) / 19 of two run_atoms
    runs (1e-10 Eh), results["dfmp2"] the composite's record; forces are refused before any run,
    as dfmp2's InputError and ASE's PropertyNotImplementedError, naming the basis."""
    from ase.calculators.calculator import PropertyNotImplementedError

    atoms = _atoms()
    atoms.calc = DFMP2Calculator(basis="cc-pv[dt]z", frozen_core=True)
    with pytest.raises(dfmp2.InputError, match=r"forces with basis 'cc-pv\[dt\]z': an extrapolated basis"):
        atoms.get_forces()
    with pytest.raises(PropertyNotImplementedError):
        atoms.get_forces()
    assert atoms.calc.results == {}
    energy = atoms.get_potential_energy() / Hartree
    molecule = [chem.Atom(s, x) for s, x in DISTORTED_WATER]
    dz, tz = (dfmp2.run_atoms(molecule, basis=b, frozen_core=True) for b in ("cc-pvdz", "cc-pvtz"))
    assert abs(energy - (tz.e_ref + (27 * tz.e_corr - 8 * dz.e_corr) / 19)) < 1e-10
    assert atoms.calc.results["dfmp2"].as_dict()["bases"] == ["cc-pvdz", "cc-pvtz"]
    assert atoms.get_potential_energy(force_consistent=True) == energy * Hartree
