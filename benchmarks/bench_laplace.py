"""The Laplace path (SOS-MP2: E_os through Z(t), `dfmp2.mp2.laplace_energy`) against the canonical pair
loop, on a ladder of sizes: (H2O)n and n-alkanes, cc-pVDZ, frozen core, fp32 products (as `dfmp2 run`
types it). Per system, on one SCF's orbitals: E_os(L) - E_os (Eh, per atom) with the recorded bound,
the MP2 step's seconds of each (the pair loop's "pair_energies", the Laplace path's "laplace") and
the whole MP2 call; over the water ladder, each step's growth exponent (seconds ~ nbasis^p, fitted)
and the crossover size; and the Trainium MODEL of the Laplace step on the synthetic shapes
(`--model`: laplace_z_kernel and laplace_energy_kernel, emulated once per shape, timed by the
calibrated model, labelled MODEL).

    python benchmarks/bench_laplace.py --waters 8 16 32 --alkanes 8 16 --json benchmarks/results/laplace_ladder.json
    python benchmarks/bench_laplace.py --waters --alkanes --model trn2 --json benchmarks/results/laplace_model_trn2.json

Each contender runs in this process, one after the other in alternating order, through the
harness's quiet-machine check (harness.measure: other processes' CPU time beside each run); a busy
machine writes nothing (exit 3). The CPU: the record's harness.machine (family and model).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import Harness, main_guard  # noqa: E402
from molecules import alkane, water_cluster  # noqa: E402

WATER_GRIDS = {8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
LAPLACE_POINTS_MODEL = 10  # the MODEL's quadrature points (auto gives 9-11 on these ranges)


def mean_field(atoms, basis="cc-pvdz", conv_tol=1e-9):
    """RHF (density-fitted, dfmp2's builds: orbitals only; both contenders share them)."""
    from pyscf import gto, scf

    from dfmp2 import use_dfmp2_jk
    from dfmp2.chem import fitted_builds_of

    mol = gto.M(atom=[(s, (x, y, z)) for s, x, y, z in atoms], basis=basis, verbose=0, max_memory=20000)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad = conv_tol, conv_tol ** 0.5
    use_dfmp2_jk(mf, device="cpu")
    mf.kernel()
    builds = fitted_builds_of(mf)
    if builds is not None:
        builds.close()
    mf.with_df.reset()
    return mf


def compare(harness, name, atoms, round_):
    """One system: the canonical and the Laplace run on the same orbitals, alternating order."""
    from dfmp2.api.driver import run_mean_field

    mf = mean_field(atoms)
    ncore = sum(1 for s, *_ in atoms if s != "H")  # 1s of O and C
    calls = {"canonical": lambda: (None, run_mean_field(mf, precision="fp32", frozen=ncore)),
             "laplace": lambda: (None, run_mean_field(mf, method="sos-mp2", precision="fp32", frozen=ncore))}
    order = list(calls) if round_ % 2 == 0 else list(calls)[::-1]
    runs = {contender: harness.measure(contender, 1, calls[contender]) for contender in order}
    canonical, laplace = runs["canonical"].payload, runs["laplace"].payload
    for run in runs.values():
        run.payload = None  # the record keeps the figures below, not the result objects
    natom = mf.mol.natm
    error = laplace.e_corr_os - canonical.e_corr_os
    row = {"name": name, "natom": natom, "nbasis": mf.mol.nao, "nocc_active": laplace.correlation.nocc,
           "nvir": laplace.correlation.nvir, "naux": laplace.correlation.naux,
           "e_os_canonical": canonical.e_corr_os, "e_os_laplace": laplace.e_corr_os, "error": error,
           "error_per_atom": abs(error) / natom, "bound": laplace.correlation.laplace["e_os_error_bound"],
           "points": laplace.correlation.laplace["points"],
           "step_seconds": {"canonical": canonical.timings["pair_energies"], "laplace": laplace.timings["laplace"]},
           "mp2_seconds": {"canonical": canonical.timings["mp2"], "laplace": laplace.timings["mp2"]},
           "call_seconds": {k: r.seconds for k, r in runs.items()}}
    row["step_speedup"] = row["step_seconds"]["canonical"] / row["step_seconds"]["laplace"]
    print(f"{name:14s} nbasis {row['nbasis']:5d}  E_os(L)-E_os {error:+.2e} Eh ({row['error_per_atom']:.1e}/atom, "
          f"bound {row['bound']:.1e}, {row['points']} points)  step: canonical {row['step_seconds']['canonical']:.2f} s, "
          f"laplace {row['step_seconds']['laplace']:.2f} s ({row['step_speedup']:.2f}x)", flush=True)
    return row


def growth(rows, key):
    """(exponent p, prefactor a) of seconds = a nbasis^p, least squares in logs; None below two sizes."""
    if len(rows) < 2:
        return None
    x = np.log([r["nbasis"] for r in rows])
    y = np.log([r["step_seconds"][key] for r in rows])
    p, log_a = np.polyfit(x, y, 1)
    return float(p), float(math.exp(log_a))


def crossover(rows):
    """The nbasis where the fitted canonical and Laplace steps take equal time (None if they never meet
    above zero or one fit is missing); 'below the ladder' where the Laplace step is faster throughout."""
    fits = growth(rows, "canonical"), growth(rows, "laplace")
    if None in fits:
        return None
    (pc, ac), (pl, al) = fits
    if all(r["step_speedup"] > 1 for r in rows):
        return {"nbasis": None, "note": "the Laplace step is faster at every size measured"}
    if pc <= pl:
        return {"nbasis": None, "note": "the fitted canonical step does not grow faster"}
    return {"nbasis": float((al / ac) ** (1.0 / (pc - pl))), "note": "where the fitted power laws meet"}


def model_rows(target, points=LAPLACE_POINTS_MODEL):
    """The Laplace step's Trainium MODEL on the synthetic shapes: B [nocc, nvir, naux] on the device
    (random), Z of `points` points accumulated a block of occupied orbitals at a time, contracted on the
    device. MODEL (calibrated, not measured): seconds, the breakdown, and the device's share."""
    import torch

    from dfmp2.kernels import get_backend
    from dfmp2.rng.synthetic import SHAPES

    rows = []
    for shape, (nbasis, nocc, naux) in SHAPES.items():
        backend = get_backend(target, simulate=True, model_only=True)
        nvir = nbasis - nocc
        rng = np.random.default_rng(0)
        e_occ, e_vir = -1.0 - rng.random(nocc), 0.3 + rng.random(nvir)
        exponents = tuple(np.geomspace(0.05, 5.0, points))
        z = backend.laplace_accumulator(points, naux)
        block = nocc  # the NKI plan: every occupied orbital in one block (plan_hints: no limit)
        for i0 in range(0, nocc, block):
            i1 = min(nocc, i0 + block)
            b = backend.to_device(torch.randn(i1 - i0, nvir, naux).numpy() * 0.05)
            z = backend.laplace_z(z, b, e_occ[i0:i1], e_vir, exponents)
        backend.laplace_energy(z, z)
        model = backend.modelled()[target]  # this backend ran the Laplace step alone (B's uploads excluded)
        steps = {k: v for k, v in model["seconds_by_step"].items() if k != "host<->device transfer"}
        total = sum(v["seconds"] for v in steps.values())
        device = model["breakdown"]["device"]  # the engines' time; the rest: launches, device copies
        rows.append({"shape": shape, "nbasis": nbasis, "nocc": nocc, "nvir": nvir, "naux": naux, "points": points,
                     "occ_block": block, "model_seconds": total, "model_device_seconds": device,
                     "device_share": device / total if total else None, "by_step": steps,
                     "breakdown": model["breakdown"],
                     "tensor_engine_useful_fraction": {k: v["tensor_engine_useful_fraction"]
                                                       for k, v in model["by_kernel"].items()},
                     "flops": 2 * points * nocc * nvir * naux * (naux + 1) / 2})
        print(f"MODEL {target} {shape:7s} nbasis {nbasis} nocc {nocc} naux {naux}: {1e3 * total:.2f} ms, "
              f"device share {100 * rows[-1]['device_share']:.1f}%", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waters", type=int, nargs="*", default=[8, 16, 32], help="(H2O)n of WATER_GRIDS")
    parser.add_argument("--alkanes", type=int, nargs="*", default=[8, 16], help="CnH2n+2")
    parser.add_argument("--model", default=None, metavar="trn1|trn2|trn3", help="the Laplace step's MODEL instead")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    harness = Harness(rounds=1, warmup=0, blas_settings={})
    if not args.model:  # (the MODEL times nothing on this machine)
        harness.wait_for_quiet()
    record = {"what": "SOS-MP2's Laplace path vs the canonical pair loop (cc-pVDZ, frozen core, fp32)"}
    if args.model:
        record["model"] = {"target": args.model,
                           "label": "MODEL (calibrated, not measured)", "rows": model_rows(args.model)}
    else:
        waters = [compare(harness, f"(H2O){n}", water_cluster(*WATER_GRIDS[n]), k) for k, n in enumerate(args.waters)]
        alkanes = [compare(harness, f"C{n}H{2 * n + 2}", alkane(n), k) for k, n in enumerate(args.alkanes)]
        record.update(waters=waters, alkanes=alkanes,
                      growth={"waters": {k: growth(waters, k) for k in ("canonical", "laplace")},
                              "alkanes": {k: growth(alkanes, k) for k in ("canonical", "laplace")}},
                      crossover={"waters": crossover(waters), "alkanes": crossover(alkanes)})
        for ladder in ("waters", "alkanes"):
            fits = record["growth"][ladder]
            if fits["canonical"] and fits["laplace"]:
                print(f"{ladder}: step ~ nbasis^{fits['canonical'][0]:.2f} (canonical), nbasis^{fits['laplace'][0]:.2f} "
                      f"(Laplace); crossover {record['crossover'][ladder]}")
    if args.json:
        harness.write(args.json, record)


if __name__ == "__main__":
    main_guard(main)
