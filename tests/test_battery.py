"""Defects the second hostile battery found (issue 46), each reproduced as a user met it: API
arguments taken for something else, files written where they must not be or read back without
proof of what they belong to, temporary files left behind, messages that break the one-line
rule or name the other interface's options. (Bad input met on the command line is in
test_cli.py's table; checkpoint provenance in test_checkpoint.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, converged_rhf
from test_cli import describe, dfmp2_cli

import dfmp2
from dfmp2.util.errors import InputError

WATER = Path(ROOT) / "examples" / "water.xyz"
FAULTS = Path(ROOT) / "tests" / "faults"


def water_df():
    return converged_rhf("water", scf_mode="df")


# ----------------------------------------------------------------------------- API arguments

@pytest.mark.parametrize("frozen", ["1", "0", 1.0, [1.5], True, [[0], [0]], {"core": 1}])
def test_frozen_must_be_an_int_or_a_list_of_ints(frozen):
    """frozen='1' (a string) froze orbital 1 without a word (a string iterates to '1'); [1.5]
    froze orbital 1. Anything but an int, a list of ints or (unrestricted) two lists is refused,
    naming frozen, before any integral is made."""
    pt = dfmp2.DFMP2(water_df(), frozen=frozen)
    with pytest.raises(InputError, match=r"^frozen="):
        pt.kernel()


def test_frozen_as_numpy_integers_is_the_same_run():
    reference = dfmp2.DFMP2(water_df(), frozen=1, precision="fp64").kernel()[0]
    for frozen in (np.int64(1), [0], np.array([0])):
        assert dfmp2.DFMP2(water_df(), frozen=frozen, precision="fp64").kernel()[0] == pytest.approx(reference,
                                                                                                    abs=1e-12)


@pytest.mark.parametrize("budget", ["4000", b"4000", [4000], True])
def test_max_memory_must_be_a_number(budget):
    """max_memory='4000' failed with numpy's TypeError from deep inside the memory plan."""
    pt = dfmp2.DFMP2(water_df())
    pt.max_memory = budget
    with pytest.raises(InputError, match=r"^max_memory must be a number of MB"):
        pt.kernel()


def test_api_messages_name_keywords_not_command_line_options():
    """From Python, an error names the keyword to change (c_os, max_memory), never a flag
    (--c-os, --max-memory); the command line names its flags (test_cli's table)."""
    with pytest.raises(InputError) as caught:
        dfmp2.run_xyz(str(WATER), c_os=0.5, c_ss=0.3)
    assert "c_os" in str(caught.value) and "xc" in str(caught.value) and "--" not in str(caught.value)
    with pytest.raises(InputError) as caught:
        dfmp2.run_xyz(str(WATER), max_memory=-1)
    assert str(caught.value).startswith("max_memory must be") and "--" not in str(caught.value)
    with pytest.raises(InputError) as caught:
        dfmp2.run_xyz(str(WATER), device="cpu", simulate=True)
    assert "simulate" in str(caught.value) and "--" not in str(caught.value)


def test_the_documented_entry_points_exist():
    """docs/cli.md cited dfmp2.run_xyz, which raised AttributeError."""
    result = dfmp2.run_xyz(str(WATER), precision="fp64")
    mf = water_df()
    assert abs(result.e_hf - mf.e_tot) < 1e-8
    assert dfmp2.run_atoms and dfmp2.run_mean_field and dfmp2.Settings


def test_keywords_in_any_case_from_python():
    """--screening took any case and --properties DIPOLE was refused: every keyword setting is
    accepted in any case (Settings), from the command line and from Python."""
    upper = dfmp2.run_xyz(str(WATER), device="CPU", precision="FP64", properties=("DIPOLE",), screening="OFF")
    assert upper.as_dict()["device"] == "cpu" and upper.as_dict()["precision"] == "fp64"
    assert len(upper.properties["dipole"]) == 3


