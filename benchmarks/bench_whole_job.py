"""The whole job as a user waits for it: `dfmp2 run MOLECULE.xyz` as typed (start-up, SCF, MP2,
output) against the PySCF script that does the same (DF-RHF with PySCF's default JK-fit set,
then PySCF's DFMP2 with the MP2-fit set dfmp2 uses, without keeping t2, as dfmp2 run), each a
whole process, timed by the harness (benchmarks/harness.py): quiet machine or no result,
alternating, each contender at its fastest BLAS setting on this machine.

    python benchmarks/bench_whole_job.py examples/naphthalene.xyz --basis cc-pvtz --rounds 3 \
        --json benchmarks/results/whole_job_naphthalene_ccpvtz_cpu.json
    python benchmarks/bench_whole_job.py examples/water.xyz --other-checkout /tmp/old   # + an older dfmp2
    python benchmarks/bench_whole_job.py examples/water16.xyz --pyscf-builds --warmup 0 --rounds 2

First each contender runs once (a warm-up: file caches, the bytecode cache) and then once per
BLAS setting (harness.BLAS_SETTINGS, alternating; --blas-rounds more each); the timed rounds use
each one's fastest. dfmp2 runs as a user types it, twice: in the machine's environment, and with
the machine's OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed ("dfmp2-openblas-unset", as on a
user's own machine; --no-unset leaves it out). Round 0 of the timed rounds is a discarded warm-up unless --warmup 0. The
report gives per-contender medians and the median of the per-round ratios PySCF / contender
(> 1: the contender is faster), the same for the SCF step alone (PySCF's mf.kernel(), integrals
and guess included, against dfmp2's scf timing plus its early JK-fit integrals' thread time), each
contender's E(total), its BLAS setting and what threadpoolctl and torch found, and every run's
quiet check. With --other-checkout DIR, `python -m dfmp2 run` from that checkout runs as a third
contender; with --pyscf-builds, `dfmp2 run --scf-backend pyscf`; with --fp64, `--precision fp64`.
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
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import add_arguments, bench_environment, from_arguments, main_guard, median, median_ratio  # noqa: E402

PYSCF_SCRIPT = """
import json, resource, sys, time
from pyscf import gto, scf, df
from pyscf.mp import dfmp2
mol = gto.M(atom=sys.argv[1], basis=sys.argv[2], verbose=0)
if len(sys.argv) > 4:  # --max-memory: PySCF's budget (MB), which its DF objects follow
    mol.max_memory = float(sys.argv[4])
mf = scf.RHF(mol).density_fit()
mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
start = time.perf_counter()
mf.kernel()
scf_seconds = time.perf_counter() - start
pt = dfmp2.DFMP2(mf)
pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
pt.kernel(with_t2=False)
json.dump({"e_tot": pt.e_tot, "e_corr": pt.e_corr, "e_ref": mf.e_tot, "scf_iterations": mf.cycles,
           "timings": {"scf": scf_seconds, "mp2": time.perf_counter() - start - scf_seconds},
           "memory": {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000}},
          open(sys.argv[3], "w"))
