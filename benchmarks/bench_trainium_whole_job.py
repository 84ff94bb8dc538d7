"""The whole job on Trainium as a Trainium user waits for it: host seconds MEASURED here (on a quiet
machine, at 1 and 2 host cores) + device seconds from the calibrated MODEL (no Trainium hardware
has run dfmp2), beside the host-SCF alternative, with the energies against the fp64 host run.

    python benchmarks/bench_trainium_whole_job.py examples/benzene.xyz --basis cc-pvtz --json

For one molecule, in this process (`dfmp2.run_xyz`, what `dfmp2 run` calls):
  host fp64     --device cpu: the reference energies (timed once, 2 cores);
  trn           --device trn2 --simulate --model-only (nki 0.7, the default trn path): dfmp2's SCF
                builds and MP2 kernels on the emulator;
  trn host SCF  the same with --scf-backend pyscf: PySCF's J/K builds on the host, MP2 kernels on trn2.
Every kernel launch is timed as it runs (emulation, or model-only's host reference math): that wall
time is not the device's and is taken out; what is left is the host's (PySCF's integrals and SCF
driver, the fp64 whitening, the exact products' operand slicing, the MP2 step's host parts), which
a Trainium instance's CPUs run too. The first run of each trn kind emulates every kernel shape (a
discarded warm-up, whose traces later runs reuse); the timed runs then cost the host part plus the
reference math only. Timed runs: the trn kind at 2 and 1 host threads (BLAS, OpenMP, torch, PySCF),
the host-SCF kind at 2 threads; the harness refuses a run during which other processes used more
than 5% of a core.

Host seconds per core count are measured; at a Trainium instance's host cores they are an
ESTIMATE: Amdahl's law fitted per part (SCF set-up, SCF cycles, each MP2 step, the rest) to the 1-
and 2-thread runs (t(n) = serial + parallel / n; the SCF per cycle, since the thread count changes
the fp64 sums' rounding and with it the mixed-precision SCF's cycle count), evaluated
at the physical cores of trn1.2xlarge (8 vCPUs), trn1.32xlarge (128) and trn2.48xlarge (192), assuming
2 vCPUs per physical core, this machine's per-core speed, and perfect scaling of the parallel part
(an optimistic bound: memory bandwidth, NUMA and PySCF's own scaling are not modelled).
Writes benchmarks/results/trainium_whole_job_<molecule>_<basis>_<cpu>.json (intel_xeon, amd_epyc: tables
never mix CPU models).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Harness, machine, main_guard  # noqa: E402

from dfmp2.api.driver import run_xyz  # noqa: E402
from dfmp2.kernels.nki import launch as nki_launch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = "trn2"  # the emulated target (nki 0.7, LNC=1); the MODEL is given for every target from its traces
# host vCPUs of Trainium instances (AWS's Trn1/Trn2 architecture pages; docs/hardware-facts.md)
INSTANCE_VCPUS = {"trn1.2xlarge": 8, "trn1.32xlarge": 128, "trn2.48xlarge": 192}
VCPUS_PER_CORE = 2  # an assumption: EC2 vCPUs are hardware threads, two per physical core
# timer steps -> the kernels launched inside them (their emulation wall time is not the host's)
STEP_KERNELS = {"scf": ("fitted_jk_kernel", "exact_matmul_kernel"), "transform": ("ao2mo_kernel",),
                "whiten": ("trsm_kernel", "gemm_kernel", "syrk_kernel"), "pair_energies": ("pair_energy_kernel",)}


class LaunchClock:
    """Wall seconds spent inside KernelLauncher.launch, per kernel (emulation or reference math:
    stand-ins for the device), and one trace cache shared by every launcher of this process."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.traces = {}
        launch, init = nki_launch.KernelLauncher.launch, nki_launch.KernelLauncher.__init__
        clock = self

        def timed_launch(launcher, kernel_name, *args, **kwargs):
            start = time.perf_counter()
            try:
                return launch(launcher, kernel_name, *args, **kwargs)
            finally:
                clock.seconds[kernel_name] += time.perf_counter() - start

        def shared_cache_init(launcher, *args, **kwargs):
            init(launcher, *args, **kwargs)
            launcher._trace_cache = clock.traces  # a kernel's trace depends only on its shapes

        nki_launch.KernelLauncher.launch = timed_launch
        nki_launch.KernelLauncher.__init__ = shared_cache_init

    def reset(self):
        self.seconds.clear()


