"""Generate docs/benchmarks.md (tables) and docs/benchmarks_time.png (plot) from benchmarks/results/.

    python benchmarks/make_page.py [--results DIR] [--out docs/benchmarks.md]

Tables follow the sibling libraries' pages: shape, device, time, TFLOPS, ratio, energy. Rows
for simulated Trainium show *modelled* times (labelled as a model); published sibling numbers
are shown as published, not as measurements of ours.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPE_ORDER = ["small", "medium", "large", "big-virtual"]  # big-virtual: Trainium model rows only
PLOT_SHAPES = SHAPE_ORDER[:3]
# warm times published by the sibling Trainium libraries for the same shapes (seconds)
PUBLISHED = {
    "NVIDIA A10G fp32 (sibling, published)": {"small": 0.001, "medium": 0.266, "large": 2.018},
    "trn1 NKI (sibling, published)": {"small": 0.091, "medium": 4.8},
}

# the calibrated MODEL before the pair-kernel rewrite (commit ee90289, launch 0.99 ms, 10.9 GB/s;
# useful fraction then counted issued FLOPs at the tiles' actual sizes): shape, target ->
# (seconds, launches, Tensor Engine useful fraction)
BEFORE = {
    ("small", "trn1"): (0.0468, 8, 0.030), ("small", "trn2"): (0.0483, 8, 0.030),
    ("medium", "trn1"): (2.4787, 608, 0.204), ("medium", "trn2"): (2.5325, 608, 0.204),
    ("large", "trn1"): (18.9585, 4824, 0.175), ("large", "trn2"): (19.4071, 4824, 0.175),
}
# the calibrated MODEL before Trainium round 3 (issue 27; results of commit 753c3c2, each trace on
# its own target): shape, target, transform -> seconds, or why it did not run
BEFORE_ROUND3 = {
    ("small", "trn1", "exact"): 0.0102, ("small", "trn1", "plain fp32"): 0.0059,
    ("small", "trn2", "exact"): 0.0085, ("small", "trn2", "plain fp32"): 0.0058,
    ("medium", "trn1", "exact"): 0.3809, ("medium", "trn1", "plain fp32"): 0.2503,
    ("medium", "trn2", "exact"): 0.3127, ("medium", "trn2", "plain fp32"): 0.2200,
    ("large", "trn1", "exact"): 1.6851, ("large", "trn1", "plain fp32"): 1.1024,
    ("large", "trn2", "exact"): 1.2904, ("large", "trn2", "plain fp32"): 0.8942,
    ("big-virtual", "trn1", "exact"): "SBUF error", ("big-virtual", "trn2", "exact"): "SBUF error",
}
A10G = PUBLISHED["NVIDIA A10G fp32 (sibling, published)"]


def before_after_table(bench):
    """Calibrated MODEL at ee90289, before round 3 and now, each run on its own target, against the A10G."""
    rows = ["| shape | target | transform | MODEL at ee90289 (s) | launches then | useful fraction then | "
            "MODEL before round 3 (s) | MODEL now (s) | launches now | specializations now | "
            "useful fraction now (pair kernel) | upload visible / hidden now (s) | "
            "now without the (mn\\|P) upload (s) | A10G measured (s, sibling) |",
            "|---" * 14 + "|"]
    for r in sorted((r for r in bench if r.get("modelled")), key=_model_order):
        name, target = r["shape"].get("name", ""), r["device"]
        m = r["modelled"][target]
        before = BEFORE.get((name, target))
        round3 = BEFORE_ROUND3.get((name, target, transform(r)), "-")
        round3 = f"{round3:.4f}" if isinstance(round3, float) else round3
        upload = m.get("seconds_by_step", {}).get("ao2mo_kernel", {}).get("upload_seconds", 0.0)
        pair = m.get("by_kernel", {}).get("pair_energy_kernel", {}).get("tensor_engine_useful_fraction")
        b = (f"{before[0]:.4f} | {before[1]} | {before[2]:.3f}" if before else "- | - | -")
        rows.append(f"| {name} | {target} | {transform(r)} | {b} | {round3} | {m['seconds']:.4f} | "
                    f"{m['launches']} | {sum(r.get('kernel_specializations', {}).values())} | "
                    f"{m['tensor_engine_useful_fraction']:.3f} ({pair:.3f}) | "
                    f"{upload:.4f} / {m.get('hidden_upload_seconds', 0.0):.4f} | "
                    f"{m['seconds'] - upload:.4f} | {A10G.get(name, '-')} |")
    return "\n".join(rows)


def load_gpu(results_dir):
    """(reference_cuda.json or None, [gpu4pyscf_*.json records]): the NVIDIA GPU runs."""
    path = os.path.join(results_dir, "reference_cuda.json")
    reference = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
    sides = [json.load(open(p, encoding="utf-8")) for p in sorted(glob.glob(os.path.join(results_dir, "gpu4pyscf_*.json")))]
    return reference, sides


def reference_table(reference):
    """Per GPU reference set-up: E_corr in fp64, and each other precision's offset from it (uEh)."""
    runs = {(r["molecule"], r["basis"], r["precision"]): r for r in reference["runs"]}
    others = sorted({p for _, _, p in runs if p != "fp64"})
    rows = ["| molecule | basis | nbasis | E_corr fp64 (Eh) | E_tot fp64 (Eh) | "
            + " | ".join(f"{p} - fp64 (uEh)" for p in others) + " | fp64 run (s) |",
            "|---|---|---|---|---|" + "---|" * len(others) + "---|"]
    for (molecule, basis, precision), r in runs.items():
        if precision != "fp64":
            continue
        offsets = " | ".join(f"{(runs[(molecule, basis, p)]['e_corr'] - r['e_corr']) * 1e6:+.3f}"
                             if (molecule, basis, p) in runs else "-" for p in others)
        rows.append(f"| {molecule} | {basis} | {r['nbasis']} | {r['e_corr']:.10f} | {r['e_tot']:.10f} | {offsets} "
                    f"| {r['seconds']:.2f} |")
    return "\n".join(rows)


