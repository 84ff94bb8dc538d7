"""Per-call MODEL of the linalg, sparse, rng and MP2 kernels (`dfmp2 bench --kernel`) on every Trainium
target, beside the per-call figures a sibling library published for ITS kernels on trn1 and an A10G
(../shared/docs/nki-facts.md). Every dfmp2 figure is the calibrated cost MODEL of one warm call from
its emulator trace (launch + host transfer + the busiest engine), not a measurement; the sibling's
are measurements of other kernels, shown for scale.

    python benchmarks/bench_layer_kernels.py --json benchmarks/results/layer_kernels_model.json \\
        --markdown benchmarks/results/layer_kernels_model.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# (kernel, size): the sizes the sibling published (gemm, trsm, syrk), else 1024
CALLS = (("gemm", 512), ("gemm", 1024), ("syrk", 1024), ("trsm", 1024), ("potrf", 1024), ("ao2mo", 1024),
         ("spmm", 1024), ("pair_energy", 512), ("rng", 1024))
TARGETS = (("trn1", "0.2"), ("trn2", "0.7"), ("trn3", "0.7"))
# the sibling's published per-call figures (../shared/docs/nki-facts.md): measured, its kernels
PUBLISHED = {("gemm", 512): "trn1 1.3 ms", ("gemm", 1024): "trn1 2.3 ms (cold 26.7 ms)",
             ("trsm", 1024): "trn1 18.72 ms; A10G 0.47 ms", ("syrk", 1024): "trn1 0.13-0.38 TFLOPS (shape not given)"}


def flops(kernel, n):
    """The call's useful FLOPs (its problem's, not the padded kernel's)."""
    from dfmp2.sparse import banded_pattern

    nocc = max(1, n // 8)
    if kernel == "spmm":  # the kept blocks' first half, the dense second half
        return 2 * 32 * nocc * (banded_pattern(n, 128, 1).stored_elements + n * (n - nocc))
    return {"gemm": 2 * n**3, "syrk": n * (n + 1) * 128, "trsm": n * n * n, "potrf": n**3 / 3,
            "ao2mo": 2 * 32 * nocc * (n * n + n * (n - nocc)), "pair_energy": 2 * 16 * n * n * 3 * n}.get(kernel)


def markdown(rows) -> str:
    """The rows as a markdown table (pipes in the problem's text escaped)."""
    lines = ["| kernel | N | problem | MODEL trn1 (nki 0.2) | MODEL trn2 (nki 0.7) | MODEL trn3 (nki 0.7) | "
             "trn2 TFLOPS (MODEL) | published by a sibling (measured, its kernels) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [f"{row[t]['ms']:.2f} ms ({row[t]['launches']} launch{'es' if row[t]['launches'] > 1 else ''}, "
                 f"LNC={row[t]['lnc']})" for t, _ in TARGETS]
        work = flops(row["kernel"], row["size"])
        rate = f"{work / (row['trn2']['ms'] * 1e-3) / 1e12:.2f}" if work else "-"
        shape = row["shape"].replace("|", "\\|")
        lines.append(f"| {row['kernel']} | {row['size']} | {shape} | " + " | ".join(cells) +
                     f" | {rate} | {row['published']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from dfmp2.app.bench import run_kernel_bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--markdown-only", action="store_true", help="remake the table from --json")
    args = parser.parse_args(argv)
    if args.markdown_only:
        with open(args.json) as f:
            rows = json.load(f)["rows"]
    else:
        rows = run_all(run_kernel_bench)
        with open(args.json, "w") as f:
            json.dump({"note": "MODEL (calibrated, from emulator traces), not a measurement; published: a sibling "
                               "library's measurements of its own kernels", "rows": rows}, f, indent=1)
    table = markdown(rows)
    with open(args.markdown, "w") as f:
        f.write(table)
    print(table)


def run_all(run_kernel_bench) -> list:
    """One row per CALLS entry: each target's MODEL of the call."""
    os.environ.pop("NEURON_LOGICAL_NC_CONFIG", None)  # each call at the degree dfmp2 chooses
    rows = []
    for kernel, size in CALLS:
        row = {"kernel": kernel, "size": size, "published": PUBLISHED.get((kernel, size), "-")}
        for target, api in TARGETS:
            record = run_kernel_bench(kernel, size, target, simulate=True, nki_api=api)
            row["shape"] = record["shape"]
            row[target] = {"ms": record["modelled"]["seconds"] * 1e3, "launches": record["launches"],
                           "lnc": record["lnc"], "nki_api": api,
                           "breakdown_ms": {k: v * 1e3 for k, v in record["modelled"]["breakdown"].items()}}
            row["commit"], row["date"] = record["commit"], record["date"]
            print(kernel, size, target, f"{row[target]['ms']:.3f} ms MODEL", flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