def test_uhf_natural_orbitals_through_the_dropin():
    """dfmp2.DFMP2(uhf_mf).make_natorbs() raised AttributeError ('tuple' object has no attribute
    'ndim'). Against PySCF's dfump2_native with the same auxiliary basis: occupations to 1e-8."""
    from pyscf import gto, scf
    from pyscf.mp.dfump2_native import DFUMP2

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-11)
    occupations, orbitals = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri", precision="fp64").make_natorbs()
    reference, _ = DFUMP2(mf, auxbasis="cc-pvdz-ri").make_natorbs()
    assert orbitals.shape == (mol.nao, mol.nao)
    assert np.abs(np.asarray(occupations) - np.asarray(reference)).max() < 1e-8


# O2 triplet, def2-SVP, def2-universal-JKFIT (PySCF's test_dfromp2.py, reference values from the REST
# program): E_corr -0.38682976, E_ss -0.11760541, E_os -0.25685885, singles -0.01236550 Eh
O2_REST = {"e_corr": -0.38682976, "e_corr_ss": -0.11760541, "e_corr_os": -0.25685885, "e_corr_singles": -0.01236550}


def test_rohf_scs_energy_includes_the_singles_as_pyscf():
    """PySCF's DFROMP2 adds the ROHF singles unscaled to its SCS energy (emp2_scs); dfmp2's left
    them out. Against REST's published parts (PySCF's test): 1e-7 Eh, their rounding."""
    from pyscf import gto, scf

    mol = gto.M(atom="O 0 0 0; O 0 0 1.2222", spin=2, basis="def2-svp", verbose=0)
    mf = scf.ROHF(mol).density_fit(auxbasis="def2svpjkfit").run(conv_tol=1e-12)
    pt = dfmp2.DFMP2(mf, precision="fp64").run()
    for key, value in O2_REST.items():
        assert abs(getattr(pt, key) - value) < 1e-7, key
    published_scs = O2_REST["e_corr_singles"] + O2_REST["e_corr_ss"] / 3 + 1.2 * O2_REST["e_corr_os"]
    assert abs(pt.emp2_scs - published_scs) < 2e-7
    assert abs(pt.e_tot_scs - (mf.e_tot + published_scs)) < 2e-7


# ----------------------------------------------------------------------------- ovL files (API)

