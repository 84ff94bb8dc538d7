"""Issue 72: one writer whose appends are whole lines or nothing, even when the disk fills, and
records that say what ran and what was reused.

A full disk is made without privileges with RLIMIT_FSIZE (a write past it fails with EFBIG,
"File too large", once SIGXFSZ is ignored, which CPython does at start-up and a child keeps
across exec), its soft limit lowered and raised again in one child process for every byte
offset; ENOSPC, EDQUOT and EIO are injected into os.write and os.fsync. The reference of a
whole file is the lines given to the writer; of a resumed run's record, the first run's.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from test_cli import describe, dfmp2_cli

WATER = Path(ROOT) / "examples" / "water.xyz"


def full_disk_cli(limit: int, *args, cwd, stdout=subprocess.PIPE):
    """`python -m dfmp2.app.cli ARGS` whose files cannot grow past `limit` bytes (RLIMIT_FSIZE)."""
    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "dfmp2.app.cli", *map(str, args)], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=600, stdin=subprocess.DEVNULL,
                          preexec_fn=small_files)


def whole_lines(data: bytes) -> list:
    """The records of a JSON Lines file that must be whole: it ends with a newline (or is empty)
    and each line parses."""
    assert data == b"" or data.endswith(b"\n"), data[-80:]
    return [json.loads(line) for line in data.decode().splitlines()]


# ----------------------------------------------------------------------------- a batch whose --json fills

@pytest.mark.parametrize("to_stdout", [False, True])
def test_a_batch_whose_json_fills_stops_with_one_line_and_whole_records(tmp_path, to_stdout):
    """Two waters, --json (a file, or standard output sent to a file) room for one record: the
    second's line was a traceback (the buffered file failed again at close) and a cut last
    record; now exit 1, one line naming the file and the reason, the first record whole, and
    no temporary file left."""
    for name in ("a.xyz", "b.xyz"):
        (tmp_path / name).write_bytes(WATER.read_bytes())
    limit = 6500  # a water record is about 4.5 kB
    if to_stdout:
        with open(tmp_path / "captured.jsonl", "wb") as out:
            proc = full_disk_cli(limit, "run", "a.xyz", "b.xyz", "--json", "-", cwd=tmp_path, stdout=out)
        written, named = (tmp_path / "captured.jsonl").read_bytes(), "--json -"
    else:
        proc = full_disk_cli(limit, "run", "a.xyz", "b.xyz", "--json", "out.jsonl", "--quiet", cwd=tmp_path)
        written, named = (tmp_path / "out.jsonl").read_bytes(), "--json out.jsonl"
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"dfmp2: error: {named}: File too large") and "b.xyz" in proc.stderr, proc.stderr
    records = whole_lines(written)
    assert [(r["molecule"], r["status"]) for r in records] == [("a.xyz", "ok")]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".dfmp2-")]


def test_a_batch_with_json_on_standard_output_names_it(tmp_path):
    """`--json -` with a failed molecule said "their reasons are in -"."""
    (tmp_path / "bad.xyz").write_text("1\n\nXx 0 0 0\n")
    (tmp_path / "worse.xyz").write_text("nonsense\n")
    proc = dfmp2_cli("run", "bad.xyz", "worse.xyz", "--json", "-", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, describe(proc)
    assert "their reasons are in the JSON Lines on standard output" in proc.stderr, proc.stderr
    assert [r["status"] for r in whole_lines(proc.stdout.encode())] == ["failed", "failed"]


def test_one_run_whose_outputs_do_not_fit_writes_none(tmp_path):
    """--json and --natorbs of one run on a full disk: one line naming the first that failed,
    exit 1, neither file nor a temporary one left (as before: the staged outputs' rule)."""
    proc = full_disk_cli(1000, "run", WATER, "--json", "o.json", "--natorbs", "n.molden", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "File too large; no output file was written" in proc.stderr
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- the writer at every byte offset

CHILD = textwrap.dedent(r"""
    import json, os, resource, sys
    from dfmp2.util.files import Outputs, write_atomically
    from dfmp2.util.errors import ComputationError
    from dfmp2.run.checkpoint.journal import PairJournal, RECORD
    from dfmp2.util.provenance import JOURNAL_HEADER_BYTES
    import numpy as np

    directory = sys.argv[1]
    FSIZE, (soft, hard) = resource.RLIMIT_FSIZE, resource.getrlimit(resource.RLIMIT_FSIZE)
    first, second = json.dumps({"molecule": "a", "e": -76.2}), json.dumps({"molecule": "b", "e": -76.3})
    found = []

    def limited(limit, action):
        # action() with files held below `limit` bytes: ('ok', None) or ('error', its message)
        resource.setrlimit(FSIZE, (limit, hard))
        try:
            action()
            return "ok", None
        except ComputationError as error:
            return "error", str(error)
        except BaseException as error:
            return "other", repr(error)
        finally:
            resource.setrlimit(FSIZE, (soft, hard))

    def contents(path):
        return open(path, "rb").read().decode("latin-1") if os.path.exists(path) else None

    for k in range(len(second) + 1):  # the second line cut at every byte
        here = os.path.join(directory, f"lines{k}"); os.mkdir(here)
        path = os.path.join(here, "out.jsonl")
        outputs = Outputs(); outputs.add("--json", path); outputs.append_line("--json", first)
        limit = len(first) + 1 + k
        appended = limited(limit, lambda: outputs.append_line("--json", second))
        closed = limited(limit, outputs.discard)  # the disk is still full when the run ends
        found.append(["append", k, appended, closed, contents(path), sorted(os.listdir(here))])

    for k in range(len(first) + 1):  # the first line cut at every byte: the file it replaces stays
        here = os.path.join(directory, f"first{k}"); os.mkdir(here)
        path = os.path.join(here, "out.jsonl")
        open(path, "w").write("previous\n")
        outputs = Outputs(); outputs.add("--json", path)
        appended = limited(k, lambda: outputs.append_line("--json", first))
        closed = limited(k, outputs.discard)
        found.append(["first", k, appended, closed, contents(path), sorted(os.listdir(here))])

    for k in range(RECORD.size + 1):  # a journal's record cut at every byte
        here = os.path.join(directory, f"journal{k}"); os.mkdir(here)
        path = os.path.join(here, "pairs.journal")
        journal = PairJournal(path, 4, {"run": k}); journal.record(0, -0.1, -0.05)
        limit = JOURNAL_HEADER_BYTES + RECORD.size + k
        appended = limited(limit, lambda: journal.record(1, -0.2, -0.07))
        closed = limited(limit, journal.close)
        sums = np.zeros((4, 2))
        done, damaged = PairJournal(path, 4, {"run": k}).restore(sums)
        found.append(["journal", k, appended, closed, os.path.getsize(path), [sorted(done), damaged, sums.tolist()]])

    here = os.path.join(directory, "atomic"); os.mkdir(here)
    path = os.path.join(here, "scf.npz"); open(path, "w").write("previous")
    def thousand_bytes(tmp):
        with open(tmp, "wb") as out:
            out.write(b"x" * 1000)

    appended = limited(100, lambda: write_atomically(path, thousand_bytes))
    found.append(["atomic", 0, appended, None, contents(path), sorted(os.listdir(here))])
    print(json.dumps(found))
""")


@pytest.fixture(scope="module")
def cut_at_every_byte(tmp_path_factory):
    """What the writers did with their files held below each byte of a line (RLIMIT_FSIZE), in
    one child process (its soft limit lowered and raised again for each case)."""
    directory = tmp_path_factory.mktemp("cut")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(directory)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_line_that_does_not_fit_is_not_written_at_any_byte(cut_at_every_byte):
    """The second line of --json's JSON Lines, its room ending at each of its bytes: the buffered
    file left the first k bytes of it (a cut record) and failed again when closed; now the file
    holds the first line alone, whole, the error names the file and the reason, and closing
    raises nothing."""
    first, second = json.dumps({"molecule": "a", "e": -76.2}), json.dumps({"molecule": "b", "e": -76.3})
    cases = [case for case in cut_at_every_byte if case[0] == "append"]
    assert len(cases) == len(second) + 1  # room for 0 .. all but the newline
    for _, k, appended, closed, text, names in cases:
        assert text == first + "\n", (k, text)
        assert closed == ["ok", None], (k, closed)
        assert names == ["out.jsonl"], (k, names)  # no temporary file
        assert appended[0] == "error" and appended[1].startswith("--json ") and "File too large" in appended[1], (
            k, appended)
        assert "this line was not written (the 1 line before it stays, whole)" in appended[1], appended


def test_a_first_line_that_does_not_fit_leaves_the_previous_file(cut_at_every_byte):
    """The first line's room ending at each of its bytes: the file it would replace keeps its
    contents, and no staged file is left."""
    first = json.dumps({"molecule": "a", "e": -76.2})
    cases = [case for case in cut_at_every_byte if case[0] == "first"]
    assert len(cases) == len(first) + 1
    for _, k, appended, closed, text, names in cases:
        assert closed == ["ok", None] and text == "previous\n" and names == ["out.jsonl"], (k, closed, text, names)
        assert appended[0] == "error" and "File too large" in appended[1] and "(nothing was written)" in appended[1], (
            k, appended)


def test_a_journal_record_that_does_not_fit_is_not_written_at_any_byte(cut_at_every_byte):
    """The pair journal's second record, its room ending at each of its bytes: an unbuffered
    write that wrote part of it went unnoticed (a torn record, the next one misaligned); now
    one error naming the journal, the file cut back to its first record, which a resume reads."""
    from dfmp2.run.checkpoint.journal import RECORD
    from dfmp2.util.provenance import JOURNAL_HEADER_BYTES

    cases = [case for case in cut_at_every_byte if case[0] == "journal"]
    assert len(cases) == RECORD.size + 1
    for _, k, appended, closed, size, (done, damaged, sums) in cases:
        if k == RECORD.size:  # room for it
            assert appended == ["ok", None] and size == JOURNAL_HEADER_BYTES + 2 * RECORD.size and done == [0, 1]
            continue
        assert size == JOURNAL_HEADER_BYTES + RECORD.size and done == [0] and damaged == 0, (k, size, done, appended)
        assert sums[0] == [-0.1, -0.05]
        assert appended[0] == "error" and "pairs.journal: File too large" in appended[1], (k, appended)
        assert closed == ["ok", None], (k, closed)


def test_an_atomic_write_that_does_not_fit_is_one_error_and_leaves_the_file(cut_at_every_byte):
    """A checkpoint's file (write_atomically) on a full disk: a bare OSError before; now one
    ComputationError naming the file and the reason, the previous file untouched, no partial."""
    [(_, _, appended, _, text, names)] = [case for case in cut_at_every_byte if case[0] == "atomic"]
    assert text == "previous" and names == ["scf.npz"]
    assert appended[0] == "error" and "scf.npz: File too large; it was not written" in appended[1], appended


# ----------------------------------------------------------------------------- injected ENOSPC, EDQUOT, EIO

def failing_writes(monkeypatch, room: int, number: int, fail_fsync=False):
    """os.write takes `room` more bytes (short writes as a filling disk makes), then fails with
    errno `number`; fail_fsync: os.fsync fails with it instead."""
    real_write, left = os.write, [room]

    def write(fd, data):
        if fail_fsync:
            return real_write(fd, data)
        if left[0] == 0:
            raise OSError(number, os.strerror(number))
        taken = real_write(fd, bytes(data[:left[0]]))
        left[0] -= taken
        return taken

    def fsync(fd):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, "write", write)
    if fail_fsync:
        monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_the_writer_cuts_a_failed_line_back_at_every_byte(tmp_path, monkeypatch, number):
    """ENOSPC, EDQUOT or EIO after each byte of a line (and at its fsync): one ComputationError
    with the C library's reason, the file holds the earlier line alone."""
    from dfmp2.util.errors import ComputationError
    from dfmp2.util.files import Outputs

    first, second = '{"molecule": "a"}', '{"molecule": "b", "e_tot": -76.23}'
    for k in [*range(len(second) + 1), "fsync"]:
        path = tmp_path / f"{k}.jsonl"
        outputs = Outputs()
        outputs.add("--json", str(path))
        outputs.append_line("--json", first)
        failing_writes(monkeypatch, 0 if k == "fsync" else k, number, fail_fsync=k == "fsync")
        with pytest.raises(ComputationError, match=rf"^--json .*{k}\.jsonl: {os.strerror(number)}; this line was not"):
            outputs.append_line("--json", second)
        outputs.discard()
        monkeypatch.undo()
        assert path.read_text() == first + "\n", k
    assert sorted(os.listdir(tmp_path)) == sorted(f"{k}.jsonl" for k in [*range(len(second) + 1), "fsync"])


def test_a_signal_between_writes_leaves_no_part_of_the_line(tmp_path, monkeypatch):
    """A stopping signal (its KeyboardInterrupt) between two writes of one line: the line's part
    goes, the signal goes on (it is not a write failure)."""
    from dfmp2.util.appends import Appender

    path = tmp_path / "lines"
    writer = Appender.open(path)
    writer.append(b"whole\n")
    real_write, calls = os.write, []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(KeyboardInterrupt):
        writer.append(b"the next line\n")
    monkeypatch.undo()
    writer.close()
    assert path.read_bytes() == b"whole\n"


def test_standard_output_sent_to_a_file_is_cut_back_only_at_its_end(tmp_path, monkeypatch):
    """A descriptor the writer did not open (standard output redirected to a file): a failed
    append that started at the file's end is cut back; one that started inside the file (what
    follows is someone else's) is not truncated."""
    from dfmp2.util.appends import Appender

    at_end = tmp_path / "end"
    at_end.write_bytes(b"theirs\n")
    fd = os.open(at_end, os.O_WRONLY)
    os.lseek(fd, 0, os.SEEK_END)
    failing_writes(monkeypatch, 4, errno.ENOSPC)
    with pytest.raises(OSError):
        Appender(fd, owned=False).append(b"ours, cut\n")
    monkeypatch.undo()
    assert at_end.read_bytes() == b"theirs\n"
    inside = tmp_path / "inside"
    inside.write_bytes(b"0123456789 theirs\n")
    fd2 = os.open(inside, os.O_WRONLY)
    failing_writes(monkeypatch, 4, errno.ENOSPC)
    writer = Appender(fd2, owned=False)
    with pytest.raises(OSError):
        writer.append(b"ours\n")
    monkeypatch.undo()
    assert inside.read_bytes() == b"ours456789 theirs\n" and writer.left_cut is None
    os.close(fd)
    os.close(fd2)


# ----------------------------------------------------------------------------- the SCF's record on resume

@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Water/cc-pVDZ with a checkpoint, the default SCF (torch's builds, mixed): (its record, the checkpoint)."""
    from dfmp2.api.driver import run_xyz

    checkpoint = tmp_path_factory.mktemp("resume") / "ck"
    return run_xyz(WATER, checkpoint=str(checkpoint)).as_dict(), checkpoint


@pytest.mark.parametrize("asked, setting", [({"scf_precision": "fp64"}, "scf_precision='fp64'"),
                                            ({"scf_backend": "pyscf"}, "scf_backend='pyscf'")])
def test_a_resumed_run_records_the_scf_it_reused(first_run, asked, setting):
    """Resuming with scf_precision='fp64' or scf_backend='pyscf' reused the checkpoint's mixed
    torch SCF and recorded fp64 / pyscf. Now the record is the reused SCF's (the first run's
    backend, precision, iterations and builds), flagged scf_reused, with a note naming what this
    run asked for; the energy is the first run's."""
    from dfmp2.api.driver import run_xyz

    made, checkpoint = first_run
    assert made["scf_backend"] == "torch" and made["scf_precision"] == "mixed"
    again = run_xyz(WATER, checkpoint=str(checkpoint), **asked).as_dict()
    assert again["checkpoint"]["reused_scf"]
    for key in ("scf_backend", "scf_precision", "scf_iterations", "scf_builds"):
        assert again.get(key) == made[key], key
    assert made["scf_reused"] is False and again["scf_reused"] is True
    assert again["screening"].get("scf") == made["screening"].get("scf")
    assert again["e_tot"] == made["e_tot"] and again["e_ref"] == made["e_ref"]
    [note] = [n for n in again["notes"] if n.startswith("the SCF was reused from checkpoint=")]
    assert "made with torch's J/K builds (mixed)" in note and setting in note and "scf.npz" in note, note


def test_a_resumed_run_asking_for_the_same_scf_has_no_note(first_run):
    from dfmp2.api.driver import run_xyz

    made, checkpoint = first_run
    again = run_xyz(WATER, checkpoint=str(checkpoint)).as_dict()
    assert again["scf_iterations"] == made["scf_iterations"] and again["scf_reused"] is True
    assert not [n for n in again["notes"] if "SCF was reused" in n]


def test_a_kept_scf_without_its_record_is_recomputed(tmp_path):
    """An scf.npz the manifest vouches for but without the record of what made it (another
    build of dfmp2): not used, a note, the SCF run again and kept with its record."""
    import numpy as np

    from dfmp2.run.checkpoint.directory import open_checkpoint
    from dfmp2.run.checkpoint.policy import SCF_RECORD, RunCheckpoint

    identity = {"molecule": "water"}
    checkpoint = open_checkpoint(tmp_path / "ck")
    checkpoint.claim("run", identity)
    checkpoint.save_arrays("scf", "run", e_tot=np.float64(-76.0))  # no record
    policy = RunCheckpoint(checkpoint)
    with policy:
        mf, reused = policy.resume_scf(identity, lambda: "ran", lambda mf: {"e_tot": np.float64(-76.1)},
                                       lambda mf: {"scf_backend": "pyscf"})
    assert (mf, reused) == ("ran", False)
    assert any("scf.npz holds no record of what made the SCF; the SCF was recomputed" in n for n in checkpoint.notes)
    checkpoint = open_checkpoint(tmp_path / "ck")
    with RunCheckpoint(checkpoint) as policy:
        held, reused = policy.resume_scf(identity, lambda: pytest.fail("ran again"), None, None)
    assert reused and held[SCF_RECORD] == {"scf_backend": "pyscf"} and float(held["e_tot"]) == -76.1


@pytest.mark.parametrize("command", [["run", "water"], ["info"]])
def test_a_summary_to_a_full_standard_output_is_one_line_not_exit_0(tmp_path, command):
    """`dfmp2 run a.xyz > file` on a full disk cut the printed summary and exited 0 without a word (the
    text layer's buffer failed at exit): the summary is written whole or not at all, and the
    failure is one line, exit 1, while the files the run wrote stay in place."""
    args = [str(WATER) if arg == "water" else arg for arg in command]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "dfmp2", *args, *(["--json", "out.json"] if "run" in args else [])],
                              cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "standard output: No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    if "run" in args:
        assert json.loads((tmp_path / "out.json").read_text())["e_tot"] < 0


def test_a_memory_error_is_one_line_that_says_out_of_memory(capsys):
    """A MemoryError (often without text) was 'MemoryError:  (rerun with --debug ...)'."""
    from dfmp2.app.signals import guarded
    from dfmp2.util.files import Outputs

    def compute():
        raise MemoryError()

    with pytest.raises(SystemExit) as stopped:
        guarded(compute, False, Outputs())
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dfmp2: error: out of memory: an allocation failed (MemoryError)")


def test_torchs_allocator_failing_is_one_line_that_says_out_of_memory(capsys):
    """torch's CPU allocator raises a RuntimeError, not a MemoryError (`dfmp2 bench --shape medium`
    under `ulimit -d 500600`): it says out of memory too, in one line."""
    import torch

    from dfmp2.app.signals import guarded
    from dfmp2.util.files import Outputs

    with pytest.raises(SystemExit) as stopped:
        guarded(lambda: torch.empty(2**45, dtype=torch.float64), False, Outputs())
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dfmp2: error: out of memory: an allocation failed (RuntimeError: ")
    assert "can't allocate memory" in err