def gpu4pyscf_table(sides):
    """dfmp2 run --device cuda against gpu4pyscf (and PySCF on the host's cores) per molecule."""
    rows = ["| molecule | basis | contender | whole job median (s) | SCF (s) | DF-MP2 (s) | other / dfmp2 | "
            "E_tot - dfmp2's (Eh) |", "|---|---|---|---|---|---|---|---|"]
    for side in sides:
        for name, c in side["contenders"].items():
            t = c["timings"]
            mp2 = f"{t['mp2']:.3f}" + (f" (warm {t['mp2_warm']:.3f})" if "mp2_warm" in t else "")
            ratio = f"{c['ratio_to_dfmp2']:.2f}" if "ratio_to_dfmp2" in c else "-"
            delta = f"{c['de_tot_vs_dfmp2']:+.1e}" if "de_tot_vs_dfmp2" in c else "-"
            rows.append(f"| {os.path.basename(side['molecule'])} | {side['basis']} | {name} | {c['median_wall']:.2f} | "
                        f"{t['scf']:.3f} | {mp2} | {ratio} | {delta} |")
    return "\n".join(rows)


def gpu_section(reference, sides):
    """The NVIDIA GPU section: reference runs and the gpu4pyscf comparison (empty without them)."""
    if reference is None and not sides:
        return ""
    text = "\n## NVIDIA GPU\n"
    if reference is not None:
        host = reference["host"]
        text += (f"\nReference runs (`benchmarks/reference_runs.py`, `dfmp2 run` set-ups, all electrons, cc-pVXZ-RI "
                 f"and -JKFIT) on {host['gpu']} (driver {host['driver']}, CUDA {host['cuda']}, torch {host['torch']}, "
                 f"PySCF {host['pyscf']}), commit {host['commit'][:7]}, {host['date']}. tests/test_gpu_references.py "
                 "holds the CPU's fp64 to 1e-8 Eh and emulated Trainium to 1 uEh of these.\n\n"
                 f"{reference_table(reference)}\n")
    if sides:
        text += ("\nWhole jobs, one process each, alternating (`benchmarks/bench_gpu4pyscf.py`; `dfmp2 run --device "
                 "cuda` in its default fp32 MP2 precision). other / dfmp2 > 1: dfmp2 is faster.\n\n"
                 f"{gpu4pyscf_table(sides)}\n")
    return text


