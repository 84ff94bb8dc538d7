"""The whole job as a user waits for it: `dfmp2 run MOLECULE.xyz` as typed (start-up, SCF, MP2,
output) against the PySCF script that does the same (DF-RHF with PySCF's default JK-fit set,
then PySCF's DFMP2 with the MP2-fit set dfmp2 uses, without keeping t2, as dfmp2 run), side by side, alternating, wall clock of
each whole process.

    python benchmarks/bench_whole_job.py examples/benzene.xyz --basis cc-pvtz --rounds 3
    python benchmarks/bench_whole_job.py examples/water.xyz --other-checkout /tmp/old   # + an older dfmp2
    python benchmarks/bench_whole_job.py examples/water16.xyz --pyscf-builds --warmup 0 --rounds 1

Round 0 is a discarded warm-up (file caches). Each later round runs every contender once, in
turn; the report gives per-contender medians and the median of the per-round ratios
PySCF / contender (> 1: the contender is faster), the same for the SCF step alone (PySCF's
mf.kernel(), integrals and guess included, against dfmp2's scf timing plus its early JK-fit
integrals' thread time), with each contender's E(total). With
--other-checkout DIR, `python -m dfmp2 run` from that checkout (PYTHONPATH=DIR, run from DIR) runs as a
third contender, e.g. the commit before a change; with --pyscf-builds, `dfmp2 run --scf-backend
pyscf` (PySCF's own J/K builds in dfmp2's SCF) runs too. --warmup 0 skips the warm-up round (for
molecules that take minutes). Each dfmp2 contender's step timings and SCF build record (of its last
round) go into the report. Writes benchmarks/results/whole_job_*.json with --json.
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
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))

PYSCF_SCRIPT = """
import json, sys, time
from pyscf import gto, scf, df
from pyscf.mp import dfmp2
mol = gto.M(atom=sys.argv[1], basis=sys.argv[2], verbose=0)
mf = scf.RHF(mol).density_fit()
mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
start = time.perf_counter()
mf.kernel()
scf_seconds = time.perf_counter() - start
pt = dfmp2.DFMP2(mf)
pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
pt.kernel(with_t2=False)
json.dump({"e_tot": pt.e_tot, "e_corr": pt.e_corr, "e_ref": mf.e_tot, "scf_iterations": mf.cycles,
           "timings": {"scf": scf_seconds, "mp2": time.perf_counter() - start - scf_seconds}},
          open(sys.argv[3], "w"))
"""


def timed(command, env=None, cwd=None):
    """Wall seconds of one process (which must succeed)."""
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{command[:4]}... failed: {proc.stderr.strip()}")
    return seconds


def scf_step_seconds(record):
    """The SCF step of a record: its scf timing, plus (dfmp2) the JK-fit integrals' thread time
    outside it where they were computed early, as if nothing had overlapped (the conservative count)."""
    builds = record.get("scf_builds") or {}
    early = (builds.get("integral_seconds") or 0.0) - (builds.get("integral_wait_seconds") or 0.0)
    return record["timings"]["scf"] + max(0.0, early)


def gemm_rates(n=2048, repeat=3):
    """This machine's square GEMM rate (GFLOP/s, best of `repeat`) in fp32 and fp64 (torch)."""
    import torch

    rates = {}
    for name, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        a = torch.randn(n, n, dtype=dtype)
        a @ a  # warm-up
        best = min(timeit.repeat(lambda: a @ a, number=1, repeat=repeat))
        rates[name] = 2 * n ** 3 / best / 1e9
    return rates