def _water_at(z):
    from pyscf import gto, scf

    mol = gto.M(atom=f"O 0 0 {z}; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
    return scf.RHF(mol).density_fit().run(conv_tol=1e-11)


@pytest.fixture(scope="module")
def ovl_files(tmp_path_factory):
    """ovL files of water at its geometry written by dfmp2 and by PySCF, and the mean fields."""
    from pyscf.mp import dfmp2 as pyscf_dfmp2

    directory = tmp_path_factory.mktemp("ovl")
    here, moved = _water_at(0.1173), _water_at(0.1273)
    dfmp2.DFMP2(here).ao2mo(ovL_to_save=str(directory / "here.h5"))
    theirs = pyscf_dfmp2.DFMP2(here)
    theirs.ao2mo(ovL_to_save=str(directory / "pyscf.h5"))
    return directory, here, moved


def test_ovl_made_at_another_geometry_is_refused(ovl_files):
    """DFMP2.ao2mo(ovL=FILE) made at another geometry was accepted because the shapes matched
    (e_corr -0.204938 instead of -0.203961). Now the file's identity (molecule, bases, active
    orbitals) and its orbitals must be this object's: InputError naming what differs."""
    directory, here, moved = ovl_files
    with pytest.raises(InputError, match=r"ovL .*here.h5: it was made for another run \(atoms\[0\]\[3\]"):
        dfmp2.DFMP2(moved).ao2mo(ovL=str(directory / "here.h5"))
    pt = dfmp2.DFMP2(here, precision="fp64")
    e_from_file = pt.kernel(eris=pt.ao2mo(ovL=str(directory / "here.h5")))[0]
    assert abs(e_from_file - dfmp2.DFMP2(here, precision="fp64").kernel()[0]) < 1e-10


def test_eris_of_another_object_are_refused(ovl_files):
    _, here, moved = ovl_files
    eris = dfmp2.DFMP2(here).ao2mo()
    with pytest.raises(InputError, match="made for another run"):
        dfmp2.DFMP2(moved).kernel(eris=eris)
    with pytest.raises(InputError, match="made for another run"):
        dfmp2.DFMP2(here, frozen=1).kernel(eris=eris)


def test_pyscfs_own_ovl_is_checked_and_noted(ovl_files):
    """A file dfmp2 did not write (PySCF's ovL: no orbitals in it) is used after its shapes are
    checked, and the result says that only they could be."""
    directory, here, _ = ovl_files
    pt = dfmp2.DFMP2(here, precision="fp64")
    e_corr = pt.kernel(eris=pt.ao2mo(ovL=str(directory / "pyscf.h5")))[0]
    assert abs(e_corr - dfmp2.DFMP2(here, precision="fp64").kernel()[0]) < 1e-10
    assert any("pyscf.h5 was not made by dfmp2" in note for note in pt.result.notes), pt.result.notes
    with pytest.raises(InputError, match="shapes"):
        dfmp2.DFMP2(here, frozen=1).ao2mo(ovL=str(directory / "pyscf.h5"))


def test_ovl_to_save_follows_the_output_rules(tmp_path, ovl_files):
    """ovL_to_save did an os.replace over anything: a device node became an HDF5 file (as root),
    a FIFO a file, a symlink was replaced. Now: a symlink's target is written (the link stays);
    a FIFO, a device, a directory, a path inside the object's checkpoint are refused, untouched."""
    _, here, _ = ovl_files
    (tmp_path / "link.h5").symlink_to("real.h5")
    pt = dfmp2.DFMP2(here)
    pt.ao2mo(ovL_to_save=str(tmp_path / "link.h5")).close()
    assert (tmp_path / "link.h5").is_symlink() and (tmp_path / "real.h5").stat().st_size > 0
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="ovL_to_save .*fifo: is not a regular file"):
        pt.ao2mo(ovL_to_save=str(tmp_path / "fifo"))
    assert (tmp_path / "fifo").is_fifo()
    with pytest.raises(InputError, match="is a directory"):
        pt.ao2mo(ovL_to_save=str(tmp_path))
    pt.checkpoint = str(tmp_path / "ck")
    with pytest.raises(InputError, match="inside the checkpoint directory"):
        pt.ao2mo(ovL_to_save=str(tmp_path / "ck" / "ovl.h5"))
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link.h5", "real.h5"]


# ----------------------------------------------------------------------------- temporary files

def _run_until_scf_then(signum, tmp_path):
    """`dfmp2 run water.xyz` with PySCF's and the system's temporary directory in tmp_path/tmp,
    stopped by `signum` once PySCF's SCF iterations have begun (tests/faults: DFMP2_TEST_SCF_*)."""
    tmp, mark = tmp_path / "tmp", tmp_path / "in-scf"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]),
               DFMP2_TEST_SCF_DELAY="60", DFMP2_TEST_SCF_MARK=str(mark), TMPDIR=str(tmp), PYSCF_TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "dfmp2", "run", str(WATER), "--json", str(tmp_path / "o.json")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the SCF did not start"
        time.sleep(0.05)
    during = os.listdir(tmp)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return proc, stderr, during, tmp


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_scf_leaves_no_temporary_file(tmp_path, signum, code):
    """A signal during the SCF left PySCF's chkfile (8-277 KB) in $TMPDIR while the message said
    "scratch removed". PySCF's temporary files now go to the run's own directory, removed on
    the way out, and dfmp2's SCF opens no chkfile at all."""
    proc, stderr, during, tmp = _run_until_scf_then(signum, tmp_path)
    assert proc.returncode == code and stderr.count("\n") == 1 and "scratch removed" in stderr, stderr
    assert os.listdir(tmp) == []
    assert not (tmp_path / "o.json").exists()
    assert [name for name in during if name.startswith("dfmp2-pyscf-")], during  # PySCF's files went there


def test_an_unwritable_pyscf_tmpdir_is_one_line_before_the_scf(tmp_path):
    """A read-only PYSCF_TMPDIR gave a 2-line h5py OSError; now one line naming the directory,
    exit 2, before the SCF (one cycle allowed would fail with exit 1)."""
    env = dict(os.environ, PYSCF_TMPDIR="/proc")
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", str(WATER), "--scf-max-cycle", "1"], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, describe(proc)
    assert "/proc" in proc.stderr and "PYSCF_TMPDIR" in proc.stderr


