"""Which library runs a CPU's GEMMs fastest at dfmp2's shapes (issue 61, item 1): torch's (MKL
in the pinned wheel) against numpy's OpenBLAS through zero-copy views, each in fp32 and fp64, with
OpenBLAS's kernels as detected and forced to Haswell (AVX2), on a square GEMM (n = 2048) and on
the SCF build's two GEMMs at naphthalene/cc-pVTZ's block shape ([r, n] x [nP; n, n], then
[n, nP r] x [nP r, n]; n 412, r 34, nP 23). Each setting runs in its own process (OpenBLAS reads
its variables at load), with dfmp2's thread defaults, timed by the harness (quiet or no result).

    python benchmarks/bench_gemm_libraries.py --json benchmarks/results/gemm_libraries_cpu_amd_epyc.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import Harness, bench_environment, main_guard  # noqa: E402

PROBE = r"""
import json, sys, time
import dfmp2  # its thread defaults, as in a run
import numpy as np, torch
from threadpoolctl import threadpool_info

def best(call, repeat=4):
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter(); call(); times.append(time.perf_counter() - start)
    return min(times)

rng = np.random.default_rng(0)
n, r, nP = 412, 34, 23
out = {"openblas": sorted({i.get("architecture", "") for i in threadpool_info() if i.get("internal_api") == "openblas"}),
       "torch_threads": torch.get_num_threads()}
for kind, dtype in (("fp32", np.float32), ("fp64", np.float64)):
    a, b = (rng.standard_normal((2048, 2048)).astype(dtype) for _ in range(2))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    flops = 2 * 2048 ** 3
    out[f"square_{kind}_numpy"] = flops / best(lambda: a @ b) / 1e9
    out[f"square_{kind}_torch"] = flops / best(lambda: ta @ tb) / 1e9
    factor, block = rng.standard_normal((n, r)).astype(dtype), rng.standard_normal((nP, n, n)).astype(dtype)
    tf, tblock = torch.from_numpy(factor), torch.from_numpy(block)

    def numpy_build():
        half = np.matmul(factor.T, block).reshape(-1, n)
        return half.T @ half.copy()  # (a copy: not numpy's SYRK, which the torch side does not get)

    def torch_build():
        half = torch.matmul(tf.t(), tblock).reshape(-1, n)
        return half.t() @ half

    flops = 4 * nP * n * n * r
    out[f"scf_build_block_{kind}_numpy"] = flops / best(numpy_build) / 1e9
    out[f"scf_build_block_{kind}_torch"] = flops / best(torch_build) / 1e9
json.dump(out, open(sys.argv[1], "w"))
"""

SETTINGS = {"detected": {"OPENBLAS_CORETYPE": None}, "Haswell": {"OPENBLAS_CORETYPE": "Haswell"}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    harness = Harness(rounds=args.rounds, warmup=1)
    harness.wait_for_quiet()

    out = tempfile.mkdtemp(prefix="gemm-libraries-")
    atexit.register(shutil.rmtree, out, True)

    def call(name, changes):  # each setting in its own process: OpenBLAS reads its variables at load
        path = os.path.join(out, f"{name}.json")
        return lambda: harness.process([sys.executable, "-c", PROBE, path], bench_environment(changes), None,
                                       lambda: json.load(open(path)))

    timed = harness.alternate({name: call(name, changes) for name, changes in SETTINGS.items()})
    rates = {}
    for name, runs in timed.items():
        keys = [k for k in runs[0].payload if k.startswith(("square", "scf_build"))]
        rates[name] = {"openblas": runs[0].payload["openblas"], "torch_threads": runs[0].payload["torch_threads"],
                       **{k: round(max(r.payload[k] for r in runs), 1) for k in keys}}
    result = {"gflops_best_of_rounds": rates}
    full = harness.write(args.json, result) if args.json else {**result, **harness.record()}
    print(f"{full['machine'].get('cpu', '')}")
    for name, values in rates.items():
        print(name, values)


if __name__ == "__main__":
    main_guard(main)
