"""The sparse layer, dense against screened, on the issue's series: linear alkanes CnH(2n+2) and
water clusters (H2O)n in cc-pVDZ. Per molecule and mode, in one process, alternating rounds, each judged quiet by
benchmarks/harness.py (another process's CPU use refuses the result):

  integrals + transform   the MP2 step 2 over every auxiliary block of the run's plan (cc-pVDZ-RI):
                          (mn|P) from libcint (dense, or the kept pair blocks) and (ia|P) = C_mi C_na (mn|P)
                          with the molecule's occupied count (no frozen core) and orthonormal orbitals
  SCF set-up and builds   JK-fit integrals, whitening and the store (cc-pVDZ-JKFIT); one fp32 and one fp64
                          J + K build of the occupied density (the mixed SCF's two kinds)
  memory                  bytes of (mn|P) dense against the kept panels (MP2 set; SCF store)

    python benchmarks/bench_sparse.py --alkanes 10 20 40 --waters 8 16 32 --rounds 3 --json benchmarks/results/sparse_cpu.json

Reports medians per step, the ratio dense / screened per round (median), the kept fractions,
and the fitted exponent of integrals + transform against the basis size over each series
(time ~ nbasis^k). A mode whose arrays do not fit the budget is reported as skipped, not run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from harness import add_arguments, bench_environment, from_arguments, main_guard  # noqa: E402
from molecules import alkane, water_cluster  # noqa: E402

WATER_GRIDS = {8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}


def molecule(kind, n, basis):
    from pyscf import gto

    atoms = alkane(n) if kind == "alkane" else water_cluster(*WATER_GRIDS[n])
    return gto.M(atom=[(s, (x, y, z)) for s, x, y, z in atoms], basis=basis, verbose=0, max_memory=20000)


def transform_step(backend, integrals, nocc, max_memory):
    """Seconds of (integrals, transform) over the plan's auxiliary blocks; orbitals orthonormal."""
    from dfmp2.run.memory import plan_for
    from dfmp2.mp2.steps import transform_to_mo
    from dfmp2.sparse import ScreenedMNP

    nao = integrals.nao
    plan = plan_for(backend, integrals, [(nocc, nao - nocc)], max_memory)
    c = np.linalg.qr(np.random.default_rng(7).standard_normal((nao, nao)))[0]
    c_occ, c_vir = backend.to_device(c[:, :nocc], fp64=True), backend.to_device(c[:, nocc:], fp64=True)
    seconds = {"integrals": 0.0, "transform": 0.0}
    for p0, p1 in integrals.aux_blocks(plan.aux_block):
        start = time.perf_counter()
        block = integrals.block(p0, p1)
        seconds["integrals"] += time.perf_counter() - start
        start = time.perf_counter()
        block = block.on_device(backend) if isinstance(block, ScreenedMNP) else backend.to_device(block, fp64=True)
        iap = transform_to_mo(backend, block, c_occ, c_vir)
        float(iap[0, 0, 0])
        seconds["transform"] += time.perf_counter() - start
        del block, iap
    seconds["aux_block"] = plan.aux_block
    return seconds


def scf_step(backend, jk, nocc, max_memory):
    """Seconds of the SCF builds' set-up and of one fp32 and one fp64 J + K build."""
    from dfmp2.chem.jk import FittedCoulombExchange

    nao = jk.nao
    c = np.linalg.qr(np.random.default_rng(8).standard_normal((nao, nao)))[0][:, :nocc]
    dm = 2 * c @ c.T
    builds = FittedCoulombExchange(backend, jk, "mixed", max_memory)
    seconds = {}
    start = time.perf_counter()
    builds._build()
    seconds["scf_setup"] = time.perf_counter() - start
    for kind in ("fp32", "fp64"):
        start = time.perf_counter()
        builds._store.build(dm[None], [(c * math.sqrt(2), None, None)], kind, True, True)
        seconds[f"scf_build_{kind}"] = time.perf_counter() - start
    seconds["scf_storage"] = builds.record.storage
    builds.close()
    return seconds


