"""Where `dfmp2 bench --device cuda` spends its pass, and what the (mn|P) upload costs: the same
synthetic shape three ways, alternating, warm medians in one process (a GPU needed):

    pageable  host-made (mn|P) blocks uploaded from pageable memory (torch's plain copy)
    pinned    host-made blocks through dfmp2's reused page-locked buffer (the default)
    device    the blocks made on the GPU (`--integrals device`: the kernel layer, no upload)

    python benchmarks/bench_cuda_upload.py --shape medium --precision fp32 --rounds 2 --json out.json
    python benchmarks/bench_cuda_upload.py --molecule examples/naphthalene.xyz --basis cc-pvtz --rounds 3

With --molecule: whole `dfmp2 run --device cuda` processes instead, pinned and pageable
alternating (start-up included), with the medians of their wall seconds and of the run's own
transform and mp2 timings.

Per variant: the pass's median seconds and its stages (integrals, metric, transform, whiten,
pair_energies), the energy; the pinned-over-pageable ratio of the transform stage and of the
pass. The pageable variant raises kernels.torch.backend.PINNED_UPLOAD_MIN_BYTES above any block for the
duration of its round (a measurement switch, not a user option).
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

from dfmp2.app.bench import run_bench
from dfmp2.kernels.torch import backend as torch_backend
from dfmp2.rng.synthetic import SHAPES
from dfmp2.run.settings import Settings

VARIANTS = ("pageable", "pinned", "device")


def one_round(variant, shape, settings, repeat):
    """run_bench's record of one variant (its warm passes' medians)."""
    default = torch_backend.PINNED_UPLOAD_MIN_BYTES
    if variant == "pageable":
        torch_backend.PINNED_UPLOAD_MIN_BYTES = 1 << 62
    try:
        return run_bench(*SHAPES[shape], repeat=repeat, settings=settings,
                         integrals="device" if variant == "device" else "host")
    finally:
        torch_backend.PINNED_UPLOAD_MIN_BYTES = default


# `python -m dfmp2 ARGS...` with the upload switch set first (argv[1]: pinned | pageable)
WRAPPER = ("import sys\nimport dfmp2.kernels.torch.backend as t\n"
           "if sys.argv[1] == 'pageable':\n    t.PINNED_UPLOAD_MIN_BYTES = 1 << 62\n"
           "sys.argv = ['dfmp2'] + sys.argv[2:]\nfrom dfmp2.app.entry import main\nmain()\n")


def whole_jobs(molecule, basis, precision, rounds):
    """{variant: {wall, transform, mp2}} medians over `rounds` alternating whole-process runs."""
    seen = {v: [] for v in ("pinned", "pageable")}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        for _ in range(rounds):
            for variant in seen:
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", WRAPPER, variant, "run", molecule, "--basis", basis,
                                "--device", "cuda", "--precision", precision, "--quiet", "--json", out], check=True)
                wall = time.perf_counter() - start
                timings = json.load(open(out, encoding="utf-8"))["timings"]
                seen[variant].append({"wall": wall, "transform": timings["transform"], "mp2": timings["mp2"]})
    return {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in seen.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="medium", choices=sorted(SHAPES))
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="warm passes per round")
    parser.add_argument("--molecule", default=None, help="whole dfmp2 run processes on this XYZ file instead")
    parser.add_argument("--basis", default="cc-pvtz")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.molecule:
        summary = {"molecule": args.molecule, "basis": args.basis, "precision": args.precision,
                   "rounds": args.rounds, "variants": whole_jobs(args.molecule, args.basis, args.precision, args.rounds)}
        for name, r in summary["variants"].items():
            print(f"{name:9s} " + "  ".join(f"{k} {v:.3f} s" for k, v in r.items()))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(summary, handle, indent=1)
        return 0
    settings = Settings(device="cuda", precision=args.precision)
    records = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            records[variant].append(one_round(variant, args.shape, settings, args.repeat))
    summary = {"shape": args.shape, "precision": args.precision, "rounds": args.rounds,
               "device_description": records["pinned"][-1]["device_description"], "variants": {}}
    for variant, rs in records.items():
        summary["variants"][variant] = {
            "total_seconds": statistics.median(r["total_seconds"] for r in rs),
            "stages": {k: statistics.median(r["stages"][k]["seconds"] for r in rs) for k in rs[0]["stages"]},
            "e_corr": rs[-1]["e_corr"], "integrals_made_on": rs[-1]["integrals_made_on"],
            "pair_tflops": rs[-1]["stages"]["pair_energies"]["tflops"],
            "device_gemm_tflops": rs[-1].get("device_gemm_tflops")}
    v = summary["variants"]
    summary["pageable_over_pinned"] = {"transform": v["pageable"]["stages"]["transform"] / v["pinned"]["stages"]["transform"],
                                       "pass": v["pageable"]["total_seconds"] / v["pinned"]["total_seconds"]}
    for name, r in v.items():
        print(f"{name:9s} pass {r['total_seconds']:.4f} s  " +
              "  ".join(f"{k} {s:.4f}" for k, s in r["stages"].items()) + f"  e_corr {r['e_corr']:.12f}")
    print(f"pageable / pinned: transform {summary['pageable_over_pinned']['transform']:.2f}x, "
          f"pass {summary['pageable_over_pinned']['pass']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
