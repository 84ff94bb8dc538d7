"""One memory budget rule for every entry point (issue 72, run/budget.py): the smallest of every
limit the process has (cgroup v1/v2 with memory.high and memsw, rlimits, Slurm, QCEngine's task
memory, PySCF's default max_memory), the user's figure warned up front where it exceeds one; the
SCF's early integrals are the run's, not its footprint; an rlimit too small for a run is refused
before torch loads and PySCF's SCF starts. Prepared cgroup trees and rlimits a child process is
given (preexec_fn): nothing here needs privileges."""

import json
import os
import re
import resource
import subprocess
import sys

import pytest

import dfmp2
from conftest import ROOT
from dfmp2.api import checks, driver
from dfmp2.run import budget, memory
from dfmp2.util import memory_limits, start_up
from dfmp2.util.system_memory import MB

WATER = os.path.join(ROOT, "examples", "water.xyz")
BENZENE = os.path.join(ROOT, "examples", "benzene.xyz")
MOUNTS = {"v1": ("/sys/fs/cgroup/memory", "cgroup cgroup rw,memory"), "v2": ("/sys/fs/cgroup", "cgroup2 cgroup2 rw")}


def cgroup_files(root, version, own, levels):
    """A file system under `root` whose process sits in the `version` cgroup `own`; levels:
    {directory under the mount: {file name: text}} (memory.stat's inactive page cache included)."""
    proc = root / "proc" / "self"
    proc.mkdir(parents=True, exist_ok=True)
    mount_point, fstype = MOUNTS[version]
    (proc / "cgroup").write_text(f"{'4:memory:' if version == 'v1' else '0::'}{own}\n")
    (proc / "mountinfo").write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n35 22 0:32 / {mount_point} rw - {fstype}\n")
    for directory, files in levels.items():
        path = root / mount_point.lstrip("/") / directory.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (path / name).write_text(f"{text}\n")
    return str(root)


@pytest.fixture
def limits_of(monkeypatch, tmp_path):
    """The budget's readers pointed at a prepared cgroup tree (and 20 GB free, no rlimit, no Slurm),
    the resident set read as 300 MB; returns a function taking (version, own, levels) as cgroup_files."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(f"MemAvailable: {20_000 * MB // 1024} kB\n")
    root = str(tmp_path)
    monkeypatch.setattr(budget, "free_memory", lambda: memory_limits.free_memory(root))
    monkeypatch.setattr(budget, "cgroup_limits", lambda: memory_limits.cgroup_limits(root))
    monkeypatch.setattr(budget, "rlimits", lambda: [])
    monkeypatch.setattr(budget, "slurm_limit", lambda held: None)
    monkeypatch.setattr(budget, "_ABOVE", {})
    monkeypatch.setattr(budget, "_WARNED", set())
    for module in (budget, memory):
        monkeypatch.setattr(module, "resident_bytes", lambda: 300 * MB)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return lambda version, own, levels: cgroup_files(tmp_path, version, own, levels)


# ----------------------------------------------------------------------------- the limits read


def test_cgroup_v2_memory_high_is_a_limit_at_every_level(tmp_path):
    """memory.high (the kernel throttles above it) was not read: a job's 1500 MB memory.high
    above its step's 4000 MB memory.max left the budget at 80% of free memory."""
    root = cgroup_files(tmp_path, "v2", "/job/step", {
        "/": {"memory.max": "max", "memory.high": "max", "memory.current": 9000 * MB},
        "/job": {"memory.max": "max", "memory.high": 1500 * MB, "memory.current": 500 * MB,
                 "memory.stat": f"inactive_file {100 * MB}"},
        "/job/step": {"memory.max": 4000 * MB, "memory.high": 3000 * MB, "memory.current": 450 * MB}})
    found = {(limit.source.split(" (")[0], limit.limit, limit.headroom) for limit in memory_limits.cgroup_limits(root)}
    assert found == {("cgroup v2 memory.high", 1500 * MB, 1100 * MB), ("cgroup v2 memory.max", 4000 * MB, 3550 * MB),
                     ("cgroup v2 memory.high", 3000 * MB, 2550 * MB)}


