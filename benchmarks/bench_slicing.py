"""The host's exact-product slicing on a quiet machine: `ozaki.split_digits` (blocks of
BLOCK_ELEMENTS on the host's threads) against the one-pass loop it replaced, on an (mn|P)-sized
operand, at 1 and 2 threads; the digits must be the same bits.

    python benchmarks/bench_slicing.py --json     # benchmarks/results/slicing_split_digits.json

The operand: benzene/cc-pVTZ's packed lower (mn|P) tiles for the AO->MO transform are about
[naux 660, 35,000 packed pairs]; the default shape is that. Alternating rounds, medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Harness, main_guard  # noqa: E402

import torch  # noqa: E402

from dfmp2.kernels.nki import ozaki  # noqa: E402
from dfmp2.kernels.nki.tiles import SLICE_BITS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def one_pass_digits(a, exponent, count):
    """The loop `split_digits` ran before (one slice at a time over the whole array)."""
    rest = np.array(a, dtype=np.float64, copy=True)
    digits = np.empty((count,) + a.shape, dtype=np.int8)
    for s in range(count):
        grid = np.exp2(exponent - SLICE_BITS * (s + 1))
        digit = np.rint(rest / grid)
        digits[s] = digit
        rest -= digit * grid
    return digits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=660)
    parser.add_argument("--columns", type=int, default=35000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.rows, args.columns)) * np.exp(rng.uniform(-15, 0, (args.rows, args.columns)))
    exponent = ozaki.digit_exponent(np.abs(a).max(axis=1))[:, None]
    reference = one_pass_digits(a, exponent, ozaki.X_DIGITS)
    harness = Harness(rounds=args.rounds, warmup=1, blas_settings={})
    harness.wait_for_quiet()

    def blocked(threads):
        def call():
            torch.set_num_threads(threads)
            digits = ozaki.split_digits(a, exponent, ozaki.X_DIGITS)
            assert np.array_equal(digits, reference), "blocked digits differ from the one-pass digits"
            return None, None
        return call

    def one_pass():
        one_pass_digits(a, exponent, ozaki.X_DIGITS)
        return None, None

    runs = harness.alternate({"one_pass": one_pass,
                              "blocked_1_thread": blocked(1), "blocked_2_threads": blocked(2)})
    medians = {name: statistics.median(r.seconds for r in timed) for name, timed in runs.items()}
    record = {"shape": [args.rows, args.columns], "digits": ozaki.X_DIGITS, "block_elements": ozaki.BLOCK_ELEMENTS,
              "median_seconds": {k: round(v, 4) for k, v in medians.items()},
              "speedup_over_one_pass": {k: round(medians["one_pass"] / v, 2) for k, v in medians.items()
                                        if k != "one_pass"},
              "note": "measured on this machine, quiet (harness); the digits are bit for bit the one-pass digits"}
    print(record)
    if args.json:
        path = os.path.join(HERE, "results", "slicing_split_digits.json")
        harness.write(path, record)
        print(f"wrote {path}")


if __name__ == "__main__":
    main_guard(main)
