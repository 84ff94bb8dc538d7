"""Reliability round 5 (issue 60): the defects a hostile battery found in the workflows of
issue 49 (fragments and ghosts, counterpoise, extrapolation, batches, optimisation), each
asserted against an independent reference (PySCF's ghost-atom energies, QCElemental's charge and
multiplicity rules, a run of the same molecule alone) or the file system's state."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from pyscf import gto, scf

from dfmp2 import chem
from dfmp2.api import composite
from dfmp2.api.driver import run_atoms
from dfmp2.run.settings import Settings
from dfmp2.util.errors import InputError

from test_cli import describe, dfmp2_cli
from test_workflows import WATER, WATER_DIMER, write

# two OH radicals 3 Angstrom apart, no 'charge multiplicity' lines
OH_OH = "4\nOH...OH\nO 0 0 0\nH 0 0 0.97\n--\nO 0 0 3.0\nH 0 0 3.97\n"


def frame_of(text, tmp_path, name="f.xyz"):
    return chem.read_frames(str(write(tmp_path / name, text)))[0]


# ----------------------------------------------------------------------------- charge and spin, one rule

def test_the_same_file_has_one_state_alone_and_in_a_counterpoise_computation(tmp_path):
    """OH...OH without lines ran as an RHF singlet alone and a UHF triplet with --counterpoise: now
    both are the high-spin triplet (QCElemental's and Psi4's rule), the same E_total, with a note."""
    write(tmp_path / "d.xyz", OH_OH)
    alone = dfmp2_cli("run", "d.xyz", "--json", "a.json", cwd=tmp_path)
    cp = dfmp2_cli("run", "d.xyz", "--counterpoise", "--json", "cp.json", cwd=tmp_path)
    assert alone.returncode == 0 and cp.returncode == 0, describe(alone) + describe(cp)
    single = json.loads((tmp_path / "a.json").read_text())
    both = json.loads((tmp_path / "cp.json").read_text())
    assert single["spin"] == 2 and single["reference"] == "uhf"
    assert any("added high-spin" in note for note in single["notes"])
    whole = both["per_basis"]["cc-pvdz"]["energies"]["whole"]["e_tot"]
    assert abs(whole - single["e_tot"]) < 1e-8
    assert [(s["charge"], s["spin"]) for s in both["systems"]] == [(0, 2), (0, 1), (0, 1)]


def test_a_whole_spin_the_fragments_cannot_take_is_refused_for_counterpoise_only(tmp_path):
    """--spin 0 on OH...OH: a plain run takes the singlet as given; a counterpoise computation,
    which runs each fragment, refuses it before any run, saying the fragments' spins add to 2 (it
    blamed 'charge multiplicity' lines the file does not have)."""
    write(tmp_path / "d.xyz", OH_OH)
    cp = dfmp2_cli("run", "d.xyz", "--counterpoise", "--spin", "0", cwd=tmp_path)
    assert cp.returncode == 2, describe(cp)
    assert "2S 0 (--spin)" in cp.stderr and "high-spin (1 + 1)" in cp.stderr and cp.stderr.count("\n") == 1
    settings = Settings(spin=0, precision="fp64")
    found = chem.charge_and_spin(frame_of(OH_OH, tmp_path), settings.charge, settings.spin)
    assert (found.charge, found.spin, found.fragments) == (0, 0, None)


@pytest.mark.parametrize("text, given, needle", [
    (OH_OH.replace("--\n", "--\n0 1\n"), {}, "fragment 2 ('0 1'): multiplicity 1 (2S 0) is impossible with its 9"),
    (OH_OH.replace("--\n", "--\n1 1\n").replace("O 0 0 0\n", "0 2\nO 0 0 0\n"), {}, None),
    ("2\nHe dimer\nHe 0 0 0\n--\n3 1\nHe 0 0 3\n", {}, "fragment 2 ('3 1'): charge 3 leaves -1 electrons"),
    ("2\nHe dimer\nHe 0 0 0\n--\n2 2\nHe 0 0 3\n", {}, "fragment 2 ('2 2'): multiplicity 2 (2S 1) is impossible"),
    ("2\nghost\nHe 0 0 0\n--\n1 2\n@He 0 0 3\n", {}, "holds ghost atoms only"),
])
def test_impossible_fragment_lines_are_bad_input_in_every_run(tmp_path, text, given, needle):
    """A plain run accepted per-fragment lines impossible for their fragment: every run checks
    them now, naming the file line and the fragment."""
    frame = frame_of(text, tmp_path)
    if needle is None:  # (possible: OH '0 2' and OH+ '1 1' make charge 1, 2S 1)
        found = chem.charge_and_spin(frame, given.get("charge"), given.get("spin"))
        assert (found.charge, found.spin, found.fragments) == (1, 1, ((0, 1), (1, 0)))
        return
    with pytest.raises(InputError, match=r", line \d+: ") as error:
        chem.charge_and_spin(frame, given.get("charge"), given.get("spin"))
    assert needle in str(error.value)


def test_a_bare_nucleus_fragment_runs_whole_but_not_in_counterpoise(tmp_path):
    """H+...He: charge +1 on H...He without lines is QCElemental's H+ and He, a singlet (the first
    fragment that can hold the charge; dfmp2 skipped fragments left without electrons and ran He+
    and H, a triplet); with the lines '1 1' and '0 1' the fragments are given, and counterpoise,
    which would run a fragment without electrons, refuses it naming the fragment."""
    found = chem.charge_and_spin(frame_of("2\nH+ He\nH 0 0 0\n--\nHe 0 0 1.6\n", tmp_path), 1, None)
    assert (found.charge, found.spin) == (1, 0)
    frame = frame_of("2\nH+ He\n1 1\nH 0 0 0\n--\n0 1\nHe 0 0 1.6\n", tmp_path, "g.xyz")
    found = chem.charge_and_spin(frame)
    assert (found.charge, found.spin, found.fragments) == (1, 0, ((1, 0), (0, 0)))
    with pytest.raises(InputError, match="fragment 1 at charge 1 has no electrons"):
        composite.counterpoise_systems(frame, ["cp"])


def _qcelemental_chgmult(frame, charge, multiplicity):
    from qcelemental.molparse.chgmult import validate_and_fill_chgmult

    zeff = [0 if a.ghost else chem.atomic_number(a.symbol) for a in frame.atoms]
    separators = [f.start for f in frame.fragments[1:]]
    found = validate_and_fill_chgmult(np.array(zeff, dtype=float), np.array(separators, dtype=int), charge,
                                      [f.charge for f in frame.fragments], multiplicity,
                                      [f.multiplicity for f in frame.fragments], verbose=0)
    return found


FRAGMENT_CASES = [  # (file, molecular charge, molecular multiplicity)
    (WATER_DIMER, None, None), (WATER_DIMER.replace("0 1\n", ""), None, None),
    (WATER_DIMER.replace("0 1\n", ""), 1, None), (WATER_DIMER.replace("0 1\n", ""), None, 3),
    (WATER_DIMER.replace("0 1\n", ""), -1, 2), (WATER_DIMER.replace("0 1\n", "", 1), None, 3),
    (WATER_DIMER.replace("0 1\nO  -1", "1 2\nO  -1"), None, None), (OH_OH, None, None), (OH_OH, None, 5),
    (OH_OH, 1, None), (OH_OH.replace("--\n", "--\n-1 1\n"), None, None), (WATER, None, None), (WATER, 1, None),
    (WATER, -1, None), (WATER, None, 3), ("2\nHHe\nH 0 0 0\n--\nHe 0 0 1.6\n", 1, None), ("4\nCH3\nC 0 0 0\nH 1.08 0 0\nH -0.54 0.93 0\nH -0.54 -0.93 0\n", None, None),
    ("5\ng\nO 0 0 0\nH 0 0.76 -0.47\nH 0 -0.76 -0.47\n--\n@He 0 0 3\n@He 0 0 5\n", None, None),
]


@pytest.mark.parametrize("k", range(len(FRAGMENT_CASES)))
def test_charge_and_spin_follow_qcelemental(tmp_path, k):
    """chem.charge_and_spin's whole charge and 2S are QCElemental's validate_and_fill_chgmult's
    (Psi4's rules) wherever it finds a solution, and its fragments' states too wherever dfmp2
    calls them determined."""
    pytest.importorskip("qcelemental")
    text, charge, multiplicity = FRAGMENT_CASES[k]
    frame = frame_of(text, tmp_path)
    reference = _qcelemental_chgmult(frame, charge, multiplicity)
    found = chem.charge_and_spin(frame, charge, None if multiplicity is None else multiplicity - 1)
    assert (found.charge, found.spin + 1) == (reference["molecular_charge"], reference["molecular_multiplicity"])
    if found.fragments is not None:
        assert [(q, s + 1) for q, s in found.fragments] == list(zip(reference["fragment_charges"],
                                                                    reference["fragment_multiplicities"]))


# ----------------------------------------------------------------------------- composites: checked before any run

def test_a_composite_is_checked_whole_before_its_first_run(tmp_path, monkeypatch):
    """An impossible system (B3+, whose frozen 1s leaves no active occupied orbital) was found
    only when its turn came, after the earlier systems' SCF and MP2: composite_runs checks every
    system in every basis first, and the message names the system."""
    text = "4\nB3+ water\n3 1\nB 0 0 -2.0\n--\n0 1\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"
    calls = []
    monkeypatch.setattr(composite, "run_atoms", lambda *a, **k: calls.append(a))
    with pytest.raises(InputError) as error:
        composite.run_composite(frame_of(text, tmp_path), Settings(frozen_core=True, charge=None, spin=None), ["cp", "nocp"])
    assert calls == []
    assert "f.xyz: fragment 1 (" in str(error.value) and "no active occupied orbital" in str(error.value)


def test_an_ecp_named_for_a_ghost_atom_is_no_refusal(tmp_path):
    """--ecp def2-svp --counterpoise on HI...HF exited 2 ('no ECP for any element here (F, H)') on
    the fragment whose iodine is a ghost, after two runs. Now the whole is checked once; every
    system runs; the interaction energy equals the one with the basis's own ECPs (--ecp auto:
    def2-SVP carries the same ECP for iodine), and the ghost iodine carries none."""
    write(tmp_path / "d.xyz", "4\nHI...HF\nI 0 0 0\nH 0 0 1.61\n--\nF 0 0 4.2\nH 0 0 5.12\n")
    runs = {}
    for ecp in ("def2-svp", "auto"):
        proc = dfmp2_cli("run", "d.xyz", "--basis", "def2-svp", "--ecp", ecp, "--bsse", "cp,nocp", "--precision",
                         "fp64", "--json", f"{ecp}.json", cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
        runs[ecp] = json.loads((tmp_path / f"{ecp}.json").read_text())
    for kind in ("cp", "nocp"):
        assert abs(runs["def2-svp"]["interaction"][kind]["e_tot"] - runs["auto"]["interaction"][kind]["e_tot"]) < 1e-9
    per_system = runs["def2-svp"]["per_basis"]["def2-svp"]["runs"]
    assert list(per_system["fragment 2 (whole basis)"]["ecp"]) == [] and list(per_system["whole"]["ecp"]) == ["I"]


# ----------------------------------------------------------------------------- options

def test_counterpoise_with_bsse_nocp_keeps_the_counterpoise_correction(tmp_path):
    """--counterpoise --bsse nocp silently dropped the CP correction: the two lists are merged."""
    write(tmp_path / "d.xyz", WATER_DIMER)
    proc = dfmp2_cli("run", "d.xyz", "--counterpoise", "--bsse", "nocp", "--json", "o.json", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["bsse"] == ["cp", "nocp"] and set(record["interaction"]) == {"cp", "nocp"}
    assert "1 system" not in proc.stdout and "5 systems" in proc.stdout


# ----------------------------------------------------------------------------- batches

def test_json_lines_never_overwrite_a_molecule_found_in_a_directory(tmp_path):
    """`dfmp2 run d --json d/a.xyz` replaced d/a.xyz by JSON Lines (exit 0); the same path named
    on the command line was refused. Now both are refused before anything runs, the file intact."""
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "a.xyz", WATER)
    write(tmp_path / "d" / "b.xyz", WATER)
    before = (tmp_path / "d" / "a.xyz").read_bytes()
    proc = dfmp2_cli("run", "d", "--json", "d/a.xyz", cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert "is the input file" in proc.stderr and (tmp_path / "d" / "a.xyz").read_bytes() == before


def test_hidden_files_are_not_molecules(tmp_path):
    """Directory scans took hidden files (macOS's ._x.xyz resource forks)."""
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "a.xyz", WATER)
    (tmp_path / "d" / "._a.xyz").write_bytes(b"\x00\x05\x16\x07binary")
    write(tmp_path / "d" / "b.xyz", WATER)
    proc = dfmp2_cli("run", "d", "--json", "o.jsonl", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert [json.loads(line)["molecule"] for line in (tmp_path / "o.jsonl").read_text().splitlines()] == \
        ["d/a.xyz", "d/b.xyz"]


def test_one_bad_frame_leaves_the_other_frames_of_its_file(tmp_path):
    """A bad frame dropped every frame of its file ('1 of 2 molecules failed'): now it is its own
    failed record, with its line, and the file's other frames run (equal to WATER run alone); a
    file that cannot be split into frames is still one failure."""
    bad = WATER.replace("H 0 0.7572", "Xx 0 0.7572")
    write(tmp_path / "t.xyz", WATER + bad + WATER.replace("0.1173", "0.1300"))
    write(tmp_path / "w.xyz", WATER)
    write(tmp_path / "broken.xyz", WATER + "junk\n")
    proc = dfmp2_cli("run", "t.xyz", "w.xyz", "broken.xyz", "--json", "o.jsonl", cwd=tmp_path)
    assert proc.returncode == 1, describe(proc)
    records = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(r["molecule"], r["status"]) for r in records] == [
        ("t.xyz#1", "ok"), ("t.xyz#2", "failed"), ("t.xyz#3", "ok"), ("w.xyz", "ok"), ("broken.xyz", "failed")]
    assert "t.xyz, line 9" in records[1]["error"] and records[1]["exit_code"] == 2
    assert records[0]["e_tot"] == records[3]["e_tot"] != records[2]["e_tot"]
    assert "2 of 5 molecules failed" in proc.stderr