@pytest.fixture
def tiny_scratch(tmp_path):
    """A 2 MB file system (tmpfs) for scratch; skipped where mounting is not allowed."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


def test_a_full_scratch_is_one_line_naming_it(tiny_scratch, tmp_path):
    """(ia|P) on disk (a checkpoint's B; the transform's blocks in scratch) on a file system that
    fills: the h5py OSError was 2 lines; now one, exit 1, naming the scratch directory, and
    nothing is left in it."""
    proc = dfmp2_cli("run", ROOT + "/examples/benzene.xyz", "--scratch", tiny_scratch, "--checkpoint", "ck",
                     "--json", "o.json", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, describe(proc)
    assert f"--scratch {tiny_scratch}" in proc.stderr and "No space left on device" in proc.stderr, proc.stderr
    assert os.listdir(tiny_scratch) == [] and not (tmp_path / "o.json").exists()


# ----------------------------------------------------------------------------- names and messages

def test_a_non_utf8_file_name_is_recorded_as_valid_json_text(tmp_path):
    """A molecule file whose name is not UTF-8 was recorded as lone surrogates (JSON that strict
    parsers reject); now its bytes are written \\xNN."""
    name = os.fsencode(tmp_path) + b"/w\xff.xyz"
    with open(name, "wb") as handle:
        handle.write(WATER.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", name, "--json", "o.json", "--quiet"],
                          capture_output=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "o.json").read_bytes().decode("utf-8", errors="strict")
    assert json.loads(text)["molecule"].endswith("w\\xff.xyz")


def test_run_help_offers_only_what_run_accepts(tmp_path):
    """`run --help` offered tf32x3|bf16x3, which run refuses (bench only)."""
    run_help, bench_help = dfmp2_cli("run", "--help", cwd=tmp_path), dfmp2_cli("bench", "--help", cwd=tmp_path)
    assert "--precision fp32|fp64 " in " ".join(run_help.stdout.split()) and "tf32x3|" not in run_help.stdout
    assert "fp32|fp64|tf32x3|bf16x3" in bench_help.stdout


# ----------------------------------------------------------------------------- optimize, bench

@pytest.mark.parametrize("atom, spin", [("He", 0), ("Li", 1)])
def test_a_single_atom_is_optimised_at_once(tmp_path, atom, spin):
    """`dfmp2 optimize he.xyz` and `li.xyz --spin 1` failed with a geomeTRIC internal error
    (exit 1). A single atom has nothing to move: one evaluation, converged at its start, its
    gradient zero, both files written."""
    pytest.importorskip("geometric")
    (tmp_path / "a.xyz").write_text(f"1\n{atom}\n{atom} 0 0 0\n")
    proc = dfmp2_cli("optimize", "a.xyz", "--spin", spin, "--json", "o.json", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["converged"] and record["steps"] == 1
    assert np.abs(record["gradient"]).max() < 1e-10
    assert (tmp_path / "a.opt.xyz").read_text().splitlines()[2].split()[0] == atom
    assert len((tmp_path / "a.traj.xyz").read_text().splitlines()) == 3


def test_bench_keeps_only_the_last_pass(monkeypatch):
    """`bench --repeat N` kept every pass's result (its arrays, its backend and trace): 1.75 GB
    after 10 minutes. Each pass's result is let go once the next begins; the record keeps each
    pass's seconds, step timings and energy."""
    import gc
    import weakref

    from dfmp2.app import bench

    alive, energy = [], bench.dfmp2_energy

    def watched(*args, **kwargs):
        gc.collect()
        alive.append(sum(ref() is not None for ref in results))
        result = energy(*args, **kwargs)
        results.append(weakref.ref(result))
        return result

    results = []
    monkeypatch.setattr(bench, "dfmp2_energy", watched)
    record = bench.run_bench(64, 8, 160, repeat=4)
    assert alive == [0, 0, 0, 0, 0]  # no earlier pass's result alive when a pass starts
    assert len(record["warm_seconds"]) == 4 and record["energy_identical_across_passes"]
