"""FP8 slices on Trn3 (NeuronCore-v4): would 4-bit slices in float8_e4m3fn serve dfmp2's exact
(Ozaki-sliced) products better than today's 7-bit slices in bf16? Errors measured on dfmp2's NKI
emulator under trn3's rules against numpy's fp64 X^T Y; Tensor Engine time from the calibrated cost
MODEL (`cost_model.call_seconds`), never a measurement.

Schemes, for X [K, M] and Y [K, N] in fp64, each column cut along the contraction K with one power
of two per column (2^e, e = ceil(log2 max_k |a_km|)):

  bf16   today's scheme: S = 5 int8 digits of 7 bits (ozaki.column_digits), slices in bf16 in SBUF,
         pairs s + t <= S - 1 on the Tensor Engine (kernels.nki.kernels.exact_matmul_kernel, unchanged).
  fp8    digits d_s with a_km = 2^e (sum_s d_s 2^(-4 - b s) + r): the first |d_0| <= 16, the others
         |d_s| <= 2^(b - 1); every digit an integer of magnitude <= 16, exact in float8_e4m3fn (4
         significant bits). b = 4 (radix 16, the issue's "4-bit slices": 35 bits at S = 9) or b = 5
         (radix 32 with balanced digits in [-16, 16]: every one still exact in e4m3fn, 35 bits at
         S = 7). The digits stay integers on the device (fp8's exponent range, 2^-9 to 448, cannot
         hold a slice's weight): each PSUM group g = s + t holds an integer sum, scaled by its weight
         2^(-8 - b g) on the Scalar Engine (exact) and added into hi + lo by TwoSum (Vector Engine).
         perf_mode=double_row (fp8 only: 256 contraction rows per instruction) as a variant.

PSUM exactness: a group's sum is an integer; it is exact in fp32 while its magnitude stays <= 2^24.
`group_bound` is the largest |sum_(s+t=g) d_s d_t| per contraction row; `max_chunk` the 128-row (or
256-row, double_row) tiles one PSUM sum may take so that rows x bound <= 2^24 (radix 16, S = 9:
704 per row, 186 tiles; today's bf16 kernel: 4 tiles).

    python benchmarks/bench_fp8_slices.py --json benchmarks/results/fp8_slices_trn3.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import nki_emulator as nki  # noqa: E402
from dfmp2.kernels.nki import model as cost_model  # noqa: E402
from nki_emulator.core import TARGETS  # noqa: E402
from dfmp2.kernels.nki.launch import load_kernels  # noqa: E402
from dfmp2.kernels.nki.ozaki import column_digits  # noqa: E402

nl = nki.language
nisa = nki.isa

P = 128  # partitions
FREE = 512  # fp32 columns of one PSUM bank
FIRST_DIGIT = 16  # |d_0| <= 16: the largest integer up to which every integer is exact in e4m3fn
EXACT_SUM = 2 ** 24  # an fp32 sum of integers is exact while it stays within 2^24
RESIDENT_BYTES = 64 * 1024  # per partition: a moving operand up to this stays in SBUF (as exact_matmul_kernel)
TARGET = "trn3"
API = "0.6"


# ---- host side: digits, PSUM bounds, the scheme's value ------------------------------------------
def fp8_digits(a: np.ndarray, count: int, bits: int):
    """fp64 a [K, M] -> (int8 digits [count, K, M], exponents e [M]) with
    a[:, m] = 2^e_m (sum_s d_s 2^(-4 - bits s) + r), |r| <= 2^(-5 - bits (count - 1)),
    |d_0| <= 16 and |d_s| <= 2^(bits - 1) for s >= 1 (round to nearest on each grid)."""
    largest = np.abs(a).max(axis=0)
    exponent = np.ceil(np.log2(np.where(largest > 0, largest, 1.0)))
    rest = np.array(a, dtype=np.float64, copy=True)
    digits = np.empty((count,) + a.shape, dtype=np.int8)
    for s in range(count):
        grid = np.exp2(exponent - 4 - bits * s)
        digit = np.rint(rest / grid)
        digits[s] = digit
        rest -= digit * grid
    return digits, exponent


def digit_bounds(count: int, bits: int) -> list:
    return [FIRST_DIGIT] + [2 ** (bits - 1)] * (count - 1)


def group_bound(count: int, bits: int) -> int:
    """The largest |sum_(s + t = g) d_s d_t| of one contraction row over the groups g < count."""
    d = digit_bounds(count, bits)
    return max(sum(d[s] * d[g - s] for s in range(g + 1)) for g in range(count))


def max_chunk(count: int, bits: int, rows: int = P) -> int:
    """Tiles of `rows` contraction rows one exact PSUM sum may take: rows x tiles x group_bound <= 2^24."""
    return EXACT_SUM // (rows * group_bound(count, bits))


def group_weight(g: int, bits: int) -> float:
    return 2.0 ** (-8 - bits * g)


def scheme_value(xd, yd, bits):
    """The truncated product sum_(s + t < S) 2^(-8 - bits (s + t)) D_s^T E_t of the digits,
    exactly (Python integers per group, then one fp64 rounding per element of the total):
    what the kernel computes, before the columns' powers of two."""
    count = xd.shape[0]
    total = np.zeros((xd.shape[2], yd.shape[2]), dtype=object)
    for g in range(count):
        acc = sum(xd[s].astype(np.int64).T @ yd[g - s].astype(np.int64) for s in range(g + 1))
        total = total * (2 ** bits) + acc.astype(object)  # Horner in units of the last group's weight
    return (total.astype(np.float64) * group_weight(count - 1, bits)).astype(np.float64)


