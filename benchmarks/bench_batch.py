"""Many small molecules in one process: `dfmp2 run batch.xyz` (a multi-frame XYZ of N molecules)
against the same molecules run one `dfmp2 run` process each, and against a PySCF script that
loops over them in one process (DF-RHF, then DFMP2 with the MP2-fit set, as dfmp2 run), timed by
the harness (benchmarks/harness.py): quiet machine or no result, alternating, each contender at
its fastest BLAS setting.

    python benchmarks/bench_batch.py --molecules 100 --singles 10 --rounds 2 \
        --json benchmarks/results/batch_100_small_ccpvdz_cpu.json

The N molecules cycle through water, ammonia, methane, hydrogen fluoride and ethylene
(examples' geometries as in tests/conftest.py), each with its coordinates moved by up to 0.02
Angstrom (a fixed seed), as a data set of distorted geometries would. "single" runs the first
--singles of them, one process each, and its figure is per molecule; the batch contenders run
all N. The report: seconds per molecule for each, the start-up a single run pays (its wall time
less the seconds its steps took), and each contender's energies (they must agree).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import add_arguments, from_arguments, main_guard  # noqa: E402

MOLECULES = {  # Angstrom
    "water": [("O", 0, 0, 0.1173), ("H", 0, 0.7572, -0.4692), ("H", 0, -0.7572, -0.4692)],
    "ammonia": [("N", 0, 0, 0.1129), ("H", 0, 0.9377, -0.2633), ("H", 0.8121, -0.4689, -0.2633),
                ("H", -0.8121, -0.4689, -0.2633)],
    "methane": [("C", 0, 0, 0), ("H", 0.6291, 0.6291, 0.6291), ("H", -0.6291, -0.6291, 0.6291),
                ("H", -0.6291, 0.6291, -0.6291), ("H", 0.6291, -0.6291, -0.6291)],
    "hf": [("F", 0, 0, 0), ("H", 0, 0, 0.9168)],
    "ethylene": [("C", 0, 0, 0.6695), ("C", 0, 0, -0.6695), ("H", 0, 0.9289, 1.2321), ("H", 0, -0.9289, 1.2321),
                 ("H", 0, 0.9289, -1.2321), ("H", 0, -0.9289, -1.2321)],
}

PYSCF_LOOP = """
import json, sys
from pyscf import gto, scf, df
from pyscf.mp import dfmp2
frames = json.load(open(sys.argv[1]))
energies = []
for atoms in frames:
    mol = gto.M(atom=[(s, (x, y, z)) for s, x, y, z in atoms], basis=sys.argv[2], verbose=0)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
    mf.kernel()
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.kernel(with_t2=False)
    energies.append(pt.e_tot)
json.dump(energies, open(sys.argv[3], "w"))
"""


def distorted_frames(count, seed=0):
    """count geometries cycling through MOLECULES, each coordinate moved by up to 0.02 Angstrom."""
    rng = np.random.default_rng(seed)
    names = list(MOLECULES)
    frames = []
    for k in range(count):
        atoms = MOLECULES[names[k % len(names)]]
        moved = np.array([a[1:] for a in atoms], dtype=float) + rng.uniform(-0.02, 0.02, (len(atoms), 3))
        frames.append([(a[0], *map(float, xyz)) for a, xyz in zip(atoms, moved)])
    return frames


def xyz_text(frames):
    return "".join(f"{len(f)}\nbench_batch frame\n" + "".join(f"{s} {x:.8f} {y:.8f} {z:.8f}\n" for s, x, y, z in f)
                   for f in frames)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--molecules", type=int, default=100)
    parser.add_argument("--singles", type=int, default=10, help="molecules run one process each")
    parser.add_argument("--basis", default="cc-pvdz")
    add_arguments(parser, rounds=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    out = tempfile.mkdtemp(prefix="batch-")
    atexit.register(shutil.rmtree, out, True)
    frames = distorted_frames(args.molecules)
    with open(os.path.join(out, "batch.xyz"), "w") as handle:
        handle.write(xyz_text(frames))
    with open(os.path.join(out, "frames.json"), "w") as handle:
        json.dump(frames, handle)
    with open(os.path.join(out, "pyscf_loop.py"), "w") as handle:
        handle.write(PYSCF_LOOP)
    for k in range(args.singles):
        with open(os.path.join(out, f"single{k}.xyz"), "w") as handle:
            handle.write(xyz_text(frames[k:k + 1]))
    dfmp2 = [sys.executable, "-m", "dfmp2"]
    commands = {
        "batch": [*dfmp2, "run", "batch.xyz", "--basis", args.basis, "--quiet", "--json", "batch.jsonl"],
        "pyscf_loop": [sys.executable, "pyscf_loop.py", "frames.json", args.basis, "pyscf.json"],
    }
    singles = [[*dfmp2, "run", f"single{k}.xyz", "--basis", args.basis, "--quiet", "--json", f"single{k}.json"]
               for k in range(args.singles)]
    harness = from_arguments(args)
    chosen = harness.choose_blas({**{n: (c, None, out) for n, c in commands.items()},
                                  "single": (singles[0], None, out)}, rounds=args.blas_rounds)

    def one_by_one():
        cpu = 0.0
        for command in singles:
            cpu += harness.process(command, chosen["single"], out)[0]
        return cpu, None

    calls = {name: (lambda c=command, n=name: harness.process(c, chosen[n], out)) for name, command in commands.items()}
    timed = harness.alternate({**calls, "single": one_by_one})
    per_molecule = {name: [round(r.seconds / (args.singles if name == "single" else args.molecules), 4) for r in runs]
                    for name, runs in timed.items()}
    batch = [json.loads(line) for line in open(os.path.join(out, "batch.jsonl"))]
    single = [json.load(open(os.path.join(out, f"single{k}.json"))) for k in range(args.singles)]
    pyscf = json.load(open(os.path.join(out, "pyscf.json")))
    single_steps = statistics.median(sum(r["timings"].values()) for r in single)
    record = {
        "molecules": args.molecules, "singles": args.singles, "basis": args.basis,
        "seconds": {n: [round(r.seconds, 3) for r in runs] for n, runs in timed.items()},
        "seconds_per_molecule": per_molecule,
        "median_seconds_per_molecule": {n: statistics.median(v) for n, v in per_molecule.items()},
        "single_run_step_seconds_median": round(single_steps, 4),
        "all_ok": all(r["status"] == "ok" for r in batch),
        "largest_energy_difference_batch_vs_single": max(abs(b["e_tot"] - s["e_tot"]) for b, s in zip(batch, single)),
        "largest_energy_difference_batch_vs_pyscf": max(abs(b["e_tot"] - p) for b, p in zip(batch, pyscf)),
    }
    medians = record["median_seconds_per_molecule"]
    record["single_over_batch"] = round(medians["single"] / medians["batch"], 2)
    record["pyscf_loop_over_batch"] = round(medians["pyscf_loop"] / medians["batch"], 2)
    full = harness.write(args.json, record) if args.json else {**record, **harness.record()}
    for name, value in medians.items():
        print(f"{name:12s} {value:.3f} s per molecule (BLAS {full['blas'][name]['setting']})")
    print(f"one process per molecule / batch = {record['single_over_batch']}; "
          f"PySCF loop / batch = {record['pyscf_loop_over_batch']}; energies: batch vs single "
          f"{record['largest_energy_difference_batch_vs_single']:.1e} Eh, vs PySCF "
          f"{record['largest_energy_difference_batch_vs_pyscf']:.1e} Eh")


if __name__ == "__main__":
    main_guard(main)
