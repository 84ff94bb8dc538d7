"""Out-of-core against in-memory, side by side (timed by benchmarks/harness.py: a quiet machine or no
result), and the scratch traffic against the disk.

    python benchmarks/bench_out_of_core.py --nbasis 500 --nocc 60 --naux 1500 --disk-budget 500 \
        --rounds 2 --scratch /tmp --json benchmarks/results/out_of_core.json

Runs `dfmp2 bench` (one warm pass) on a synthetic shape alternately with no budget (B in
memory) and with --disk-budget MB (B in an HDF5 scratch file), as separate processes, and
reports the median times, their ratio, the scratch bytes (`io`) and what they mean in GB/s over
the disk stages (transform + whitening write, pair stage read). The disk's own sequential rate
is measured first: a file as large as the tensor written with fsync, then read back after
dropping it from the page cache (posix_fadvise DONTNEED).

A tensor larger than free RAM: --leave-free GB starts a process that holds all available
memory but GB (anonymous pages; on a machine without swap they cannot be evicted) during
each disk run, so the page cache cannot hold the scratch file; the in-memory runs go without
it. The block device's own counters (/sys/dev/block) give the bytes that really came from
and went to the disk in each disk run. --repeat 0 times one cold pass (big shapes).

    python benchmarks/bench_out_of_core.py --nbasis 1600 --nocc 100 --naux 4000 \
        --disk-budget 2000 --leave-free 3.5 --repeat 0 --rounds 1 --json ...
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import add_arguments, bench_environment, from_arguments, main_guard  # noqa: E402

CHUNK = 64 * 2**20


def disk_rate(directory, nbytes):
    """(write GB/s with fsync, cold read GB/s) of a sequential file of `nbytes`."""
    block = os.urandom(CHUNK)
    handle, path = tempfile.mkstemp(prefix="dfmp2-disk-rate-", dir=directory)
    try:
        start = time.perf_counter()
        written = 0
        while written < nbytes:
            written += os.write(handle, block)
        os.fsync(handle)
        write_s = time.perf_counter() - start
        os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(handle, 0, os.SEEK_SET)
        start = time.perf_counter()
        while os.read(handle, CHUNK):
            pass
        read_s = time.perf_counter() - start
    finally:
        os.close(handle)
        os.unlink(path)
    return written / write_s / 1e9, written / read_s / 1e9


HOLD = """
import sys, numpy as np
held = np.ones(int(sys.argv[1]) // 8)  # every page written: resident, and without swap unevictable
print("held", flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
"""


def mem_available():
    """MemAvailable of /proc/meminfo, bytes."""
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


class MemoryHold:
    """A child process holding all available memory but `leave_free` bytes while in `with`."""

    def __init__(self, leave_free):
        self.nbytes = max(0, mem_available() - int(leave_free))

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(self.nbytes)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "held":
            raise RuntimeError("the memory-holding process did not start")
        self.available = mem_available()
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait()


def device_counters(directory):
    """(bytes read, bytes written) so far by the block device holding `directory`; None where
    it has no block device (tmpfs, overlay, btrfs subvolumes)."""
    dev = os.stat(directory).st_dev
    path = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
    if not os.path.exists(path):
        return None
    with open(path, encoding="ascii") as handle:
        fields = [int(v) for v in handle.read().split()]
    return fields[2] * 512, fields[6] * 512  # sectors read, sectors written (512 bytes each)


def bench(harness, name, round_, shape, budget, scratch, repeat):
    """One `dfmp2 bench` process timed by the harness (quiet check) -> its JSON record."""
    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "bench.json")
        args = [sys.executable, "-m", "dfmp2", "bench", *shape, "--repeat", str(repeat), "--quiet", "--json", path]
        if budget is not None:
            args += ["--max-memory", str(budget)]
        env = bench_environment({"TMPDIR": scratch, "PYSCF_TMPDIR": scratch})  # the scratch file's directory
        run = harness.measure(name, round_, lambda: harness.process(args, env, payload=lambda: json.load(
            open(path, encoding="utf-8"))))
        return run.payload


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nbasis", type=int, default=500)
    parser.add_argument("--nocc", type=int, default=60)
    parser.add_argument("--naux", type=int, default=1500)
    parser.add_argument("--disk-budget", type=float, default=500.0, help="MB, whole process")
    add_arguments(parser, rounds=2)
    parser.add_argument("--scratch", default=tempfile.gettempdir())
    parser.add_argument("--repeat", type=int, default=1, help="warm passes per run (0: the cold pass)")
    parser.add_argument("--leave-free", type=float, default=None, metavar="GB",
                        help="during disk runs, hold all available memory but this much")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shape = ["--nbasis", str(args.nbasis), "--nocc", str(args.nocc), "--naux", str(args.naux)]
    tensor = args.nocc * (args.nbasis - args.nocc) * args.naux * 8
    write_rate, read_rate = disk_rate(args.scratch, max(tensor, 256 * 2**20))
    harness = from_arguments(args)
    harness.note_blas("dfmp2", "detected", bench_environment(harness.blas_settings.get("detected", {})), True)
    runs = {"memory": [], "disk": []}
    device_io, held = [], None
    for round_ in range(1, args.rounds + 1):  # alternate (one program: one BLAS setting for both)
        runs["memory"].append(bench(harness, "memory", round_, shape, None, args.scratch, args.repeat))
        with contextlib.ExitStack() as stack:
            if args.leave_free is not None:
                hold = stack.enter_context(MemoryHold(args.leave_free * 1e9))
                held = {"held_gb": hold.nbytes / 1e9, "mem_available_gb_while_held": hold.available / 1e9}
            before = device_counters(args.scratch)
            runs["disk"].append(bench(harness, "disk", round_, shape, args.disk_budget, args.scratch, args.repeat))
            after = device_counters(args.scratch)
        if before is not None:
            device_io.append({"bytes_read": after[0] - before[0], "bytes_written": after[1] - before[1]})
    seconds = {k: statistics.median(r["total_seconds"] for r in v) for k, v in runs.items()}
    disk = runs["disk"][-1]
    stages = {k: statistics.median(r["stages"][k]["seconds"] for r in runs["disk"])
              for k in ("transform", "whiten", "pair_energies")}
    io = disk["io"]
    record = {
        "shape": disk["shape"], "tensor_gb": tensor / 1e9, "disk_budget_mb": args.disk_budget,
        "memory_plan": disk["memory"], "io": io,
        "written_over_tensor": io["bytes_written"] / io["tensor_bytes"],
        "read_over_tensor": io["bytes_read"] / io["tensor_bytes"],
        "seconds": seconds, "disk_over_memory": seconds["disk"] / seconds["memory"],
        "disk_stage_seconds": stages,
        "write_gb_per_s_over_transform_and_whiten": io["bytes_written"] / 1e9 / (stages["transform"] + stages["whiten"]),
        "read_gb_per_s_over_whiten_and_pairs": io["bytes_read"] / 1e9 / (stages["whiten"] + stages["pair_energies"]),
        "disk_sequential_gb_per_s": {"write_fsync": write_rate, "read_cold": read_rate},
        "energies_equal": abs(runs["disk"][-1]["e_corr"] - runs["memory"][-1]["e_corr"]) < 1e-10,
        "e_corr": {k: v[-1]["e_corr"] for k, v in runs.items()},
        "block_device_io_per_disk_run": device_io,
        "device_read_over_store_read": device_io[-1]["bytes_read"] / max(1, io["bytes_read"]) if device_io else None,
        "memory_held_during_disk_runs": held,
        "repeat": args.repeat, "timed_passes": disk.get("timed_passes"),
        "rounds": args.rounds, "machine": disk["machine"], "commit": disk.get("commit"),
        "note": ("the tensor fits the page cache here: reads mostly come from memory, not the disk"
                 if held is None else "a process held all available memory but --leave-free during the "
                 "disk runs, so the scratch file could not stay in the page cache (see block_device_io)"),
    }
    full = harness.write(args.json, record) if args.json else {**record, **harness.record()}
    print(json.dumps({k: v for k, v in full.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main_guard(main)