def truncation_bound(count: int, bits: int) -> float:
    """|X^T Y - scheme| <= K 2^(e_x + e_y) times this: the dropped pairs s + t >= S and the residuals
    (|x| <= 2^e per column, |r| <= 2^(-5 - bits (S - 1)))."""
    d = digit_bounds(count, bits)
    w = [2.0 ** (-4 - bits * s) for s in range(count)]
    dropped = sum(d[s] * w[s] * d[t] * w[t] for s in range(count) for t in range(count) if s + t >= count)
    r = 2.0 ** (-5 - bits * (count - 1))
    return dropped + 2 * r + r * r


# ---- the experiment kernel (emulated under trn3's rules) -------------------------------------------
def _psum_groups(count, width):
    """count PSUM accumulators [P, width], FREE // width side by side in each one-bank tile."""
    per_bank = FREE // width
    banks = [nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum) for _ in range((count + per_bank - 1) // per_bank)]
    return [banks[g // per_bank][:, (g % per_bank) * width:(g % per_bank + 1) * width] for g in range(count)]


def _load_digits(src, k, K, rows, c0, w, dst, first, stride, S, halves):
    """dst[0:n, s * stride + first, j, 0:w] = digits s of src rows k rows + j P ... (n of them), as
    float8_e4m3fn integers (exact: |d| <= 16) on the Scalar Engine; a double_row tile's short second
    half is zero-filled first (the contraction pads with zeros)."""
    for s in range(S):
        for j in range(halves):
            r0 = k * rows + j * P
            n = min(P, K - r0)
            if n < P and halves == 2 and j == 1:
                nisa.memset(dst=dst[0:min(P, K - k * rows), s * stride + first, j, 0:w], value=0.0)
            if n > 0:
                digits = nl.ndarray((P, w), dtype=nl.int8, buffer=nl.sbuf)
                nisa.dma_copy(dst=digits[0:n, 0:w], src=src[s, r0:r0 + n, c0:c0 + w])
                nisa.activation(dst=dst[0:n, s * stride + first, j, 0:w], op=nl.copy, data=digits[0:n, 0:w])


def _add_scaled(group, weight, hi, lo, w, first):
    """hi + lo += weight * group (PSUM; the product is exact: a power of two), by TwoSum."""
    R = hi.shape[0]
    g = nl.ndarray((P, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=g[0:R], op=nl.copy, data=group, scale=weight)
    if first:
        nisa.tensor_copy(dst=hi, src=g[0:R])
        nisa.memset(dst=lo, value=0.0)
        return
    total = nl.ndarray((P, w), dtype=nl.float32, buffer=nl.sbuf)
    b_part = nl.ndarray((P, w), dtype=nl.float32, buffer=nl.sbuf)
    a_part = nl.ndarray((P, w), dtype=nl.float32, buffer=nl.sbuf)
    err = nl.ndarray((P, w), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total[0:R], data1=hi, data2=g[0:R], op=nl.add)
    nisa.tensor_tensor(dst=b_part[0:R], data1=total[0:R], data2=hi, op=nl.subtract)
    nisa.tensor_tensor(dst=a_part[0:R], data1=total[0:R], data2=b_part[0:R], op=nl.subtract)
    nisa.tensor_tensor(dst=a_part[0:R], data1=hi, data2=a_part[0:R], op=nl.subtract)
    nisa.tensor_tensor(dst=err[0:R], data1=g[0:R], data2=b_part[0:R], op=nl.subtract)
    nisa.tensor_tensor(dst=err[0:R], data1=a_part[0:R], data2=err[0:R], op=nl.add)
    nisa.tensor_tensor(dst=lo, data1=lo, data2=err[0:R], op=nl.add)
    nisa.tensor_copy(dst=hi, src=total[0:R])


@nki.jit
def fp8_exact_matmul_kernel(x, y, bits, chunk, double):
    """out[0] + out[1] = sum_(s + t < S) 2^(-8 - bits (s + t)) X_s^T Y_t for int8 digits x [S, K, M]
    (stationary) and y [S, K, N] (moving), |d| <= 16, held as float8_e4m3fn in SBUF. Pairs of group
    g = s + t accumulate in PSUM group g over `chunk` contraction tiles (exact: see max_chunk); the
    groups are scaled by their weights and combined by TwoSum. double (1): perf_mode=double_row,
    256 contraction rows per matmul (tiles [K, 2, M] and [K, 2, N]). Moving tiles of 512 columns
    (256 when S > 8: S groups in at most 8 PSUM banks); y stays in SBUF when it fits RESIDENT_BYTES."""
    S, K, MX = x.shape
    NY = y.shape[2]
    halves = 2 if double == 1 else 1
    rows = P * halves
    nk = (K + rows - 1) // rows
    width = FREE if S <= 8 else FREE // 2
    mode = nisa.matmul_perf_mode.double_row if double == 1 else nisa.matmul_perf_mode.none
    out = nl.ndarray((2, MX, NY), dtype=nl.float32, buffer=nl.shared_hbm)
    resident = S * nk * halves * NY <= RESIDENT_BYTES
    if resident:
        y_sb = nl.ndarray((P, S * nk, halves, NY), dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
        for k in range(nk):
            _load_digits(y, k, K, rows, 0, NY, y_sb, k, nk, S, halves)
    for c0 in range(0, NY, width):
        w = min(width, NY - c0)
        for m0 in range(0, MX, P):
            rm = min(P, MX - m0)
            hi = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
            lo = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.sbuf)
            for k0 in range(0, nk, chunk):
                groups = _psum_groups(S, width)
                for k in range(k0, min(k0 + chunk, nk)):
                    rk = min(P, K - k * rows)
                    x_sb = nl.ndarray((P, S, halves, P), dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
                    _load_digits(x, k, K, rows, m0, rm, x_sb, 0, 1, S, halves)
                    if resident:
                        y_tiles, y0, ys, ycol = y_sb, k, nk, c0
                    else:
                        y_tiles = nl.ndarray((P, S, halves, width), dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
                        _load_digits(y, k, K, rows, c0, w, y_tiles, 0, 1, S, halves)
                        y0, ys, ycol = 0, 1, 0
                    for s in range(S):
                        for t in range(S - s):  # pairs s + t <= S - 1
                            if double == 1:
                                stationary = x_sb[0:rk, s, 0:2, 0:rm]
                                moving = y_tiles[0:rk, t * ys + y0, 0:2, ycol:ycol + w]
                            else:
                                stationary = x_sb[0:rk, s, 0, 0:rm]
                                moving = y_tiles[0:rk, t * ys + y0, 0, ycol:ycol + w]
                            nisa.nc_matmul(dst=groups[s + t][0:rm, 0:w], stationary=stationary, moving=moving,
                                           perf_mode=mode)
                for g in range(S):
                    _add_scaled(groups[g][0:rm, 0:w], group_weight(g, bits), hi[0:rm, 0:w], lo[0:rm, 0:w], w,
                                k0 == 0 and g == 0)
            nisa.dma_copy(dst=out[0, m0:m0 + rm, c0:c0 + w], src=hi[0:rm, 0:w])
            nisa.dma_copy(dst=out[1, m0:m0 + rm, c0:c0 + w], src=lo[0:rm, 0:w])
    return out


# ---- running the schemes --------------------------------------------------------------------------
def fp8_product(x, y, count, bits, double=False, chunk=None):
    """X^T Y (fp64 [M, N]) by the fp8 kernel on the emulated trn3, and the kernel's trace."""
    xd, ex = fp8_digits(x, count, bits)
    yd, ey = fp8_digits(y, count, bits)
    rows = 2 * P if double else P
    chunk = chunk or max_chunk(count, bits, rows)
    if chunk < 1:
        raise ValueError(f"S={count}, {bits}-bit digits: one {rows}-row tile already exceeds 2^24 in PSUM")
    with nki.target(TARGET, api=API):
        out = fp8_exact_matmul_kernel(xd, yd, bits, chunk, int(double))
    value = (out[0].astype(np.float64) + out[1].astype(np.float64)) * np.exp2(ex)[:, None] * np.exp2(ey)[None, :]
    return value, fp8_exact_matmul_kernel.last_trace, chunk


_BF16 = {}


def bf16_product(x, y, count=5):
    """X^T Y by dfmp2's exact_matmul_kernel (7-bit int8 digits, bf16 slices) on the emulated trn3."""
    if "module" not in _BF16:
        _BF16["module"] = load_kernels(simulate=True)
    kernel = _BF16["module"].exact_matmul_kernel
    xd, sx = column_digits(x, count)
    yd, sy = column_digits(y, count)
    with nki.target(TARGET, api=API):
        out = kernel(xd[:, None], yd[:, None])
    value = out[0, 0].astype(np.float64) + out[1, 0].astype(np.float64)
    value *= sx.astype(np.float64) * sy[:, 0].astype(np.float64)
    return value, kernel.last_trace


@contextlib.contextmanager
def double_row_cycles(cycles):
    """MODEL what-if: the cost model's cycles per double_row fp8 column set to `cycles`."""
    key = "float8_e4m3fn/double_row"
    before = cost_model.CYCLES_PER_COLUMN[key]
    cost_model.CYCLES_PER_COLUMN[key] = cycles
    try:
        yield
    finally:
        cost_model.CYCLES_PER_COLUMN[key] = before


def modelled(trace) -> dict:
    """MODEL: Tensor Engine cycles and the call's seconds on trn3 (cost_model.call_seconds)."""
    target = TARGETS[TARGET]
    cal = cost_model.CALIBRATIONS[TARGET]
    cycles = trace.instructions["tensor"] * cost_model.FIXED_CYCLES + cost_model._column_cycles(trace)
    parts = cost_model.call_seconds(trace, target)
    return {"matmul_instructions": trace.matmuls, "te_cycles_MODEL": int(cycles),
            "te_seconds_MODEL": cycles / cal.tensor_columns_per_s,
            "device_seconds_MODEL": parts["device"], "call_seconds_MODEL": parts["seconds"],
            "engine_seconds_MODEL": {k: parts[k] for k in ("tensor_engine", "dma", "vector", "scalar")},
            "moving_columns_by_key": dict(trace.matmul_columns_by_dtype)}


def errors(value, x, y) -> dict:
    """Errors of value against numpy's fp64 X^T Y: largest and rms, relative to the largest |X^T Y|
    element and elementwise to |X|^T |Y| (the scale an exact-product error is measured on)."""
    ref = x.T @ y
    err = np.abs(value - ref)
    scale = np.abs(x).T @ np.abs(y)
    return {"max_abs": float(err.max()), "rms_abs": float(np.sqrt(np.mean(err ** 2))),
            "max_rel_to_max_ref": float(err.max() / np.abs(ref).max()),
            "rms_rel_to_rms_ref": float(np.sqrt(np.mean(err ** 2)) / np.sqrt(np.mean(ref ** 2))),
            "max_rel_to_abs_product": float((err / np.where(scale > 0, scale, 1.0)).max())}


VARIANTS = [  # (name, kind, slices, bits, double_row)
    ("bf16_7bit_S5 (today)", "bf16", 5, 7, False),
    ("fp8_4bit_S6", "fp8", 6, 4, False),
    ("fp8_4bit_S7", "fp8", 7, 4, False),
    ("fp8_4bit_S8", "fp8", 8, 4, False),
    ("fp8_4bit_S9", "fp8", 9, 4, False),
    ("fp8_4bit_S9_double_row", "fp8", 9, 4, True),
    ("fp8_5bit_S6", "fp8", 6, 5, False),
    ("fp8_5bit_S7", "fp8", 7, 5, False),
    ("fp8_5bit_S7_double_row", "fp8", 7, 5, True),
    ("fp8_5bit_S8", "fp8", 8, 5, False),
    ("fp8_5bit_S8_double_row", "fp8", 8, 5, True),
]


def run_case(name, x, y, variants=VARIANTS):
    """Every variant on one product X^T Y: errors (emulated) and modelled time."""
    k, m = x.shape
    n = y.shape[1]
    ref32 = x.astype(np.float32).T @ y.astype(np.float32)
    case = {"case": name, "K": k, "M": m, "N": n,
            "fp32_plain_errors": errors(ref32.astype(np.float64), x, y), "variants": []}
    for label, kind, count, bits, double in variants:
        start = time.perf_counter()
        if kind == "bf16":
            value, trace = bf16_product(x, y, count)
            chunk = 4  # kernels.nki.kernels.CHUNK
        else:
            value, trace, chunk = fp8_product(x, y, count, bits, double)
        row = {"variant": label, "input_dtype": "bfloat16" if kind == "bf16" else "float8_e4m3fn",
               "slices": count, "digit_bits": bits, "double_row": double,
               "slice_pairs": count * (count + 1) // 2, "psum_chunk_tiles": chunk,
               "errors_emulated": errors(value, x, y), **modelled(trace),
               "emulator_wall_s": time.perf_counter() - start}
        if double:
            with double_row_cycles(2):
                alt = modelled(trace)
            row["te_seconds_MODEL_if_double_row_at_bf16_rate"] = alt["te_seconds_MODEL"]
            row["device_seconds_MODEL_if_double_row_at_bf16_rate"] = alt["device_seconds_MODEL"]
        if kind == "fp8":
            row["truncation_bound_rel"] = truncation_bound(count, bits)
        today = case["variants"][0] if case["variants"] else row
        row["ratio_to_today"] = {
            "te_seconds_MODEL": row["te_seconds_MODEL"] / today["te_seconds_MODEL"],
            "device_seconds_MODEL": row["device_seconds_MODEL"] / today["device_seconds_MODEL"],
            "max_rel_to_max_ref": (row["errors_emulated"]["max_rel_to_max_ref"]
                                   / today["errors_emulated"]["max_rel_to_max_ref"])}
        case["variants"].append(row)
        print(f"{name:28s} {label:26s} max_rel={row['errors_emulated']['max_rel_to_max_ref']:.2e} "
              f"te={row['te_seconds_MODEL'] * 1e6:9.1f} us  dev={row['device_seconds_MODEL'] * 1e6:9.1f} us "
              f"mm={row['matmul_instructions']}", flush=True)
    return case


def synthetic(k, m, n, decades, seed):
    """Random X [k, m], Y [k, n]: normal entries times 10^u, u uniform in [-decades, 0] per entry
    (a dynamic range like screened integrals'), each column scaled by a random power of ten."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((k, m)) * 10.0 ** rng.uniform(-decades, 0, (k, m)) * 10.0 ** rng.uniform(-2, 2, m)
    y = rng.standard_normal((k, n)) * 10.0 ** rng.uniform(-decades, 0, (k, n)) * 10.0 ** rng.uniform(-2, 2, n)
    return x, y


BENZENE = """C 0 1.3915 0; C 1.2051 0.6958 0; C 1.2051 -0.6958 0; C 0 -1.3915 0; C -1.2051 -0.6958 0;
C -1.2051 0.6958 0; H 0 2.4715 0; H 2.1404 1.2357 0; H 2.1404 -1.2357 0; H 0 -2.4715 0;
H -2.1404 -1.2357 0; H -2.1404 1.2357 0"""


def benzene_operands():
    """Benzene cc-pVDZ / cc-pVDZ-JKFIT (pyscf): whitened B^P_mn (Cholesky of the Coulomb metric),
    RHF occupied C; returns (exchange X = G [(P, i), m] with G^P_mi = sum_n B^P_mn C_ni,
    J-like (rho [P, 1], B [P, mn]) with rho_P = sum_(mn) B^P_mn D_mn)."""
    from pyscf import df, gto, lib, scf

    mol = gto.M(atom=BENZENE, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run()
    nocc = mol.nelectron // 2
    c = mf.mo_coeff[:, :nocc]
    tril = df.incore.cholesky_eri(mol, auxbasis="cc-pvdz-jkfit")  # [naux, nao(nao+1)/2]
    b = lib.unpack_tril(tril)  # [naux, nao, nao]
    g = np.einsum("pmn,ni->pim", b, c).reshape(-1, mol.nao)  # [(P, i), m]
    d = 2 * c @ c.T
    rho = np.einsum("pmn,mn->p", b, d)[:, None]
    return g, rho, b.reshape(b.shape[0], -1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--no-real", action="store_true", help="skip the benzene cases (pyscf)")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "fp8_slices_trn3.json"))
    args = parser.parse_args(argv)
    cases = []
    for k in args.ks:
        x, y = synthetic(k, 128, 512, decades=6, seed=k)
        cases.append(run_case(f"synthetic K={k}", x, y))
    if not args.no_real:
        g, rho, b = benzene_operands()
        cases.append(run_case("benzene exchange G^T G", g, g))
        cases.append(run_case("benzene Coulomb rho^T B", rho, b))
    record = {
        "what": "exact (Ozaki-sliced) X^T Y on trn3 (NeuronCore-v4): today's 7-bit bf16 slices against "
                "fp8 e4m3fn slices; errors measured on dfmp2's NKI emulator (trn3 rules, nki 0.6) against "
                "numpy fp64 X^T Y; times are the calibrated cost MODEL (cost_model.call_seconds), not measurements",
        "target": TARGET, "nki_api": API,
        "model_assumptions": {
            "tensor_engine_columns_per_s_MODEL": cost_model.CALIBRATIONS[TARGET].tensor_columns_per_s,
            "cycles_per_moving_column_MODEL": dict(cost_model.CYCLES_PER_COLUMN),
            "fixed_cycles_per_instruction_MODEL": cost_model.FIXED_CYCLES,
            "fp8_plain": "1 cycle per column (bf16 rate): Trainium3 guide, Tensor data path "
                         "'2x128 (non-MXFP8 dense input)'",
            "fp8_double_row": "ASSUMED 1 cycle per column of a 256-row instruction (Trainium2 guide's double "
                              "FP8 rate; no v4 rate documented); '..._if_double_row_at_bf16_rate' gives 2 cycles",
            "mxfp8": "not modelled (nc_matmul_mx; the exactness of its scaled accumulation is not documented)",
        },
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    print("wrote", args.json)


if __name__ == "__main__":
    main()
