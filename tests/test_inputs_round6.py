"""Inputs the sixth hostile battery (issue 72) found taken wrongly: environment values that
crashed with a ValueError (exit 1) instead of one line naming the variable (exit 2); ASE's initial
charges and magnetic moments ignored; QCSchema v2 keys out of place run without a word, and a
device that is not usable typed unknown_error; ghost atoms moved by an optimisation; a cut last
frame failing its whole file; device names in upper case, a byte-order mark and numbers Python
reads but no XYZ file writes. Each test failed on 09f317c."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

from dfmp2.util import environment
from dfmp2.util.errors import InputError

WATER = Path(ROOT) / "examples" / "water.xyz"


# ----------------------------------------------------------------------------- environment values

BAD_NUMBERS = ["abc", "2.5", "\u00b2", "-1", "1e3", "0x10", " 4 4", "\u0664"]  # '²' and Arabic-Indic 4 are str.isdigit()


@pytest.mark.parametrize("name", sorted(environment.WHOLE_NUMBERS))
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_every_whole_number_variable_refuses_what_is_not_one(name, value):
    """The class: every variable dfmp2 reads as a number is judged in one place, and anything but
    ASCII digits is one line naming it."""
    with pytest.raises(InputError, match=rf"^environment variable {name}=.* is not a whole number"):
        environment.whole_number(name, environ={name: value})
    with pytest.raises(InputError, match=rf"^environment variable {name}="):
        environment.check_values(environ={name: value})


def test_whole_numbers_are_read_and_their_least_value_held():
    assert environment.whole_number("LOCAL_WORLD_SIZE", 1, environ={"LOCAL_WORLD_SIZE": " 4 "}) == 4
    assert environment.whole_number("LOCAL_WORLD_SIZE", 1, environ={}) == 1
    assert environment.whole_number("SLURM_MEM_PER_NODE", environ={"SLURM_MEM_PER_NODE": "0"}) == 0
    with pytest.raises(InputError, match="from 1"):
        environment.whole_number("WORLD_SIZE", environ={"WORLD_SIZE": "0"})


@pytest.mark.parametrize("variable", ["LOCAL_WORLD_SIZE=abc", "LOCAL_WORLD_SIZE=2.5", "SLURM_MEM_PER_CPU=\u00b2",
                                      "SLURM_MEM_PER_GPU=lots", "WORLD_SIZE=two"])
def test_a_bad_environment_value_is_one_line_and_exit_2(tmp_path, variable):
    """LOCAL_WORLD_SIZE=abc or 2.5, SLURM_MEM_PER_CPU=² were exit 1 with a ValueError."""
    name, value = variable.split("=")
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(WATER), "--json", "out.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, name: value})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{name}=" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_the_api_refuses_a_bad_environment_value_before_the_scf(monkeypatch):
    import dfmp2
    from dfmp2.chem import Atom

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "abc")
    atoms = [Atom("H", (0.0, 0.0, 0.0)), Atom("H", (0.0, 0.0, 0.74))]
    with pytest.raises(InputError, match="LOCAL_WORLD_SIZE"):
        dfmp2.run_atoms(atoms)


def _cli(tmp_path, capsys, *args):
    """`dfmp2 ARGS` in this process, in `tmp_path`: (exit status, stderr)."""
    from dfmp2.app.cli import main

    capsys.readouterr()
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(SystemExit) as stop:
            main([str(arg) for arg in args])
    finally:
        os.chdir(before)
    return stop.value.code, capsys.readouterr().err


# ----------------------------------------------------------------------------- ASE: charges and moments

WATER_ATOMS = [("O", (0.0, 0.0, 0.1173)), ("H", (0.0, 0.7572, -0.4692)), ("H", (0.0, -0.7572, -0.4692))]


def _ase_atoms(atoms):
    from ase import Atoms

    return Atoms([s for s, _ in atoms], positions=[x for _, x in atoms])


def test_ase_magnetic_moments_give_the_triplet_oxygen_atom():
    """An O atom with initial magnetic moment 2 ran as an RHF singlet: now 2S 2 (UHF), its energy
    run_atoms' with spin=2 (1e-10 Eh) and PySCF's DF-UHF and DFUMP2 on the same fitting sets (1e-8 Eh)."""
    pytest.importorskip("ase")
    from ase.units import Hartree
    from pyscf import df, gto, scf
    from pyscf.mp.dfump2 import DFUMP2

    import dfmp2
    from dfmp2.ase import DFMP2Calculator

    atom = _ase_atoms([("O", (0.0, 0.0, 0.0))])
    atom.set_initial_magnetic_moments([2.0])
    atom.calc = DFMP2Calculator(basis="cc-pvdz")
    energy = atom.get_potential_energy() / Hartree
    result = atom.calc.results["dfmp2"]
    assert result.reference == "uhf" and result.mean_field.mol.spin == 2
    ours = dfmp2.run_atoms([dfmp2.chem.Atom("O", (0.0, 0.0, 0.0))], basis="cc-pvdz", spin=2)
    assert abs(energy - ours.e_tot) < 1e-10
    mol = gto.M(atom="O 0 0 0", basis="cc-pvdz", spin=2, verbose=0)
    mf = scf.UHF(mol).density_fit()
    mf.conv_tol = 1e-11
    mf.kernel()
    pt = DFUMP2(mf)
    pt.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    pt.kernel()
    assert abs(result.e_hf - mf.e_tot) < 1e-8 and abs(energy - (mf.e_tot + pt.e_corr)) < 1e-8


def test_ase_initial_charges_give_the_cation_and_odd_electrons_a_doublet():
    """Water with initial charges summing to +1 ran as neutral, and OH was refused (the command
    line takes it as a doublet): now the cation doublet (run_atoms' energy with charge 1, spin 1),
    and OH a doublet with the note `dfmp2 run` gives it."""
    pytest.importorskip("ase")
    from ase.units import Hartree

    import dfmp2
    from dfmp2.ase import DFMP2Calculator

    water = _ase_atoms(WATER_ATOMS)
    water.set_initial_charges([0.4, 0.3, 0.3])
    water.calc = DFMP2Calculator(basis="sto-3g")
    energy = water.get_potential_energy() / Hartree
    mol = water.calc.results["dfmp2"].mean_field.mol
    assert (mol.charge, mol.spin) == (1, 1)
    cation = dfmp2.run_atoms([dfmp2.chem.Atom(s, x) for s, x in WATER_ATOMS], basis="sto-3g", charge=1, spin=1)
    assert abs(energy - cation.e_tot) < 1e-10
    hydroxyl = _ase_atoms([("O", (0.0, 0.0, 0.0)), ("H", (0.0, 0.0, 0.97))])
    hydroxyl.calc = DFMP2Calculator(basis="sto-3g")
    energy = hydroxyl.get_potential_energy() / Hartree
    result = hydroxyl.calc.results["dfmp2"]
    doublet = dfmp2.run_atoms([dfmp2.chem.Atom("O", (0.0, 0.0, 0.0)), dfmp2.chem.Atom("H", (0.0, 0.0, 0.97))],
                              basis="sto-3g", spin=1)
    assert result.mean_field.mol.spin == 1 and abs(energy - doublet.e_tot) < 1e-10
    assert any(note.startswith("2S 1: the lowest spin of 9 electrons") for note in result.notes), result.notes


@pytest.mark.parametrize("parameters, charges, moments, message", [
    ({"charge": 0}, [1, 0, 0], None, r"DFMP2Calculator\(charge=0\) disagrees with the atoms' initial charges"),
    ({"spin": 0}, None, [1, 1, 0], r"DFMP2Calculator\(spin=0\) disagrees with the atoms' initial magnetic moments"),
    ({}, None, [0.5, 0, 0], "initial magnetic moments sum to 0.5: not a whole number"),
    ({}, [0.5, 0, 0], None, "initial charges sum to 0.5: not a whole number"),
    ({}, None, [1, 0, 0], r"2S 1 \(spin or the initial magnetic moments\) is impossible with 10 electrons"),
    ({"charge": 1.0}, None, None, r"DFMP2Calculator: charge must be a whole number, got 1.0"),
])
def test_ase_charge_and_spin_that_disagree_are_refused_before_anything_runs(monkeypatch, parameters, charges,
                                                                          moments, message):
    """A parameter that disagrees with the atoms' values is refused (neither wins), and so is a
    sum that is no whole number or a state the electrons cannot have: one line, nothing run (the
    old calculator ran the parameters' state and ignored the atoms')."""
    pytest.importorskip("ase")
    from dfmp2.api import ase_calculator
    from dfmp2.ase import DFMP2Calculator

    monkeypatch.setattr(ase_calculator, "run_atoms", lambda *a, **k: pytest.fail("ran"))
    water = _ase_atoms(WATER_ATOMS)
    if charges is not None:
        water.set_initial_charges(charges)
    if moments is not None:
        water.set_initial_magnetic_moments(moments)
    with pytest.raises(InputError, match=message) as raised:  # (a parameter of the wrong kind: at once, by Settings)
        water.calc = DFMP2Calculator(basis="sto-3g", **parameters)
        water.get_potential_energy()
    assert "\n" not in str(raised.value)


def test_ase_agreeing_values_and_moments_down_are_the_same_state():
    """A parameter equal to the atoms' value is taken; moments summing to -2 are the triplet
    (M_S = -1 of it: the same energy), with a note."""
    pytest.importorskip("ase")
    from dfmp2.api.ase_calculator import charge_and_spin_of

    atoms = [dfmp2_atom(s, x) for s, x in WATER_ATOMS]
    water = _ase_atoms(WATER_ATOMS)
    water.set_initial_charges([1, 0, 0])
    found = charge_and_spin_of(water, {"charge": 1}, atoms)
    assert (found.charge, found.spin) == (1, 1)
    water.set_initial_charges(None)
    water.set_initial_magnetic_moments([-1.0, -0.5, -0.5])
    found = charge_and_spin_of(water, {}, atoms)
    assert (found.charge, found.spin) == (0, 2) and "sum to -2" in found.notes[-1]


def dfmp2_atom(symbol, xyz):
    from dfmp2 import chem

    return chem.Atom(symbol, xyz)


# ----------------------------------------------------------------------------- QCSchema: layouts and error types

WATER_BOHR = [0.0, 0.0, 0.2216655, 0.0, 1.4309, -0.8866, 0.0, -1.4309, -0.8866]
QC_WATER = {"symbols": ["O", "H", "H"], "geometry": WATER_BOHR}


def _v1(**changes):
    return {"schema_name": "qcschema_input", "schema_version": 1, "molecule": dict(QC_WATER), "driver": "energy",
            "model": {"method": "mp2", "basis": "sto-3g"}, "keywords": {}, **changes}


def _v2(spec=None, **changes):
    specification = {"driver": "energy", "model": {"method": "mp2", "basis": "sto-3g"}, "keywords": {},
                     "program": "dfmp2", **(spec or {})}
    return {"schema_name": "qcschema_atomic_input", "schema_version": 2, "molecule": dict(QC_WATER),
            "specification": specification, **changes}


@pytest.mark.parametrize("data, message", [
    (_v2(driver="gradient"), "driver: QCSchema v2 puts it under 'specification'"),
    (_v2(keywords={"frozen_core": True}), "keywords: QCSchema v2 puts it under 'specification'"),
    (_v2(model={"method": "scs-mp2", "basis": "sto-3g"}), "model: QCSchema v2 puts it under 'specification'"),
    (_v2(program="psi4"), "program: QCSchema v2 puts it under 'specification' (specification.program); at a v2"),
    (_v2({"program": "psi4"}), "specification.program 'psi4': this is dfmp2"),
    (_v2({"molecule": QC_WATER}), "specification.molecule: QCSchema v2 puts it at the AtomicInput's top level"),
    (_v2({"method": "mp2"}), "specification.method: not a field of QCSchema v2's specification"),
    (_v2({"schema_name": "qcschema_input"}), "specification.schema_name 'qcschema_input'"),
    (_v1(program="dfmp2"), "program: a QCSchema v2 field (specification.program); a v1 AtomicInput has none"),
    (_v1(basis="sto-3g"), "basis: not a field of a QCSchema v1 AtomicInput"),
    (_v1(model={"method": "mp2", "basis": "sto-3g", "basis_spec": "x"}), "model.basis_spec: not a field dfmp2 reads"),
    (_v1(protocols={"stdout": True, "keep": 1}), "protocols.keep: not a field dfmp2 reads"),
    (_v1(protocols={"native_files": "all"}), "protocols.native_files 'all'"),
    (_v1(molecule={**QC_WATER, "charge": 1}), "molecule.charge: not a field of a QCSchema molecule"),
    (_v1(molecule={**QC_WATER, "atomic_numbers": [8, 1, 2]}), "molecule.atomic_numbers[2] 2 is not"),
])
def test_every_qcschema_key_is_read_or_refused_by_name(data, message):
    """A v2 input with a top-level driver gradient ran an energy without a word, and so did one
    for program psi4 or with any other key out of its place: each key is its version's
    (QCElemental's models) and read, or an input_error naming it, one line, before any SCF."""
    from dfmp2.api.qcschema import run_qcschema

    out = run_qcschema(data)
    assert out["success"] is False and out["error"]["error_type"] == "input_error", out.get("error")
    assert message in out["error"]["error_message"] and "\n" not in out["error"]["error_message"]
    assert out["error"]["extras"]["exit_code"] == 2


def test_qcschema_v2_gradient_in_its_specification_is_a_gradient():
    """driver gradient where v2 puts it (specification.driver) computes the gradient: run_atoms'
    (1e-10 Eh/bohr), and the inputs QCElemental's models write (every field) are read."""
    from qcelemental.models import v2

    import dfmp2
    from dfmp2.api.qcschema import run_qcschema

    model = v2.AtomicInput(molecule=QC_WATER, specification={"driver": "gradient", "program": "dfmp2",
                                                            "model": {"method": "mp2", "basis": "sto-3g"}})
    out = run_qcschema(model.model_dump(mode="json"))
    assert out["success"], out.get("error")
    xyz = np.reshape(WATER_BOHR, (-1, 3)) * dfmp2.chem.angstrom_per_bohr()
    ours = dfmp2.run_atoms([dfmp2.chem.Atom(s, tuple(x)) for s, x in zip(QC_WATER["symbols"], xyz)], basis="sto-3g",
                           gradient=True)
    assert np.abs(np.reshape(out["return_result"], (-1, 3)) - ours.gradient).max() < 1e-10


def test_failure_kinds_have_qcschemas_error_types():
    """The table of dfmp2's failure kinds and QCSchema's error types (QCEngine's classifiers,
    which QCElemental's ComputeError points to): bad input, a budget that cannot hold the run, a
    device that is not usable, an SCF that did not converge; a CUDA run where no GPU is usable
    was unknown_error, now resource_error (as QCEngine reports it too)."""
    import qcengine
    from qcengine import exceptions

    import dfmp2
    from dfmp2.api.qcschema import ERROR_TYPES, error_type, run_qcschema
    from dfmp2.util import errors

    documented = {kind.error_type for kind in vars(exceptions).values()
                  if isinstance(kind, type) and issubclass(kind, exceptions.QCEngineException)}
    assert set(ERROR_TYPES.values()) <= documented
    expected = {errors.InputError("x"): "input_error", errors.MemoryBudgetError("x"): "resource_error",
                errors.DeviceUnavailableError("x"): "resource_error", errors.ConvergenceError("x"): "convergence_error",
                errors.ComputationError("x"): "unknown_error", MemoryError(): "resource_error",
                KeyError("x"): "unknown_error"}
    assert {type(e).__name__: error_type(e) for e in expected} == {type(e).__name__: t for e, t in expected.items()}
    unconverged = run_qcschema(_v1(keywords={"scf_max_cycle": 1}))
    assert unconverged["error"]["error_type"] == "convergence_error", unconverged["error"]
    assert "did not converge" in unconverged["error"]["error_message"]
    assert unconverged["error"]["extras"]["exit_code"] == 1
    from dfmp2.kernels.torch.backend import cuda_available

    if cuda_available():
        return
    out = run_qcschema(_v2({"keywords": {"device": "cuda"}}))
    assert out["error"]["error_type"] == "resource_error" and "no CUDA GPU" in out["error"]["error_message"]
    dfmp2.register_qcengine()
    through = qcengine.compute(_v1(keywords={"device": "cuda"}), "dfmp2", return_dict=True)
    assert through["success"] is False and through["error"]["error_type"] == "resource_error", through["error"]


# ----------------------------------------------------------------------------- ghosts held in an optimisation

def test_optimize_holds_ghost_atoms_where_they_are(tmp_path, capsys):
    """`dfmp2 optimize` of water beside Gh(O) moved the ghost as an atom: now the ghost is where
    the input has it in the optimised XYZ (to the digit), the water's centre too (1e-6
    Angstrom), the run converges and its notes say what was held."""
    pytest.importorskip("geometric")
    from dfmp2 import chem

    (tmp_path / "w.xyz").write_text("4\nwater and a ghost O\nO 0 0 0.1\nH 0 0.8 -0.45\nH 0 -0.75 -0.5\n"
                                    "Gh(O) 0 0 3.0\n", encoding="utf-8")
    code, stderr = _cli(tmp_path, capsys, "optimize", "w.xyz", "--basis", "sto-3g", "--precision", "fp64", "--json",
                        "out.json")
    assert code == 0, stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["converged"] and record["steps"] >= 3
    final = chem.read_xyz(str(tmp_path / "w.opt.xyz"))
    assert final[3].ghost and final[3].xyz == (0.0, 0.0, 3.0)
    water = np.array([a.xyz for a in final[:3]])
    assert np.abs(water.mean(axis=0) - np.array([0.0, 0.05 / 3, -0.85 / 3])).max() < 1e-6
    assert np.abs(water - [[0, 0, 0.1], [0, 0.8, -0.45], [0, -0.75, -0.5]]).max() > 0.01  # (the water relaxed)
    assert any(note.startswith("ghost atoms 4 (O) held where the input has them") for note in record["notes"])


# ----------------------------------------------------------------------------- a cut last frame

WATER_XYZ = "3\nwater\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"


@pytest.mark.parametrize("cut, reason", [
    ("3\nwater\nO 0 0 0.1173\n", "line 11 says 3 atoms but the frame has 1 atom lines: the file ends there"),
    ("3\n", "line 11: the file ends after the atom count (3)"),
])
def test_a_cut_last_frame_is_its_own_failure(tmp_path, cut, reason):
    """A multi-frame file whose last frame is cut (fewer atom lines than its count, or a count
    with nothing after it) was refused whole: the frames before it are read, the cut one is its
    FrameError; read as one geometry, the file is still bad input."""
    from dfmp2 import chem

    path = tmp_path / "t.xyz"
    path.write_text(WATER_XYZ + WATER_XYZ.replace("0.1173", "0.1300") + cut, encoding="utf-8")
    frames = chem.read_frames(str(path), keep_going=True)
    assert [type(f).__name__ for f in frames] == ["Frame", "Frame", "FrameError"]
    assert reason in str(frames[2]) and "cut" in str(frames[2])
    assert frames[1].atoms[0].xyz == (0.0, 0.0, 0.13)
    with pytest.raises(InputError, match="cut"):
        chem.read_frames(str(path))


def test_a_batch_with_a_cut_last_frame_runs_the_good_frames(tmp_path, capsys):
    """`dfmp2 run t.xyz` of 2 good frames and a cut one: exit 1, records ok, ok, failed (its
    reason, exit code 2 as its own run would have), the good frames' energies those of the
    water run alone."""
    (tmp_path / "t.xyz").write_text(WATER_XYZ + WATER_XYZ + "3\nwater\nO 0 0 0\n", encoding="utf-8")
    code, stderr = _cli(tmp_path, capsys, "run", "t.xyz", "--basis", "sto-3g", "--json", "o.jsonl")
    assert code == 1, stderr
    records = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["molecule"], r["status"]) for r in records] == [
        ("t.xyz#1", "ok"), ("t.xyz#2", "ok"), ("t.xyz#3", "failed")]
    assert "the file ends there (the frame is cut)" in records[2]["error"] and records[2]["exit_code"] == 2
    assert records[0]["e_tot"] == records[1]["e_tot"] and "1 of 3 molecules failed" in stderr
    assert "Traceback" not in stderr


