"""The whole job on Trainium as a calibrated MODEL (not a measurement: no Trainium hardware has
run dfmp2), beside the host-SCF alternative, with the energy envelope against the fp64 host run.

    python benchmarks/bench_trainium_whole_job.py examples/benzene.xyz --basis cc-pvtz --json

For one molecule, three runs of dfmp2 in this process:
  host        --device cpu (fp64; the energies the Trainium runs are compared with);
  nki builds  --device trn1 --simulate --model-only: the SCF's J/K builds and the MP2 kernels
              on the emulator (each kernel shape emulated once, repeats by host reference math);
  host SCF    the same with --scf-backend pyscf: PySCF's builds on the host, MP2 kernels on trn1.
The whole job per target is then: host seconds (measured here: PySCF's SCF driver, numint, the
integrals, the fp64 whitening, the MP2 step's host parts) + modelled device seconds (calibrated
MODEL of every kernel launch and host <-> device transfer, including B's one upload). Emulation
wall time is not a device time and is left out. Writes benchmarks/results/trainium_whole_job_*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from dfmp2.api.driver import run_xyz

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("trn1", "trn2", "trn3")


def breakdown(record, wall):
    """Host seconds measured and device seconds modelled, per target, of one simulated run."""
    timings = record["timings"]
    builds = record.get("scf_builds") or {}
    build_wall = sum(builds.get("build_seconds", []))  # emulation of the builds: not a device time
    host_scf = timings["scf"] - build_wall  # PySCF's driver, numint, guess, integrals and whitening
    host_mp2 = sum(timings.get(k, 0.0) for k in ("integrals", "metric"))  # (mn|P) by libcint, (P|Q)
    out = {"host_scf_seconds": round(host_scf, 3), "host_mp2_seconds": round(host_mp2, 3),
           "scf_build_wall_seconds_emulated": round(build_wall, 3), "emulation_wall_seconds": round(wall, 1)}
    for target in TARGETS:
        model = record["modelled"][target]
        scf_model = sum(builds.get("modelled_build_seconds", {}).get(target, []))
        device_other = model["seconds"] - scf_model  # MP2 kernels and all transfers (B's upload included)
        out[target] = {"scf_builds_model_seconds": round(scf_model, 4),
                       "mp2_and_transfers_model_seconds": round(device_other, 4),
                       "whole_job_seconds": round(host_scf + host_mp2 + scf_model + device_other, 3),
                       "by_step": {step: round(v["seconds"], 4) for step, v in model["seconds_by_step"].items()}}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--json", action="store_true", help="write benchmarks/results/trainium_whole_job_*.json")
    args = parser.parse_args(argv)
    runs = {}
    for name, options in (("host", {}),
                          ("nki_builds", dict(device="trn1", simulate=True, model_only=True)),
                          ("host_scf", dict(device="trn1", simulate=True, model_only=True, scf_backend="pyscf"))):
        start = time.perf_counter()
        runs[name] = (run_xyz(args.molecule, basis=args.basis, **options).as_dict(), time.perf_counter() - start)
    host = runs["host"][0]
    report = {"molecule": host["formula"], "basis": args.basis, "nbasis": host["nbasis"],
              "note": "host seconds measured on this machine; device seconds a calibrated MODEL, not a measurement",
              "host_fp64": {"e_tot": host["e_tot"], "e_hf": host["e_hf"], "wall_seconds": round(runs["host"][1], 2),
                            "timings": host["timings"]}}
    for name in ("nki_builds", "host_scf"):
        record, wall = runs[name]
        report[name] = {"e_tot_minus_host": record["e_tot"] - host["e_tot"],
                        "e_hf_minus_host": record["e_hf"] - host["e_hf"],
                        "scf_backend": record["scf_backend"], "scf_iterations": record["scf_iterations"],
                        "scf_builds": {k: v for k, v in (record.get("scf_builds") or {}).items()
                                       if k not in ("build_seconds", "modelled_build_seconds")},
                        **breakdown(record, wall)}
    for target in TARGETS:
        ours, theirs = report["nki_builds"][target], report["host_scf"][target]
        report[f"host_scf_over_nki_builds_{target}"] = round(theirs["whole_job_seconds"] / ours["whole_job_seconds"], 2)
    print(json.dumps(report, indent=1))
    if args.json:
        stem = os.path.splitext(os.path.basename(args.molecule))[0]
        path = os.path.join(HERE, "results", f"trainium_whole_job_{stem}_{args.basis.replace('-', '')}.json")
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