def threads(count):
    """Limit BLAS, OpenMP (libcint), torch and PySCF to `count` threads -> a restore function."""
    import torch
    from pyscf import lib
    from threadpoolctl import threadpool_limits

    before_torch, before_pyscf = torch.get_num_threads(), lib.num_threads()
    limits = threadpool_limits(limits=count)
    torch.set_num_threads(count)
    lib.num_threads(count)

    def restore():
        limits.restore_original_limits()
        torch.set_num_threads(before_torch)
        lib.num_threads(before_pyscf)

    return restore


def trn_run(molecule, basis, clock, thread_count, **options):
    """One model-only trn run -> (record, wall seconds, launch seconds per kernel)."""
    clock.reset()
    restore = threads(thread_count)
    try:
        start = time.perf_counter()
        record = run_xyz(molecule, basis=basis, device=DEVICE, simulate=True, model_only=True, **options).as_dict()
        wall = time.perf_counter() - start
    finally:
        restore()
    return record, wall, dict(clock.seconds)


def breakdown(record, wall, launches):
    """Host seconds (wall minus the launches' emulation) in all and per step, and the device MODEL
    per target: SCF builds, MP2 kernels and transfers."""
    timings = record["timings"]
    emulated = sum(launches.values())
    host_steps = {step: round(timings[step] - sum(launches.get(k, 0.0) for k in STEP_KERNELS.get(step, ())), 3)
                  for step in timings if step != "mp2"}  # 'mp2' is the sum of its steps
    builds = record.get("scf_builds") or {}
    out = {"host_seconds": round(wall - emulated, 3), "host_seconds_by_step": host_steps,
           "emulation_wall_seconds": round(emulated, 2), "scf_iterations": record["scf_iterations"],
           "scf_setup_seconds": builds.get("setup_seconds")}
    for target, model in record["modelled"].items():
        scf_model = sum(builds.get("modelled_build_seconds", {}).get(target, []))
        out[target] = {"scf_builds_model_seconds": round(scf_model, 4),
                       "mp2_and_transfers_model_seconds": round(model["seconds"] - scf_model, 4),
                       "device_model_seconds": round(model["seconds"], 4),
                       "by_step": {step: round(v["seconds"], 4) for step, v in model["seconds_by_step"].items()}}
    return out


def amdahl(one, two):
    """t(n) = serial + parallel / n through t(1) = one and t(2) = two (parallel >= 0; a faster than
    linear speed-up, t(2) < t(1) / 2, is taken as all parallel through the 2-thread point)."""
    parallel = max(0.0, 2.0 * (one - two))
    if parallel > one:
        return 0.0, 2.0 * two
    return one - parallel, parallel


def host_parts(run):
    """A trn run's host seconds by part: the SCF's set-up, its cycles, each MP2 step, the rest."""
    steps = dict(run["host_seconds_by_step"])
    setup = run.get("scf_setup_seconds") or 0.0
    parts = {"scf_setup": setup, "scf_cycles": steps.pop("scf", 0.0) - setup, **steps}
    parts["other"] = run["host_seconds"] - sum(parts.values())
    return parts


def instance_estimate(one, two):
    """ESTIMATE of the 2-thread run's host seconds at n cores: Amdahl's law fitted per part to the 1-
    and 2-thread runs; the SCF cycles per cycle (thread counts change the fp64 sums' rounding and so
    the mixed-precision SCF's path and cycle count), times the 2-thread run's cycles."""
    p1, p2 = host_parts(one), host_parts(two)
    fits = {}
    for part in p2:
        a, b = p1.get(part, 0.0), p2[part]
        if part == "scf_cycles":
            a, b = a / one["scf_iterations"], b / two["scf_iterations"]
        serial, parallel = amdahl(a, b)
        scale = two["scf_iterations"] if part == "scf_cycles" else 1
        fits[part] = (serial * scale, parallel * scale)
    serial = sum(s for s, _ in fits.values())
    parallel = sum(p for _, p in fits.values())
    return serial, parallel, {part: [round(s, 3), round(p, 3)] for part, (s, p) in fits.items()}


def add_estimate(report):
    """report["instance_estimate"] from its measured trn@1 and trn@2 runs (no measurement)."""
    serial, parallel, fits = instance_estimate(report["trn@1"], report["trn@2"])
    report["instance_estimate"] = {
        "note": ("ESTIMATE, not a measurement: Amdahl's law fitted per part (SCF set-up, SCF cycles per cycle, "
                 "each MP2 step, the rest) to the trn run's host seconds at 1 and 2 threads here, the SCF's "
                 f"cycles as in the 2-thread run; {VCPUS_PER_CORE} vCPUs per physical core assumed, this "
                 "machine's per-core speed, the parallel part scaling perfectly (an optimistic bound)"),
        "serial_seconds": round(serial, 3), "parallel_seconds": round(parallel, 3),
        "parallel_fraction": round(parallel / (serial + parallel), 3) if serial + parallel else None,
        "serial_and_parallel_seconds_by_part": fits, "instances": {}}
    targets = [t for t in report["trn@2"] if isinstance(report["trn@2"][t], dict) and "device_model_seconds"
               in report["trn@2"][t]]
    for instance, vcpus in INSTANCE_VCPUS.items():
        cores = vcpus // VCPUS_PER_CORE
        host_at = serial + parallel / cores
        report["instance_estimate"]["instances"][instance] = {
            "physical_cores_assumed": cores, "host_seconds": round(host_at, 3),
            "whole_job_seconds": {t: round(host_at + report["trn@2"][t]["device_model_seconds"], 3) for t in targets}}


