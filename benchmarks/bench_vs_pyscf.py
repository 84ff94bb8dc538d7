"""Time the DF-MP2 step (3-center integrals -> energy; SCF excluded) of dfmp2 and PySCF side by side.

One converged density-fitted RHF is shared. Each repeat runs, in turn, PySCF's DFMP2
(same MP2-fit auxiliary basis, with_t2=False, a fresh DF object so nothing is cached),
dfmp2 fp64 and dfmp2 fp32; the first round is a discarded warm-up. Prints per-run medians
and the median ratio PySCF time / dfmp2 time (> 1 means dfmp2 is faster).

    python benchmarks/bench_vs_pyscf.py examples/benzene.xyz --basis cc-pvtz --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xyz", nargs="?", default=os.path.join(os.path.dirname(__file__), "..",
                                                                "examples", "benzene.xyz"))
    parser.add_argument("--basis", default="cc-pvtz")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-frozen-core", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args(argv)

    import torch
    from pyscf import df, lib
    from pyscf.mp import dfmp2 as pyscf_dfmp2

    import dfmp2
    from dfmp2 import DFMP2, chem

    mol = chem.build_molecule(chem.read_xyz(args.xyz), args.basis)
    mf = chem.run_scf(mol, "df")
    aux = df.make_auxbasis(mol, mp2fit=True)
    frozen = None if args.no_frozen_core else chem.frozen_core_count(mol)

    def run_pyscf():
        pt = pyscf_dfmp2.DFMP2(mf, frozen=frozen)
        pt.with_df = df.DF(mol, auxbasis=aux)
        pt.kernel(with_t2=False)
        return pt.e_corr, {}

    def run_dfmp2(precision):
        def run():
            pt = DFMP2(mf, frozen=frozen, device=args.device, precision=precision).run()
            return pt.e_corr, pt.result.timings
        return run

    contenders = {"pyscf": run_pyscf, "dfmp2-fp64": run_dfmp2("fp64"), "dfmp2-fp32": run_dfmp2("fp32")}
    times = {name: [] for name in contenders}
    after_integrals = {name: [] for name in contenders if name != "pyscf"}
    energies = {}
    for round_ in range(args.repeat + 1):  # round 0 is warm-up
        for name, run in contenders.items():
            start = time.perf_counter()
            energy, timings = run()
            elapsed = time.perf_counter() - start
            energies[name] = energy
            if round_ == 0:
                continue
            times[name].append(elapsed)
            if timings:
                after_integrals[name].append(elapsed - timings["integrals"])

    medians = {name: statistics.median(v) for name, v in times.items()}
    ratios = {name: statistics.median(p / d for p, d in zip(times["pyscf"], times[name]))
              for name in contenders if name != "pyscf"}
    nocc = mol.nelectron // 2 - (frozen or 0)
    print(f"{os.path.basename(args.xyz)} / {args.basis}: nao {mol.nao}, active nocc {nocc}, "
          f"aux {aux if isinstance(aux, str) else 'mp2fit'}, {torch.get_num_threads()} threads, "
          f"{args.repeat} timed rounds (medians)")
    print(f"{'code':12s} {'time (s)':>9s} {'pyscf/this':>10s} {'e_corr (Eh)':>18s} {'vs pyscf':>9s}")
    for name in contenders:
        ratio = "1.00" if name == "pyscf" else f"{ratios[name]:.2f}"
        delta = energies[name] - energies["pyscf"]
        print(f"{name:12s} {medians[name]:9.3f} {ratio:>10s} {energies[name]:18.10f} {delta:9.1e}")
    for name, values in after_integrals.items():
        print(f"  {name}: {statistics.median(values):.3f} s after the 3-center integrals")

    if args.json:
        record = {
            "molecule": os.path.basename(args.xyz), "basis": args.basis, "nao": mol.nao,
            "frozen": frozen, "repeat": args.repeat, "median_seconds": medians,
            "median_ratio_pyscf_over_dfmp2": ratios, "e_corr": energies,
            "seconds_after_integrals": {k: statistics.median(v) for k, v in after_integrals.items()},
            "machine": {"cpu": dfmp2.kernels.device_report()["cpu"][1], "python": platform.python_version()},
            "versions": {"dfmp2": dfmp2.__version__, "torch": torch.__version__,
                         "pyscf": __import__("pyscf").__version__, "numpy": np.__version__},
            "threads": lib.num_threads(), "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=2)


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
