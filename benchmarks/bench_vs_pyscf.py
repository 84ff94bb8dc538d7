"""Time the DF-MP2 step (3-center integrals -> energy; SCF excluded) of dfmp2 and PySCF side by side.

Two worker processes, started together and driven alternately in one run:
  - PySCF: `pyscf.mp.dfmp2.DFMP2` (closed shell) or `pyscf.mp.dfump2.DFUMP2` (--spin > 0: a UHF
    reference) with the same MP2-fit auxiliary basis, `with_t2=False`, a
    fresh DF object per call so nothing is cached. This process never imports torch or
    dfmp2 (so it runs exactly as a PySCF user's script would).
  - dfmp2: `dfmp2.DFMP2(...).kernel()` in fp64 and fp32.
Each worker runs the same density-fitted RHF once (not timed). Round 0 is a discarded warm-up;
then each round times PySCF, dfmp2 fp64, dfmp2 fp32 in turn (--gap: idle seconds before
each call). Both workers run with OMP_WAIT_POLICY=PASSIVE unless the caller set it. Prints medians and the median of
the per-round ratios PySCF time / dfmp2 time (> 1: dfmp2 is faster).

    python benchmarks/bench_vs_pyscf.py examples/benzene.xyz --basis cc-pvtz --repeat 7
    python benchmarks/bench_vs_pyscf.py examples/naphthalene.xyz --basis cc-pvtz --charge 1 --spin 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _scf(xyz, basis, charge=0, spin=0):
    """The same tightly converged DF-RHF (DF-UHF for spin > 0) in every worker (PySCF only)."""
    from pyscf import gto, scf

    mol = gto.M(atom=xyz, basis=basis, charge=charge, spin=spin, verbose=0)
    mf = (scf.UHF if spin else scf.RHF)(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
    mf.kernel()
    assert mf.converged
    return mol, mf


def _frozen(mol, frozen_core):
    from pyscf.data.elements import chemcore

    return chemcore(mol) if frozen_core else None


def pyscf_worker(conn, xyz, basis, frozen_core, charge, spin):
    import pyscf
    from pyscf import df
    from pyscf.mp import dfmp2, dfump2

    mol, mf = _scf(xyz, basis, charge, spin)
    aux = df.make_auxbasis(mol, mp2fit=True)
    frozen = _frozen(mol, frozen_core)
    nocc = [n - (frozen or 0) for n in mol.nelec] if spin else mol.nelectron // 2 - (frozen or 0)
    conn.send({"nao": mol.nao, "nocc": nocc, "pyscf": pyscf.__version__,
               "reference": "uhf" if spin else "rhf",
               "auxbasis": aux if isinstance(aux, str) else "mp2fit"})
    peer = dfump2.DFUMP2 if spin else dfmp2.DFMP2
    while conn.recv() is not None:
        start = time.perf_counter()
        pt = peer(mf, frozen=frozen)
        pt.with_df = df.DF(mol, auxbasis=aux)
        pt.kernel(with_t2=False)
        conn.send((time.perf_counter() - start, pt.e_corr, None))


def dfmp2_worker(conn, xyz, basis, frozen_core, charge, spin, device):
    import dfmp2  # first, as in the CLI: it sets the OpenMP wait policy before torch/PySCF load
    import torch
    from dfmp2 import DFMP2
    from dfmp2.kernels import device_report

    mol, mf = _scf(xyz, basis, charge, spin)
    frozen = _frozen(mol, frozen_core)
    conn.send({"dfmp2": dfmp2.__version__, "torch": torch.__version__,
               "device": device_report()[device][1], "threads": torch.get_num_threads()})
    while (precision := conn.recv()) is not None:
        start = time.perf_counter()
        pt = DFMP2(mf, frozen=frozen, device=device, precision=precision)
        pt.kernel()
        conn.send((time.perf_counter() - start, pt.e_corr, pt.result.timings))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xyz", nargs="?", default=os.path.join(HERE, "..", "examples", "benzene.xyz"))
    parser.add_argument("--basis", default="cc-pvtz")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-frozen-core", action="store_true")
    parser.add_argument("--charge", type=int, default=0)
    parser.add_argument("--spin", type=int, default=0, help="2S; > 0: UHF, PySCF's DFUMP2 as the peer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gap", type=float, default=0.0, help="idle seconds before each timed call")
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    frozen_core = not args.no_frozen_core

    # Same thread environment for both workers: dfmp2 sets a passive OpenMP wait policy for
    # itself; PySCF gets it too, which also calms its own OpenBLAS/OpenMP contention.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    for name, target, extra in (("pyscf", pyscf_worker, ()), ("dfmp2", dfmp2_worker, (args.device,))):
        parent, child = ctx.Pipe()
        process = ctx.Process(target=target, args=(child, args.xyz, args.basis, frozen_core, args.charge,
                                                   args.spin, *extra))
        process.start()
        workers[name] = (parent, process)
    info = {name: conn.recv() for name, (conn, _) in workers.items()}

    contenders = {"pyscf": ("pyscf", True), "dfmp2-fp64": ("dfmp2", "fp64"),
                  "dfmp2-fp32": ("dfmp2", "fp32")}
    times = {name: [] for name in contenders}
    after_integrals = {name: [] for name in contenders if name != "pyscf"}
    energies = {}
    for round_ in range(args.repeat + 1):  # round 0 is warm-up
        for name, (worker, request) in contenders.items():
            conn = workers[worker][0]
            time.sleep(args.gap)  # let the other worker's BLAS/OpenMP threads go idle first
            conn.send(request)
            elapsed, energy, timings = conn.recv()
            energies[name] = energy
            if round_ == 0:
                continue
            times[name].append(elapsed)
            if timings:
                after_integrals[name].append(elapsed - timings["integrals"])
    for conn, process in workers.values():
        conn.send(None)
        process.join()

    medians = {name: statistics.median(v) for name, v in times.items()}
    ratios = {name: statistics.median(p / d for p, d in zip(times["pyscf"], times[name]))
              for name in contenders if name != "pyscf"}
    sizes = info["pyscf"]
    print(f"{os.path.basename(args.xyz)} / {args.basis} ({sizes['reference'].upper()}, charge {args.charge}, "
          f"2S {args.spin}): nao {sizes['nao']}, active nocc "
          f"{sizes['nocc']}, aux {sizes['auxbasis']}; {info['dfmp2']['device']}; "
          f"{args.repeat} timed rounds (medians)")
    best = {name: min(v) for name, v in times.items()}
    print(f"{'code':12s} {'median (s)':>10s} {'pyscf/this':>10s} {'best (s)':>9s} {'pyscf/this':>10s} "
          f"{'e_corr (Eh)':>18s} {'vs pyscf':>9s}")
    for name in contenders:
        ratio = "1.00" if name == "pyscf" else f"{ratios[name]:.2f}"
        best_ratio = best["pyscf"] / best[name]
        delta = energies[name] - energies["pyscf"]
        print(f"{name:12s} {medians[name]:10.3f} {ratio:>10s} {best[name]:9.3f} {best_ratio:10.2f} "
              f"{energies[name]:18.10f} {delta:9.1e}")
    for name, values in after_integrals.items():
        print(f"  {name}: {statistics.median(values):.3f} s of it after the 3-center integrals")

    if args.json:
        record = {
            "molecule": os.path.basename(args.xyz), "basis": args.basis, "sizes": sizes, "gap": args.gap,
            "charge": args.charge, "spin": args.spin, "reference": sizes["reference"],
            "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
            "frozen_core": frozen_core, "repeat": args.repeat, "median_seconds": medians,
            "median_ratio_pyscf_over_dfmp2": ratios, "best_seconds": best,
            "all_seconds": times, "e_corr": energies,
            "seconds_after_integrals": {k: statistics.median(v) for k, v in after_integrals.items()},
            "machine": {"device": info["dfmp2"]["device"], "python": platform.python_version(),
                        "threads": info["dfmp2"]["threads"]},
            "versions": {"dfmp2": info["dfmp2"]["dfmp2"], "torch": info["dfmp2"]["torch"],
                         "pyscf": sizes["pyscf"]},
            "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=2)


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
