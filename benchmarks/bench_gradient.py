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
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_whole_job import timed  # noqa: E402  (one timing helper for the whole-job benchmarks)

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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--pyscf", action="store_true", help="also PySCF's conventional MP2 gradient")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    molecule = os.path.abspath(args.molecule)
    dfmp2_script = os.path.join(os.path.dirname(sys.executable), "dfmp2")
    out = tempfile.mkdtemp(prefix="dfmp2-bench-gradient-")
    contenders = {name: ([dfmp2_script, name, molecule, "--basis", args.basis, "--quiet", "--json",
                          os.path.join(out, f"{name}.json")], None) for name in ("run", "grad")}
    if args.pyscf:
        contenders["pyscf-conventional-grad"] = ([sys.executable, "-c", PYSCF_GRADIENT_SCRIPT, molecule, args.basis,
                                                  os.path.join(out, "pyscf.json")], None)
    times = {name: [] for name in contenders}
    for round_ in range(args.warmup + args.rounds):
        for name, (command, env) in contenders.items():
            seconds = timed(command, env=env)
            if round_ >= args.warmup:
                times[name].append(seconds)
        print(f"round {round_}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items() if t), flush=True)
    records = {name: json.load(open(os.path.join(out, f"{name}.json"), encoding="utf-8")) for name in ("run", "grad")}
    grad = records["grad"]
    report = {
        "molecule": os.path.relpath(molecule), "basis": args.basis, "rounds": args.rounds,
        "nbasis": grad["nbasis"], "naux": grad["naux"], "nocc": grad["nocc"],
        "median_seconds": {name: statistics.median(t) for name, t in times.items()},
        "grad_over_run": statistics.median(g / r for g, r in zip(times["grad"], times["run"])),
        "grad_timings": grad["timings"], "run_timings": records["run"]["timings"],
        "gradient_parts_seconds": {k: v for k, v in grad["timings"].items() if k.startswith("gradient_")},
        "e_tot": {"run": records["run"]["e_tot"], "grad": grad["e_tot"]},
        "device": grad["device"], "precision": grad["precision"],
    }
    if args.pyscf:
        theirs = json.load(open(os.path.join(out, "pyscf.json"), encoding="utf-8"))
        report["e_tot"]["pyscf_conventional"] = theirs["e_tot"]
        report["pyscf_conventional_over_grad"] = statistics.median(
            p / g for p, g in zip(times["pyscf-conventional-grad"], times["grad"]))
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