def reestimate(path):
    """Recompute a record's instance_estimate from its measured runs (nothing is run or timed)."""
    with open(path, encoding="utf-8") as handle:
        report = json.load(handle)
    add_estimate(report)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    print(json.dumps(report["instance_estimate"], indent=1))


def cpu_tag() -> str:
    """The record's CPU family for its file name: intel_xeon, amd_epyc, else cpu."""
    model = machine()["cpu"]
    return "intel_xeon" if "Xeon" in model else "amd_epyc" if "EPYC" in model else "cpu"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--json", action="store_true", help="write benchmarks/results/trainium_whole_job_*.json")
    parser.add_argument("--reestimate", action="store_true",
                        help="recompute the instance estimate of MOLECULE, a record written before (nothing is run)")
    args = parser.parse_args(argv)
    if args.reestimate:
        return reestimate(args.molecule)
    clock = LaunchClock()
    harness = Harness(rounds=1, warmup=0, blas_settings={})
    harness.wait_for_quiet()
    start = time.perf_counter()
    host = run_xyz(args.molecule, basis=args.basis).as_dict()
    host_wall = time.perf_counter() - start
    kinds = {"trn": {}, "trn_host_scf": {"scf_backend": "pyscf"}}
    for options in kinds.values():  # warm-up: every kernel shape emulated once (traces kept)
        trn_run(args.molecule, args.basis, clock, 2, **options)
    measured = {}
    for name, thread_count in (("trn", 2), ("trn", 1), ("trn_host_scf", 2)):
        key = f"{name}@{thread_count}"
        run = harness.measure(key, 1, lambda: (None, trn_run(args.molecule, args.basis, clock, thread_count,
                                                             **kinds[name])))
        measured[key] = run.payload
        print(f"{key}: wall {run.seconds:.1f} s, emulation {sum(run.payload[2].values()):.1f} s", flush=True)
    report = {"molecule": host["formula"], "basis": args.basis, "nbasis": host["nbasis"], "emulated_device": DEVICE,
              "nki_api": measured["trn@2"][0].get("nki_api"), "lnc": measured["trn@2"][0].get("lnc"),
              "note": ("host seconds MEASURED on this machine (quiet, 1 and 2 threads); device seconds a calibrated "
                       "MODEL, not a measurement; host seconds at an instance's cores an ESTIMATE (Amdahl, see "
                       "instance_estimate)"),
              "environment": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                                            "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")},
              "host_fp64": {"e_tot": host["e_tot"], "e_hf": host["e_hf"], "wall_seconds": round(host_wall, 2),
                            "scf_iterations": host["scf_iterations"], "timings": host["timings"]}}
    for key, (record, wall, launches) in measured.items():
        report[key] = {"e_tot_minus_host": record["e_tot"] - host["e_tot"],
                       "e_hf_minus_host": record["e_hf"] - host["e_hf"], "scf_backend": record["scf_backend"],
                       "wall_seconds": round(wall, 2), **breakdown(record, wall, launches)}
    add_estimate(report)
    for target in measured["trn@2"][0]["modelled"]:
        device = report["trn@2"][target]["device_model_seconds"]
        host_seconds = report["trn@2"]["host_seconds"]
        report[f"whole_job_2_cores_{target}"] = {
            "seconds": round(host_seconds + device, 3), "device_share": round(device / (host_seconds + device), 4),
            "host_scf_alternative_seconds": round(report["trn_host_scf@2"]["host_seconds"]
                                                  + report["trn_host_scf@2"][target]["device_model_seconds"], 3)}
    print(json.dumps({k: v for k, v in report.items() if k.startswith(("whole_job", "instance"))}, indent=1))
    if args.json:
        stem = os.path.splitext(os.path.basename(args.molecule))[0]
        path = os.path.join(HERE, "results", f"trainium_whole_job_{stem}_{args.basis.replace('-', '')}_{cpu_tag()}.json")
        harness.write(path, report)
        print(f"wrote {path}")


if __name__ == "__main__":
    main_guard(main)
