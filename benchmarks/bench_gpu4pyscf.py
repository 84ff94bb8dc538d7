"""dfmp2 on an NVIDIA GPU against gpu4pyscf, side by side: the whole job as a user waits for it
(one process each, start-up included), timed by benchmarks/harness.py (a quiet machine or no result,
alternating, each at its fastest BLAS setting), plus each one's SCF and DF-MP2 steps.

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
import atexit
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_whole_job import PYSCF_SCRIPT  # noqa: E402  (the PySCF user's script, shared)
from harness import add_arguments, from_arguments, main_guard, median, median_ratio  # noqa: E402

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--precision", default="fp32", help="dfmp2's MP2 precision (fp32: dfmp2 run's default)")
    add_arguments(parser)
    parser.add_argument("--contenders", default="dfmp2,gpu4pyscf", help="of dfmp2, gpu4pyscf, pyscf-cpu")
    parser.add_argument("--device", default="cuda", help="dfmp2's device (cpu: to try the script without a GPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    molecule, scratch = os.path.abspath(args.molecule), tempfile.mkdtemp(prefix="dfmp2-bench-gpu-")
    atexit.register(shutil.rmtree, scratch, True)  # the runs' records, read into the result
    outs = {name: os.path.join(scratch, f"{name}.json") for name in ("dfmp2", "gpu4pyscf", "pyscf-cpu")}
    commands = {
        "dfmp2": [sys.executable, "-m", "dfmp2", "run", molecule, "--basis", args.basis, "--device", args.device,
                  "--precision", args.precision, "--quiet", "--json", outs["dfmp2"]],
        "gpu4pyscf": [sys.executable, "-c", GPU4PYSCF_SCRIPT, molecule, args.basis, outs["gpu4pyscf"]],
        "pyscf-cpu": [sys.executable, "-c", PYSCF_SCRIPT, molecule, args.basis, outs["pyscf-cpu"]],
    }
    names = args.contenders.split(",")
    harness = from_arguments(args)
    chosen = harness.choose_blas({name: (commands[name], None, ROOT) for name in names}, rounds=args.blas_rounds)
    timed = harness.alternate({name: (lambda n=name: harness.process(commands[n], chosen[n], ROOT, lambda: json.load(
        open(outs[n], encoding="utf-8")))) for name in names})
    report = {"molecule": args.molecule, "basis": args.basis, "dfmp2_precision": args.precision, "contenders": {}}
    for name in names:
        record = timed[name][-1].payload
        report["contenders"][name] = {
            "wall_seconds": [round(r.seconds, 3) for r in timed[name]], "median_wall": round(median(timed[name]), 3),
            "timings": record["timings"], "e_tot": record["e_tot"], "e_corr": record["e_corr"],
            "e_ref": record.get("e_ref"), "version": record.get("version"), "scf_iterations": record.get("scf_iterations")}
        if name != "dfmp2" and "dfmp2" in timed:
            report["contenders"][name]["ratio_to_dfmp2"] = round(median_ratio(timed[name], timed["dfmp2"]), 3)
            report["contenders"][name]["de_tot_vs_dfmp2"] = record["e_tot"] - timed["dfmp2"][-1].payload["e_tot"]
    full = harness.write(args.json, report) if args.json else {**report, **harness.record()}
    print(json.dumps({k: v for k, v in full.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main_guard(main)
