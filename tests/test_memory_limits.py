"""The default memory budget honours the limits a process really has (issue 60): free memory, its
cgroup's limit (v1, v2; on its own cgroup or a parent's, in a namespace), RLIMIT_AS/RLIMIT_DATA
and a Slurm job's memory; the smallest sets the budget and the record names it. Prepared cgroup
trees and environments, then real runs in a cgroup made for them where the machine allows it."""

import json
import os
import resource
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT
from dfmp2.run import budget, memory
from dfmp2.util import memory_limits
from dfmp2.util.errors import InputError
from dfmp2.util.memory_limits import MIB, cgroup_limits, free_memory, memory_cgroups, rlimits, slurm_limit
from dfmp2.util.system_memory import MB

V1_NONE = 9223372036854771712  # what cgroup v1 reports for no limit
MOUNTINFO = {  # (mount root, mount point, fstype, super options)
    "v1": "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n",
    "v2": "41 31 0:38 {root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
}
MOUNT_POINT = {"v1": "/sys/fs/cgroup/memory", "v2": "/sys/fs/cgroup"}
FILES = {"v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
         "v2": ("memory.max", "memory.current", "inactive_file")}


def cgroup_tree(root, version, own, levels, mount_root="/"):
    """A file system under `root` whose process sits in cgroup `own` (as /proc/self/cgroup says)
    of a `version` hierarchy mounted from `mount_root`; levels: {directory under the mount:
    (limit, usage, inactive_file)} in bytes (limit None: v1's no-limit figure, v2's "max")."""
    proc = root / "proc" / "self"
    proc.mkdir(parents=True, exist_ok=True)
    line = "4:memory:" if version == "v1" else "0::"
    (proc / "cgroup").write_text(f"12:pids:/\n{line}{own}\n")
    (proc / "mountinfo").write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                                    + MOUNTINFO[version].format(root=mount_root))
    limit_file, usage_file, inactive = FILES[version]
    for directory, (limit, usage, inactive_file) in levels.items():
        path = root / MOUNT_POINT[version].lstrip("/") / directory.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        (path / limit_file).write_text(f"{limit if limit is not None else (V1_NONE if version == 'v1' else 'max')}\n")
        (path / usage_file).write_text(f"{usage}\n")
        (path / "memory.stat").write_text(f"cache {inactive_file + 4096}\n{inactive} {inactive_file}\n")
    return str(root)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_limit_on_the_process_cgroup_counts_what_it_holds_less_the_page_cache(tmp_path, version):
    """headroom = limit - (usage - inactive_file): a run's scratch files in the page cache do not
    eat the budget."""
    root = cgroup_tree(tmp_path, version, "/job/step", {
        "/": (None, 50_000 * MB, 0), "/job": (None, 900 * MB, 0), "/job/step": (2500 * MB, 1000 * MB, 600 * MB)})
    [limit] = cgroup_limits(root)
    assert limit.limit == 2500 * MB and limit.headroom == 2100 * MB and limit.shared
    directory = f"{MOUNT_POINT[version]}/job/step"
    assert limit.source == f"cgroup {version} {FILES[version][0]} ({directory}): 2500 MB, 400 MB held"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_limit_on_a_parent_applies_and_every_level_is_read(tmp_path, version):
    """Slurm sets its job's limit on the job's cgroup, above the step the process runs in."""
    root = cgroup_tree(tmp_path, version, "/slurm/job_7/step_0", {
        "/slurm": (None, 0, 0), "/slurm/job_7": (3000 * MB, 1200 * MB, 200 * MB),
        "/slurm/job_7/step_0": (None, 800 * MB, 0)})
    [limit] = cgroup_limits(root)
    assert limit.limit == 3000 * MB and limit.headroom == 2000 * MB
    assert f"({MOUNT_POINT[version]}/slurm/job_7)" in limit.source
    root = cgroup_tree(tmp_path, version, "/slurm/job_7/step_0", {"/slurm/job_7/step_0": (1000 * MB, 700 * MB, 0)})
    assert sorted(limit.limit for limit in cgroup_limits(root)) == [1000 * MB, 3000 * MB]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_no_limit_is_no_limit(tmp_path, version):
    root = cgroup_tree(tmp_path, version, "/user.slice/session", {
        "/": (None, 9000 * MB, 0), "/user.slice": (None, 800 * MB, 0), "/user.slice/session": (None, 700 * MB, 0)})
    assert cgroup_limits(root) == []
    assert cgroup_limits(str(tmp_path / "nothing")) == []  # no /proc: no cgroup to read


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cgroup_namespace_is_read_at_the_mount_root(tmp_path, version):
    """A container with its own cgroup namespace: /proc/self/cgroup names the host's path, the
    mount shows the container's cgroup at its root (Kubernetes, docker run -m)."""
    root = cgroup_tree(tmp_path, version, "/kubepods/burstable/pod1/ctr", {"/": (2500 * MB, 300 * MB, 0)})
    [limit] = cgroup_limits(root)
    assert limit.headroom == 2200 * MB and f"({MOUNT_POINT[version]})" in limit.source
    # a mount of a sub-tree (mountinfo's root field): the path is taken relative to it
    root = cgroup_tree(tmp_path / "sub", version, "/docker/abc", {"/": (1500 * MB, 500 * MB, 0)},
                       mount_root="/docker/abc")
    assert [limit.headroom for limit in cgroup_limits(root)] == [1000 * MB]


