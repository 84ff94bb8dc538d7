"""The limits on how much memory this process may hold, each read from where the system keeps it:
free memory (MemAvailable), the memory cgroup's limits (v1 memory.limit_in_bytes and
memory.memsw.limit_in_bytes, v2 memory.max and memory.high, at every level from the process's
cgroup up to the mount root), the RLIMIT_AS and RLIMIT_DATA resource limits, and a Slurm job's
memory. Sizes in bytes; a limit's text in MB (10^6 bytes, as PySCF counts).

Each reader takes the file system root (or the environment) it reads, so that tests can point
it at prepared files; `budget.memory_budget` (dfmp2.run) turns the limits into the budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import environment
from .system_memory import MB, proc_field_bytes

# cgroup v1 writes "no limit" as its largest page count (9223372036854771712 bytes with 4 KiB
# pages); a figure from an exabyte (2^60 bytes) up is no limit on any machine
NO_CGROUP_LIMIT = 2**60
MIB = 2**20  # Slurm's memory unit: its "MB" (--mem=2500 and SLURM_MEM_PER_NODE=2500 are 2500 MiB)


@dataclass(frozen=True)
class MemoryLimit:
    """One limit on this process: headroom, the bytes its processes may still add (not below 0);
    limit, the ceiling itself (None: free memory, which has none of its own); shared, whether the
    node's ranks share it (free memory, a cgroup, a Slurm job) or each process has its own (the
    rlimits); source, what it is, for the record (e.g. "cgroup v2 memory.max (/sys/fs/cgroup/job):
    2500 MB"); counts, what it is counted in: "resident" (pages held: free memory, a cgroup, a
    Slurm job), "VmData" or "VmSize" (address space mapped: RLIMIT_DATA's, RLIMIT_AS's, which
    thread stacks and BLAS buffers fill beyond what is resident) or "whole" (a figure for the
    whole process that a caller gives, as QCEngine's task memory: `budget.caller_limit`); held,
    what is counted against it now (bytes; None where not known)."""

    headroom: int
    limit: int | None
    shared: bool
    source: str
    counts: str = "resident"
    held: int | None = None


def free_memory(root: str = "/") -> MemoryLimit:
    """MemAvailable of `root`/proc/meminfo (Linux), else the physical memory size."""
    available = proc_field_bytes(_under(root, "/proc/meminfo"), "MemAvailable:")
    if available is not None:
        return MemoryLimit(available, None, True, f"free memory (MemAvailable): {available / MB:.0f} MB")
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return MemoryLimit(physical, None, True, f"physical memory (no MemAvailable): {physical / MB:.0f} MB")


def cgroup_limits(root: str = "/") -> list:
    """A MemoryLimit for each limit set at each level of this process's memory cgroups (v1's
    memory controller, v2's unified hierarchy), from its own cgroup up to the mount root (a limit
    on a parent, e.g. a Slurm job's above its step, applies too): CGROUP_LIMITS, v1's
    memory.limit_in_bytes and memory.memsw.limit_in_bytes, v2's memory.max and memory.high.
    headroom = limit - what the cgroup holds, its usage (of memory and swap for memsw) less the
    page cache it can reclaim (inactive_file): scratch files a run writes stay in that cache
    without taking memory from it. Read from `root`/proc/self/cgroup and /proc/self/mountinfo; a
    cgroup path that is not under its mount (a cgroup namespace: a container sees its own cgroup
    at the mount root) is read at the mount root."""
    limits = []
    for version, directory, mount_point in memory_cgroups(root):
        while True:
            limits += _cgroup_level_limits(root, version, directory)
            if directory == mount_point:
                break
            directory = os.path.dirname(directory)
    return limits


def rlimits(root: str = "/") -> list:
    """A MemoryLimit (this process's own) for each of RLIMIT_AS and RLIMIT_DATA whose soft limit
    is set: headroom = the limit - VmSize (address space) or VmData (data segments and private
    mappings) of `root`/proc/self/status; a process's resident set grows by no more than these."""
    import resource

    limits = []
    for name, key in (("RLIMIT_AS", "VmSize:"), ("RLIMIT_DATA", "VmData:")):
        soft, _ = resource.getrlimit(getattr(resource, name))
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        used = proc_field_bytes(_under(root, "/proc/self/status"), key)
        counted = f"{used / MB:.0f} MB in use ({key[:-1]})" if used is not None else f"no {key[:-1]} to count from"
        limits.append(MemoryLimit(max(0, soft - (used or 0)), soft, False,
                                  f"{name} (soft limit): {soft / MB:.0f} MB, {counted}", key[:-1], used))
    return limits


def slurm_limit(held: int, environ=None) -> MemoryLimit | None:
    """A Slurm job's memory on this node, from its environment (default the process's: util.environment):
    SLURM_MEM_PER_NODE (--mem), or SLURM_MEM_PER_CPU (--mem-per-cpu) times SLURM_CPUS_ON_NODE
    (one CPU where that is not set), or SLURM_MEM_PER_GPU (--mem-per-gpu) times SLURM_GPUS_ON_NODE
    (one GPU where that is not set), all in MiB (Slurm's "MB": its cgroup limit is the figure x
    2^20 bytes); None outside Slurm or with --mem=0 (the whole node). held: what the job's
    processes on this node hold now (bytes; the caller's estimate), taken from the headroom."""
    per_node = _slurm_mib(environ, "SLURM_MEM_PER_NODE")
    if per_node is not None:
        mib, what = per_node, f"Slurm SLURM_MEM_PER_NODE={per_node} (MiB)"
    else:
        for each, count in (("SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"), ("SLURM_MEM_PER_GPU", "SLURM_GPUS_ON_NODE")):
            per_unit = _slurm_mib(environ, each)
            if per_unit is not None:
                break
        else:
            return None
        units = _slurm_mib(environ, count)
        unit = count.split("_")[1][:-1]  # CPU, GPU
        mib = per_unit * (units or 1)
        what = (f"Slurm {each}={per_unit} (MiB) x " +
                (f"{count}={units}" if units else f"1 {unit} ({count} not set)"))
    if mib == 0:  # --mem=0: all of the node's memory, which free memory and the cgroup bound
        return None
    limit = mib * MIB
    return MemoryLimit(max(0, limit - held), limit, True, f"{what}: {limit / MB:.0f} MB", held=held)


def _slurm_mib(environ, name):
    """The whole number a Slurm variable holds; None when it is not set; InputError otherwise
    (`environment.whole_number`)."""
    return environment.whole_number(name, environ=environ)


def memory_cgroups(root: str = "/") -> list:
    """(version "v1" or "v2", directory, mount point) of each memory cgroup of this process: v1's
    memory controller and v2's unified hierarchy, where mounted (paths as the process sees them,
    read from `root`/proc/self/cgroup and /proc/self/mountinfo)."""
    mounts = {}  # (version) -> (mount root, mount point)
    for line in _lines(_under(root, "/proc/self/mountinfo")):
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1:]
        fstype, options = tail[0], tail[2].split(",") if len(tail) > 2 else []
        version = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and "memory" in options else None
        if version is not None and version not in mounts:
            mounts[version] = (_unescape(fields[3]), _unescape(fields[4]))
    found = []
    for line in _lines(_under(root, "/proc/self/cgroup")):
        hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
        version = "v2" if hierarchy == "0" and not controllers else (
            "v1" if "memory" in controllers.split(",") else None)
        if version is None or version not in mounts:
            continue
        mount_root, mount_point = mounts[version]
        relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else ".."
        directory = os.path.normpath(os.path.join(mount_point, relative))
        if relative.startswith("..") or not os.path.isdir(_under(root, directory)):
            directory = mount_point  # a cgroup namespace: this process's cgroup is the mount root
        found.append((version, directory, mount_point))
    return found


# the limits of a cgroup level, each (limit file, usage file, what it means): v1's memory and its
# memory+swap (memsw: usage is memory plus swap, so swap in use leaves less of it; the kernel kills at
# either), v2's hard limit and its throttle (above memory.high the kernel reclaims and stalls the
# process's allocations: not a kill, but a run there crawls). v2's memory.swap.max bounds swap
# alone, not the pages a run adds, and v1's soft limit only orders reclaim: neither is read.
CGROUP_LIMITS = {
    "v1": (("memory.limit_in_bytes", "memory.usage_in_bytes", ""),
           ("memory.memsw.limit_in_bytes", "memory.memsw.usage_in_bytes", " of memory and swap")),
    "v2": (("memory.max", "memory.current", ""),
           ("memory.high", "memory.current", " (the kernel throttles the process above it)")),
}
RECLAIMABLE = {"v1": "total_inactive_file", "v2": "inactive_file"}  # memory.stat's reclaimable page cache


def _cgroup_level_limits(root, version, directory) -> list:
    """The MemoryLimits one cgroup directory sets (CGROUP_LIMITS; none where it sets none or
    they cannot be read)."""
    found = []
    reclaimable = None
    for limit_file, usage_file, meaning in CGROUP_LIMITS[version]:
        limit = _read_number(_under(root, os.path.join(directory, limit_file)))
        if limit is None or limit >= NO_CGROUP_LIMIT:
            continue
        if reclaimable is None:
            reclaimable = _stat_field(_under(root, os.path.join(directory, "memory.stat")), RECLAIMABLE[version]) or 0
        usage = _read_number(_under(root, os.path.join(directory, usage_file)))
        held = max(0, usage - reclaimable) if usage is not None else None
        counted = f"{held / MB:.0f} MB held" if held is not None else f"no {usage_file} to count from"
        found.append(MemoryLimit(max(0, limit - (held or 0)), limit, True,
                                 f"cgroup {version} {limit_file} ({directory}): {limit / MB:.0f} MB{meaning}, {counted}",
                                 held=held))
    return found


def _read_number(path):
    """The integer a cgroup file holds; None where there is no such file or it says "max"."""
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _stat_field(path, key):
    """The `key N` line of a cgroup memory.stat (bytes); None where there is none."""
    for line in _lines(path):
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def _lines(path):
    """The lines of a text file; none where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read().splitlines()
    except OSError:
        return []


def _unescape(field):
    """A mountinfo path with its octal escapes (\\040 for a space) decoded."""
    parts = field.split("\\")
    return parts[0] + "".join(chr(int(p[:3], 8)) + p[3:] if p[:3].isdigit() else "\\" + p for p in parts[1:])


def _under(root, path):
    """`path` (absolute, as this process sees it) under the file system root `root`."""
    return path if root == "/" else os.path.join(root, path.lstrip("/"))
