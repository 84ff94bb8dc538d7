"""Out-of-core against in-memory, side by side, and the scratch traffic against the disk.

    python benchmarks/bench_out_of_core.py --nbasis 500 --nocc 60 --naux 1500 --disk-budget 500 \
        --rounds 2 --scratch /tmp --json benchmarks/results/out_of_core.json

Runs `dfmp2 bench` (one warm pass) on a synthetic shape alternately with no budget (B in
memory) and with --disk-budget MB (B in an HDF5 scratch file), as separate processes, and
reports the median times, their ratio, the scratch bytes (`io`) and what they mean in GB/s over
the disk stages (transform + whitening write, pair stage read). The disk's own sequential rate
is measured first: a file as large as the tensor written with fsync, then read back after
dropping it from the page cache (posix_fadvise DONTNEED).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

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


def bench(shape, budget, scratch):
    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "bench.json")
        args = [sys.executable, "-m", "dfmp2", "bench", *shape, "--repeat", "1", "--quiet", "--json", path]
        if budget is not None:
            args += ["--max-memory", str(budget)]
        env = dict(os.environ, TMPDIR=scratch)  # the scratch file's directory
        subprocess.run(args, check=True, env=env)
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nbasis", type=int, default=500)
    parser.add_argument("--nocc", type=int, default=60)
    parser.add_argument("--naux", type=int, default=1500)
    parser.add_argument("--disk-budget", type=float, default=500.0, help="MB, whole process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scratch", default=tempfile.gettempdir())
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shape = ["--nbasis", str(args.nbasis), "--nocc", str(args.nocc), "--naux", str(args.naux)]
    tensor = args.nocc * (args.nbasis - args.nocc) * args.naux * 8
    write_rate, read_rate = disk_rate(args.scratch, max(tensor, 256 * 2**20))
    runs = {"memory": [], "disk": []}
    for _ in range(args.rounds):  # alternate: this machine is noisy
        runs["memory"].append(bench(shape, None, args.scratch))
        runs["disk"].append(bench(shape, args.disk_budget, args.scratch))
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
        "rounds": args.rounds, "machine": disk["machine"], "commit": disk.get("commit"),
        "note": "the tensor fits the page cache here: reads mostly come from memory, not the disk",
    }
    print(json.dumps(record, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)


if __name__ == "__main__":
    main()