def test_cgroup_v1_memsw_counts_memory_and_swap(tmp_path):
    """memory.memsw.limit_in_bytes (memory + swap) was not read: with 700 MB of the job's pages in
    swap, its 2000 MB memsw limit leaves 600 MB, less than the 1900 MB its memory limit leaves."""
    root = cgroup_files(tmp_path, "v1", "/slurm/job/step", {
        "/slurm/job": {"memory.limit_in_bytes": 2000 * MB, "memory.usage_in_bytes": 100 * MB,
                       "memory.memsw.limit_in_bytes": 2000 * MB, "memory.memsw.usage_in_bytes": 1400 * MB,
                       "memory.stat": f"total_inactive_file {0}"},
        "/slurm/job/step": {"memory.limit_in_bytes": 9223372036854771712, "memory.usage_in_bytes": 90 * MB,
                            "memory.memsw.limit_in_bytes": 1200 * MB, "memory.memsw.usage_in_bytes": 500 * MB,
                            "memory.stat": f"total_inactive_file {50 * MB}"}})
    found = sorted((limit.headroom, limit.source) for limit in memory_limits.cgroup_limits(root))
    assert [headroom for headroom, _ in found] == [600 * MB, 750 * MB, 1900 * MB]
    assert found[0][1].startswith("cgroup v1 memory.memsw.limit_in_bytes (/sys/fs/cgroup/memory/slurm/job): "
                                  "2000 MB of memory and swap, 1400 MB held")
    assert "(/sys/fs/cgroup/memory/slurm/job/step): 1200 MB of memory and swap, 450 MB held" in found[1][1]


def test_the_tightest_of_memory_high_and_memsw_sets_the_budget(limits_of):
    limits_of("v2", "/job", {"/job": {"memory.max": 3000 * MB, "memory.high": 1000 * MB, "memory.current": 300 * MB}})
    found = budget.memory_budget(None)
    assert found.size == 300 * MB + int(0.8 * 700 * MB) and found.source.startswith("cgroup v2 memory.high (")
    assert len(found.limits) == 3  # free memory, memory.max, memory.high: every limit, each with what it allows


# ----------------------------------------------------------------------------- true numbers


def test_a_budget_planned_before_the_scf_stays_below_the_cgroup_and_says_so(limits_of):
    """A 250 MB cgroup holding 190 MB, a resident set of 300 MB (shared library pages counted
    elsewhere), 48 MB allowed for what the SCF leaves: the budget was 348 + 80% of 60 = 396 MB,
    the growth counted as resident and again as headroom, above the 360 MB the cgroup lets the
    process reach (300 + 60): the run then filled the cgroup. Now 348 + 80% of (60 - 48), and the
    message names those figures."""
    limits_of("v1", "/job", {"/job": {"memory.limit_in_bytes": 250 * MB, "memory.usage_in_bytes": 190 * MB}})
    found = budget.memory_budget(None, 348 * MB)
    assert found.size <= 300 * MB + 60 * MB  # never above where the limit stops the process
    assert abs(found.size - (348 * MB + 0.8 * 12 * MB)) <= 1
    assert found.source.startswith("cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job): 250 MB, 190 MB held; "
                                   "the budget: 348 MB resident + 80% of 12 MB (less 48 MB that the run adds before "
                                   "then; it counts 190 MB of the 300 MB resident")
    sizes = memory.TensorSizes(nao=192, spaces=[(40, 152)], naux=672, largest_shell=9, itemsize=8)
    with pytest.raises(memory.MemoryBudgetError) as refused:
        memory.plan_memory(found.size, sizes, baseline=348 * MB, growth=48 * MB, source=found.source)
    assert "the memory budget is 357.6 MB (cgroup v1 memory.limit_in_bytes" in str(refused.value)


