"""Gradient time over energy time, as a user waits for them: `dfmp2 grad MOLECULE.xyz` against
`dfmp2 run MOLECULE.xyz` (the same options, whole processes, start-up included), alternating,
medians; the gradient's breakdown from its JSON timings; optionally PySCF's conventional
(non-DF) MP2 gradient on an exact RHF, the gradient PySCF users have today, where it fits in
memory (--pyscf).

    python benchmarks/bench_gradient.py examples/hexane.xyz --basis cc-pvdz --rounds 3 --pyscf
    python benchmarks/bench_gradient.py examples/benzene.xyz --basis cc-pvtz --json benchmarks/results/gradient_benzene_ccpvtz.json

Round 0 is a discarded warm-up (file caches; --warmup 0 skips it). The goal (issue 26): the
gradient's whole job at most 3x the energy's (literature DF-MP2 gradients cost 2-4x an
energy). Reported: medians of each contender, the median of the per-round ratios grad / run,
the gradient's parts (gradient_* timings of the last grad round) and the energies.
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
sys.path.insert(0, HERE)

from harness import add_arguments, from_arguments, main_guard, median, median_ratio  # noqa: E402

PYSCF_GRADIENT_SCRIPT = """
import json, sys, time
from pyscf import gto, scf, mp
mol = gto.M(atom=sys.argv[1], basis=sys.argv[2], verbose=0)
mf = scf.RHF(mol)
mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
mf.kernel()
pt = mp.MP2(mf).run()
de = pt.nuc_grad_method().kernel()
json.dump({"e_tot": pt.e_tot, "gradient": de.tolist()}, open(sys.argv[3], "w"))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    add_arguments(parser)
    parser.add_argument("--pyscf", action="store_true", help="also PySCF's conventional MP2 gradient")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    molecule = os.path.abspath(args.molecule)
    dfmp2_script = os.path.join(os.path.dirname(sys.executable), "dfmp2")
    out = tempfile.mkdtemp(prefix="dfmp2-bench-gradient-")
    atexit.register(shutil.rmtree, out, True)  # the runs' records, read into the result
    contenders = {name: ([dfmp2_script, name, molecule, "--basis", args.basis, "--quiet", "--json",
                          os.path.join(out, f"{name}.json")], None, None) for name in ("run", "grad")}
    if args.pyscf:
        contenders["pyscf-conventional-grad"] = ([sys.executable, "-c", PYSCF_GRADIENT_SCRIPT, molecule, args.basis,
                                                  os.path.join(out, "pyscf.json")], None, None)
    harness = from_arguments(args)
    chosen = harness.choose_blas(contenders, rounds=args.blas_rounds)
    timed = harness.alternate({name: (lambda n=name: harness.process(contenders[n][0], chosen[n]))
                               for name in contenders})
    records = {name: json.load(open(os.path.join(out, f"{name}.json"), encoding="utf-8")) for name in ("run", "grad")}
    grad = records["grad"]
    report = {
        "molecule": os.path.relpath(molecule), "basis": args.basis,
        "nbasis": grad["nbasis"], "naux": grad["naux"], "nocc": grad["nocc"],
        "median_seconds": {name: round(median(runs), 3) for name, runs in timed.items()},
        "grad_over_run": round(median_ratio(timed["grad"], timed["run"]), 3),
        "grad_timings": grad["timings"], "run_timings": records["run"]["timings"],
        "gradient_parts_seconds": {k: v for k, v in grad["timings"].items() if k.startswith("gradient_")},
        "e_tot": {"run": records["run"]["e_tot"], "grad": grad["e_tot"]},
        "device": grad["device"], "precision": grad["precision"],
    }
    if args.pyscf:
        theirs = json.load(open(os.path.join(out, "pyscf.json"), encoding="utf-8"))
        report["e_tot"]["pyscf_conventional"] = theirs["e_tot"]
        report["pyscf_conventional_over_grad"] = round(median_ratio(timed["pyscf-conventional-grad"], timed["grad"]),
                                                       3)
    full = harness.write(args.json, report) if args.json else {**report, **harness.record()}
    print(json.dumps({k: v for k, v in full.items() if k not in ("runs",)}, indent=1))


if __name__ == "__main__":
    main_guard(main)
