"""The PySCF drop-in as a script user meets it: one PySCF script, run whole (start-up, SCF, MP2),
once with PySCF's DFMP2 and once with only its import changed to dfmp2's, side by side,
alternating, wall clock of each process.

    python benchmarks/bench_dropin.py examples/benzene.xyz --basis cc-pvtz --rounds 3 --json

The script is PySCF's defaults throughout: a density-fitted RHF (its JK-fit set), then
`DFMP2(mf).kernel()`, which reuses the SCF's fitting and keeps t2 (both classes). Round 0 is a
discarded warm-up; the report gives each contender's median, the median of the per-round
ratios PySCF / dfmp2 (> 1: dfmp2 faster) and both energies. --json writes
benchmarks/results/dropin_*.json.
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

SCRIPT = """
import json, sys
from pyscf import gto, scf
{import_line}
mol = gto.M(atom=sys.argv[1], basis=sys.argv[2], verbose=0)
mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11, conv_tol_grad=1e-7)
pt = DFMP2(mf)
e_corr, t2 = pt.kernel()
json.dump({{"e_tot": pt.e_tot, "e_corr": e_corr, "t2_kept": t2 is not None}}, open(sys.argv[3], "w"))
"""

CONTENDERS = {"pyscf": "from pyscf.mp.dfmp2 import DFMP2", "dfmp2": "from dfmp2 import DFMP2"}


def run_once(import_line, molecule, basis, out):
    """(wall seconds, the script's JSON) of one whole process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(import_line=import_line), molecule, basis, out],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{import_line}: the script failed: {proc.stderr.strip()}")
    with open(out) as handle:
        return seconds, json.load(handle)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
    parser.add_argument("--json", action="store_true", help="write benchmarks/results/dropin_*.json")
    args = parser.parse_args(argv)
    times = {name: [] for name in CONTENDERS}
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds + 1):
            for name, import_line in CONTENDERS.items():
                seconds, records[name] = run_once(import_line, args.molecule, args.basis, os.path.join(tmp, "out.json"))
                if round_:
                    times[name].append(seconds)
    ratios = [p / d for p, d in zip(times["pyscf"], times["dfmp2"])]
    report = {
        "molecule": os.path.basename(args.molecule), "basis": args.basis, "rounds": args.rounds,
        "cores": os.cpu_count(), "seconds": times,
        "median_seconds": {name: statistics.median(t) for name, t in times.items()},
        "median_ratio_pyscf_over": {"dfmp2": statistics.median(ratios)},
        "e_tot": {name: r["e_tot"] for name, r in records.items()},
        "t2_kept": {name: r["t2_kept"] for name, r in records.items()},
        "date": time.strftime("%Y-%m-%d"),
    }
    for name in CONTENDERS:
        print(f"{name:6s} median {report['median_seconds'][name]:7.2f} s  E_tot {report['e_tot'][name]:.10f}  "
              f"t2 kept {report['t2_kept'][name]}")
    print(f"PySCF / dfmp2 (median of rounds): {report['median_ratio_pyscf_over']['dfmp2']:.2f}  "
          f"|dE| {abs(report['e_tot']['pyscf'] - report['e_tot']['dfmp2']):.1e} Eh")
    if args.json:
        stem = f"dropin_{os.path.splitext(report['molecule'])[0]}_{args.basis}.json"
        with open(os.path.join(HERE, "results", stem), "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