def load(results_dir):
    bench, peers, kernels = [], [], []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        name = os.path.basename(path)
        if name.startswith("kernel_"):
            kernels.append(record)
        elif name.startswith("bench_"):
            bench.append(record)
        elif name.startswith("peer_"):
            peers.append(record)
        # whole_job_*, dropin_*, out_of_core_*: their own scripts' records, not tabulated here
    return bench, peers, kernels


def transform(record):
    """The AO->MO transform's arithmetic on Trainium: exact products (default) or plain fp32."""
    return "plain fp32" if record.get("transform") == "fp32" else "exact"


def label(record):
    if record.get("simulated"):
        return (f"{record['device']} (emulated{', model-only' if record.get('model_only') else ''}, "
                f"{transform(record)} transform)")
    return f"{record['device']} {record['precision']}"


def _model_order(r):
    return (SHAPE_ORDER.index(r["shape"].get("name") or "small"), r["device"], transform(r))


def bench_table(bench):
    rows = ["| shape | nbasis/nocc/naux | device | warm time (s) | pair-energy TFLOPS | "
            "of measured GEMM rate | calibrated MODEL (s) | old peak MODEL trn1 / trn2 (s) "
            "| e_corr (Eh) |",
            "|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (SHAPE_ORDER.index(r["shape"].get("name") or "small"), label(r))  # noqa: E731
    for r in sorted(bench, key=key):
        s = r["shape"]
        pair = r["stages"]["pair_energies"]
        tflops = f"{pair['tflops']:.3f}" if pair.get("tflops") and not r.get("simulated") else "-"
        time_s = "-" if r.get("simulated") else f"{r['total_seconds']:.3f}"
        peak = (f"{r['modelled_seconds']['trn1']:.4f} / {r['modelled_seconds']['trn2']:.4f}"
                if r.get("modelled_seconds") else "-")
        # a trace models the target it was emulated for (a trn2 trace runs on two cores, LNC=2)
        model = (f"{r['modelled'][r['device']]['seconds']:.4f} ({r['device']})" if r.get("modelled") else "-")
        fraction = r.get("pair_energies_fraction_of_gemm_rate")
        fraction = f"{100 * fraction:.0f}% of {r['device_gemm_tflops']:.3f}" if fraction else "-"
        rows.append(f"| {s.get('name', '')} | {s['nbasis']}/{s['nocc']}/{s['naux']} | {label(r)} | "
                    f"{time_s} | {tflops} | {fraction} | {model} | {peak} | {r['e_corr']:.10f} |")
    return "\n".join(rows)


def model_table(bench):
    """Calibrated model breakdown of the simulated runs (one row per shape and target)."""
    parts = ("launch", "host_transfer", "tensor_engine", "dma", "vector", "scalar", "device")
    rows = ["| shape | emulated on | transform | target | MODEL seconds (one core) | one chip, ideal split | "
            + " | ".join(parts) + " | launches | Tensor Engine useful fraction |",
            "|---" * (len(parts) + 8) + "|"]
    for r in sorted((r for r in bench if r.get("modelled")), key=_model_order):
        for target, m in r["modelled"].items():
            if target != r["device"]:  # a trace models the target it was emulated for (LNC differs)
                continue
            cells = " | ".join(f"{m['breakdown'][p]:.4f}" for p in parts)
            fraction = m["tensor_engine_useful_fraction"]
            chip = m.get("chip_seconds_ideal_split")
            chip = f"{chip:.4f} ({m['cores_per_chip']} cores)" if chip is not None else "-"
            rows.append(f"| {r['shape'].get('name', '')} | {r['device']} (nki {r.get('nki_api', '?')}) | "
                        f"{transform(r)} | {target} | {m['seconds']:.4f} | {chip} | {cells} | {m['launches']} | "
                        f"{fraction:.3f} |")
    return "\n".join(rows)


def step_table(bench):
    """Calibrated MODEL per kernel / transfer / device copy of each simulated run (its own target)."""
    rows = ["| shape | target | transform | step | MODEL seconds | launches |", "|---|---|---|---|---|---|"]
    for r in sorted((r for r in bench if r.get("modelled")), key=_model_order):
        m = r["modelled"].get(r["device"], {})
        for step, cost in sorted(m.get("seconds_by_step", {}).items(), key=lambda kv: -kv[1]["seconds"]):
            rows.append(f"| {r['shape'].get('name', '')} | {r['device']} | {transform(r)} | {step} | "
                        f"{cost['seconds']:.4f} | {cost['launches']} |")
    return "\n".join(rows)


def kernel_table(kernels):
    rows = ["| kernel | size | shape | target | nki | MODEL ms | launch | host transfer | device | "
            "published trn1 ms | model / published |", "|---" * 11 + "|"]
    for k in sorted(kernels, key=lambda k: (k["device"], k["kernel"], k["size"])):
        b = k["modelled"]["breakdown"]
        published = k.get("published_trn1_ms")
        rows.append(f"| {k['kernel']} | {k['size']} | {k['shape']} | {k['device']} | {k['nki_api']} | "
                    f"{k['modelled']['seconds'] * 1e3:.3f} | {b['launch'] * 1e3:.3f} | "
                    f"{b['host_transfer'] * 1e3:.3f} | {b['device'] * 1e3:.3f} | "
                    f"{published if published else '-'} | "
                    f"{k['model_over_published']:.2f} |" if published else
                    f"| {k['kernel']} | {k['size']} | {k['shape']} | {k['device']} | {k['nki_api']} | "
                    f"{k['modelled']['seconds'] * 1e3:.3f} | {b['launch'] * 1e3:.3f} | "
                    f"{b['host_transfer'] * 1e3:.3f} | {b['device'] * 1e3:.3f} | - | - |")
    return "\n".join(rows)


def stage_table(bench):
    rows = ["| shape | device | " + " | ".join(["integrals", "metric", "transform", "whiten",
                                                  "pair_energies"]) + " |", "|---|---|---|---|---|---|---|"]
    for r in bench:
        if r.get("simulated"):
            continue
        cells = [f"{v['seconds']:.3f} s / {v['gflop']:.1f} GF" for v in r["stages"].values()]
        rows.append(f"| {r['shape'].get('name', '')} | {label(r)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def peer_table(peers):
    rows = ["| molecule | peer | code | median (s) | peer / dfmp2 (median ratio) | e_corr (Eh) |",
            "|---|---|---|---|---|---|"]
    for p in peers:
        ratios = p.get("median_ratio_pyscf_over_dfmp2") or p.get("median_ratio_peer_over_dfmp2", {})
        peer = "PySCF (CPU)" if "median_ratio_pyscf_over_dfmp2" in p else "gpu4pyscf (GPU)"
        if p.get("reference") == "uhf":
            peer = "PySCF DFUMP2 (CPU)"
        shell = f" ({p['reference'].upper()}, charge {p['charge']}, 2S {p['spin']})" if p.get("spin") else ""
        for code, seconds in p["median_seconds"].items():
            ratio = f"{ratios[code]:.2f}" if code in ratios else "1.00"
            rows.append(f"| {p['molecule']} / {p['basis']}{shell} | {peer} | {code} | {seconds:.3f} | {ratio} | "
                        f"{p['e_corr'][code]:.10f} |")
    return "\n".join(rows)


def plot(bench, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    for r in bench:
        name = r["shape"].get("name")
        if name not in PLOT_SHAPES:
            continue
        if r.get("simulated"):
            if r.get("modelled"):
                series.setdefault(f"{r['device']} {transform(r)} transform (calibrated MODEL)", {})[name] = \
                    r["modelled"][r["device"]]["seconds"]
            if transform(r) == "exact":
                series.setdefault(f"{r['device']} (old peak MODEL)", {})[name] = \
                    r["modelled_seconds"][r["device"]]
        else:
            series.setdefault(label(r) + " (measured)", {})[name] = r["total_seconds"]
    for name, values in PUBLISHED.items():
        series[name] = values
    for name, values in sorted(series.items()):
        shapes = [s for s in PLOT_SHAPES if s in values]
        style = "--" if "MODEL" in name else (":" if "published" in name else "-")
        ax.plot([PLOT_SHAPES.index(s) for s in shapes], [values[s] for s in shapes], style, marker="o",
                label=name)
    ax.set_xticks(range(3), ["small\n128/16/384", "medium\n512/64/1536", "large\n768/96/2304"])
    ax.set_yscale("log")
    ax.set_ylabel("warm time per DF-MP2 pass (s, log scale)")
    ax.set_title("dfmp2 bench: synthetic DF-MP2 shapes")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(HERE, "results"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    args = parser.parse_args(argv)
    bench, peers, kernels = load(args.results)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    png = os.path.splitext(args.out)[0] + "_time.png"
    plot(bench, png)
    machines = sorted({f"{r['machine']['cpu']}" for r in bench if "machine" in r})
    dates = sorted({r.get("date", "?") for r in bench})
    commits = sorted({r.get("commit", "?") for r in bench})
    text = f"""# Benchmarks

Generated by `benchmarks/make_page.py` from `benchmarks/results/*.json` (produced by
`benchmarks/run_benchmarks.py` and `benchmarks/bench_vs_pyscf.py`). Machine(s): {', '.join(machines) or '-'};
date(s): {', '.join(dates) or '-'}; commit(s): {', '.join(commits) or '-'}.

Times are warm medians of the whole pipeline (synthetic integrals, metric Cholesky, AO->MO
transform, whitening, pair energies). **Trainium rows are not measurements**: they are times
*modelled* from each NKI kernel's emulator trace. No Trainium hardware was used. Two models:

- **calibrated MODEL** (`modelled` in the JSON): per kernel call, launch + host<->device
  transfer of the arguments not already in device HBM + the busiest engine (Tensor Engine per streamed
  column, DMA at 65% of bandwidth, Vector/Scalar per element, each instruction a 64-cycle fixed
  cost), engines overlapping, launch and transfers not. Launch cost and transfer rate are fitted
  to measured trn1 GEMM calls (see Calibration below); everything else comes from AWS's guides.
- **old peak MODEL** (`modelled_seconds`): the trace at published peaks with perfect overlap and
  no launch cost, kept for comparison: it was 4-10x optimistic.

## Synthetic shapes (`dfmp2 bench`)

{bench_table(bench)}

Published by the sibling libraries for the same shapes (their measurements, not ours):
{chr(10).join(f'- {k}: ' + ', '.join(f'{s} {v} s' for s, v in vals.items()) for k, vals in PUBLISHED.items())}
(large on trn1: only a CPU fallback was published).

![time per shape]({os.path.basename(png)})

## Calibrated Trainium model: where the time goes (MODEL, seconds)

The engine columns are busy times of engines that run concurrently; `device` is the sum over
calls of the busiest engine, and MODEL seconds = launch + host_transfer + device.

{model_table(bench)}

### Before and after (MODEL): the pair-kernel rewrite, then Trainium round 3

Three states. "ee90289": before the pair-kernel rewrite (a pair-energy launch per small block
pair with a second (ib|ja) matmul chain and padding to 512, B copied from the host for every
launch, fp32 (mn|P) slices). "Before round 3": the results of commit 753c3c2, before issue 27
(each (ia|jb) formed once, B resident in HBM, 32 x 32-pair launches split over the two physical
cores of a trn2 logical core, (mn|P) as dense int8 digits, fp32 slice products, the upload
serial with the kernels; the exact transform's resident C slices stopped nbasis 1,408 with an
SBUF error). "Now": C_vir streamed (any size), only the lower 128 x 128 tiles of (mn|P) uploaded,
bf16 slice products, and each ao2mo launch's upload overlapped with the previous launch (a
MODEL of an asynchronous runtime, not a measurement: the hidden seconds have their own column).
The useful fraction counts the 128 x 128 array per streamed column (a ragged tile's empty rows
are waste); the pair kernel's own figure is in brackets. Two transforms: `exact` (the default:
35 slice products per (mn|P) tile for exact sums, needed for 1 uEh on diffuse and large basis
sets, see docs/trainium.md; the lower tiles of (mn|P) cross as 5 int8 digits per element) and
`plain fp32` (`--transform fp32`: one fp32 product per half, the arithmetic of the A10G's fp32
run; every tile crosses, 4 bytes per element). "Without the upload" subtracts the visible
host -> device transfer of (mn|P), the one step whose cost is the host link rather than the
NeuronCore.

{before_after_table(bench)}

Per step (each run on the target it was emulated for: a trn2 trace splits its launches over
the two physical cores of a logical NeuronCore, LNC=2; trn1 runs LNC=1). A kernel's row holds
its launches, the host -> device transfer of its arguments that were not already in device
HBM, and its device time; "host<->device transfer" is everything else that crossed (L, results);
"device copy" the layout changes into and out of the three-center tensor in HBM.

{step_table(bench)}

## Calibration (`dfmp2 bench --kernel NAME --size N --device trn1|trn2 --simulate`)

Per-call MODEL of single kernel calls. The two trn1 GEMM rows are the calibration: a sibling
library measured its NKI GEMM on trn1.2xlarge (neuronx-cc 2.24, warm): 512^3 1.3 ms and 1024^3
2.3 ms per call. Modelling dfmp2's gemm_kernel at those sizes leaves two unknowns, the launch
cost and the host<->device rate, fitted to the two figures: 0.982 ms and 10.30 GB/s (the
published "~1-3 ms per call" launch estimate agrees). Sources of the other constants: Tensor
Engine rate = bf16 peak / (2 x 128 x 128) columns per second, fp32 4x slower (92 and 79
TFLOPS bf16 per core); DMA: 16 engines x 27.2 GB/s, capped by the core's share of HBM (820 GB/s
per trn1 chip of 2 cores, 2.9 TB/s per trn2 chip of 8), at 65% efficiency; engine clocks 1.12
GHz (trn1) / 0.96 GHz (trn2); 64 cycles fixed cost per instruction (performance guide: 60-100).
trn2 uses the trn1 launch and transfer figures: no trn2 per-call measurement is published.
The TRSM row is a check, not a calibration, and it disagrees by design: the sibling's 18.7 ms
TRSM (0.13-0.38 TFLOPS) is its own, much slower kernel; dfmp2's trsm_kernel does one
Tensor-Engine matmul per 128-block pair with host-inverted diagonal blocks.

{kernel_table(kernels) if kernels else 'No kernel results yet.'}

## Per stage (seconds / GFLOP)

{stage_table(bench)}

## Peers on molecules (same MP2-fit auxiliary basis, alternating runs)

{peer_table(peers) if peers else 'No peer results yet.'}
{gpu_section(*load_gpu(args.results))}"""
    with open(args.out, "w", encoding="utf-8") as out:
        out.write(text)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