def test_max_memory_above_a_limit_is_warned_before_the_scf_and_the_smallest_is_the_budget(limits_of, monkeypatch,
                                                                                         capsys):
    """--max-memory 3000 in a 400 MB cgroup: noted only in the final summary, and the run killed.
    Now one line on stderr before the SCF starts, the record's budget is the cgroup's, and a
    figure below every limit is the budget as given."""
    limits_of("v1", "/job", {"/job": {"memory.limit_in_bytes": 2500 * MB, "memory.usage_in_bytes": 400 * MB}})
    from dfmp2 import chem

    seen = []
    run_scf = chem.run_scf
    monkeypatch.setattr(chem, "run_scf", lambda *a, **kw: (seen.append(capsys.readouterr().err), run_scf(*a, **kw))[1])
    record = dfmp2.run_xyz(WATER, max_memory=3000).as_dict()
    assert seen[0].startswith("dfmp2: warning: max_memory 3000 MB is above what the cgroup v1 memory.limit_in_bytes "
                              "(/sys/fs/cgroup/memory/job): 2500 MB, 400 MB held lets this process hold (2400 MB")
    assert seen[0].count("\n") == 1 and capsys.readouterr().err == ""  # once
    assert abs(record["memory"]["budget_mb"] - (300 + 0.8 * 2100)) < 0.01
    assert record["memory"]["budget_source"].startswith("cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job)")
    assert [note for note in record["notes"] if note.startswith("max_memory 3000 MB is above what the cgroup v1")]
    record = dfmp2.run_xyz(WATER, max_memory=2000).as_dict()
    assert (record["memory"]["budget_mb"], record["memory"]["budget_source"], record["notes"]) == (2000, "max_memory", [])


def rlimited_run(args, which, kilobytes, tmp_path, name):
    """`python -m dfmp2 ARGS` with the rlimit `which` (soft and hard) at `kilobytes` (ulimit's kB),
    2 threads, its scratch in tmp_path/name -> (CompletedProcess, the scratch directory)."""
    scratch = tmp_path / name
    scratch.mkdir()
    limit = kilobytes * 1024
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "2", "TMPDIR": str(scratch)}
    scratch_option = ["--scratch", str(scratch)] if args[0] != "info" else []  # (info has no scratch)
    proc = subprocess.run([sys.executable, "-m", "dfmp2", *map(str, args), *scratch_option],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, env=env,
                          preexec_fn=lambda: resource.setrlimit(which, (limit, limit)))
    return proc, scratch


def test_a_max_memory_above_an_rlimit_is_warned_up_front_on_the_command_line(tmp_path):
    """The CLI under a real hard limit (RLIMIT_AS, what `ulimit -v` sets): a --max-memory far above it
    is one line on stderr, the record's budget is the rlimit's and its note says why."""
    kilobytes = 4_000_000  # a water run on 2 threads maps about 1.4 GB (budget.START_UP)
    out = tmp_path / "water.json"
    proc, scratch = rlimited_run(["run", WATER, "--quiet", "--json", out, "--max-memory", 1e6], resource.RLIMIT_AS,
                                 kilobytes, tmp_path, "scratch")
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"dfmp2: warning: --max-memory 1e\+06 MB is above what the RLIMIT_AS \(soft limit\): \d+ MB, "
                        r".* lets this process hold \(\d+ MB of resident set\): the budget is what the limits allow, "
                        r"as without --max-memory \(\d+ MB now\)\n", proc.stderr), proc.stderr
    record = json.loads(out.read_text())
    assert record["memory"]["budget_source"].startswith("RLIMIT_AS (soft limit)")
    assert record["memory"]["budget_mb"] < kilobytes * 1024 / MB
    assert [note for note in record["notes"] if note.startswith("--max-memory 1e+06 MB is above what the RLIMIT_AS")]
    assert os.listdir(scratch) == []


# ----------------------------------------------------------------------------- rlimits before the run


