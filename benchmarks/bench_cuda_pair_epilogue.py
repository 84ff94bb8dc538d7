"""The pair stage on a GPU with the fused Triton epilogue (`dfmp2/kernels/torch/cuda_pair.py`, the
default) against the same GEMMs followed by torch ops (the CPU's code): the synthetic shapes,
(mn|P) made on the GPU (`--integrals device`), alternating rounds, warm medians in one process
(a GPU needed):

    python benchmarks/bench_cuda_pair_epilogue.py --shapes medium:fp32,large:fp64 --rounds 3 --json out.json

Per shape and variant: the pass's median seconds, its stages, the pair stage's TFLOPS and its
fraction of the GEMM rate `dfmp2 bench` measures in the same run (DGEMM in fp64, SGEMM in fp32),
the energy. `dfmp2 bench` takes the fused epilogue (it times warm passes: `warm_kernels`); the
torch-ops variant makes `kernels.torch.backend.fused_epilogue_pays` answer False for the duration of its
round (a measurement switch, not a user option; the records' kernel counts say which ran).
"""

from __future__ import annotations

import argparse
import json
import statistics

from dfmp2.app.bench import run_bench
from dfmp2.kernels.torch import backend as torch_backend
from dfmp2.rng.synthetic import SHAPES
from dfmp2.run.settings import Settings

VARIANTS = ("fused", "torch-ops")


def one_round(variant, shape, precision, repeat):
    """run_bench's record of one variant (its warm passes' medians)."""
    pays = torch_backend.fused_epilogue_pays
    if variant == "torch-ops":
        torch_backend.fused_epilogue_pays = lambda *args: False
    try:
        return run_bench(*SHAPES[shape], repeat=repeat, settings=Settings(device="cuda", precision=precision),
                         integrals="device")
    finally:
        torch_backend.fused_epilogue_pays = pays


def summarise(records):
    """{variant: medians} of one shape's rounds."""
    out = {}
    for variant, rs in records.items():
        pair = statistics.median(r["stages"]["pair_energies"]["seconds"] for r in rs)
        tflops = rs[-1]["stages"]["pair_energies"]["gflop"] / pair / 1e3
        gemm = statistics.median(r["device_gemm_tflops"] for r in rs)
        out[variant] = {"total_seconds": statistics.median(r["total_seconds"] for r in rs),
                        "stages": {k: statistics.median(r["stages"][k]["seconds"] for r in rs) for k in rs[0]["stages"]},
                        "pair_tflops": tflops, "device_gemm_tflops": gemm, "pair_fraction_of_gemm": tflops / gemm,
                        "e_corr": rs[-1]["e_corr"], "kernels": rs[-1]["kernels"], "notes": rs[-1]["notes"]}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="medium:fp32,large:fp64", help="shape:precision,...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="warm passes per round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    summary = {"rounds": args.rounds, "repeat": args.repeat, "shapes": {}}
    for item in args.shapes.split(","):
        shape, precision = item.split(":")
        records = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                records[variant].append(one_round(variant, shape, precision, args.repeat))
        summary["device_description"] = records["fused"][-1]["device_description"]
        v = summarise(records)
        v["torch_ops_over_fused"] = {"pair": v["torch-ops"]["stages"]["pair_energies"] / v["fused"]["stages"]["pair_energies"],
                                     "pass": v["torch-ops"]["total_seconds"] / v["fused"]["total_seconds"]}
        summary["shapes"][f"{shape}_{precision}"] = v
        for name in VARIANTS:
            r = v[name]
            print(f"{shape} {precision} {name:9s} pass {r['total_seconds']:.4f} s  " +
                  "  ".join(f"{k} {s:.4f}" for k, s in r["stages"].items()) +
                  f"  pair {r['pair_tflops']:.1f} TFLOPS = {100 * r['pair_fraction_of_gemm']:.0f}% of GEMM"
                  f" {r['device_gemm_tflops']:.1f}  e_corr {r['e_corr']:.12f}")
        print(f"{shape} {precision} torch-ops / fused: pair {v['torch_ops_over_fused']['pair']:.2f}x, "
              f"pass {v['torch_ops_over_fused']['pass']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
