"""Scratch ownership (issue 72): every scratch directory a run makes is named by its run and locked
by it (dfmp2.util.scratch: an flock the kernel drops when the holder dies), and only a directory
whose lock can be taken is removed; a resume removes its own dead run's scratch of every kind.

The runs are real `dfmp2` processes stopped at known points by tests/faults/sitecustomize.py
(DFMP2_TEST_*: a wait at the pair stage, in the SCF, before a checkpoint's lock, after a scratch
directory of a given kind is made). Reference energies: an uninterrupted in-process run.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dfmp2.api.driver import run_xyz
from dfmp2.kernels import COMMAND_PRECISION

from conftest import ROOT

WATER = os.path.join(ROOT, "examples", "water.xyz")
FAULTS = os.path.join(ROOT, "tests", "faults")


@pytest.fixture(scope="module")
def water_energy():
    """E_tot of water/cc-pVDZ in the command's default precision, uninterrupted, in process."""
    return run_xyz(WATER, precision=COMMAND_PRECISION).e_tot


def start(command, *args, cwd=None, **hooks):
    """`dfmp2 command args` started in `cwd` (where an optimisation writes its geometry files), with
    the fault hooks `hooks` (DFMP2_TEST_<NAME>=value)."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYSCF_TMPDIR", "TMPDIR")}
    env["PYTHONPATH"] = os.pathsep.join([FAULTS, os.environ.get("PYTHONPATH", "")])
    env.update({f"DFMP2_TEST_{name}": str(value) for name, value in hooks.items()})
    return subprocess.Popen([sys.executable, "-m", "dfmp2", command, *map(str, args)], env=env, text=True, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def finish(proc, timeout=600):
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stdout, stderr


def wait_for(path, *procs, timeout=300):
    """Wait until `path` exists, every process in `procs` still running."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        for proc in procs:
            assert proc.poll() is None, f"ended before {path}: {finish(proc)}"
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)


def scratch_of(root) -> list:
    return sorted(os.listdir(root))


HOLDER = textwrap.dedent("""
    import sys, time
    from dfmp2.util.scratch import scratch_directory
    directory = scratch_directory(sys.argv[2], sys.argv[1], name=sys.argv[3])
    print(directory.name, flush=True)
    time.sleep(600)
""")