@pytest.mark.parametrize("kilobytes", [150000, 300000, 450000])
def test_an_rlimit_too_small_is_refused_before_the_run_and_the_figure_it_names_runs(tmp_path, kilobytes):
    """`ulimit -d 150000` (RLIMIT_DATA) hung for ever at 100% CPU while importing numpy and SciPy
    (their OpenBLAS retrying its thread buffers), 300000 was exit 1 with hundreds of "Exception
    ignored" fragments (importing torch failed), 450000 a segfault in PySCF's initial guess (exit 139,
    scratch left). Now one line, exit 2, nothing left; the least limit it names runs (with the few MB
    the address space in use drifts between runs)."""
    proc, scratch = rlimited_run(["run", WATER, "--quiet"], resource.RLIMIT_DATA, kilobytes, tmp_path, "small")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.startswith(f"dfmp2: error: RLIMIT_DATA (soft limit): {kilobytes * 1024 / MB:.0f} MB, ")
    assert "ulimit -d" in proc.stderr and os.listdir(scratch) == []
    if kilobytes == 450000:
        least = int(re.search(r"at least (\d+) kB", proc.stderr).group(1))
        proc, scratch = rlimited_run(["run", WATER, "--quiet"], resource.RLIMIT_DATA, least + 4096, tmp_path, "enough")
        assert proc.returncode == 0 and proc.stderr == "", (least, proc.returncode, proc.stderr[-3000:])
        assert os.listdir(scratch) == []


def test_the_start_up_check_counts_the_threads_and_what_is_loaded(monkeypatch):
    """What a run maps before its plan grows with its threads (each one's BLAS buffer and stack; the
    imports' BLAS pools at most one thread a CPU); torch loaded already maps nothing more."""
    two, eight = start_up.start_up_bytes(("torch", "scf"), 2), start_up.start_up_bytes(("torch", "scf"), 8)
    assert eight["VmData"] - two["VmData"] == 6 * (18 + 40) * MB and eight["VmSize"] > two["VmSize"]
    cpus = len(os.sched_getaffinity(0))
    assert start_up.start_up_bytes(("imports",), cpus + 6) == start_up.start_up_bytes(("imports",), cpus)
    assert start_up.stages_to_come(scf=False) == ()  # (torch is loaded in this process)
    monkeypatch.setattr(start_up, "rlimits", lambda: [memory_limits.MemoryLimit(
        100 * MB, 600 * MB, False, "RLIMIT_DATA (soft limit): 600 MB, 500 MB in use (VmData)", "VmData", 500 * MB)])
    with pytest.raises(budget.MemoryBudgetError, match=r"raise it to at least \d+ kB \(ulimit -d\)"):
        start_up.check_start_up(("scf",), memory.SCF_GROWTH)
    start_up.check_start_up((), 0)  # 100 MB left holds the smallest blocks
    # the entry point's check: a command that runs an SCF needs every stage; any other, or a --help, its imports
    monkeypatch.setattr(start_up, "rlimits", lambda: [memory_limits.MemoryLimit(
        400 * MB, 408 * MB, False, "RLIMIT_DATA (soft limit): 408 MB, 8 MB in use (VmData)", "VmData", 8 * MB)])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for words in (["info"], ["bench", "--shape", "small"], ["run", "--help"], []):
        start_up.check_command(words)
    for words in (["run", "water.xyz"], ["grad", "water.xyz"], ["optimize", "water.xyz"]):
        with pytest.raises(budget.MemoryBudgetError, match="dfmp2's libraries and loading torch and the SCF and MP2 steps"):
            start_up.check_command(words)


def test_a_command_under_an_rlimit_its_imports_cannot_map_is_refused_at_once(tmp_path):
    """`dfmp2 info` under `ulimit -d 150000` hung for ever in numpy's OpenBLAS before a line was
    printed; now one line naming the least limit, exit 2, and that limit runs it."""
    proc, _ = rlimited_run(["info"], resource.RLIMIT_DATA, 150000, tmp_path, "small")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (proc.returncode, proc.stderr[-3000:])
    assert "dfmp2's libraries map for 2 threads" in proc.stderr and proc.stdout == ""
    least = int(re.search(r"at least (\d+) kB", proc.stderr).group(1))
    proc, _ = rlimited_run(["info"], resource.RLIMIT_DATA, least + 4096, tmp_path, "enough")
    assert proc.returncode == 0, (least, proc.returncode, proc.stderr[-3000:])