def measure(kind, n, mode, args):
    from dfmp2 import chem
    from dfmp2.kernels import get_backend
    from dfmp2.sparse import screen_integrals

    mol = molecule(kind, n, args.basis)
    backend = get_backend("cpu", "fp64")
    nocc = mol.nelectron // 2
    out = {}
    integrals = chem.MNPIntegrals(mol, None)
    start = time.perf_counter()
    out["screening_mp2"] = screen_integrals(mode, integrals, backend.screens, "torch")
    out["pattern_seconds"] = time.perf_counter() - start
    out.update(transform_step(backend, integrals, nocc, args.max_memory))
    gc.collect()
    jk = chem.jk_fitting_integrals(mol, chem.fitting_basis(mol, mp2fit=False).basis)
    out["screening_scf"] = screen_integrals(mode, jk, backend.screens, "torch", "scf")
    from dfmp2.chem.jk import fitted_bytes
    out["scf_fitted_bytes"] = fitted_bytes(jk)
    if fitted_bytes(jk) * 1.6 > args.max_memory * 1e6:
        out["scf"] = "skipped: the JK-fit store does not fit the budget"
    else:
        out.update(scf_step(backend, jk, nocc, args.max_memory))
    out.update(nbasis=mol.nao, naux_mp2=integrals.naux, naux_jk=jk.naux, nocc=nocc)
    gc.collect()
    return out


def summarise(runs):
    """Medians per step and the per-round dense / screened ratios."""
    steps = ("integrals", "transform", "scf_setup", "scf_build_fp32", "scf_build_fp64")
    summary = {}
    for mode, rounds in runs.items():
        summary[mode] = {s: statistics.median(r[s] for r in rounds) for s in steps if all(s in r for r in rounds)}
        summary[mode]["integrals+transform"] = statistics.median(r["integrals"] + r["transform"] for r in rounds)
    if "off" in runs and len(runs) == 2:
        other = next(m for m in runs if m != "off")
        pairs = list(zip(runs["off"], runs[other]))
        summary["ratio_dense_over_screened"] = {
            s: statistics.median(d[s] / x[s] for d, x in pairs) for s in steps
            if all(s in d and s in x for d, x in pairs)}
        summary["ratio_dense_over_screened"]["integrals+transform"] = statistics.median(
            (d["integrals"] + d["transform"]) / (x["integrals"] + x["transform"]) for d, x in pairs)
    return summary


def exponent(points):
    """k of time ~ nbasis^k, least squares on the logs: points [(nbasis, seconds)]."""
    if len(points) < 2:
        return None
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, y, 1)[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alkanes", type=int, nargs="*", default=[10, 20])
    parser.add_argument("--waters", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--screening", default="1e-10", help="the screened mode's --screening value")
    add_arguments(parser, rounds=2)
    parser.add_argument("--max-memory", type=float, default=18000, help="MB")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    harness = from_arguments(args)  # (one program in this process: the BLAS setting it was started with)
    harness.note_blas("dfmp2", "as started", bench_environment(base=os.environ), True)
    report = {"basis": args.basis, "screening": args.screening, "rounds": args.rounds, "molecules": {}}
    for kind, sizes in (("alkane", args.alkanes), ("water", args.waters)):
        for n in sizes:
            name = f"C{n}H{2 * n + 2}" if kind == "alkane" else f"(H2O){n}"
            runs = {"off": [], args.screening: []}
            for r in range(args.rounds):
                for mode in (("off", args.screening) if r % 2 == 0 else (args.screening, "off")):
                    run = harness.measure(f"{name} {mode}", r + 1, lambda m=mode: (None, measure(kind, n, m, args)))
                    runs[mode].append(run.payload)  # (in this process: its own CPU time is the contender's)
            entry = {"nbasis": runs["off"][0]["nbasis"], "runs": runs, "summary": summarise(runs)}
            report["molecules"][name] = entry
            s = entry["summary"]
            print(f"{name:12s} nbasis {entry['nbasis']:5d} kept {runs[args.screening][0]['screening_mp2'].get('kept_fraction')} "
                  f"| int+tr dense {s['off']['integrals+transform']:.2f} s screened "
                  f"{s[args.screening]['integrals+transform']:.2f} s | ratios "
                  f"{ {k: round(v, 2) for k, v in s.get('ratio_dense_over_screened', {}).items()} }", flush=True)
    for kind in ("alkane", "water"):
        for mode in ("off", args.screening):
            pts = [(e["nbasis"], e["summary"][mode]["integrals+transform"]) for name, e in report["molecules"].items()
                   if name.startswith("C" if kind == "alkane" else "(") and mode in e["summary"]]
            k = exponent(pts)
            report.setdefault("exponents", {}).setdefault(kind, {})[mode] = k
            if k is not None:
                print(f"exponent of integrals + transform, {kind}s, {mode}: {k:.2f}")
    full = {**json.loads(json.dumps(report, default=str)), **harness.record()}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(full, handle, indent=1)


if __name__ == "__main__":
    main_guard(main)