def test_a_one_line_error_quotes_no_more_than_a_line_fragment(tmp_path):
    """A one-line batch error quoted a 3 kB line whole."""
    write(tmp_path / "x.xyz", "1\nlong\n" + "Q" * 3000 + " 0 0 0\n")
    proc = dfmp2_cli("run", "x.xyz", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr) < 300, describe(proc)
    assert "(3000 characters)" in proc.stderr


def _default_stop_signals():
    """In the child: SIGINT and SIGHUP at their default disposition, whatever the test runner
    inherited (a background or nohup'd run ignores them, and dfmp2 keeps an inherited ignore)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_batch_keeps_the_records_of_finished_molecules(tmp_path, signum):
    """A batch stopped by a signal wrote no JSON Lines at all (or left the old file): each
    molecule's line is in place when it finishes, so the file holds whole records only, the
    previous file stays until the first record replaces it, and the exit status is 128 + N."""
    (tmp_path / "m").mkdir()
    for k in range(12):
        write(tmp_path / "m" / f"w{k:02d}.xyz", WATER.replace("0.1173", f"{0.11 + 0.001 * k:.4f}"))
    write(tmp_path / "o.jsonl", "old contents\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "dfmp2", "run", "m", "--json", "o.jsonl"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_stop_signals)  # (an ignore inherited from nohup is kept by dfmp2)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # wait for two finished records
        text = (tmp_path / "o.jsonl").read_text()
        if text.count("\n") >= 2 and not text.startswith("old"):
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, (out, err)
    lines = (tmp_path / "o.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # whole lines only
    assert 2 <= len(records) < 12 and all(r["status"] == "ok" for r in records)
    assert [r["molecule"] for r in records] == [f"m/w{k:02d}.xyz" for k in range(len(records))]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".dfmp2-")]


# ----------------------------------------------------------------------------- optimisation

def test_optimize_keeps_ghost_atoms_ghosts(tmp_path):
    """`dfmp2 optimize` turned ghost atoms into real atoms (water + Gh(O): an 18-electron
    molecule at -151 Eh). Step 0 is now the energy of the same file's run, which equals PySCF's
    water with a ghost O, and the geometry files keep the ghost and the fragments' lines."""
    pytest.importorskip("geometric")
    from dfmp2.app.optimize import optimize_atoms

    text = "4\nwater + ghost O\n0 1\nO 0 0 0.1\nH 0 0.8 -0.45\nH 0 -0.75 -0.5\n--\n0 1\nGh(O) 0 0 3.0\n"
    frame = frame_of(text, tmp_path)
    found = optimize_atoms(list(frame.atoms), Settings(precision="fp64"), max_steps=1, fragments=frame.fragments)
    mol = gto.M(atom="O 0 0 0.1; H 0 0.8 -0.45; H 0 -0.75 -0.5; ghost-O 0 0 3.0", basis="cc-pvdz", verbose=0)
    assert mol.nelectron == 10
    reference = run_atoms(list(frame.atoms), precision="fp64")
    assert abs(found.steps[0].energy - reference.e_tot) < 1e-10 and reference.e_tot > -77
    assert [a.ghost for a in found.atoms] == [False, False, False, True]
    written = chem.read_frames(str(write(tmp_path / "t.xyz", chem.format_xyz(found.frames()))))
    for step in written:
        assert [a.ghost for a in step.atoms] == [False, False, False, True]
        assert [(f.start, f.stop, f.charge, f.multiplicity) for f in step.fragments] == [(0, 3, 0, 1), (3, 4, 0, 1)]
    assert found.as_dict()["atoms"] == ["O", "H", "H", "ghost-O"]
    # (the ghost's energy: PySCF's RHF on the same molecule)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)
    assert abs(reference.e_ref - mf.e_tot) < 1e-8