def scf_build_rates(record, rates):
    """Median GFLOP/s of the SCF's builds per kind, and the fraction of the GEMM rate in the kind's
    precision (incremental builds are fp32), from a dfmp2 JSON record (RHF: rank nocc; 4 naux
    nao^2 r flops per build of rank r)."""
    builds = record.get("scf_builds") or {}
    kinds, seconds = builds.get("build_kinds"), builds.get("build_seconds")
    if not kinds or not seconds:
        return None
    nao, naux, nocc = record["nbasis"], builds["naux"], record["nocc"] + record.get("nfrozen", 0)
    ranks = iter(builds.get("increment_ranks", []))
    forms = iter(builds.get("increment_forms", []))
    per_kind = {}
    for kind, t in zip(kinds, seconds):
        # an increment from the orbitals' step: one half transform and one GEMM of rank r, plus
        # the anchor's half transform where it was not kept; the eigenvector form has rank 2 r
        rank = nocc
        if kind == "incremental":
            rank = next(ranks) * (1.5 if next(forms, "") == "orbitals, anchor halves made" else 1)
        if kind in ("fp32", "fp64", "incremental"):
            per_kind.setdefault(kind, []).append(4 * naux * nao * nao * rank / t / 1e9)
    return {kind: {"gflops": round(statistics.median(v), 1),
                   "fraction_of_gemm": round(statistics.median(v) / rates["fp64" if kind == "fp64" else "fp32"], 3)}
            for kind, v in per_kind.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
    parser.add_argument("--other-checkout", default=None, help="another dfmp2 checkout to time too")
    parser.add_argument("--pyscf-builds", action="store_true", help="also time dfmp2 run --scf-backend pyscf")
    parser.add_argument("--fp64", action="store_true", help="also time dfmp2 run --precision fp64")
    parser.add_argument("--pyscf-openblas", action="store_true",
                        help="also time the PySCF script with OPENBLAS_THREAD_TIMEOUT=4 (what dfmp2 sets)")
    parser.add_argument("--warmup", type=int, default=1, choices=(0, 1), help="run a discarded warm-up round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    molecule = os.path.abspath(args.molecule)
    out = tempfile.mkdtemp(prefix="whole-job-")
    dfmp2_script = os.path.join(os.path.dirname(sys.executable), "dfmp2")
    contenders = {
        "pyscf": ([sys.executable, "-c", PYSCF_SCRIPT, molecule, args.basis, os.path.join(out, "pyscf.json")],
                  (None, None)),
        "dfmp2": ([dfmp2_script, "run", molecule, "--basis", args.basis, "--quiet",
                   "--json", os.path.join(out, "dfmp2.json")], (None, None)),
    }
    if args.pyscf_openblas:
        contenders["pyscf-openblas"] = ([sys.executable, "-c", PYSCF_SCRIPT, molecule, args.basis,
                                         os.path.join(out, "pyscf-openblas.json")],
                                        (dict(os.environ, OPENBLAS_THREAD_TIMEOUT="4"), None))
    if args.pyscf_builds:
        contenders["dfmp2-pyscf-builds"] = ([dfmp2_script, "run", molecule, "--basis", args.basis, "--quiet",
                                             "--scf-backend", "pyscf", "--json",
                                             os.path.join(out, "dfmp2-pyscf-builds.json")], (None, None))
    if args.fp64:
        contenders["dfmp2-fp64"] = ([dfmp2_script, "run", molecule, "--basis", args.basis, "--quiet",
                                     "--precision", "fp64", "--json", os.path.join(out, "dfmp2-fp64.json")], (None, None))
    if args.other_checkout:
        # run from inside that checkout: `python -m` puts the working directory first on sys.path,
        # ahead of PYTHONPATH (from this checkout it would import this checkout's dfmp2)
        other = os.path.abspath(args.other_checkout)
        contenders["dfmp2-other"] = ([sys.executable, "-m", "dfmp2", "run", molecule, "--basis", args.basis,
                                      "--quiet", "--json", os.path.join(out, "dfmp2-other.json")],
                                     (dict(os.environ, PYTHONPATH=other), other))
    seconds = {name: [] for name in contenders}
    scf_seconds = {name: [] for name in contenders}  # each round's SCF step, as its record gives it
    for round_ in range(1 - args.warmup, args.rounds + 1):
        for name, (command, (env, cwd)) in contenders.items():
            t = timed(command, env, cwd)
            if round_:
                seconds[name].append(t)
                scf_seconds[name].append(scf_step_seconds(json.load(open(os.path.join(out, f"{name}.json")))))
        if round_:
            print(f"round {round_}: " + ", ".join(f"{name} {s[-1]:.2f} s" for name, s in seconds.items()))
    records = {name: json.load(open(os.path.join(out, f"{name}.json"))) for name in contenders}
    energies = {name: record["e_tot"] for name, record in records.items()}
    record = {
        "molecule": os.path.relpath(molecule), "basis": args.basis, "rounds": args.rounds,
        "seconds": seconds, "median_seconds": {n: statistics.median(s) for n, s in seconds.items()},
        "median_ratio_pyscf_over": {n: statistics.median(p / s for p, s in zip(seconds["pyscf"], seconds[n]))
                                    for n in contenders if n != "pyscf"},
        **({"median_ratio_pyscf_openblas_over": {
            n: statistics.median(p / s for p, s in zip(seconds["pyscf-openblas"], seconds[n]))
            for n in contenders if not n.startswith("pyscf")}} if args.pyscf_openblas else {}),
        # the SCF step alone (PySCF: mf.kernel(), integrals and guess included; dfmp2: scf_step_seconds)
        "scf_seconds": scf_seconds,
        "median_scf_ratio_pyscf_over": {n: statistics.median(p / s for p, s in zip(scf_seconds["pyscf"], scf_seconds[n]))
                                        for n in contenders if n != "pyscf"},
        "pyscf_steps": {name: {key: r.get(key) for key in ("timings", "scf_iterations")}
                        for name, r in records.items() if name.startswith("pyscf")},
        "e_tot": energies, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
        "steps": {name: {key: r.get(key) for key in ("timings", "scf_backend", "scf_precision", "scf_iterations",
                                                     "scf_builds", "precision", "nbasis", "nocc")}
                  for name, r in records.items() if not name.startswith("pyscf")},
    }
    rates = gemm_rates()
    record["gemm_gflops"] = {k: round(v, 1) for k, v in rates.items()}
    record["scf_build_rates"] = {name: scf_build_rates(r, rates) for name, r in records.items()
                                 if not name.startswith("pyscf")}
    print(f"GEMM rate: fp32 {rates['fp32']:.0f}, fp64 {rates['fp64']:.0f} GFLOP/s; SCF builds: "
          f"{record['scf_build_rates'].get('dfmp2')}")
    for name in contenders:
        ratio = record["median_ratio_pyscf_over"].get(name)
        tuned = record.get("median_ratio_pyscf_openblas_over", {}).get(name)
        scf_ratio = record["median_scf_ratio_pyscf_over"].get(name)
        print(f"{name:14s} median {record['median_seconds'][name]:7.2f} s" +
              f" (SCF step {statistics.median(scf_seconds[name]):6.2f} s)" +
              (f"   PySCF / {name} = {ratio:.2f} (SCF step {scf_ratio:.2f})" if ratio else "") +
              (f"   PySCF (OpenBLAS timeout) / {name} = {tuned:.2f}" if tuned else "") +
              f"   E(total) {energies[name]:.10f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=1)


if __name__ == "__main__":
    main()
