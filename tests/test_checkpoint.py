"""Checkpoint/restart and signals, by stopping real `dfmp2 run` processes.

The runs are slowed in the pair stage by tests/faults/sitecustomize.py (a sleep before each
pair block), so that SIGKILL/SIGTERM/SIGINT land after some blocks have finished and before
the last; the arithmetic is untouched. Reference energies come from uninterrupted in-process
runs without a checkpoint.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dfmp2.run.checkpoint.journal import RECORD
from dfmp2.util.provenance import JOURNAL_HEADER_BYTES
from dfmp2.util.errors import InputError
from dfmp2.api.driver import run_xyz
from dfmp2.kernels import COMMAND_PRECISION

from conftest import ROOT

BENZENE = os.path.join(ROOT, "examples", "benzene.xyz")
FAULTS = os.path.join(ROOT, "tests", "faults")
DELAY_S = "0.4"  # per pair block: 10 blocks on benzene/cc-pVDZ


@pytest.fixture(scope="module")
def uninterrupted():
    """Benzene/cc-pVDZ without a checkpoint, in the command's default precision: the energy a
    resumed run must reproduce."""
    return run_xyz(BENZENE, precision=COMMAND_PRECISION)


def start(args, delay=None):
    env = dict(os.environ)
    if delay is not None:
        env["PYTHONPATH"] = os.pathsep.join([FAULTS, env.get("PYTHONPATH", "")])
        env["DFMP2_TEST_PAIR_DELAY"] = delay
    return subprocess.Popen([sys.executable, "-m", "dfmp2", "run", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, preexec_fn=_default_stop_signals)


def _default_stop_signals():
    """SIGINT and SIGTERM as a shell gives a foreground command, whatever the test process inherited."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def finished_blocks(checkpoint):
    path = os.path.join(checkpoint, "pairs.journal")
    return max(0, os.path.getsize(path) - JOURNAL_HEADER_BYTES) // RECORD.size if os.path.exists(path) else 0


def wait_for_blocks(proc, checkpoint, count, timeout=240):
    deadline = time.monotonic() + timeout
    while finished_blocks(checkpoint) < count:
        assert proc.poll() is None, f"the run ended before {count} pair blocks: {proc.communicate()}"
        assert time.monotonic() < deadline, "no pair-stage progress"
        time.sleep(0.05)


