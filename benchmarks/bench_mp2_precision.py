"""How far the fp32-GEMM pair stage (fp64 sums) is from fp64: e_corr of both on the same SCF orbitals, for
the reference set (../shared/reference/energies.json, or --references PATH) and for larger molecules.

    python benchmarks/bench_mp2_precision.py --json benchmarks/results/mp2_precision.json
    python benchmarks/bench_mp2_precision.py --molecules examples/triacontane.xyz:cc-pvdz \
        --no-references --scf-builds dfmp2 --conv-tol 1e-9

The SCF only supplies the orbitals both precisions share, so for large molecules it may use dfmp2's
builds (--scf-builds dfmp2) and a looser convergence (--conv-tol): the comparison is unchanged.

Prints |e_corr(fp32) - e_corr(fp64)| per case (and per component: os, ss), with the basis size.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from pyscf import gto, scf

from dfmp2 import use_dfmp2_jk
from dfmp2.chem import fitted_builds_of
from dfmp2.api.driver import run_mean_field

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCES = os.path.join(HERE, "..", "..", "shared", "reference", "energies.json")
MOLECULES = ["examples/benzene.xyz:cc-pvtz", "examples/naphthalene.xyz:cc-pvtz", "examples/water16.xyz:cc-pvdz",
             "examples/hexadecane.xyz:cc-pvdz"]


def reference_cases(path):
    """(name, mol, reference) of every closed- and open-shell case in the reference file."""
    data = json.load(open(path))
    for group in (data["cases"], data["open_shell"]["cases"]):
        for case in group:
            mol = gto.M(atom=case["atom"], basis=case["basis"], charge=case.get("charge", 0),
                        spin=case.get("spin", 0), unit=case.get("unit", "Angstrom"), verbose=0)
            yield case["name"], mol, case.get("reference", "rhf" if mol.spin == 0 else "uhf"), case.get("auxbasis")


def compare(name, mol, reference, auxbasis=None, scf_builds="pyscf", conv_tol=1e-11):
    mf = {"rhf": scf.RHF, "uhf": scf.UHF, "rohf": scf.ROHF}[reference](mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.max_memory = conv_tol, max(1e-7, conv_tol ** 0.5), 20000
    if scf_builds == "dfmp2":
        use_dfmp2_jk(mf, device="cpu")
    mf.kernel()
    builds = fitted_builds_of(mf)
    if builds is not None:
        builds.close()  # the JK-fit tensor: its memory goes back before the MP2 step
    mf.with_df.reset()
    runs = {}
    for precision in ("fp64", "fp32"):
        start = time.perf_counter()
        runs[precision] = (run_mean_field(mf, precision=precision, auxbasis=auxbasis), time.perf_counter() - start)
    (r64, t64), (r32, t32) = runs["fp64"], runs["fp32"]
    row = {"name": name, "nbasis": mol.nao, "reference": reference, "e_corr_fp64": r64.e_corr,
           "abs_error": abs(r32.e_corr - r64.e_corr), "abs_error_os": abs(r32.e_corr_os - r64.e_corr_os),
           "abs_error_ss": abs(r32.e_corr_ss - r64.e_corr_ss), "seconds_fp64": t64, "seconds_fp32": t32}
    print(f"{name:40s} nbasis {mol.nao:5d}  |dE| {row['abs_error']:.2e} Eh  (os {row['abs_error_os']:.1e}, "
          f"ss {row['abs_error_ss']:.1e})  MP2 {t64:.1f} s fp64, {t32:.1f} s fp32", flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--references", default=REFERENCES)
    parser.add_argument("--molecules", nargs="*", default=MOLECULES, metavar="XYZ:BASIS")
    parser.add_argument("--no-references", action="store_true", help="only the --molecules")
    parser.add_argument("--scf-builds", choices=("pyscf", "dfmp2"), default="pyscf",
                        help="whose J/K builds the --molecules' SCF uses (the orbitals only)")
    parser.add_argument("--conv-tol", type=float, default=1e-11, help="the --molecules' SCF conv_tol")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = [] if args.no_references else [compare(*case) for case in reference_cases(args.references)]
    for item in args.molecules:
        path, basis = item.rsplit(":", 1)
        rows.append(compare(os.path.basename(path) + "/" + basis, gto.M(atom=path, basis=basis, verbose=0), "rhf",
                            scf_builds=args.scf_builds, conv_tol=args.conv_tol))
    worst = max(rows, key=lambda r: r["abs_error"])
    print(f"largest |dE| {worst['abs_error']:.2e} Eh ({worst['name']}, {worst['nbasis']} functions)")
    if args.json:
        json.dump({"rows": rows, "largest_abs_error": worst["abs_error"], "date": time.strftime("%Y-%m-%d"),
                   "cpus": os.cpu_count()}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