# ----------------------------------------------------------------------------- the early integrals


def test_the_early_integrals_are_the_runs_arrays_not_its_footprint(monkeypatch):
    """(H2O)8 with --max-memory 470 was refused as below the footprint, which counted the 138 MB of
    SCF integrals the early thread held. The check before the SCF now takes what they hold off
    the resident set (benzene/cc-pVDZ's 29 MB here; the run is stopped at that check)."""
    seen = {}
    early, plan_for = driver._early_jk_integrals, checks.plan_for

    def watched_early(*args):
        seen["early"] = early(*args)
        return seen["early"]

    def watched_plan(*args, **kw):
        seen["resident"] = memory.resident_bytes()
        seen["plan"] = plan_for(*args, **kw)
        raise StopIteration  # (the SCF is not needed)

    monkeypatch.setattr(driver, "_early_jk_integrals", watched_early)
    monkeypatch.setattr(checks, "plan_for", watched_plan)
    with pytest.raises(StopIteration):
        dfmp2.run_xyz(BENZENE)
    held = seen["early"].held_bytes()
    assert held > 25 * MB  # they were computed early, and are resident
    assert seen["plan"].baseline <= seen["resident"] - held + memory.SCF_GROWTH + 5 * MB, (seen, held)


def water8(tmp_path):
    """(H2O)8: the first 8 molecules of examples/water16.xyz, written to tmp_path."""
    lines = open(os.path.join(ROOT, "examples", "water16.xyz")).read().splitlines()[2:2 + 24]
    xyz = tmp_path / "water8.xyz"
    xyz.write_text("24\n(H2O)8\n" + "\n".join(lines) + "\n")
    return xyz


def test_water8_runs_at_470_mb_as_with_a_checkpoint(tmp_path):
    """The issue's case (slow tier): (H2O)8/cc-pVDZ at --max-memory 470 was refused before the SCF;
    with --checkpoint (no early thread) it ran, peak 412 MB. Now it runs (the early thread not
    started: the budget cannot hold it beside what torch adds), within the budget."""
    out = tmp_path / "water8.json"
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", str(water8(tmp_path)), "--quiet", "--json", str(out),
                           "--max-memory", "470"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["memory"]["peak_rss_mb"] <= 1.05 * 470 and record["scf_builds"]["integrals"] == "set-up"


QCENGINE_RUN = """import sys, qcengine, qcelemental, dfmp2
dfmp2.register_qcengine()
molecule = qcelemental.models.Molecule.from_data(open(sys.argv[1]).read().split("\\n", 2)[2])
out = qcengine.compute({"molecule": molecule, "driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"}},
                       "dfmp2", return_dict=True)
print(out["success"], out["extras"]["dfmp2"]["memory"]["budget_source"] if out["success"] else out["error"])
"""


def test_qcengine_runs_water8_in_a_520_mb_cgroup(tmp_path):
    """The issue's case (slow tier; needs a cgroup this process may make): QCEngine's compute of
    (H2O)8 in a 520 MB cgroup was OOM-killed (exit 137), QCEngine's default memory (most of the
    machine's) its budget; now the cgroup's limit sets it, and the run succeeds."""
    from test_memory_limits import child_cgroup

    directory, _ = child_cgroup(520 * MB)
    script = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
    try:
        proc = subprocess.run(["sh", "-c", script, "sh", directory, sys.executable, "-c", QCENGINE_RUN,
                               str(water8(tmp_path))], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=900, env={**os.environ, "PYTHONPATH": ROOT})
    finally:
        os.rmdir(directory)
    assert proc.returncode == 0 and proc.stdout.startswith("True cgroup "), (proc.returncode, proc.stdout,
                                                                                proc.stderr[-2000:])
    assert f"({directory}): 520 MB" in proc.stdout


