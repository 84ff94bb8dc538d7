"""The PySCF drop-in as a script user meets it: one PySCF script, run whole (start-up, SCF, MP2),
once with PySCF's DFMP2 and once with only its import changed to dfmp2's, side by side, timed
by the harness (benchmarks/harness.py: a quiet machine or no result, alternating, each at its
fastest BLAS setting), wall clock of each process.

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
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import add_arguments, from_arguments, main_guard, median, median_ratio  # noqa: E402

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="write benchmarks/results/dropin_*.json")
    args = parser.parse_args(argv)
    harness = from_arguments(args)
    with tempfile.TemporaryDirectory() as tmp:
        outs = {name: os.path.join(tmp, f"{name}.json") for name in CONTENDERS}
        commands = {name: ([sys.executable, "-c", SCRIPT.format(import_line=line), args.molecule, args.basis,
                            outs[name]], None, None) for name, line in CONTENDERS.items()}
        chosen = harness.choose_blas(commands, rounds=args.blas_rounds, torch={"dfmp2"})
        timed = harness.alternate({name: (lambda n=name: harness.process(commands[n][0], chosen[n], payload=lambda: (
            json.load(open(outs[n]))))) for name in CONTENDERS})
    records = {name: runs[-1].payload for name, runs in timed.items()}
    report = {
        "molecule": os.path.basename(args.molecule), "basis": args.basis,
        "seconds": {name: [round(r.seconds, 3) for r in runs] for name, runs in timed.items()},
        "median_seconds": {name: round(median(runs), 3) for name, runs in timed.items()},
        "median_ratio_pyscf_over": {"dfmp2": round(median_ratio(timed["pyscf"], timed["dfmp2"]), 3)},
        "e_tot": {name: r["e_tot"] for name, r in records.items()},
        "t2_kept": {name: r["t2_kept"] for name, r in records.items()},
    }
    path = os.path.join(HERE, "results", f"dropin_{os.path.splitext(report['molecule'])[0]}_{args.basis}.json")
    full = harness.write(path, report) if args.json else {**report, **harness.record()}
    for name in CONTENDERS:
        print(f"{name:6s} median {full['median_seconds'][name]:7.2f} s  E_tot {full['e_tot'][name]:.10f}  "
              f"t2 kept {full['t2_kept'][name]}  BLAS {full['blas'][name]['setting']}")
    print(f"PySCF / dfmp2 (median of rounds): {full['median_ratio_pyscf_over']['dfmp2']:.2f}  "
          f"|dE| {abs(full['e_tot']['pyscf'] - full['e_tot']['dfmp2']):.1e} Eh")
    return 0


if __name__ == "__main__":
    main_guard(main)