"""


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


def contenders_of(args, molecule, out) -> dict:
    """name -> (command, base environment or None, cwd, the JSON file it writes)."""
    dfmp2_script = os.path.join(os.path.dirname(sys.executable), "dfmp2")
    run = [dfmp2_script, "run", molecule, "--basis", args.basis, "--quiet", "--json"]
    contenders = {
        "pyscf": ([sys.executable, "-c", PYSCF_SCRIPT, molecule, args.basis, os.path.join(out, "pyscf.json")],
                  None, None),
        "dfmp2": (run + [os.path.join(out, "dfmp2.json")], None, None),
    }
    if args.pyscf_builds:
        contenders["dfmp2-pyscf-builds"] = (run + [os.path.join(out, "dfmp2-pyscf-builds.json"), "--scf-backend",
                                                   "pyscf"], None, None)
    if args.screening_off:
        contenders["dfmp2-screening-off"] = (run + [os.path.join(out, "dfmp2-screening-off.json"), "--screening",
                                                    "off"], None, None)
    if args.fp64:
        contenders["dfmp2-fp64"] = (run + [os.path.join(out, "dfmp2-fp64.json"), "--precision", "fp64"], None, None)
    if args.other_checkout:
        # run from inside that checkout: `python -m` puts the working directory first on sys.path,
        # ahead of PYTHONPATH (from this checkout it would import this checkout's dfmp2)
        other = os.path.abspath(args.other_checkout)
        contenders["dfmp2-other"] = ([sys.executable, "-m", "dfmp2", "run", molecule, "--basis", args.basis,
                                      "--quiet", "--json", os.path.join(out, "dfmp2-other.json")],
                                     dict(os.environ, PYTHONPATH=other), other)
    if args.max_memory is not None:  # the same budget for every contender (PySCF's: its max_memory)
        budget = str(args.max_memory)
        contenders = {name: (command + ([budget] if name == "pyscf" else ["--max-memory", budget]), env, cwd)
                      for name, (command, env, cwd) in contenders.items()}
    return contenders


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    add_arguments(parser)
    parser.add_argument("--other-checkout", default=None, help="another dfmp2 checkout to time too")
    parser.add_argument("--pyscf-builds", action="store_true", help="also time dfmp2 run --scf-backend pyscf")
    parser.add_argument("--fp64", action="store_true", help="also time dfmp2 run --precision fp64")
    parser.add_argument("--screening-off", action="store_true", help="also time dfmp2 run --screening off")
    parser.add_argument("--no-pyscf", action="store_true", help="leave the PySCF script out (dfmp2 against itself)")
    parser.add_argument("--no-unset", action="store_true",
                        help="leave out dfmp2 with the machine's OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed")
    parser.add_argument("--max-memory", type=float, default=None,
                        help="MB: dfmp2 run --max-memory, and PySCF's max_memory, for every contender")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    molecule = os.path.abspath(args.molecule)
    out = tempfile.mkdtemp(prefix="whole-job-")
    atexit.register(shutil.rmtree, out, True)  # the runs' records, read into the result
    contenders = contenders_of(args, molecule, out)
    if args.no_pyscf:
        del contenders["pyscf"]
    harness = from_arguments(args)
    # PySCF at its best of every BLAS setting the machine offers (the machine's OPENBLAS_* removed
    # included); dfmp2 as a user types it, in the machine's environment and with OPENBLAS_* unset
    # (a user's own machine), each warmed once (its first run measures the CPU products' libraries)
    typed = {name: c for name, c in contenders.items() if not name.startswith("pyscf")}
    unset = {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}
    if not args.no_unset:
        contenders["dfmp2-openblas-unset"] = typed["dfmp2-openblas-unset"] = (
            [part.replace("dfmp2.json", "dfmp2-openblas-unset.json") for part in contenders["dfmp2"][0]],
            bench_environment(unset, contenders["dfmp2"][1]), contenders["dfmp2"][2])
    chosen = harness.choose_blas({n: c for n, c in contenders.items() if n not in typed}, rounds=args.blas_rounds)
    for name, (command, base, cwd) in typed.items():
        env = bench_environment(base=base)
        if harness.warmup:
            harness.measure(name, 0, lambda c=command, e=env, d=cwd: harness.process(c, e, d))
        harness.note_blas(name, "as typed" if name != "dfmp2-openblas-unset" else "OPENBLAS_* unset", env, True)
        chosen[name] = env

    def call(name):
        command, _, cwd = contenders[name]
        return lambda: harness.process(command, chosen[name], cwd, lambda: json.load(
            open(os.path.join(out, f"{name}.json"))))

    timed = harness.alternate({name: call(name) for name in contenders})
    records = {name: runs[-1].payload for name, runs in timed.items()}
    scf_steps = {name: [scf_step_seconds(r.payload) for r in runs] for name, runs in timed.items()}
    rates = gemm_rates()
    record = {
        "molecule": os.path.relpath(molecule, os.path.dirname(HERE)), "basis": args.basis,
        "seconds": {n: [round(r.seconds, 3) for r in runs] for n, runs in timed.items()},
        "median_seconds": {n: round(median(runs), 3) for n, runs in timed.items()},
        "median_ratio_pyscf_over": {n: round(median_ratio(timed["pyscf"], runs), 3)
                                    for n, runs in timed.items() if n != "pyscf" and "pyscf" in timed},
        "median_ratio_over_dfmp2": {n: round(median_ratio(runs, timed["dfmp2"]), 3)
                                    for n, runs in timed.items() if n != "dfmp2"},
        "scf_seconds": {n: [round(s, 3) for s in v] for n, v in scf_steps.items()},
        "median_scf_ratio_pyscf_over": {n: round(statistics.median(p / s for p, s in zip(scf_steps["pyscf"], v)), 3)
                                        for n, v in scf_steps.items() if n != "pyscf" and "pyscf" in scf_steps},
        "e_tot": {n: r["e_tot"] for n, r in records.items()},
        "pyscf_steps": {n: {k: r.get(k) for k in ("timings", "scf_iterations")} for n, r in records.items()
                        if n.startswith("pyscf")},
        "max_memory_mb": args.max_memory,
        "peak_rss_mb": {n: r.get("memory", {}).get("peak_rss_mb") for n, r in records.items()},
        "steps": {n: {k: r.get(k) for k in ("timings", "scf_backend", "scf_precision", "scf_iterations",
                                             "scf_builds", "precision", "nbasis", "nocc", "memory")}
                  for n, r in records.items() if not n.startswith("pyscf")},
        "gemm_gflops": {k: round(v, 1) for k, v in rates.items()},
        "scf_build_rates": {n: scf_build_rates(r, rates) for n, r in records.items() if not n.startswith("pyscf")},
    }
    full = harness.write(args.json, record) if args.json else {**record, **harness.record()}
    for name in contenders:
        ratio = full["median_ratio_pyscf_over"].get(name)
        over = full["median_ratio_over_dfmp2"].get(name)
        print(f"{name:20s} median {full['median_seconds'][name]:8.2f} s (SCF step "
              f"{statistics.median(scf_steps[name]):7.2f} s) BLAS {full['blas'][name]['setting']:9s}"
              + (f"  PySCF / {name} = {ratio:.2f} (SCF step {full['median_scf_ratio_pyscf_over'][name]:.2f})"
                 if ratio else "") + (f"  {name} / dfmp2 = {over:.2f}" if over and name != "pyscf" else "")
              + f"  E(total) {full['e_tot'][name]:.10f}")
    print(f"quiet: largest share of a core used by other processes during a timed run "
          f"{100 * full['harness']['largest_other_fraction']:.1f}%")


if __name__ == "__main__":
    main_guard(main)
