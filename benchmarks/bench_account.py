"""Where `dfmp2 run` spends its time against this machine's limits (issue 61, item 2): each step's
seconds (from the run's own record), its flops and bytes moved (counted from the shapes below),
and the share of this machine's measured GEMM rate at the step's own shapes (the SCF builds' and
the pair energies' GEMMs; a square GEMM of the precision for the triangular solves and the
transform), or of its measured memory bandwidth, for the CPU at hand. Quiet machine or no result (benchmarks/harness.py).

    python benchmarks/bench_account.py examples/naphthalene.xyz --basis cc-pvtz --rounds 2 \
        --json benchmarks/results/account_naphthalene_ccpvtz_cpu_amd_epyc.json

`dfmp2 run MOLECULE --json` runs as typed (no BLAS setting changed), --rounds times after a
warm-up; the run with the median wall time gives the steps. Then, in this process (torch, as
dfmp2's CPU backend; 2 threads here), each step's GEMMs at its own shapes on random data, and
the memory bandwidth: a copy into touched pages, and the first touch of fresh ones.

Counted (RHF; n = nbasis, X = the JK-fit functions, r = the SCF's occupied orbitals, o and v the
correlated occupied and virtual orbitals, Y = the MP2-fit functions, p = n (n + 1) / 2):
  SCF whitening     X^2 p flops (fp64 TRSM)                       B = (mn|P) L^-T
  SCF store         read X p fp64, write X n^2 fp32               the fp32 square copy of B
  SCF build         4 X n^2 r flops in the build's kind           X^P = C^T B^P,  K = sum_P X^P^T X^P
                    + J: two passes over the fp64 triangle        rho = B D,  J = rho B
  SCF increment     4 X n^2 r flops in fp32 (+ J as above)        Y^P = E^T B^P,  M = sum (X_a + Y/2)^T Y
  MP2 transform     2 Y n^2 o + 2 Y n o v flops (fp64)            (P|ia) = C_i^T (P|mn) C_a
  MP2 whitening     Y^2 o v flops (TRSM in the run's precision)
  MP2 pair energies 2 Y v^2 o (o + 1) / 2 flops (fp32 GEMMs)      (ia|jb) = sum_P B_ia^P B_jb^P, i <= j
The rest of the SCF step (PySCF's driver: Fock diagonalisation, DIIS, energies) and the start-up
(Python, imports, basis sets, output) are seconds without a count. The floor: the wall time were
every counted step at this machine's limit (each GEMM step at the square GEMM rate of its
precision, each memory step at the copy rate) and the uncounted ones as measured.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import add_arguments, from_arguments, main_guard  # noqa: E402

import dfmp2  # noqa: E402,F401  (its thread defaults, before torch loads, as in a run)


def best_seconds(call, repeat=3) -> float:
    call()  # warm-up: pages touched, libraries loaded
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def machine_limits(shapes) -> dict:
    """This machine's GEMM rates (GFLOP/s) at each step's shapes, the best of every library dfmp2
    can run a CPU product on (kernels.torch.cpu_libraries; each one's in "gemm_libraries"), and its memory
    bandwidth (GB/s), on random data. shapes: the run's sizes (`run_shapes`)."""
    import torch

    from dfmp2.kernels.torch.fitted import TorchFittedStore

    from dfmp2.kernels.torch.cpu_libraries import _CALLS, _takes

    n, X, r, Y, o, v = (shapes[k] for k in ("n", "X", "r", "Y", "o", "v"))
    rates, libraries = {}, {}

    def best_rate(name, flops, operands, step):
        """The best GFLOP/s any installed library reaches on step(matmul) (issue 73: the floor at
        the best library's rate, not torch's alone); the library is recorded."""
        found = {lib: flops / best_seconds(lambda call=call: step(call)) / 1e9
                 for lib, call in _CALLS.items() if _takes(lib, *operands)}
        libraries[name] = {lib: round(rate, 1) for lib, rate in found.items()}
        rates[name] = max(found.values())

    for kind, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        best_rate(f"square_gemm_{kind}", 2 * 2048 ** 3, (a, b), lambda mm: mm(a, b))
    # the SCF build's two GEMMs over every auxiliary block, at the block size the store uses
    rows = TorchFittedStore._block_rows(SimpleNamespace(_file=None, nao=n), r)
    for kind, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        block = torch.randn(rows, n, n, dtype=dtype)
        factor = torch.randn(n, r, dtype=dtype)

        def build(mm):
            for _ in range(0, X, rows):
                half = mm(factor.transpose(0, 1), block)
                flat = half.reshape(-1, n)
                mm(flat.transpose(0, 1), flat.clone())

        best_rate(f"scf_build_gemms_{kind}", 4 * X * n * n * r, (factor, block), build)
    rates["scf_build_block_rows"] = rows
    lower = torch.randn(X, X, dtype=torch.float64).tril_() + X * torch.eye(X, dtype=torch.float64)
    columns = torch.randn(4096, X, dtype=torch.float64)
    rates["trsm_fp64"] = X * X * 4096 / best_seconds(
        lambda: torch.linalg.solve_triangular(lower.transpose(0, 1), columns, upper=True, left=False)) / 1e9
    left, right = torch.randn(8 * v, Y, dtype=torch.float32), torch.randn(8 * v, Y, dtype=torch.float32)
    best_rate("pair_gemm_fp32", 2 * (8 * v) ** 2 * Y, (left, right), lambda mm: mm(left, right.transpose(0, 1)))
    # memory: a copy into touched pages (read + write), the first touch of fresh pages (write)
    source = torch.randn(64 * 2 ** 20, dtype=torch.float64)  # 512 MiB
    target = torch.empty_like(source).fill_(0.0)
    bandwidth = {"copy_gbs": 2 * source.numel() * 8 / best_seconds(lambda: target.copy_(source)) / 1e9,
                 "first_touch_gbs": source.numel() * 8 / best_seconds(
                     lambda: torch.empty_like(source).fill_(1.0)) / 1e9}
    triangle = torch.randn(X, n * (n + 1) // 2, dtype=torch.float64)
    density = torch.randn(1, triangle.shape[1], dtype=torch.float64)
    coulomb = best_seconds(lambda: (density @ triangle.transpose(0, 1)) @ triangle)
    bandwidth["coulomb_pass_gbs"] = 2 * triangle.numel() * 8 / coulomb / 1e9
    return {"gemm_gflops": {k: round(x, 1) for k, x in rates.items()}, "gemm_libraries": libraries,
            "memory": {k: round(x, 1) for k, x in bandwidth.items()}, "threads": torch.get_num_threads()}


def run_shapes(record) -> dict:
    builds = record.get("scf_builds") or {}
    o, v = record["nocc"], record["nvir"]
    return {"n": record["nbasis"], "X": builds.get("naux", 0), "r": record["nocc"] + record.get("nfrozen", 0),
            "Y": record["naux"], "o": o, "v": v}


def account(record, wall, limits) -> list:
    """Rows {step, seconds, flops, bytes, gflops, of_rate, gbs, of_bandwidth, limit} of a run."""
    s = run_shapes(record)
    n, X, r, Y, o, v = (s[k] for k in ("n", "X", "r", "Y", "o", "v"))
    p = n * (n + 1) // 2
    gemm, memory = limits["gemm_gflops"], limits["memory"]
    timings, builds = record["timings"], record.get("scf_builds") or {}
    mp2 = "fp64" if record.get("precision") == "fp64" else "fp32"  # the MP2 step's B and its whitening
    rows = []

    def row(step, seconds, flops=None, moved=None, rate=None, bandwidth=None, count=1):
        rows.append({"step": step, "seconds": round(seconds, 3), **({"count": count} if count != 1 else {}),
                     **({"gflop": round(flops / 1e9, 2), "gflops": round(flops / seconds / 1e9, 1),
                         "of_rate": round(flops / seconds / 1e9 / gemm[rate], 2), "rate": rate}
                        if flops and seconds > 0 else {}),
                     **({"gb": round(moved / 1e9, 2), "gbs": round(moved / seconds / 1e9, 1),
                         "of_bandwidth": round(moved / seconds / 1e9 / memory[bandwidth], 2), "bandwidth": bandwidth}
                        if moved and seconds > 0 else {})})

    early = builds.get("integral_seconds")
    if early is not None:
        row("SCF: JK-fit integrals (libcint, early thread; wall, overlapping the start-up)", early)
        row("SCF set-up: waiting for them", builds.get("integral_wait_seconds", 0.0))
    row("SCF set-up: metric + whitening (fp64 TRSM)", builds.get("whitening_seconds", 0.0), flops=X * X * p,
        rate="square_gemm_fp64")
    row("SCF set-up: fp32 square of B", builds.get("store_seconds", 0.0), moved=X * p * 8 + X * n * n * 4,
        bandwidth="first_touch_gbs")
    kinds, seconds = builds.get("build_kinds", []), builds.get("build_seconds", [])
    # J: one pass (rho from K's half transforms, `TorchFittedStore.coulomb_form`) or two (rho, J)
    passes = "pass" if builds.get("coulomb", "").startswith("rho") else "rho pass, J pass"
    for kind, rate in (("fp32", "scf_build_gemms_fp32"), ("fp64", "scf_build_gemms_fp64"),
                       ("incremental", "scf_build_gemms_fp32")):
        mine = [t for k, t in zip(kinds, seconds) if k == kind]
        if mine:
            each = statistics.median(mine)
            row(f"SCF build {kind} (x{len(mine)}, median; K GEMMs + J)", each, flops=4 * X * n * n * r, rate=rate,
                count=len(mine))
            row(f"  of which J's {passes} over the fp64 triangle (measured alone)",
                len(passes.split(",")) * X * p * 8 / memory["coulomb_pass_gbs"] / 1e9,
                moved=len(passes.split(",")) * X * p * 8, bandwidth="copy_gbs", count=len(mine))
    setup = builds.get("setup_seconds", 0.0)
    row("SCF: the rest (PySCF's driver: diagonalisation, DIIS, energies; guess)",
        timings["scf"] - setup - sum(seconds))
    row("MP2: integrals (libcint)", timings.get("integrals", 0.0))
    row("MP2: metric (Cholesky)", timings.get("metric", 0.0), flops=Y ** 3 / 3, rate="square_gemm_fp64")
    row("MP2: AO->MO transform (fp64)", timings.get("transform", 0.0), flops=2 * Y * n * n * o + 2 * Y * n * o * v,
        rate="square_gemm_fp64")
    row(f"MP2: whitening ({mp2} TRSM)", timings.get("whiten", 0.0), flops=Y * Y * o * v, rate=f"square_gemm_{mp2}")
    row("MP2: pair energies (fp32 GEMMs + fp64 sums)", timings.get("pair_energies", 0.0),
        flops=2 * Y * v * v * o * (o + 1) // 2, rate="pair_gemm_fp32")
    steps = timings["scf"] + timings["mp2"] + max(0.0, (early or 0.0) - builds.get("integral_wait_seconds", 0.0))
    row("start-up and output (wall less the SCF and MP2 steps and the early integrals' own time)",
        max(0.0, wall - steps))
    row("whole job (wall)", wall)
    return rows


def floor_seconds(rows, limits) -> dict:
    """The whole job's wall time were every counted step at this machine's limit: each GEMM step's
    flops at the square GEMM rate of its precision (the fastest shape measured), each memory step's
    bytes at the copy rate, the steps without a count (the integrals, PySCF's driver, the start-up
    and output) as measured; builds counted as often as they ran. -> {seconds, counted, uncounted}."""
    gemm, copy = limits["gemm_gflops"], limits["memory"]["copy_gbs"]
    counted = uncounted = 0.0
    for r in rows:
        if r["step"].startswith(("whole job", "SCF set-up: waiting")):
            continue
        count = r.get("count", 1)
        if "gflop" in r:
            precision = "fp64" if r["rate"].endswith("fp64") else "fp32"
            counted += count * r["gflop"] / gemm[f"square_gemm_{precision}"]
        elif "gb" in r:
            counted += count * r["gb"] / copy
        else:
            uncounted += r["seconds"]
    return {"seconds": round(counted + uncounted, 2), "counted": round(counted, 2), "uncounted": round(uncounted, 2)}


def markdown(rows) -> str:
    lines = ["| step | seconds | GFLOP | GFLOP/s | of the GEMM rate at its shapes | GB | GB/s | of the bandwidth |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['seconds']:.3f} | {r.get('gflop', '')} | {r.get('gflops', '')} | "
                     f"{r.get('of_rate', '')}{' (' + r['rate'] + ')' if 'rate' in r else ''} | {r.get('gb', '')} | "
                     f"{r.get('gbs', '')} | {r.get('of_bandwidth', '')}"
                     f"{' (' + r['bandwidth'] + ')' if 'bandwidth' in r else ''} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("molecule")
    parser.add_argument("--basis", default="cc-pvdz")
    add_arguments(parser, rounds=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--from-result", default=None,
                        help="recount the account of a result this script wrote (its run and limits), no runs")
    args = parser.parse_args(argv)
    if args.from_result:
        result = json.load(open(args.from_result))
        shapes, run = result["shapes"], result["run"]
        for key, value in (("nbasis", shapes["n"]), ("nocc", shapes["o"]), ("nvir", shapes["v"]),
                           ("naux", shapes["Y"]), ("nfrozen", shapes["r"] - shapes["o"])):
            run.setdefault(key, value)
        result["account"] = account(run, sorted(result["seconds"])[(len(result["seconds"]) - 1) // 2],
                                    result["limits"])
        result["floor"] = floor_seconds(result["account"], result["limits"])
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(result, handle, indent=1)
                handle.write("\n")
        print(markdown(result["account"]))
        print(f"floor (every counted step at this machine's limit): {result['floor']}")
        return
    molecule = os.path.abspath(args.molecule)
    out = tempfile.mkdtemp(prefix="account-")
    atexit.register(shutil.rmtree, out, True)
    harness = from_arguments(args)
    command = [os.path.join(os.path.dirname(sys.executable), "dfmp2"), "run", molecule, "--basis", args.basis,
               "--quiet", "--json", os.path.join(out, "dfmp2.json")]
    timed = harness.alternate({"dfmp2": lambda: harness.process(
        command, None, None, lambda: json.load(open(os.path.join(out, "dfmp2.json"))))})["dfmp2"]
    middle = sorted(timed, key=lambda run: run.seconds)[(len(timed) - 1) // 2]
    record = middle.payload
    limits = harness.measure("limits", 1, lambda: (None, machine_limits(run_shapes(record)))).payload
    rows = account(record, middle.seconds, limits)
    result = {"molecule": os.path.relpath(molecule, os.path.dirname(HERE)), "basis": args.basis,
              "seconds": [round(r.seconds, 3) for r in timed], "shapes": run_shapes(record),
              "limits": limits, "account": rows, "floor": floor_seconds(rows, limits),
              "run": {k: record.get(k) for k in ("timings", "scf_builds", "scf_iterations", "precision", "device_description",
                                                 "cpu_configuration", "e_tot", "nbasis", "nocc", "nvir", "naux",
                                                 "nfrozen")}}
    full = harness.write(args.json, result) if args.json else {**result, **harness.record()}
    print(f"{full['machine'].get('cpu', '')}: shapes {result['shapes']}")
    print(f"limits: {limits}")
    print(markdown(rows))
    print(f"floor (every counted step at this machine's limit): {result['floor']}")


if __name__ == "__main__":
    main_guard(main)