def test_a_failed_batch_without_json_is_one_line_naming_the_failure(tmp_path, capsys):
    """The same batch without --json was exit 1 "TypeError: expected str, bytes or os.PathLike
    object, not NoneType" (the message named the JSON file there was none of): one line naming the
    failed frame and its reason."""
    (tmp_path / "t.xyz").write_text(WATER_XYZ + "3\nwater\nO 0 0 0\n", encoding="utf-8")
    code, stderr = _cli(tmp_path, capsys, "run", "t.xyz", "--basis", "sto-3g", "--quiet")
    assert code == 1, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("dfmp2: error: 1 of 2 molecules failed; the first: t.xyz#2: ")
    assert "the frame is cut" in stderr and "TypeError" not in stderr


# ----------------------------------------------------------------------------- cosmetic items

def test_use_dfmp2_jk_takes_a_device_name_in_any_case():
    """use_dfmp2_jk(device="CPU") was refused (unknown device 'CPU') where the command line takes
    --device CPU: device names are judged in one place (kernels.device_name), any case; the
    builds give PySCF's DF-RHF energy (1e-9 Eh); a name of no device is still refused."""
    from pyscf import gto, scf

    import dfmp2
    from dfmp2.kernels import device_name

    mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="sto-3g", verbose=0)
    reference = scf.RHF(mol).density_fit().run(conv_tol=1e-11).e_tot
    mf = dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), device="CPU", precision="fp64")
    mf.conv_tol = 1e-11
    assert abs(mf.kernel() - reference) < 1e-9
    assert device_name(" Cuda ") == "cuda" and device_name("TRN2") == "trn2"
    with pytest.raises(InputError, match="unknown device 'tpu'"):
        dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), device="tpu")