def test_hybrid_hierarchy_reads_the_v1_memory_controller(tmp_path):
    """cgroup v1 controllers beside a v2 hierarchy without the memory controller (no memory.max
    in it): the v1 limit is found, and the v2 hierarchy adds none."""
    root = cgroup_tree(tmp_path, "v1", "/process_api/x", {"/process_api/x": (800 * MB, 100 * MB, 0)})
    with open(os.path.join(root, "proc/self/mountinfo"), "a", encoding="ascii") as handle:
        handle.write("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    with open(os.path.join(root, "proc/self/cgroup"), "a", encoding="ascii") as handle:
        handle.write("0::/\n")
    (tmp_path / "sys/fs/cgroup/unified").mkdir(parents=True)
    assert [version for version, _, _ in memory_cgroups(root)] == ["v1", "v2"]
    assert [limit.limit for limit in cgroup_limits(root)] == [800 * MB]


def test_rlimits_count_against_the_address_space_and_data(tmp_path, monkeypatch):
    """RLIMIT_AS against VmSize, RLIMIT_DATA against VmData (the soft limits); each process's own."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "status").write_text("Name:\tpython\nVmSize:\t 3000000 kB\nVmRSS:\t 300000 kB\nVmData:\t 1000000 kB\n")
    given = {resource.RLIMIT_AS: (4_000_000 * 1024, resource.RLIM_INFINITY),
             resource.RLIMIT_DATA: (resource.RLIM_INFINITY, resource.RLIM_INFINITY)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: given[which])
    [limit] = rlimits(str(tmp_path))
    assert limit.headroom == 1_000_000 * 1024 and not limit.shared
    assert limit.source.startswith("RLIMIT_AS (soft limit): 4096 MB, 3072 MB in use (VmSize)")
    given[resource.RLIMIT_DATA] = (1_500_000 * 1024, resource.RLIM_INFINITY)
    assert [limit.headroom for limit in rlimits(str(tmp_path))] == [1_000_000 * 1024, 500_000 * 1024]
    given.update({which: (resource.RLIM_INFINITY,) * 2 for which in given})
    assert rlimits(str(tmp_path)) == []


def test_slurm_figures_are_mib_per_node():
    """--mem=2500 is 2500 MiB (Slurm's cgroup limit is the figure x 2^20); --mem-per-cpu counts
    the CPUs on the node; --mem=0 is the whole node; held comes off the headroom."""
    limit = slurm_limit(500 * MIB, {"SLURM_MEM_PER_NODE": "2500"})
    assert limit.limit == 2500 * MIB and limit.headroom == 2000 * MIB and limit.shared
    assert limit.source == "Slurm SLURM_MEM_PER_NODE=2500 (MiB): 2621 MB"
    limit = slurm_limit(0, {"SLURM_MEM_PER_CPU": "1000", "SLURM_CPUS_ON_NODE": "4"})
    assert limit.limit == 4000 * MIB and "SLURM_CPUS_ON_NODE=4" in limit.source
    limit = slurm_limit(0, {"SLURM_MEM_PER_CPU": "1000"})
    assert limit.limit == 1000 * MIB and "1 CPU (SLURM_CPUS_ON_NODE not set)" in limit.source
    assert slurm_limit(0, {"SLURM_MEM_PER_NODE": "0"}) is None
    assert slurm_limit(0, {"SLURM_JOB_ID": "7"}) is None
    with pytest.raises(InputError, match="SLURM_MEM_PER_NODE='2500M' is not a whole number"):
        slurm_limit(0, {"SLURM_MEM_PER_NODE": "2500M"})


def test_slurm_memory_per_gpu_counts_the_gpus_on_the_node():
    """--mem-per-gpu (SLURM_MEM_PER_GPU) was not read (issue 72): a GPU job's memory was no limit."""
    limit = slurm_limit(0, {"SLURM_MEM_PER_GPU": "3000", "SLURM_GPUS_ON_NODE": "2"})
    assert limit.limit == 6000 * MIB and "SLURM_MEM_PER_GPU=3000 (MiB) x SLURM_GPUS_ON_NODE=2" in limit.source
    limit = slurm_limit(0, {"SLURM_MEM_PER_GPU": "3000"})
    assert limit.limit == 3000 * MIB and "1 GPU (SLURM_GPUS_ON_NODE not set)" in limit.source
    with pytest.raises(InputError, match="SLURM_GPUS_ON_NODE='two'"):
        slurm_limit(0, {"SLURM_MEM_PER_GPU": "3000", "SLURM_GPUS_ON_NODE": "two"})


def test_free_memory_is_memavailable(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: 8000000 kB\n")
    limit = free_memory(str(tmp_path))
    assert limit.headroom == 8_000_000 * 1024 and limit.limit is None
    assert limit.source == "free memory (MemAvailable): 8192 MB"


@pytest.fixture
def limited(tmp_path, monkeypatch):
    """The budget's readers pointed at prepared files: 20 GB free, a 2500 MB cgroup holding
    400 MB, an RLIMIT_AS with 3000 MB left, no Slurm; resident 300 MB (as the budget reads it), one rank."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(f"MemAvailable: {20_000 * MB // 1024} kB\n")
    cgroup_tree(tmp_path, "v1", "/job", {"/job": (2500 * MB, 700 * MB, 300 * MB)})
    (tmp_path / "proc" / "self" / "status").write_text(f"VmSize: {5000 * MB // 1024} kB\nVmData: 1 kB\n")
    given = {resource.RLIMIT_AS: (8000 * MB, resource.RLIM_INFINITY),
             resource.RLIMIT_DATA: (resource.RLIM_INFINITY, resource.RLIM_INFINITY)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: given[which])
    root = str(tmp_path)
    monkeypatch.setattr(budget, "free_memory", lambda: memory_limits.free_memory(root))
    monkeypatch.setattr(budget, "cgroup_limits", lambda: memory_limits.cgroup_limits(root))
    monkeypatch.setattr(budget, "rlimits", lambda: memory_limits.rlimits(root))
    environ = {}
    monkeypatch.setattr(budget, "slurm_limit", lambda held: memory_limits.slurm_limit(held, environ))
    monkeypatch.setattr(budget, "_ABOVE", {})  # no --max-memory found above a limit yet
    for module in (budget, memory):  # the budget's and the plan's reading of the resident set
        monkeypatch.setattr(module, "resident_bytes", lambda: 300 * MB)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return given, environ


def test_the_smallest_limit_sets_the_budget_and_is_named(limited, monkeypatch):
    """resident + 80% of each headroom: free 300 + 16000, cgroup 300 + 1680, RLIMIT_AS 300 + 2400
    (MB): the cgroup's, named; shared headroom divided among LOCAL_WORLD_SIZE ranks, a
    process's own (RLIMIT_AS) not; a Slurm job below them all wins."""
    given, environ = limited
    found = budget.memory_budget(None, 300 * MB)
    assert abs(found.size - 1980 * MB) <= 1 and found.note == ""
    assert found.source.startswith("cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job): 2500 MB")
    assert budget.budget_bytes(None, 300 * MB) == found.size
    given[resource.RLIMIT_AS] = (6500 * MB, resource.RLIM_INFINITY)  # 1500 MB left: 300 + 1200
    assert budget.memory_budget(None, 300 * MB).source.startswith("RLIMIT_AS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # the cgroup's 2100 MB headroom / 4: 300 + 420
    found = budget.memory_budget(None, 300 * MB)
    assert abs(found.size - 720 * MB) <= 1 and found.source.startswith("cgroup v1")
    environ["SLURM_MEM_PER_NODE"] = "1600"  # 1677.7 MB less 4 x 300 MB held, / 4, x 0.8: 300 + 95.5
    found = budget.memory_budget(None, 300 * MB)
    assert found.source.startswith("Slurm SLURM_MEM_PER_NODE=1600 (MiB)")
    assert abs(found.size - (300 * MB + 0.8 * (1600 * MIB - 1200 * MB) / 4)) <= 1


def test_max_memory_is_kept_below_every_limit_and_replaced_above_one(limited):
    """--max-memory below what each hard limit lets the process hold is the budget; above one (the
    cgroup stops it at 300 + 2100 MB) it is not usable: the budget is the default's, with a note
    (issue 72: it was kept, and the run killed by the cgroup)."""
    found = budget.memory_budget(2000)
    assert (found.size, found.source, found.note) == (2000 * MB, "max_memory", "")
    found = budget.memory_budget(3000)
    assert abs(found.size - 1980 * MB) <= 1 and found.source.startswith("cgroup v1 memory.limit_in_bytes")
    assert found.note.startswith("max_memory 3000 MB is above what the cgroup v1 memory.limit_in_bytes "
                                  "(/sys/fs/cgroup/memory/job): 2500 MB, 400 MB held lets this process hold (2400 MB")


def test_a_default_budget_below_the_footprint_names_its_source(limited):
    given, _ = limited
    given[resource.RLIMIT_AS] = (4900 * MB, resource.RLIM_INFINITY)  # VmSize above the limit: no headroom
    sizes = memory.TensorSizes(nao=24, spaces=[(5, 19)], naux=84, largest_shell=9, itemsize=4)
    found = budget.memory_budget(None, 300 * MB)
    with pytest.raises(memory.MemoryBudgetError, match=r"the default memory budget 300 MB \(RLIMIT_AS"):
        memory.plan_memory(found.size, sizes, baseline=300 * MB, source=found.source)


def test_pyscf_and_the_record_get_the_default_budget(limited, monkeypatch):
    """PySCF's mol.max_memory is the default budget (it was PySCF's 4000 MB), and the record's
    memory block names what set the budget."""
    import dfmp2
    from dfmp2 import chem

    told, budgets = [], []  # PySCF's max_memory, and the default budget then (MB)
    build = chem.build_molecule

    def building(*args, **kw):
        told.append(args[4])
        budgets.append(budget.budget_bytes(None) / MB)
        return build(*args, **kw)

    monkeypatch.setattr(chem, "build_molecule", building)
    record = dfmp2.run_xyz(os.path.join(ROOT, "examples", "water.xyz")).as_dict()
    assert len(told) == 1 and told[0] is not None and abs(told[0] - budgets[0]) < 20, (told, budgets)
    assert record["memory"]["budget_source"].startswith("cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/job)")
    # the resident set (300 MB, as the budget reads it) + 80% of the prepared cgroup's 2100 MB headroom
    assert abs(record["memory"]["budget_mb"] - record["memory"]["baseline_mb"] - 1680) < 0.01
    assert record["notes"] == []
    record = dfmp2.run_xyz(os.path.join(ROOT, "examples", "water.xyz"), max_memory=3000).as_dict()
    assert abs(told[1] - 1980) < 1 and record["memory"]["budget_source"].startswith("cgroup v1")
    assert any(note.startswith("max_memory 3000 MB is above what the cgroup v1") for note in record["notes"])
    record = dfmp2.run_xyz(os.path.join(ROOT, "examples", "water.xyz"), max_memory=2000).as_dict()
    assert told[2] == 2000 and record["memory"]["budget_source"] == "max_memory" and record["notes"] == []


# ----------------------------------------------------------------------------- real cgroups


def child_cgroup(limit_bytes):
    """A new memory cgroup below this process's, limited to `limit_bytes`: (its directory, the
    limit file's name); pytest.skip with the reason where the machine does not allow one."""
    found = {version: directory for version, directory, _ in memory_cgroups()}
    name = f"dfmp2-test-{uuid.uuid4().hex[:8]}"
    if "v1" in found:
        version, limit_file = "v1", "memory.limit_in_bytes"
    elif "v2" in found and "memory" in _read(os.path.join(found["v2"], "cgroup.subtree_control")).split():
        version, limit_file = "v2", "memory.max"
    else:
        pytest.skip("no cgroup v1 memory controller, nor a v2 cgroup whose children get one")
    directory = os.path.join(found[version], name)
    try:
        os.mkdir(directory)
    except OSError as error:
        pytest.skip(f"cannot make a cgroup in {found[version]}: {error.strerror}")
    try:
        with open(os.path.join(directory, limit_file), "w", encoding="ascii") as handle:
            handle.write(str(limit_bytes))
    except OSError as error:
        os.rmdir(directory)
        pytest.skip(f"cannot set {limit_file} in {directory}: {error.strerror}")
    return directory, version


def _read(path):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return ""


def run_in_cgroup(directory, args, timeout):
    """`python -m dfmp2 ARGS` as the only process of the cgroup `directory` (a shell moves itself
    in, then execs), the cgroup removed afterwards -> (CompletedProcess, peak bytes of the cgroup)."""
    script = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
    try:
        proc = subprocess.run(["sh", "-c", script, "sh", directory, sys.executable, "-m", "dfmp2", *args],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": ROOT})
        peak = _read(os.path.join(directory, "memory.max_usage_in_bytes")) or _read(os.path.join(directory,
                                                                                                  "memory.peak"))
        return proc, int(peak) if peak.strip().isdigit() else None
    finally:
        os.rmdir(directory)


@pytest.mark.parametrize("max_memory", [None, 2000])
def test_a_run_in_a_real_cgroup_takes_its_limit(tmp_path, max_memory):
    """examples/water.xyz in a 1000 MB cgroup made for it: with no --max-memory the budget is
    below the limit and the record names the cgroup; a --max-memory above it is replaced by the
    same budget, warned in one line on stderr and noted (issue 72: it was kept, noted at the end)."""
    limit = 1000 * MB
    tighter = [limit_.source for limit_ in cgroup_limits() if limit_.limit <= 2 * limit]
    if tighter:
        pytest.skip(f"this process's cgroup already has a tighter limit: {tighter[0]}")
    directory, version = child_cgroup(limit)
    out = tmp_path / "water.json"
    args = ["run", os.path.join(ROOT, "examples", "water.xyz"), "--quiet", "--json", str(out)]
    proc, _ = run_in_cgroup(directory, args + (["--max-memory", str(max_memory)] if max_memory else []), 120)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
    if max_memory is None:
        assert record["memory"]["budget_source"].startswith(f"cgroup {version} {limit_file} ({directory}): ")
        assert record["memory"]["budget_mb"] < limit / MB and record["notes"] == []
    else:
        assert record["memory"]["budget_source"].startswith(f"cgroup {version} {limit_file} ({directory}): ")
        assert record["memory"]["budget_mb"] < limit / MB
        assert [note for note in record["notes"] if f"({directory})" in note and "is above what the cgroup" in note]
        assert proc.stderr.startswith(f"dfmp2: warning: --max-memory {max_memory} MB is above what the cgroup ")
        assert proc.stderr.count("\n") == 1, proc.stderr


def test_water16_runs_in_a_2500_mb_cgroup_without_max_memory(tmp_path):
    """The issue's acceptance check (slow tier): (H2O)16/cc-pVDZ with no --max-memory was killed
    in a 2500 MB cgroup (exit 137 after 35 s, no output: its budget was 80% of the machine's free
    RAM and PySCF was told 4000 MB); now it finishes with the unlimited run's energy."""
    xyz = os.path.join(ROOT, "examples", "water16.xyz")
    directory, _ = child_cgroup(2500 * MB)
    limited_json, free_json = tmp_path / "limited.json", tmp_path / "free.json"
    proc, peak = run_in_cgroup(directory, ["run", xyz, "--quiet", "--json", str(limited_json)], 900)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    free = subprocess.run([sys.executable, "-m", "dfmp2", "run", xyz, "--quiet", "--json", str(free_json)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    assert free.returncode == 0, free.stderr
    limited, unlimited = json.loads(limited_json.read_text()), json.loads(free_json.read_text())
    assert limited["memory"]["budget_source"].startswith("cgroup ") and limited["memory"]["budget_mb"] < 2500
    measured = (limited["memory"], peak)  # the cgroup's own peak (v1: page cache included)
    assert abs(limited["e_tot"] - unlimited["e_tot"]) < 2e-7, (limited["e_tot"], unlimited["e_tot"], measured)
