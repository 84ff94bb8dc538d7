"""dfmp2 on an NVIDIA GPU against gpu4pyscf, side by side: the whole job as a user waits for it
(one process each, start-up included), alternating, plus each one's SCF and DF-MP2 steps.

    python benchmarks/bench_gpu4pyscf.py examples/benzene.xyz --basis cc-pvtz --rounds 3
    python benchmarks/bench_gpu4pyscf.py examples/water.xyz --contenders dfmp2,pyscf-cpu --device cpu

Contenders, each a fresh process per round:
  dfmp2       `python -m dfmp2 run MOLECULE --basis B --device cuda --precision P --quiet --json F`
              (dfmp2's DF-SCF builds on the GPU, then DF-MP2 on the GPU)
  gpu4pyscf   the script a gpu4pyscf user writes: scf.RHF(mol).density_fit().to_gpu(), then
              gpu4pyscf.mp.dfmp2.DFMP2 (its default MP2 fitting set, the one dfmp2 uses), no t2
  pyscf-cpu   PySCF's DF-RHF and DFMP2 on the host's cores: what users run today (the script of
              bench_whole_job.py)
All converge the SCF to 1e-11 Eh / 1e-7 (dfmp2 run's thresholds). Round 0 is a discarded warm-up
(file caches). The report gives per-contender median wall seconds, step timings, E(total), and
the median of per-round ratios other / dfmp2 (> 1: dfmp2 is faster). gpu4pyscf's DF-MP2 is also
timed a second time in the same process (warm: its kernels compiled and its memory pool full).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_whole_job import PYSCF_SCRIPT  # noqa: E402  (the PySCF user's script, shared)

GPU4PYSCF_SCRIPT = """
import json, sys, time
import cupy
from pyscf import gto, scf
import gpu4pyscf
from gpu4pyscf.mp import dfmp2
mol = gto.M(atom=sys.argv[1], basis=sys.argv[2], verbose=0)
mf = scf.RHF(mol).density_fit().to_gpu()
mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
start = time.perf_counter()
mf.kernel()
cupy.cuda.Device().synchronize()
scf_seconds = time.perf_counter() - start
mp2 = []
for _ in range(2):
    start = time.perf_counter()
    pt = dfmp2.DFMP2(mf)
    pt.kernel(with_t2=False)
    cupy.cuda.Device().synchronize()
    mp2.append(time.perf_counter() - start)
json.dump({"e_tot": float(pt.e_tot), "e_corr": float(pt.e_corr), "e_ref": float(mf.e_tot),
           "version": gpu4pyscf.__version__, "scf_iterations": mf.cycles,
           "timings": {"scf": scf_seconds, "mp2": mp2[0], "mp2_warm": mp2[1]}}, open(sys.argv[3], "w"))
"""


def timed(command, output):
    """(wall seconds, the JSON the process wrote) of one process, which must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{command[:4]}... failed: {proc.stderr.strip()[-2000:]}")
    with open(output, encoding="utf-8") as handle:
        return seconds, json.load(handle)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--precision", default="fp32", help="dfmp2's MP2 precision (fp32: dfmp2 run's default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, choices=(0, 1))
    parser.add_argument("--contenders", default="dfmp2,gpu4pyscf", help="of dfmp2, gpu4pyscf, pyscf-cpu")
    parser.add_argument("--device", default="cuda", help="dfmp2's device (cpu: to try the script without a GPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    molecule, scratch = os.path.abspath(args.molecule), tempfile.mkdtemp(prefix="dfmp2-bench-gpu-")
    contenders = {
        "dfmp2": lambda out: [sys.executable, "-m", "dfmp2", "run", molecule, "--basis", args.basis,
                              "--device", args.device, "--precision", args.precision, "--quiet", "--json", out],
        "gpu4pyscf": lambda out: [sys.executable, "-c", GPU4PYSCF_SCRIPT, molecule, args.basis, out],
        "pyscf-cpu": lambda out: [sys.executable, "-c", PYSCF_SCRIPT, molecule, args.basis, out],
    }
    contenders = {name: contenders[name] for name in args.contenders.split(",")}
    walls = {name: [] for name in contenders}
    records = {}
    for round_index in range(args.rounds + args.warmup):
        for name, command in contenders.items():
            out = os.path.join(scratch, f"{name}.json")
            seconds, record = timed(command(out), out)
            if round_index >= args.warmup:
                walls[name].append(seconds)
                records[name] = record
            print(f"round {round_index} {name:10s} {seconds:8.2f} s  E_tot {record['e_tot']:.10f}", flush=True)
    report = {"molecule": args.molecule, "basis": args.basis, "dfmp2_precision": args.precision,
              "rounds": args.rounds, "contenders": {}}
    for name in contenders:
        record = records[name]
        report["contenders"][name] = {
            "wall_seconds": [round(s, 3) for s in walls[name]], "median_wall": round(statistics.median(walls[name]), 3),
            "timings": record["timings"], "e_tot": record["e_tot"], "e_corr": record["e_corr"],
            "e_ref": record.get("e_ref"), "version": record.get("version"), "scf_iterations": record.get("scf_iterations")}
        if name != "dfmp2":
            ratios = [other / mine for other, mine in zip(walls[name], walls["dfmp2"])]
            report["contenders"][name]["ratio_to_dfmp2"] = round(statistics.median(ratios), 3)
            report["contenders"][name]["de_tot_vs_dfmp2"] = record["e_tot"] - records["dfmp2"]["e_tot"]
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    sys.exit(main())
