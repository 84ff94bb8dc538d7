"""`dfmp2 optimize` and dfmp2.app.optimize: geomeTRIC on the analytic DF-MP2 gradient. Converged
geometries are checked against PySCF's conventional (non-DF) MP2 gradients and optimum; the
checkpoint's replay against a fresh optimisation."""

import json
import subprocess
import sys

import numpy as np
import pytest
from pyscf import gto, scf

from dfmp2 import chem
from dfmp2.app.optimize import optimize_atoms
from dfmp2.run.settings import Settings

pytest.importorskip("geometric")

DISTORTED_WATER = "3\ndistorted water\nO 0 0 0.1\nH 0 0.8 -0.45\nH 0 -0.75 -0.5\n"
CRITERION = 4.5e-4  # Eh/bohr: PySCF's (geomeTRIC's) default largest-gradient criterion


def _optimize_cli(tmp_path, *extra):
    (tmp_path / "w.xyz").write_text(DISTORTED_WATER, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "dfmp2", "optimize", "w.xyz", "--precision", "fp64", "--json",
                           "out.json", *extra], cwd=tmp_path, capture_output=True, text=True, timeout=900)


def test_cli_optimize_water_reaches_the_mp2_minimum(tmp_path):
    """dfmp2 optimize: exit 0, one stderr line per step; JSON energies (first = the start, as
    run_xyz computes it there, 1e-8 Eh), e_tot = the last, the final gradient below PySCF's
    criterion; the optimised XYZ (default name) holds the JSON's coordinates and the trajectory
    one frame per step. At the optimum, PySCF's own conventional MP2 gradient is below 1e-3
    Eh/bohr (criterion plus the DF error; at the start it is 1.2e-2)."""
    from pyscf import mp

    from dfmp2.api.driver import run_xyz

    proc = _optimize_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    energies = record["energies"]
    assert record["converged"] and record["steps"] == len(energies) >= 3
    assert proc.stderr.count("  step ") == len(energies)
    start = run_xyz(str(tmp_path / "w.xyz"), precision="fp64").e_tot
    assert abs(energies[0] - start) < 1e-8
    assert record["e_tot"] == energies[-1] < energies[0] - 1e-4
    assert np.abs(record["gradient"]).max() < CRITERION
    assert record["optimized_xyz"] == "w.opt.xyz" and record["trajectory"] == "w.traj.xyz"
    final = chem.read_xyz(str(tmp_path / "w.opt.xyz"))
    coords = np.array([a.xyz for a in final])
    assert [a.symbol for a in final] == ["O", "H", "H"]
    assert np.abs(coords - np.array(record["coordinates"])).max() < 1e-9
    frames = (tmp_path / "w.traj.xyz").read_text(encoding="utf-8").splitlines()
    assert len(frames) == 5 * len(energies) and frames[1].startswith("step 0")
    mol = gto.M(atom=[("O", coords[0]), ("H", coords[1]), ("H", coords[2])], basis="cc-pvdz", verbose=0)
    conventional = mp.MP2(scf.RHF(mol).run(conv_tol=1e-11)).run().nuc_grad_method().kernel()
    assert np.abs(conventional).max() < 1e-3


