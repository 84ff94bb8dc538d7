"""Time the DF-MP2 step (3-center integrals -> energy; SCF excluded) of dfmp2 and PySCF side by side.

Worker processes, each converging the same density-fitted RHF once (not timed), then driven one
call at a time by the harness (benchmarks/harness.py: a quiet machine or no result, alternating,
each contender at its fastest BLAS setting):
  - PySCF: `pyscf.mp.dfmp2.DFMP2` (closed shell) or `pyscf.mp.dfump2.DFUMP2` (--spin > 0: a UHF
    reference) with the same MP2-fit auxiliary basis, `with_t2=False`, a fresh DF object per
    call so nothing is cached. This process never imports torch or dfmp2 (so it runs exactly as a
    PySCF user's script would).
  - dfmp2: `dfmp2.DFMP2(...).kernel()` in fp64 and fp32 (one worker).
One worker per contender and BLAS setting is started; each is timed (--blas-rounds calls) and the
fastest setting's worker runs the timed rounds. Each call reports its process's CPU seconds, for
the harness's quiet check. Prints medians and the median of the per-round ratios PySCF time /
dfmp2 time (> 1: dfmp2 is faster).

    python benchmarks/bench_vs_pyscf.py examples/benzene.xyz --basis cc-pvtz --rounds 7
    python benchmarks/bench_vs_pyscf.py examples/naphthalene.xyz --basis cc-pvtz --charge 1 --spin 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import add_arguments, bench_environment, from_arguments, main_guard, median, median_ratio  # noqa: E402


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
        start, cpu = time.perf_counter(), time.process_time()
        pt = peer(mf, frozen=frozen)
        pt.with_df = df.DF(mol, auxbasis=aux)
        pt.kernel(with_t2=False)
        conn.send((time.perf_counter() - start, time.process_time() - cpu, pt.e_corr, None))


def dfmp2_worker(conn, xyz, basis, frozen_core, charge, spin, device):
    import dfmp2  # first, as in the CLI: it sets the OpenMP wait policy before torch/PySCF load
    import torch
    from dfmp2 import DFMP2
    from dfmp2.kernels import device_report

    from pyscf import df

    mol, mf = _scf(xyz, basis, charge, spin)
    frozen = _frozen(mol, frozen_core)
    aux = df.make_auxbasis(mol, mp2fit=True)  # the MP2-fit set PySCF's worker uses (not the SCF's JK-fit one)
    conn.send({"dfmp2": dfmp2.__version__, "torch": torch.__version__,
               "device": device_report()[device][1], "threads": torch.get_num_threads()})
    while (precision := conn.recv()) is not None:
        start, cpu = time.perf_counter(), time.process_time()
        pt = DFMP2(mf, frozen=frozen, device=device, precision=precision, auxbasis=aux)
        pt.kernel()
        conn.send((time.perf_counter() - start, time.process_time() - cpu, pt.e_corr, pt.result.timings))


def start_worker(ctx, target, args, env):
    """A worker process started in `env` (its BLAS reads the environment when it loads)."""
    parent, child = ctx.Pipe()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        process = ctx.Process(target=target, args=(child, *args))
        process.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return parent, process


def ask(worker, request):
    """A call for the harness: one timed request to a worker -> (its CPU seconds, (seconds,
    e_corr, timings))."""
    conn, _ = worker
    conn.send(request)
    seconds, cpu, energy, timings = conn.recv()
    return cpu, (seconds, energy, timings)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xyz", nargs="?", default=os.path.join(HERE, "..", "examples", "benzene.xyz"))
    parser.add_argument("--basis", default="cc-pvtz")
    add_arguments(parser, rounds=7)
    parser.add_argument("--no-frozen-core", action="store_true")
    parser.add_argument("--charge", type=int, default=0)
    parser.add_argument("--spin", type=int, default=0, help="2S; > 0: UHF, PySCF's DFUMP2 as the peer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--settle", type=float, default=0.5, help="idle seconds before each timed call")
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    frozen_core = not args.no_frozen_core
    harness = from_arguments(args)
    # a worker's BLAS threads may spin for ~0.1 s after its call (PySCF's defaults): each call
    # starts once they are idle, or they would count as other work during the next one's
    harness.settle = args.settle
    ctx = multiprocessing.get_context("spawn")
    molecule = (args.xyz, args.basis, frozen_core, args.charge, args.spin)
    workers, info = {}, {}
    for name, target, extra in (("pyscf", pyscf_worker, ()), ("dfmp2", dfmp2_worker, (args.device,))):
        for setting, changes in harness.blas_settings.items():
            workers[(name, setting)] = start_worker(ctx, target, (*molecule, *extra), bench_environment(changes))
    for key, (conn, _) in workers.items():
        info[key] = conn.recv()
    try:
        requests = {"pyscf": True, "dfmp2": "fp32"}  # (dfmp2's BLAS setting is chosen on its default precision)
        for key, worker in workers.items():
            harness.measure(key[0], 0, lambda w=worker, r=requests[key[0]]: ask(w, r))  # warm-up
        best = harness.choose({name: {setting: (lambda w=workers[(name, setting)], r=requests[name]: ask(w, r))
                                      for setting in harness.blas_settings} for name in requests},
                              args.blas_rounds)
        for name, (setting, trials) in best.items():
            harness.note_blas(name, setting, bench_environment(harness.blas_settings[setting]), name == "dfmp2",
                              trials)
        chosen = {name: workers[(name, setting)] for name, (setting, _) in best.items()}
        for key in [key for key in workers if workers[key] is not chosen[key[0]]]:  # the others go
            conn, process = workers.pop(key)
            conn.send(None)
            process.join()
        timed = harness.alternate({"pyscf": lambda: ask(chosen["pyscf"], True),
                                   "dfmp2-fp64": lambda: ask(chosen["dfmp2"], "fp64"),
                                   "dfmp2-fp32": lambda: ask(chosen["dfmp2"], "fp32")})
    finally:
        for conn, process in workers.values():
            conn.send(None)
            process.join()

    energies = {name: runs[-1].payload[1] for name, runs in timed.items()}
    after_integrals = {name: [r.seconds - r.payload[2]["integrals"] for r in runs]
                       for name, runs in timed.items() if name != "pyscf"}
    medians = {name: median(runs) for name, runs in timed.items()}
    ratios = {name: median_ratio(timed["pyscf"], runs) for name, runs in timed.items() if name != "pyscf"}
    sizes = info[("pyscf", best["pyscf"][0])]
    dfmp2_info = info[("dfmp2", best["dfmp2"][0])]
    print(f"{os.path.basename(args.xyz)} / {args.basis} ({sizes['reference'].upper()}, charge {args.charge}, "
          f"2S {args.spin}): nao {sizes['nao']}, active nocc {sizes['nocc']}, aux {sizes['auxbasis']}; "
          f"{dfmp2_info['device']}; {args.rounds} timed rounds (medians); BLAS: PySCF {best['pyscf'][0]}, "
          f"dfmp2 {best['dfmp2'][0]}")
    print(f"{'code':12s} {'median (s)':>10s} {'pyscf/this':>10s} {'e_corr (Eh)':>18s} {'vs pyscf':>9s}")
    for name in timed:
        ratio = "1.00" if name == "pyscf" else f"{ratios[name]:.2f}"
        print(f"{name:12s} {medians[name]:10.3f} {ratio:>10s} {energies[name]:18.10f} "
              f"{energies[name] - energies['pyscf']:9.1e}")
    for name, values in after_integrals.items():
        print(f"  {name}: {statistics.median(values):.3f} s of it after the 3-center integrals")
    record = {
        "molecule": os.path.basename(args.xyz), "basis": args.basis, "sizes": sizes, "charge": args.charge,
        "spin": args.spin, "reference": sizes["reference"], "frozen_core": frozen_core,
        "median_seconds": medians, "median_ratio_pyscf_over_dfmp2": ratios,
        "seconds": {n: [round(r.seconds, 4) for r in runs] for n, runs in timed.items()}, "e_corr": energies,
        "seconds_after_integrals": {k: statistics.median(v) for k, v in after_integrals.items()},
        "versions": {"dfmp2": dfmp2_info["dfmp2"], "torch": dfmp2_info["torch"], "pyscf": sizes["pyscf"]},
        "threads": dfmp2_info["threads"], "device": dfmp2_info["device"],
    }
    full = harness.write(args.json, record) if args.json else {**record, **harness.record()}
    print(f"quiet: largest share of a core used by other processes during a timed call "
          f"{100 * full['harness']['largest_other_fraction']:.1f}%")


if __name__ == "__main__":
    main_guard(main)
