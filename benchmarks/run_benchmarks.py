"""Benchmark harness: `dfmp2 bench` shapes on every usable device, plus the peers side by side.

    python benchmarks/run_benchmarks.py                       # everything usable here
    python benchmarks/run_benchmarks.py --shapes small medium --devices cpu trn1-sim
    python benchmarks/run_benchmarks.py --shapes big-virtual --devices trn1-sim trn2-sim --no-peers --no-kernels
    python benchmarks/run_benchmarks.py --shapes --no-peers                # only the NKI kernel models
    python benchmarks/make_page.py                            # -> docs/benchmarks.md + plot

Writes one JSON file per measurement into benchmarks/results/ (machine, versions, date and
commit inside each). Devices: cpu, cuda (if torch sees a GPU), trn1-sim / trn2-sim / trn3-sim (the NKI
kernels on the emulator: energies and *modelled* Trainium times; the emulator's own run time
is not a Trainium time; medium and large run model-only). Peers on molecules, same MP2-fit auxiliary basis:
  - PySCF's DFMP2 on the CPU against dfmp2 fp64/fp32 (benchmarks/bench_vs_pyscf.py);
  - gpu4pyscf's DFMP2 against dfmp2 --device cuda, when gpu4pyscf and a GPU are present.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ROOT = os.path.dirname(HERE)


def bench_devices():
    import dfmp2  # noqa: F401  first: sets the OpenMP wait policy before torch loads
    import torch

    devices = [("cpu", "fp64", False, None), ("cpu", "fp32", False, None)]
    if torch.cuda.is_available():
        devices += [("cuda", "fp64", False, None), ("cuda", "fp32", False, None)]
    # Trainium: both AO->MO transforms (exact products, the default; plain fp32 products)
    devices += [(trn, "fp32", True, transform) for trn in ("trn1", "trn2", "trn3") for transform in ("exact", "fp32")]
    return devices


# beyond the published shapes: many virtuals, few occupied (the exact transform's C_vir streaming;
# issue 27's case that stopped with an SBUF error); run with --shapes big-virtual
EXTRA_SHAPES = {"big-virtual": (1408, 8, 2304)}


def run_shapes(shapes, wanted, repeat):
    from dfmp2.app.bench import run_bench
    from dfmp2.rng.synthetic import SHAPES

    shape_table = {**SHAPES, **EXTRA_SHAPES}
    for shape in shapes:
        for device, precision, simulate, transform in bench_devices():
            label = f"{device}-sim" if simulate else device
            if wanted and label not in wanted:
                continue
            start = time.perf_counter()
            # beyond the small shape, full emulation in numpy takes hours: model-only emulates
            # each kernel shape once and reuses its trace (the modelled time is the same)
            record = run_bench(*shape_table[shape], device=device, precision=precision, simulate=simulate,
                               repeat=1 if simulate else repeat,
                               model_only=simulate and shape != "small", transform=transform)
            record["shape"]["name"] = shape
            record["harness_seconds"] = time.perf_counter() - start
            suffix = "_fp32-transform" if transform == "fp32" else ""
            path = os.path.join(RESULTS, f"bench_{shape}_{label}_{precision}{suffix}.json")
            _write(path, record)
            print(f"{shape:7s} {label:9s} {precision}{suffix}: e_corr {record['e_corr']:.10f}, warm "
                  f"{record['total_seconds']:.3f} s" + (
                      f", modelled trn1 {record['modelled_seconds']['trn1']:.4f} s (model)" if simulate else ""))


# kernel micro-benchmarks (MODEL): the trn1 GEMM sizes calibrate the model, the rest show it
KERNEL_RUNS = [("gemm", 512), ("gemm", 1024), ("trsm", 1024), ("syrk", 1024), ("ao2mo", 512),
               ("pair_energy", 512)]


def run_kernels(targets=("trn1", "trn2", "trn3")):
    from dfmp2.app.bench import run_kernel_bench

    for target in targets:
        for kernel, size in KERNEL_RUNS:
            record = run_kernel_bench(kernel, size, target, simulate=True)
            _write(os.path.join(RESULTS, f"kernel_{target}_{kernel}_{size}.json"), record)
            print(f"kernel {kernel} {size} {target}: MODEL {record['modelled']['seconds'] * 1e3:.3f} ms")


def run_pyscf_peer(repeat):
    out = os.path.join(RESULTS, "peer_pyscf_benzene_ccpvtz_cpu.json")
    subprocess.run([sys.executable, os.path.join(HERE, "bench_vs_pyscf.py"), "--rounds", str(repeat),
                    "--json", out], check=True)
    # an open shell with > 300 basis functions: the naphthalene cation radical (UHF, 412 functions)
    out = os.path.join(RESULTS, "peer_pyscf_naphthalene_cation_ccpvtz_uhf_cpu.json")
    subprocess.run([sys.executable, os.path.join(HERE, "bench_vs_pyscf.py"),
                    os.path.join(ROOT, "examples", "naphthalene.xyz"), "--charge", "1", "--spin", "1",
                    "--rounds", str(repeat), "--json", out], check=True)


def run_gpu4pyscf_peer(xyz, basis, repeat):
    """gpu4pyscf DFMP2 vs dfmp2 --device cuda on one molecule (needs a GPU and gpu4pyscf)."""
    import torch

    if not torch.cuda.is_available():
        print("gpu4pyscf peer skipped: no CUDA GPU")
        return
    try:
        from gpu4pyscf.mp.dfmp2 import DFMP2 as GpuDFMP2
    except ImportError:
        print("gpu4pyscf peer skipped: gpu4pyscf is not installed (pip install gpu4pyscf-cuda12x)")
        return
    from pyscf import df

    from dfmp2 import DFMP2
    from dfmp2 import chem

    mol = chem.build_molecule(chem.read_xyz(xyz), basis)
    mf = chem.run_scf(mol, "df")
    aux = df.make_auxbasis(mol, mp2fit=True)
    frozen = chem.frozen_core_count(mol)
    mf_gpu = mf.to_gpu()

    def gpu4pyscf_run():
        pt = GpuDFMP2(mf_gpu, auxbasis=aux)
        pt.frozen = frozen
        e = pt.kernel()
        torch.cuda.synchronize()
        return float(e if not isinstance(e, tuple) else e[0])

    def dfmp2_run(precision):
        def run():
            e, _ = DFMP2(mf, frozen=frozen, device="cuda", precision=precision).kernel()
            torch.cuda.synchronize()
            return e
        return run

    runs = {"gpu4pyscf": gpu4pyscf_run, "dfmp2-cuda-fp64": dfmp2_run("fp64"),
            "dfmp2-cuda-fp32": dfmp2_run("fp32")}
    times = {k: [] for k in runs}
    energies = {}
    for round_ in range(repeat + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            energies[name] = run()
            if round_:
                times[name].append(time.perf_counter() - start)
    record = {"molecule": os.path.basename(xyz), "basis": basis, "frozen": frozen,
              "median_seconds": {k: statistics.median(v) for k, v in times.items()},
              "median_ratio_peer_over_dfmp2": {
                  k: statistics.median(p / d for p, d in zip(times["gpu4pyscf"], times[k]))
                  for k in runs if k != "gpu4pyscf"},
              "e_corr": energies, "device": torch.cuda.get_device_name(0),
              "date": time.strftime("%Y-%m-%d")}
    _write(os.path.join(RESULTS, f"peer_gpu4pyscf_{os.path.basename(xyz)[:-4]}_{basis}.json"), record)


def _write(path, record):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=["small", "medium", "large"])
    parser.add_argument("--devices", nargs="+", default=None,
                        help="subset of: cpu cuda trn1-sim trn2-sim trn3-sim (default: all usable)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--no-kernels", action="store_true", help="skip the NKI kernel models")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    import dfmp2  # noqa: F401  first: sets the OpenMP wait policy before torch and numpy's BLAS load
    run_shapes(args.shapes, set(args.devices or []), args.repeat)
    if not args.no_kernels:
        run_kernels()
    if not args.no_peers:
        run_pyscf_peer(max(args.repeat, 7))
        run_gpu4pyscf_peer(os.path.join(ROOT, "examples", "benzene.xyz"), "cc-pvtz", args.repeat)


if __name__ == "__main__":
    main()