def test_optimize_checkpoint_resumes_where_it_stopped(tmp_path):
    """--max-steps 2 with a --checkpoint: exit 1 with one line after the 3 geometries (the start
    and 2 steps), no output file written; the same command without the limit replays the 3
    stored ones (no calculation) and ends exactly where a fresh optimisation ends (same
    energies, 1e-10 Eh)."""
    stopped = _optimize_cli(tmp_path, "--max-steps", "2", "--checkpoint", "ck")
    assert stopped.returncode == 1 and "did not converge in 2 steps" in stopped.stderr
    assert "Traceback" not in stopped.stderr and len(stopped.stderr.strip().splitlines()) == 4  # 3 steps + error
    assert not any((tmp_path / name).exists() for name in ("out.json", "w.opt.xyz", "w.traj.xyz"))
    resumed = _optimize_cli(tmp_path, "--checkpoint", "ck")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("(checkpoint)") == 3
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["steps_replayed"] == 3
    (tmp_path / "out.json").unlink()
    fresh = _optimize_cli(tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    again = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert again["steps_replayed"] == 0 and len(again["energies"]) == len(record["energies"])
    assert np.abs(np.array(again["energies"]) - record["energies"]).max() < 1e-10


def test_optimize_refusals(tmp_path):
    """Exit 2 with the reason: ROHF, ROKS double hybrids, a bad --max-steps."""
    (tmp_path / "w.xyz").write_text(DISTORTED_WATER, encoding="utf-8")
    for args, message in ((["--charge", "1", "--spin", "1", "--reference", "rohf"], "ROHF"),
                          (["--charge", "1", "--spin", "1", "--reference", "rohf", "--xc", "B2PLYP"], "ROHF"),
                          (["--max-steps", "0"], "--max-steps")):
        proc = subprocess.run([sys.executable, "-m", "dfmp2", "optimize", "w.xyz", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "w.opt.xyz").exists()


def _shape(coords):
    """(r1, r2, angle in degrees) of a triatomic A-B... as (center, a, b)."""
    r1, r2 = np.linalg.norm(coords[1] - coords[0]), np.linalg.norm(coords[2] - coords[0])
    angle = np.degrees(np.arccos(np.dot(coords[1] - coords[0], coords[2] - coords[0]) / (r1 * r2)))
    return np.array([r1, r2, angle])


def test_radical_optimisation_matches_the_conventional_ump2_optimum():
    """The NH2 radical (UHF, doublet) from a distorted start: converges with the default
    criteria; bonds within 1e-3 A and the angle within 0.1 degree of the optimum PySCF's
    conventional UMP2 gradients give under its geomopt (exact SCF, cc-pVTZ-RI fitting; measured
    5.8e-6 A and 4.1e-4 degree, 5 steps)."""
    import contextlib
    import io

    from pyscf import mp
    from pyscf.geomopt.geometric_solver import optimize

    atoms = [chem.Atom("N", (0.0, 0.0, 0.1)), chem.Atom("H", (0.0, 0.85, -0.55)), chem.Atom("H", (0.0, -0.95, -0.5))]
    ours = optimize_atoms(atoms, Settings(spin=1, scf="exact", auxbasis="cc-pvtz-ri"))
    assert ours.converged and np.abs(ours.steps[ours.final_step].gradient).max() < CRITERION
    assert ours.final.reference == "uhf"
    start = gto.M(atom=[(a.symbol, a.xyz) for a in atoms], basis="cc-pvdz", spin=1, verbose=0)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        theirs = optimize(mp.UMP2(scf.UHF(start).run(conv_tol=1e-11)), maxsteps=50)
    ours_shape = _shape(np.array([a.xyz for a in ours.atoms]))
    theirs_shape = _shape(theirs.atom_coords(unit="Angstrom"))
    assert np.abs(ours_shape[:2] - theirs_shape[:2]).max() < 1e-3 and abs(ours_shape[2] - theirs_shape[2]) < 0.1


def test_twenty_atom_optimisation_converges_to_alkane_bond_lengths():
    """n-hexane (20 atoms, examples/hexane.xyz: an idealised zig-zag) converges with the default
    criteria (6 steps here, about a minute), every step lowering the energy; the optimised C-C
    and C-H bonds fall where MP2/cc-pVDZ puts them in alkanes (1.515-1.535 and 1.095-1.110 A)."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "hexane.xyz")
    found = optimize_atoms(chem.read_xyz(path), Settings())
    assert found.converged and len(found.atoms) == 20
    assert np.abs(found.steps[found.final_step].gradient).max() < CRITERION
    assert np.all(np.diff(found.energies) < 0)
    coords = np.array([a.xyz for a in found.atoms])
    carbons = [k for k, a in enumerate(found.atoms) if a.symbol == "C"]
    distances = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    cc = [distances[i, j] for i, j in zip(carbons, carbons[1:])]
    ch = [distances[k, carbons].min() for k, a in enumerate(found.atoms) if a.symbol == "H"]
    assert 1.515 < min(cc) and max(cc) < 1.535 and 1.095 < min(ch) and max(ch) < 1.110