def test_resume_after_sigkill_redoes_no_finished_work(tmp_path, uninterrupted):
    checkpoint, out, scratch = tmp_path / "ck", tmp_path / "out.json", tmp_path / "scratch"
    scratch.mkdir()
    args = [BENZENE, "--checkpoint", checkpoint, "--json", out, "--quiet", "--scratch", scratch]
    proc = start(args, delay=DELAY_S)
    wait_for_blocks(proc, checkpoint, 4)
    proc.kill()  # SIGKILL: no cleanup of any kind
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    kept = finished_blocks(checkpoint)
    assert kept >= 4

    resumed = subprocess.run([sys.executable, "-m", "dfmp2", "run", *map(str, args)], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    record = json.loads(out.read_text())
    ck = record["checkpoint"]
    total = ck["pair_tasks"]
    assert total >= 6 and kept < total
    assert ck["reused_scf"] and ck["reused_B"] and ck["reused_pair_tasks"] == kept
    assert record["kernels"].get("pair_energy") == total - kept  # finished blocks not recomputed
    assert "ao2mo" not in record["kernels"]  # neither the transform nor the whitening ran again
    for key in ("e_corr", "e_corr_os", "e_corr_ss", "e_tot"):
        assert abs(record[key] - getattr(uninterrupted, key)) < 1e-12, key
    assert os.listdir(scratch) == []  # the killed run's scratch directory went with the rerun


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_removes_scratch_keeps_checkpoint(tmp_path, signum, code):
    checkpoint, scratch, out = tmp_path / "ck", tmp_path / "scratch", tmp_path / "out.json"
    scratch.mkdir()
    proc = start([BENZENE, "--checkpoint", checkpoint, "--scratch", scratch, "--json", out], delay=DELAY_S)
    wait_for_blocks(proc, checkpoint, 1)
    assert os.listdir(scratch)  # the run's scratch directory exists while it runs
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert signal.Signals(signum).name in stderr
    assert "E(corr)" not in stdout and not out.exists()
    assert os.listdir(scratch) == []
    assert {"manifest.json", "scf.npz", "B_restricted.h5", "pairs.journal"} <= set(os.listdir(checkpoint))


def test_checkpoint_of_another_run_is_refused(tmp_path):
    checkpoint = tmp_path / "ck"
    water = os.path.join(ROOT, "examples", "water.xyz")
    first = subprocess.run([sys.executable, "-m", "dfmp2", "run", water, "--checkpoint", checkpoint, "--quiet"],
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    other_basis = subprocess.run([sys.executable, "-m", "dfmp2", "run", water, "--checkpoint", checkpoint,
                                  "--basis", "cc-pvtz"], capture_output=True, text=True, timeout=600)
    assert other_basis.returncode == 2
    assert "belongs to another run" in other_basis.stderr and "basis" in other_basis.stderr
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["run"]["dfmp2"] = "0.0.1"
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    other_version = subprocess.run([sys.executable, "-m", "dfmp2", "run", water, "--checkpoint", checkpoint],
                                   capture_output=True, text=True, timeout=600)
    assert other_version.returncode == 2 and "dfmp2" in other_version.stderr


def test_plugin_checkpoint_open_shell(tmp_path):
    """UHF through the plugin: a second run on the same checkpoint reuses B and every pair
    block, and both equal a run without a checkpoint."""
    from pyscf import gto, scf

    from dfmp2 import DFMP2

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-11)
    plain = DFMP2(mf).run()
    first = DFMP2(mf)
    first.checkpoint = str(tmp_path / "ck")
    first.run()
    again = DFMP2(mf)
    again.checkpoint = str(tmp_path / "ck")
    again.run()
    ck = again.result.correlation.checkpoint
    assert ck["reused_B"] and ck["reused_pair_tasks"] == ck["pair_tasks"] == 3
    assert again.result.kernels.get("pair_energy") is None
    assert abs(first.e_corr - plain.e_corr) < 1e-12 and again.e_corr == first.e_corr
    other = DFMP2(mf, frozen=1)
    other.checkpoint = str(tmp_path / "ck")
    with pytest.raises(InputError, match="belongs to another run"):
        other.run()


# ----------------------------------------------------------------------------- trust (issue 21)

WATER = os.path.join(ROOT, "examples", "water.xyz")
OTHER_WATER = "3\nanother geometry\nO 0 0 0\nH 0 0.8 -0.5\nH 0 -0.8 -0.5\n"


def dfmp2_run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dfmp2", "run", *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600, cwd=cwd)


def snapshot(directory):
    """{name: bytes} of every file in `directory`."""
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.fixture(scope="module")
def water_checkpoint(tmp_path_factory):
    """A complete checkpoint of water/cc-pVDZ and the run's record."""
    directory = tmp_path_factory.mktemp("water-ck")
    out = directory / "out.json"
    proc = dfmp2_run(WATER, "--checkpoint", directory / "ck", "--json", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    return directory / "ck", json.loads(out.read_text())


def copy_of(checkpoint, tmp_path):
    import shutil

    target = tmp_path / "ck"
    shutil.copytree(checkpoint, target)
    return target


def test_a_checkpoint_without_its_manifest_is_not_trusted(tmp_path, water_checkpoint):
    """The defect: with manifest.json deleted, another geometry reused the old SCF (E_corr -0.432
    instead of -0.221, "reused: SCF"). Now nothing unvouched is used, nor touched: exit 2."""
    checkpoint = copy_of(water_checkpoint[0], tmp_path)
    os.unlink(checkpoint / "manifest.json")
    before = snapshot(checkpoint)
    (tmp_path / "other.xyz").write_text(OTHER_WATER)
    proc = dfmp2_run(tmp_path / "other.xyz", "--checkpoint", checkpoint, "--json", tmp_path / "out.json")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no dfmp2 manifest.json" in proc.stderr
    assert snapshot(checkpoint) == before and not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("name, reused, recomputed", [
    ("scf.npz", (), "the SCF was"),
    ("B_restricted.h5", ("reused_scf",), "B (transform and whitening) was"),
    ("pairs.journal", ("reused_scf", "reused_B"), "those pair blocks were"),
])
def test_a_damaged_file_is_recomputed_and_announced(tmp_path, water_checkpoint, name, reused, recomputed):
    """One byte of a vouched-for file flipped: size and sha256 (journal records: crc32) catch it,
    the run recomputes what it held, gives the undamaged energy and says so in its notes."""
    source, first = water_checkpoint
    checkpoint = copy_of(source, tmp_path)
    data = bytearray((checkpoint / name).read_bytes())
    # (a journal's: in its last record, past the header that names its run)
    data[len(data) - RECORD.size // 2 if name == "pairs.journal" else len(data) // 2] ^= 0x01
    (checkpoint / name).write_bytes(bytes(data))
    out = tmp_path / "out.json"
    proc = dfmp2_run(WATER, "--checkpoint", checkpoint, "--json", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert abs(record["e_corr"] - first["e_corr"]) < 1e-12
    notes = [note for note in record["notes"] if name in note]
    assert len(notes) == 1 and "damaged" in notes[0] and recomputed in notes[0], record["notes"]
    ck = record["checkpoint"]
    for key in ("reused_scf", "reused_B"):
        assert ck[key] == (key in reused), (key, ck)
    if name == "pairs.journal":
        assert ck["reused_pair_tasks"] == 0 and record["kernels"]["pair_energy"] == ck["pair_tasks"]


def test_files_dfmp2_did_not_write_are_never_deleted(tmp_path):
    """--checkpoint on a directory holding the user's B_*.h5, .B_* and pairs*.journal deleted them
    when it reset its B and pair sections. Now: refused without a flag; with it, dfmp2 writes
    beside them, and a reset (a damaged B) removes only its own files."""
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    mine = {"B_mine.h5": b"user data 1", ".B_hidden": b"user data 2", "pairs7.journal": b"user data 3"}
    for name, data in mine.items():
        (checkpoint / name).write_bytes(data)
    refused = dfmp2_run(WATER, "--checkpoint", checkpoint)
    assert refused.returncode == 2 and "--checkpoint-allow-other-files" in refused.stderr
    assert snapshot(checkpoint) == mine
    for _ in range(2):
        proc = dfmp2_run(WATER, "--checkpoint", checkpoint, "--checkpoint-allow-other-files", "--quiet")
        assert proc.returncode == 0, proc.stderr
        data = bytearray((checkpoint / "B_restricted.h5").read_bytes())  # the next run resets B
        data[len(data) // 2] ^= 0x01
        (checkpoint / "B_restricted.h5").write_bytes(bytes(data))
    assert {name: (checkpoint / name).read_bytes() for name in mine} == mine
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert not set(mine) & set(manifest["files"])


def test_a_second_run_on_a_checkpoint_in_use_is_refused_at_once(tmp_path):
    """Two runs sharing one --checkpoint: the second exits 2 naming the first's process, before
    its SCF (it used to fail after it with an HDF5 lock error)."""
    checkpoint = tmp_path / "ck"
    # 3 s a block (the first is killed at the end): the first run must outlast the second's
    # start-up even on a loaded machine, where 0.4 s blocks let it finish first
    first = start([BENZENE, "--checkpoint", checkpoint, "--quiet"], delay="3.0")
    try:
        wait_for_blocks(first, checkpoint, 1)
        second = dfmp2_run(BENZENE, "--checkpoint", checkpoint, "--scf-max-cycle", "1")
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"in use by process {first.pid}" in second.stderr
    finally:
        first.kill()
        first.communicate()


# ----------------------------------------------------------------------------- provenance (issue 46)

def test_a_journal_copied_from_another_runs_checkpoint_is_not_used(tmp_path, water_checkpoint):
    """The defect: pairs.journal copied from another run's checkpoint (same pair-task list, another
    geometry) was reused: exit 0, E_tot 5.2e-4 Eh off, reused_pair_tasks 1, no note (its records
    carry only their own crc32). Now the journal's header names the run it was written for: the
    copy is not used, the run says so and gives the energy of its own geometry."""
    source, _ = water_checkpoint
    (tmp_path / "other.xyz").write_text(OTHER_WATER)
    checkpoint, out = tmp_path / "ck", tmp_path / "out.json"
    first = dfmp2_run(tmp_path / "other.xyz", "--checkpoint", checkpoint, "--json", out, "--quiet")
    assert first.returncode == 0, first.stderr
    own = json.loads(out.read_text())
    (checkpoint / "pairs.journal").write_bytes((source / "pairs.journal").read_bytes())
    again = dfmp2_run(tmp_path / "other.xyz", "--checkpoint", checkpoint, "--json", out, "--quiet")
    assert again.returncode == 0, again.stderr
    record = json.loads(out.read_text())
    assert record["checkpoint"]["reused_pair_tasks"] == 0 and record["checkpoint"]["reused_B"]
    assert abs(record["e_tot"] - own["e_tot"]) < 1e-12
    notes = [note for note in record["notes"] if "pairs.journal" in note]
    assert len(notes) == 1 and "not written for this run" in notes[0], record["notes"]


def test_every_checkpoint_file_carries_its_identity(water_checkpoint):
    """scf.npz, B and the journal each hold the identity of the manifest sections they were made
    from (dfmp2.util.provenance), the journal as a header, so that a file alone says what it belongs to."""
    import h5py

    from dfmp2.run.checkpoint.directory import FILE_SOURCES
    from dfmp2.util.provenance import JOURNAL_MAGIC, arrays_identity, digest, h5_identity

    source, _ = water_checkpoint
    manifest = json.loads((source / "manifest.json").read_text())

    def expected(section):
        return {"format": manifest["format_version"], "section": section,
                **{s: manifest[s] for s in FILE_SOURCES[section] if s in manifest}}

    with np.load(source / "scf.npz") as data:
        assert arrays_identity(dict(data))[0] == expected("run")
    with h5py.File(source / "B_restricted.h5", "r") as held:
        assert h5_identity(held) == expected("B")
    journal = (source / "pairs.journal").read_bytes()
    assert journal.startswith(JOURNAL_MAGIC) and journal[len(JOURNAL_MAGIC):len(JOURNAL_MAGIC) + 32] == \
        digest(expected("pairs"))


def test_another_runs_checkpoint_names_the_whole_difference(tmp_path, water_checkpoint):
    """The refusal named the differing setting truncated to 60 characters (a geometry's atoms
    list cut before the atom that moved). Now it names the first differing value itself, with its
    place (atoms[1][2] of the run section) and both values."""
    checkpoint = copy_of(water_checkpoint[0], tmp_path)
    moved = Path(WATER).read_text().splitlines()
    fields = moved[3].split()
    fields[2] = f"{float(fields[2]) + 0.01:.6f}"
    moved[3] = "  ".join(fields)
    (tmp_path / "moved.xyz").write_text("\n".join(moved) + "\n")
    proc = dfmp2_run(tmp_path / "moved.xyz", "--checkpoint", checkpoint)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "run differs: atoms[1][2]: " in proc.stderr and fields[2].rstrip("0") in proc.stderr, proc.stderr