def test_a_byte_order_mark_is_no_content(tmp_path, capsys):
    """A UTF-8 byte-order mark before an XYZ file's count (as Windows editors write it) was refused
    ('expected the number of atoms'): the file reads as without it; a QCSchema JSON file with one
    runs as without it (json.load refused it)."""
    from dfmp2 import chem
    from dfmp2.api.qcschema import run_qcschema

    (tmp_path / "bom.xyz").write_bytes(b"\xef\xbb\xbf" + WATER_XYZ.encode())
    (tmp_path / "plain.xyz").write_bytes(WATER_XYZ.encode())
    assert chem.read_frames(str(tmp_path / "bom.xyz")) == \
        [chem.Frame(f.atoms, f.comment, f.fragments, str(tmp_path / "bom.xyz"), f.first_line)
         for f in chem.read_frames(str(tmp_path / "plain.xyz"))]
    (tmp_path / "in.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(_v1()).encode())
    code, stderr = _cli(tmp_path, capsys, "run", "in.json", "--json", "out.json")
    assert code == 0, stderr
    out = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert out["success"] and abs(out["return_result"] - run_qcschema(_v1())["return_result"]) < 1e-10


NOT_XYZ_NUMBERS = ["0.117_3", "nan", "inf", "-Infinity", "\u0661", "1e", "1_0", "\uff10.5", "0x1p3", "1e5.0",
                   "1.2.3", "+-1", "1d0", "\u00b2"]


def test_xyz_numbers_are_what_xyz_files_write(tmp_path):
    """Python's float() took '0.117_3' as 0.1173, and '١' (Arabic-Indic 1) or full-width digits
    as numbers, in a coordinate, a count or a charge line: an XYZ file's numbers are [sign] digits
    [. digits] [e [sign] digits] (chem.molecule.xyz_decimal, xyz_whole_number), anything else one
    line naming the file's line; the forms programs write are read to their values."""
    from dfmp2 import chem

    def read(text):
        (tmp_path / "x.xyz").write_text(text, encoding="utf-8")
        return chem.read_frames(str(tmp_path / "x.xyz"))[0]

    for bad in NOT_XYZ_NUMBERS:
        with pytest.raises(InputError, match=r"x\.xyz, line 3: coordinate") as raised:
            read(f"3\nw\nO 0 0 {bad}\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
        assert "\n" not in str(raised.value) and repr(bad) in str(raised.value)
    for count in ("\u0663", "\uff13", "3_0"):
        with pytest.raises(InputError, match="line 1: expected the number of atoms"):
            read(f"{count}\nw\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    for line in ("\u0661 2", "1_0 1", "0 \uff12"):
        with pytest.raises(InputError, match="line 3: expected 'Symbol x y z' or a fragment's 'charge multiplicity'"):
            read(f"3\nw\n{line}\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    frame = read("3\nw\n+1 2\nO +0.0 .0 1.173E-1\nH 0. 7.572e-1 -0.4692\nH 0 -757.2E-3 -4692e-4\n")
    assert [a.xyz for a in frame.atoms] == [(0.0, 0.0, 0.1173), (0.0, 0.7572, -0.4692), (0.0, -0.7572, -0.4692)]
    assert (frame.fragments[0].charge, frame.fragments[0].multiplicity) == (1, 2)


def test_use_dfmp2_jk_takes_its_precision_in_any_case():
    """precision='FP64' was refused where Settings take keywords in any case (the class of device='CPU')."""
    from pyscf import gto, scf

    import dfmp2

    mol = gto.M(atom="H 0 0 0; H 0 0 0.74", basis="sto-3g", verbose=0)
    reference = scf.RHF(mol).density_fit().run().e_tot
    mf = dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), device=" Cpu ", precision="FP64").run()
    assert mf.e_tot == pytest.approx(reference, abs=1e-9)
    with pytest.raises(InputError, match="unknown SCF precision"):
        dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), precision="fp16")