# ----------------------------------------------------------------------------- the other entry points


@pytest.fixture
def cgroup_2500(limits_of):
    limits_of("v1", "/job", {"/job": {"memory.limit_in_bytes": 2500 * MB, "memory.usage_in_bytes": 400 * MB}})


@pytest.mark.parametrize("gib,source", [(1, "QCEngine's task_config memory 1 GiB: 1074 MB"),
                                        (20, "cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job)")])
def test_qcengine_memory_is_one_limit_and_the_smallest_sets_the_budget(cgroup_2500, gib, source):
    """QCEngine's task memory (by default most of the machine's memory) was the budget, over the
    cgroup's limit: (H2O)8 in a 520 MB cgroup was OOM-killed while `dfmp2 run` passed. Now it is
    one limit: the budget where it is the smallest (1 GiB), the cgroup's where that is (20 GiB)."""
    import qcengine

    dfmp2.register_qcengine()
    molecule = {"symbols": ["O", "H", "H"], "geometry": [0, 0, 0.2216655, 0, 1.4309, -0.8866, 0, -1.4309, -0.8866]}
    out = qcengine.compute({"molecule": molecule, "driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"}},
                           "dfmp2", return_dict=True, task_config={"memory": gib})
    assert out["success"], out.get("error")
    record = out["extras"]["dfmp2"]["memory"]
    assert record["budget_source"].startswith(source)
    assert record["budget_mb"] == pytest.approx(min(gib * 1024 ** 3 / MB, 300 + 0.8 * 2100), abs=0.01)
    assert [limit for limit in record["limits"] if limit.startswith("QCEngine's task_config memory")]
    assert out["extras"]["dfmp2"]["notes"] == []


def test_pyscf_default_max_memory_is_a_limit_and_a_set_one_is_the_users(cgroup_2500):
    """The drop-in took PySCF's default max_memory (4000 MB) as the budget, above the cgroup's
    limit. Now PySCF's default is one limit (never above the cgroup's, no warning); a max_memory
    the user set is the user's figure: the budget below the limits, replaced and noted above one."""
    from pyscf import gto, scf

    mf = scf.RHF(gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz",
                       verbose=0)).run()
    assert mf.max_memory == 4000  # PySCF's default
    pt = dfmp2.DFMP2(mf).run()
    record = pt.result.as_dict()
    assert record["memory"]["budget_source"].startswith("cgroup v1") and record["notes"] == []
    assert [limit for limit in record["memory"]["limits"] if limit.startswith("PySCF's default max_memory: 4000 MB")]
    pt.max_memory = 3000
    assert [note for note in pt.run().result.notes if note.startswith("max_memory 3000 MB is above what the cgroup")]
    pt.max_memory = 1000
    assert pt.run().result.as_dict()["memory"]["budget_mb"] == 1000


def test_pyscf_default_max_memory_is_the_budget_where_it_is_the_smallest(limits_of):
    limits_of("v1", "/job", {"/job": {"memory.limit_in_bytes": 50_000 * MB, "memory.usage_in_bytes": 400 * MB}})
    from pyscf import gto, scf

    mf = scf.RHF(gto.M(atom="H 0 0 0; H 0 0 0.74", basis="cc-pvdz", verbose=0)).run()
    record = dfmp2.DFMP2(mf).run().result.as_dict()
    assert (record["memory"]["budget_mb"], record["memory"]["budget_source"]) == (4000, "PySCF's default max_memory: "
                                                                                        "4000 MB")


