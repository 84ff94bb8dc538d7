"""GPU reference runs: `dfmp2 run` set-ups on an NVIDIA GPU, stored with the hardware and the
software that made them, for the CPU and the emulated Trainium paths to be checked against.

    python benchmarks/reference_runs.py --device cuda --commit $(git rev-parse HEAD)

Molecules: water, benzene, naphthalene (RHF) and the methyl radical (UHF, spin 1), each in
cc-pVDZ and cc-pVTZ (MP2 fitting set cc-pVXZ-RI, DF-SCF with cc-pVXZ-JKFIT, all electrons
correlated: `dfmp2 run`'s defaults), in every precision asked for (default fp64 and fp32; the
split-precision modes tf32x3 and bf16x3 for their accuracy table). Each set-up is one in-process
run (driver.run_xyz) with wall time. Writes benchmarks/results/reference_<device>.json:
{"host": {...}, "runs": [{molecule, xyz, spin, basis, precision, e_ref, e_corr, e_corr_os,
e_corr_ss, e_tot, nbasis, naux, seconds, timings}]}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MOLECULES = {"water": 0, "benzene": 0, "naphthalene": 0, "methyl": 1}  # examples/NAME.xyz -> spin
BASES = ("cc-pvdz", "cc-pvtz")


def host_record(device: str, commit: str | None) -> dict:
    """What ran: GPU, driver, CUDA, torch, PySCF, numpy, Python and dfmp2's commit."""
    import numpy
    import pyscf
    import torch

    record = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "pyscf": pyscf.__version__, "numpy": numpy.__version__,
              "commit": commit, "cpu_threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")}
    if device == "cuda":
        record["gpu"] = torch.cuda.get_device_name(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        record["driver"], record["gpu_memory"] = (part.strip() for part in smi.stdout.split(",", 1))
    return record


def reference_run(name: str, basis: str, device: str, precision: str) -> dict:
    """One `dfmp2 run examples/NAME.xyz --basis BASIS --device DEVICE --precision PRECISION`."""
    from dfmp2.api.driver import run_xyz

    spin = MOLECULES[name]
    start = time.perf_counter()
    result = run_xyz(os.path.join(ROOT, "examples", f"{name}.xyz"), basis=basis, spin=spin, device=device,
                     precision=precision)
    seconds = time.perf_counter() - start
    record = result.as_dict()
    keep = ("e_ref", "e_corr", "e_corr_os", "e_corr_ss", "e_tot", "nbasis", "naux", "auxbasis", "scf_auxbasis",
            "reference", "device", "device_description", "precision", "timings")
    return {"molecule": name, "xyz": f"examples/{name}.xyz", "spin": spin, "basis": basis,
            **{key: record[key] for key in keep}, "seconds": round(seconds, 3)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precisions", default="fp64,fp32")
    parser.add_argument("--molecules", default=",".join(MOLECULES))
    parser.add_argument("--bases", default=",".join(BASES))
    parser.add_argument("--commit", default=None, help="dfmp2's commit (the device host may have no git)")
    parser.add_argument("--json", default=None, help="default: benchmarks/results/reference_<device>.json")
    args = parser.parse_args(argv)
    report = {"host": host_record(args.device, args.commit), "runs": []}
    for name in args.molecules.split(","):
        for basis in args.bases.split(","):
            for precision in args.precisions.split(","):
                run = reference_run(name, basis, args.device, precision)
                report["runs"].append(run)
                print(f"{name:12s} {basis:8s} {precision:7s} e_corr {run['e_corr']:.12f} e_tot {run['e_tot']:.12f} "
                      f"{run['seconds']:7.2f} s", flush=True)
    path = args.json or os.path.join(HERE, "results", f"reference_{args.device}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