def holder(root, name, kind="scf"):
    """A process that made a scratch directory <name><kind>-* under `root` through util.scratch and
    holds it (sleeps): (the process, the directory)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), kind, name], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    path = proc.stdout.readline().strip()
    assert path and os.path.isdir(path), proc.communicate()
    return proc, path


def scratch_name(checkpoint) -> str:
    """The name the scratch directories of a checkpoint's runs bear (its manifest's identity)."""
    from dfmp2.util.scratch import run_name

    return run_name(json.loads((checkpoint / "manifest.json").read_text())["scratch_id"])


# ----------------------------------------------------------------------------- the lock


def test_a_sweep_removes_a_dead_runs_directory_and_never_a_live_or_unlocked_one(tmp_path):
    """A scratch directory held by a live process is never swept; one whose holder was SIGKILLed is
    (its lock went with it); one without a lock file (the user's, or one being made) is left
    alone, as is one this process holds itself."""
    from dfmp2.util.scratch import LOCKING, in_use, run_name, scratch_directory, sweep

    name = run_name("0123456789abcdef")
    live, live_path = holder(tmp_path, name)
    dead, dead_path = holder(tmp_path, name, kind="gradient")
    try:
        dead.kill()
        dead.communicate()
        unlocked = tmp_path / f"{name}mine"  # bears the name, holds no lock file: not provably dfmp2's
        unlocked.mkdir()
        (unlocked / "data").write_text("the user's")
        half_made = tmp_path / f"{name}scf-new"  # its lock file not yet renamed to its final name
        half_made.mkdir()
        (half_made / LOCKING).write_text("")
        other = holder(tmp_path, run_name("fedcba9876543210"))  # another run's name: not matched
        own = scratch_directory("b", tmp_path, name=name)
        assert in_use(own.name) and not in_use(live_path)
        removed = sweep(name, tmp_path)
        assert removed == [dead_path]
        assert os.path.isdir(live_path) and os.path.isdir(own.name) and os.path.isdir(other[1])
        assert (unlocked / "data").read_text() == "the user's" and half_made.is_dir()
        own.cleanup()
        assert not os.path.exists(own.name)
        other[0].kill()
        other[0].communicate()
    finally:
        live.kill()
        live.communicate()
    assert sweep(name, tmp_path) == [live_path]  # dead now: swept


def test_a_forked_child_neither_removes_nor_releases_its_parents_directory(tmp_path):
    """An flock belongs to the open file description a forked child shares: the child's cleanup
    (its interpreter's exit, a collected object) leaves the directory to its maker, and the lock
    stays held (another process's sweep passes it over) until the maker itself lets it go."""
    from dfmp2.util.scratch import run_name, scratch_directory

    name = run_name("00000000000000aa")
    directory = scratch_directory("rank", tmp_path, name=name)
    child = os.fork()
    if child == 0:  # the child: clean up its copy, as its exit would
        try:
            directory.cleanup()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    sweep_from_elsewhere = subprocess.run(
        [sys.executable, "-c", f"from dfmp2.util.scratch import sweep; print(sweep({name!r}, {str(tmp_path)!r}))"],
        capture_output=True, text=True, timeout=120)
    assert sweep_from_elsewhere.stdout.strip() == "[]", sweep_from_elsewhere
    assert os.path.isdir(directory.name)
    directory.cleanup()
    assert scratch_of(tmp_path) == []


# ----------------------------------------------------------------------------- runs on shared scratch


def test_a_run_on_another_checkpoint_at_the_same_path_leaves_a_live_runs_scratch_alone(tmp_path, water_energy):
    """Defect: two nodes sharing a scratch root, each with its own --checkpoint at the same path:
    the second run deleted the first's live scratch (dfmp2-ck<hash of the path>-*), and the first
    died (exit 1). Here, without namespaces: run A holds DIR in its pair stage; DIR is moved away
    (A keeps its files) and a new DIR, its manifest copied from A's (so that B's scratch bears A's
    very name), made at the same path; run B on it, same scratch root, runs to the end: A's
    directories stay (they are locked), and A finishes with the uninterrupted energy, exit 0."""
    checkpoint, scratch = tmp_path / "ck", tmp_path / "scratch"
    scratch.mkdir()
    pairs, release = tmp_path / "in-pairs", tmp_path / "go-on"
    args = [WATER, "--checkpoint", checkpoint, "--scratch", scratch, "--quiet"]
    first = start("run", *args, "--json", tmp_path / "a.json", PAIR_DELAY=300, PAIR_MARK=pairs,
                  PAIR_RELEASE=release)
    try:
        wait_for(pairs, first)
        held = scratch_of(scratch)
        assert held, "run A holds no scratch directory in its pair stage"
        os.rename(checkpoint, tmp_path / "ck-of-A")
        checkpoint.mkdir()
        (checkpoint / "manifest.json").write_bytes((tmp_path / "ck-of-A" / "manifest.json").read_bytes())
        second = start("run", *args, "--json", tmp_path / "b.json")
        code, _, stderr = finish(second)
        assert code == 0, stderr
        assert set(held) <= set(scratch_of(scratch)), "run B removed run A's live scratch"
    finally:
        release.touch()
    code, _, stderr = finish(first)
    assert code == 0, stderr
    for out in ("a.json", "b.json"):
        assert abs(json.loads((tmp_path / out).read_text())["e_tot"] - water_energy) < 1e-10
    assert scratch_of(scratch) == []


def test_runs_waiting_for_a_checkpoint_in_use_are_refused_or_resume_it_never_crash(tmp_path, water_energy):
    """Defect: a second run on one --checkpoint started 5.5-6 s after the first exited 1
    (FileNotFoundError) instead of "in use by process N". Its PySCF directory, made before it tried
    the checkpoint's lock and named by the checkpoint, was removed by the first run's sweep of its
    killed runs' scratch; the first then finished, the second took the lock and PySCF's first
    temporary file went to a directory that was gone. Here that interleaving is forced: runs B and
    C start while A holds DIR (in its SCF) and wait just before the lock while A passes its SCF, B
    and its sweep. B, let go while A holds DIR, is refused in one line, exit 2, naming A; A
    finishes, exit 0; C, let go after, resumes DIR: exit 0, the uninterrupted energy."""
    checkpoint, scratch = tmp_path / "ck", tmp_path / "scratch"
    scratch.mkdir()
    marks = {name: tmp_path / name for name in ("in-scf", "scf-go", "in-pairs", "pairs-go", "b-at-lock", "b-go",
                                                "c-at-lock", "c-go")}
    args = [WATER, "--checkpoint", checkpoint, "--scratch", scratch, "--quiet"]
    first = start("run", *args, "--json", tmp_path / "a.json", SCF_DELAY=300, SCF_MARK=marks["in-scf"],
                  SCF_RELEASE=marks["scf-go"], PAIR_DELAY=300, PAIR_MARK=marks["in-pairs"],
                  PAIR_RELEASE=marks["pairs-go"])
    waiting = []
    try:
        wait_for(marks["in-scf"], first)  # A holds DIR, in its SCF
        for run in ("b", "c"):
            waiting.append(start("run", *args, "--json", tmp_path / f"{run}.json", LOCK_MARK=marks[f"{run}-at-lock"],
                                 LOCK_RELEASE=marks[f"{run}-go"]))
            wait_for(marks[f"{run}-at-lock"], first, *waiting)
        marks["scf-go"].touch()
        wait_for(marks["in-pairs"], first, *waiting)  # past A's SCF, B and any sweep
        marks["b-go"].touch()
        code, _, stderr = finish(waiting[0])
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f"in use by process {first.pid}" in stderr, stderr
        marks["pairs-go"].touch()
        code, _, stderr = finish(first)
        assert code == 0, stderr
        marks["c-go"].touch()
        code, _, stderr = finish(waiting[1])
        assert code == 0, stderr
    finally:
        for mark in marks.values():
            mark.touch()
        for proc in [first, *waiting]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for run in ("a", "c"):
        assert abs(json.loads((tmp_path / f"{run}.json").read_text())["e_tot"] - water_energy) < 1e-10
    assert json.loads((tmp_path / "c.json").read_text())["checkpoint"]["reused_scf"]
    assert not (tmp_path / "b.json").exists() and scratch_of(scratch) == []


# ----------------------------------------------------------------------------- a resume removes its dead run's


@pytest.mark.parametrize("command, kind, hooks", [
    # a low-memory SCF: the JK-fit integrals in a scratch file (RowFile)
    pytest.param("run", "scf", {"SCF_ON_DISK": 1}, id="run-in-a-low-memory-scf"),
    pytest.param("grad", "gradient", {}, id="grad-in-the-gradient"),
    # in the first step's run, the optimisation's own directory made before it
    pytest.param("optimize", "pyscf", {}, id="optimize-in-a-step"),
])
def test_a_resume_removes_its_killed_runs_scratch_of_every_kind(tmp_path, command, kind, hooks):
    """Defect: after SIGKILL during a low-memory SCF, `grad` or `optimize`, the resume with the same
    --checkpoint left dfmp2-scf-* (132 MB), dfmp2-gradient-*, dfmp2-optimize-*: their names
    carried no run. Now each is named by the checkpoint and the resume removes the killed run's,
    and not the directory of a live process bearing the same name."""
    checkpoint, scratch, mark = tmp_path / "ck", tmp_path / "scratch", tmp_path / "made"
    scratch.mkdir()
    args = [WATER, "--checkpoint", checkpoint, "--scratch", scratch, "--quiet", "--json", tmp_path / "out.json"]
    killed = start(command, *args, cwd=tmp_path, SCRATCH_KIND=kind, SCRATCH_MARK=mark, SCRATCH_DELAY=300, **hooks)
    try:
        wait_for(mark, killed)
    finally:
        killed.kill()
        killed.communicate()
    left = scratch_of(scratch)
    assert [name for name in left if f"-{kind}-" in name], left
    if command == "optimize":
        assert [name for name in left if "-optimize-" in name], left
    live, live_path = holder(scratch, scratch_name(checkpoint))  # a live run's, bearing the same name
    try:
        code, _, stderr = finish(start(command, *args, cwd=tmp_path))
        assert code == 0, stderr
        assert scratch_of(scratch) == [os.path.basename(live_path)]
    finally:
        live.kill()
        live.communicate()


# ----------------------------------------------------------------------------- TMPDIR


def _unwritable_directory(tmp_path):
    """A directory nothing can be made in: read-only (0o555) for a user; as root, whom the mode
    does not stop, /proc (no directory can be made there by anyone)."""
    if os.geteuid() == 0:
        return "/proc"
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    return str(path)


@pytest.mark.parametrize("case", ["missing", "a file", "read-only"])
def test_an_unusable_tmpdir_is_one_line_before_anything_runs(tmp_path, case):
    """Defect: TMPDIR naming a missing directory, a file or a read-only directory sent scratch to
    the system's default without a word (tempfile passes over it), while the same PYSCF_TMPDIR was
    refused. Now TMPDIR is checked as PYSCF_TMPDIR is: one line naming it, exit 2, no traceback,
    nothing computed (one SCF cycle allowed would fail with exit 1)."""
    value = {"missing": str(tmp_path / "missing"), "a file": str(tmp_path / "file"),
             "read-only": _unwritable_directory(tmp_path)}[case]
    (tmp_path / "file").write_text("not a directory")
    env = {name: v for name, v in os.environ.items() if name != "PYSCF_TMPDIR"}
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", WATER, "--scf-max-cycle", "1"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600, env={**env, "TMPDIR": value})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"TMPDIR={value}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_pyscf_tmpdir_still_comes_before_tmpdir(tmp_path, monkeypatch):
    """PySCF's rule: PYSCF_TMPDIR, where set, is where scratch goes, whatever TMPDIR says (an unusable
    TMPDIR beside a good PYSCF_TMPDIR is not refused); without PYSCF_TMPDIR, TMPDIR."""
    from dfmp2.util.errors import InputError
    from dfmp2.util.scratch import check_scratch, scratch_directory, scratch_root

    good = tmp_path / "good"
    good.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setenv("PYSCF_TMPDIR", str(good))
    assert scratch_root() == str(good)
    check_scratch()
    with scratch_directory("probe") as made:
        assert os.path.dirname(made) == str(good)
    monkeypatch.delenv("PYSCF_TMPDIR")
    with pytest.raises(InputError, match="TMPDIR=.*missing: no such directory"):
        check_scratch()
    monkeypatch.setenv("TMPDIR", str(good))
    assert scratch_root() == str(good)


# ----------------------------------------------------------------------------- cosmetic


def test_a_checkpoint_directory_holding_dfmp2s_scratch_is_not_called_the_users(tmp_path, water_energy):
    """Defect (cosmetic): --checkpoint DIR --scratch DIR on a new, empty DIR was refused "the directory
    holds files (dfmp2-ck...-pyscf-...) but no dfmp2 manifest.json": dfmp2's own scratch listed as
    the user's files. Now the checkpoint is locked before any scratch is made, and dfmp2's scratch
    directories (named, holding their lock file) are never counted as the user's: the run goes
    through, and leaves only the checkpoint's files."""
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    code, _, stderr = finish(start("run", WATER, "--checkpoint", checkpoint, "--scratch", checkpoint, "--quiet",
                                   "--json", tmp_path / "out.json"))
    assert code == 0, stderr
    assert abs(json.loads((tmp_path / "out.json").read_text())["e_tot"] - water_energy) < 1e-10
    assert not [name for name in os.listdir(checkpoint) if name.startswith("dfmp2-ck")]