def _water_atoms():
    from dfmp2.chem import Atom

    return [Atom("O", (0.0, 0.0, 0.1173)), Atom("H", (0.0, 0.7572, -0.4692)), Atom("H", (0.0, -0.7572, -0.4692))]


@pytest.mark.parametrize("call, message", [
    (lambda d: d.run_xyz(None), "an XYZ file's path is a str or os.PathLike, got NoneType"),
    (lambda d: d.run_xyz(3), "an XYZ file's path is a str or os.PathLike, got int 3"),  # (os.stat: a descriptor)
    (lambda d: d.run_atoms([("O", (0, 0, 0))]), "atoms: a list of dfmp2.chem.Atom"),
    (lambda d: d.run_atoms("O 0 0 0"), "atoms: a list of dfmp2.chem.Atom"),
    (lambda d: d.run_atoms(_water_atoms(), charge=1.5), "charge must be a whole number, got 1.5"),
    (lambda d: d.run_atoms(_water_atoms(), charge=True), "charge must be a whole number, got True"),
    (lambda d: d.Settings(frozen_core="no"), "frozen_core must be True or False, got 'no'"),
    (lambda d: d.Settings(gradient=1), "gradient must be True or False, got 1"),
    (lambda d: d.DFMP2(None), "the drop-in takes a PySCF mean field"),
])
def test_the_api_names_an_input_of_the_wrong_kind(call, message):
    """The battery's Python API cases: run_xyz(None) was a TypeError from os.stat, run_xyz(3) "no such
    file" (a file descriptor), atoms as tuples an AttributeError, charge=1.5 PySCF's RuntimeError,
    frozen_core="no" froze the core, DFMP2(None) an AttributeError: each is InputError naming it."""
    import dfmp2

    with pytest.raises(dfmp2.InputError, match="^" + re.escape(message)):
        call(dfmp2)


def test_numpy_whole_numbers_are_a_charge_and_spin():
    """Whole numbers of numpy's kinds (what ASE and numpy code hand over) are a charge and 2S as ints are."""
    import numpy as np

    import dfmp2

    ran = dfmp2.run_atoms(_water_atoms(), charge=np.int64(1), spin=np.int32(1), basis="sto-3g")
    again = dfmp2.run_atoms(_water_atoms(), charge=1, spin=1, basis="sto-3g")
    assert abs(ran.e_tot - again.e_tot) < 1e-10 and ran.e_tot != 0.0