def test_ase_runs_under_the_same_rule(cgroup_2500):
    """The ASE calculator's max_memory parameter is the user's figure under the same rule."""
    from ase import Atoms

    from dfmp2.ase import DFMP2Calculator

    atoms = Atoms("OH2", positions=[(0, 0, 0.1173), (0, 0.7572, -0.4692), (0, -0.7572, -0.4692)])
    atoms.calc = DFMP2Calculator(basis="cc-pvdz", max_memory=3000)
    atoms.get_potential_energy()
    record = atoms.calc.results["dfmp2"].as_dict()
    assert record["memory"]["budget_source"].startswith("cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job)")
    assert [note for note in record["notes"] if note.startswith("max_memory 3000 MB is above what the cgroup v1")]


def test_use_dfmp2_jk_takes_pyscfs_default_as_a_limit_and_a_set_one_as_the_users(cgroup_2500, capsys):
    """use_dfmp2_jk gave its builds PySCF's default max_memory (4000 MB) as the user's figure: above a
    2500 MB cgroup it was warned of as the user's choice. Now the default is one more limit (no
    warning, the cgroup's budget), a max_memory the user set is the user's figure (warned above it)."""
    from pyscf import gto, scf

    mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
    reference = scf.RHF(mol).density_fit().run().e_tot
    mf = dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit()).run()
    assert mf.max_memory == 4000 and mf.e_tot == pytest.approx(reference, abs=1e-8)
    assert "warning" not in capsys.readouterr().err
    mf = scf.RHF(mol).density_fit()
    mf.max_memory = 3000
    dfmp2.use_dfmp2_jk(mf).run()
    assert "3000" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["cgroup", "rlimit", "caller", "free", "max-memory"])
def test_a_refusal_names_what_the_limit_itself_would_need(monkeypatch, kind):
    """In a 250 MB cgroup (H2O)8 was refused naming a budget of 370 MB, above the cgroup's own limit
    (the budget counts the resident set; the cgroup charges 189 MB of its 302 MB, the rest shared
    pages charged elsewhere): now the refusal also says what the limit would need to be, in the
    limit's own terms (MB; an rlimit's kB; a caller's figure; free memory), and a limit raised to
    that figure gives a budget that holds the run. --max-memory's refusal names no limit."""
    now = dfmp2.util.system_memory.resident_bytes()
    source = {"cgroup": "cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job): 262 MB",
              "rlimit": "RLIMIT_DATA (soft limit): 700 MB, 600 MB in use (VmData)", "caller": "QCEngine's task memory",
              "free": "free memory (MemAvailable): 90 MB", "max-memory": "free memory (MemAvailable): 9e6 MB"}[kind]
    counts = {"rlimit": "VmData", "caller": "whole"}.get(kind, "resident")
    held = {"cgroup": now // 2, "rlimit": 600 * MB, "caller": now}.get(kind)

    def limit_of(size):  # the limit at `size` bytes (free memory: `size` bytes free)
        ceiling = None if kind in ("free", "max-memory") else size
        return memory_limits.MemoryLimit(max(0, size - (held or 0)), ceiling, kind != "rlimit", source, counts, held)

    size = {"cgroup": 262 * MB, "rlimit": 700 * MB, "caller": (now // MB + 40) * MB + 100_000, "free": 90 * MB, "max-memory": 9e12}[kind]
    monkeypatch.setattr(budget, "process_limits", lambda now: [limit_of(int(size))])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    figure = 100 if kind == "max-memory" else None
    found = budget.memory_budget(figure)
    need = found.size + 30 * MB + 222_222  # (not whole MB: the figure named is rounded up)
    text = budget.limit_needed(found.binding, found.size, need)
    if kind == "max-memory":
        assert found.binding is None and text == ""
        return
    match = re.fullmatch(r"; (.*) would need to be at least (\d+) (MB|kB)|; it needs about (\d+) MB more free memory",
                         text)
    assert match, text
    if match.group(4):
        raised = size + int(match.group(4)) * MB
    else:
        assert match.group(1) == source.split(":")[0]
        raised = int(match.group(2)) * (1024 if match.group(3) == "kB" else MB)
    monkeypatch.setattr(budget, "process_limits", lambda now: [limit_of(raised)])
    assert budget.memory_budget(None).size >= need > budget.memory_budget(None).size - 3 * MB
