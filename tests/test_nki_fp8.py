"""float8_e4m3fn on the NKI emulator (NeuronCore-v4, trn3) and the fp8-slice experiment
(benchmarks/bench_fp8_slices.py; docs/trainium.md, "FP8 slices on Trn3").

- rounding of every write into an fp8 tile: against torch's float8_e4m3fn cast (an independent
  implementation) where it does not overflow, and against a brute-force nearest search over the
  256 codes decoded from their bit fields; overflow gives NaN (torch saturates: the one difference);
- the dtype is refused on trn1/trn2 with neuronx-cc's EVRF051 message (rule L16);
- fp8 nc_matmul on trn3: exact for integers |n| <= 16, fp32 PSUM, fp8 x fp32 refused, perf_mode
  double_row (256 contraction rows) exact and its layout rules; the trace's columns and the cost
  model's cycles for them;
- the experiment kernel at small sizes: equal to the scheme's value computed in exact integer
  arithmetic on the host, and within the scheme's truncation bound of numpy's fp64 X^T Y.
"""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest
import torch

import nki_emulator as nki
from nki_emulator import NkiConstraintError
from dfmp2.kernels.nki import model as cost_model
from nki_emulator.core import round_to_fp8_e4m3fn

nl = nki.language
nisa = nki.isa
P = 128
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _kernels_compiled_at_lnc_1(monkeypatch):
    """Under nki 0.7 (the emulated default on trn2) every kernel runs at neuronx-cc's LNC degree (L14);
    dfmp2 compiles at LNC=1 there, and so do these kernels."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_fp8_slices",
                                                  os.path.join(ROOT, "benchmarks", "bench_fp8_slices.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


# ---- the dtype: rounding, bytes, targets ---------------------------------------------------------
@nki.jit
def fp8_roundtrip_kernel(x):
    """x (fp32) -> an fp8 SBUF tile (DMA) -> fp32 (tensor_copy) -> out."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
    back = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_copy(dst=back, src=t)
    nisa.dma_copy(dst=out, src=back)
    return out


def _roundtrip(x):
    with nki.target("trn3"):
        return fp8_roundtrip_kernel(np.ascontiguousarray(x, dtype=np.float32).reshape(P, -1)).reshape(-1)


def test_fp8_rounding_matches_torch_below_overflow():
    rng = np.random.default_rng(0)
    n = P * 2000
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-13, 9.5, n))).astype(np.float32)
    x[:8] = [464.0, -464.0, 2.0 ** -10, 3 * 2.0 ** -11, 17.0, 2.0 ** -6 * 1.0625, -0.0, 2.0 ** -9]  # ties
    got = _roundtrip(x)
    ref = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    inside = np.abs(x) <= 464  # |x| <= 464 rounds to at most 448 (464 is a tie, to even: 448)
    np.testing.assert_array_equal(got[inside], ref[inside])
    assert np.signbit(got[6]) and got[0] == 448 and got[2] == 0 and got[3] == 2.0 ** -9 and got[4] == 16
    assert (~inside).sum() > 100 and np.isnan(got[~inside]).all()  # overflow: NaN (torch saturates to 448)
    assert (ref[~inside] == np.sign(x[~inside]) * 448).all()


def _all_codes():
    """The finite values of the 256 e4m3fn codes, decoded from the bit fields (not by rounding):
    (value, mantissa bit 0) per code; S.1111.111 is NaN."""
    values = []
    for code in range(256):
        sign, exponent, mantissa = code >> 7, (code >> 3) & 15, code & 7
        if exponent == 15 and mantissa == 7:
            continue
        magnitude = mantissa * 2.0 ** -9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        values.append(((-1) ** sign * magnitude, mantissa & 1))
    return values


def test_fp8_rounding_is_nearest_even_over_every_code():
    codes = _all_codes()
    finite = np.array(sorted({v for v, _ in codes}))
    assert len(finite) == 253 and finite.max() == 448 and finite[finite > 0].min() == 2.0 ** -9  # +-0 are one value
    odd = {v for v, bit in codes if bit}
    mid = (finite[:-1] + finite[1:]) / 2
    probes = np.concatenate([finite, mid, np.nextafter(mid.astype(np.float32), np.float32(np.inf)),
                             np.nextafter(mid.astype(np.float32), np.float32(-np.inf))]).astype(np.float32)
    got = round_to_fp8_e4m3fn(probes)
    for x, g in zip(probes.astype(np.float64), got.astype(np.float64)):
        distance = np.abs(finite - x)
        nearest = finite[distance == distance.min()]
        expected = nearest[0] if len(nearest) == 1 else next(v for v in nearest if v not in odd)
        assert g == expected, (x, g, expected)
    assert np.isnan(round_to_fp8_e4m3fn(np.array([np.nan, np.inf, -np.inf, 465.0], np.float32))).all()


def test_fp8_tile_counts_one_byte_per_element():
    x = np.ones((P, 3000), dtype=np.float32)
    with nki.target("trn3"):
        np.testing.assert_array_equal(fp8_roundtrip_kernel(x), x)
        trace = fp8_roundtrip_kernel.last_trace
    assert trace.peak_sbuf_bytes == 3000 * (1 + 4)  # the fp8 tile and its fp32 copy


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_fp8_is_refused_before_trn3_with_evrf051(target):
    api = nki.NEWEST_API[target]
    with nki.target(target), pytest.raises(NkiConstraintError) as info:
        fp8_roundtrip_kernel(np.ones((P, 4), dtype=np.float32))
    message = str(info.value)
    assert "Data type F8E4M3FN is not supported on TRN1/TRN2." in message
    assert f"[L16; {target}, nki {api}]" in message


# ---- nc_matmul with fp8 operands -----------------------------------------------------------------
@nki.jit
def fp8_matmul_kernel(a_t, b, s_dtype, m_dtype, double):
    """a_t [K, M] (or [K, 2, M]), b [K, N] (or [K, 2, N]) in the given dtypes -> a_t^T b (fp32 PSUM)."""
    m, n = a_t.shape[-1], b.shape[-1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray(a_t.shape, dtype=s_dtype, buffer=nl.sbuf)
    v = nl.ndarray(b.shape, dtype=m_dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=a_t)
    nisa.dma_copy(dst=v, src=b)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    mode = nisa.matmul_perf_mode.double_row if double == 1 else nisa.matmul_perf_mode.none
    nisa.nc_matmul(dst=acc, stationary=s, moving=v, perf_mode=mode)
    r = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=acc)
    nisa.dma_copy(dst=out, src=r)
    return out


def _ints(shape, seed, top=16):
    return np.random.default_rng(seed).integers(-top, top + 1, shape).astype(np.float32)


def test_fp8_matmul_of_small_integers_is_exact_on_trn3():
    a_t, b = _ints((P, 64), 1), _ints((P, 300), 2)
    with nki.target("trn3"):
        out = fp8_matmul_kernel(a_t, b, nl.float8_e4m3fn, nl.float8_e4m3fn, 0)
    np.testing.assert_array_equal(out, a_t.astype(np.int64).T @ b.astype(np.int64))
    trace = fp8_matmul_kernel.last_trace
    assert trace.matmul_columns_by_dtype == {"float8_e4m3fn": 300}


def test_fp8_operand_rounds_integers_above_16():
    """17 is not an e4m3fn value (4 significant bits): it becomes 16 (tie to even), 19 becomes 20."""
    a_t = np.ones((P, 1), dtype=np.float32)
    b = np.concatenate([np.full((P, 1), 17.0), np.full((P, 1), 19.0)], axis=1).astype(np.float32)
    with nki.target("trn3"):
        out = fp8_matmul_kernel(a_t, b, nl.float8_e4m3fn, nl.float8_e4m3fn, 0)
    np.testing.assert_array_equal(out, [[P * 16, P * 20]])


def test_fp8_times_bf16_is_legal_and_fp8_times_fp32_is_refused():
    a_t, b = _ints((64, 8), 3), _ints((64, 16), 4)
    with nki.target("trn3"):
        out = fp8_matmul_kernel(a_t, b, nl.float8_e4m3fn, nl.bfloat16, 0)
        np.testing.assert_array_equal(out, a_t.astype(np.int64).T @ b.astype(np.int64))
        with pytest.raises(NkiConstraintError, match=re.escape("not float8_e4m3fn x float32 [MM4; trn3")):
            fp8_matmul_kernel(a_t, b, nl.float8_e4m3fn, nl.float32, 0)


def test_double_row_contracts_256_rows_exactly():
    a_t, b = _ints((P, 2, 32), 5), _ints((P, 2, 200), 6)
    with nki.target("trn3"):
        out = fp8_matmul_kernel(a_t, b, nl.float8_e4m3fn, nl.float8_e4m3fn, 1)
    ref = np.einsum("kjm,kjn->mn", a_t.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(out, ref)
    trace = fp8_matmul_kernel.last_trace
    assert trace.matmuls == 1 and trace.matmul_flops == 2 * 256 * 32 * 200
    assert trace.matmul_columns_by_dtype == {"float8_e4m3fn/double_row": 200}


@pytest.mark.parametrize("a_shape, b_shape, s_dtype, fragment", [
    ((P, 2, 8), (P, 2, 16), "bfloat16", "it needs fp8 inputs"),
    ((P, 3, 8), (P, 3, 16), "float8_e4m3fn", "first free dim that must be 2"),
    ((P, 8), (P, 16), "float8_e4m3fn", "first free dim that must be 2"),
])
def test_double_row_rules(a_shape, b_shape, s_dtype, fragment):
    dtype = getattr(nl, s_dtype)
    with nki.target("trn3"), pytest.raises(NkiConstraintError, match=re.escape(fragment)):
        fp8_matmul_kernel(_ints(a_shape, 7), _ints(b_shape, 8), dtype, dtype, 1)


def test_cost_model_charges_fp8_columns_at_the_bf16_rate():
    """Plain fp8 streams a column per cycle like bf16 (v4 data path); double_row's columns are
    charged CYCLES_PER_COLUMN's (assumed) rate for twice the contraction."""
    a_t, b = _ints((P, P), 9), _ints((P, 512), 10)
    cal = cost_model.CALIBRATIONS["trn3"]
    seconds = {}
    for name, dtype in (("bf16", nl.bfloat16), ("fp8", nl.float8_e4m3fn), ("fp32", nl.float32)):
        with nki.target("trn3"):
            fp8_matmul_kernel(a_t, b, dtype, dtype, 0)
        seconds[name] = cost_model._engine_seconds(fp8_matmul_kernel.last_trace, cal)["tensor_engine"]
    assert seconds["fp8"] == seconds["bf16"] < seconds["fp32"]
    trace = nki.Trace(matmul_columns=512)
    trace.matmul_columns_by_dtype["float8_e4m3fn/double_row"] = 512
    assert cost_model._column_cycles(trace) == 512 * cost_model.CYCLES_PER_COLUMN["float8_e4m3fn/double_row"]


# ---- the experiment kernel -----------------------------------------------------------------------
def test_digits_stay_exact_in_fp8_and_the_psum_chunk_bound():
    rng = np.random.default_rng(12)
    a = rng.standard_normal((300, 20)) * 10.0 ** rng.uniform(-12, 3, (300, 20))
    a[0, 0] = 2.0 ** 5  # a column maximum that is a power of two: first digit exactly 16
    for count, bits in ((9, 4), (7, 5), (8, 5)):
        digits, exponent = bench.fp8_digits(a, count, bits)
        bounds = np.array(bench.digit_bounds(count, bits))[:, None, None]
        assert (np.abs(digits) <= bounds).all() and np.abs(digits[0]).max() == 16
        value = sum(digits[s] * 2.0 ** (-4 - bits * s) for s in range(count)) * np.exp2(exponent)
        assert (np.abs(value - a) <= np.exp2(exponent) * 2.0 ** (-5 - bits * (count - 1))).all()
    # worst case per row: every digit at its bound with one sign; a group of g + 1 pairs
    assert bench.group_bound(9, 4) == 2 * 16 * 8 + 7 * 8 * 8 == 704
    assert bench.group_bound(7, 5) == 7 * 16 * 16
    assert bench.max_chunk(9, 4) == 186 and 186 * P * 704 <= 2 ** 24 < 187 * P * 704
    assert bench.max_chunk(7, 5, 2 * P) == 36


@pytest.mark.parametrize("count, bits, double, chunk", [(9, 4, False, None), (9, 4, True, None),
                                                        (7, 5, False, 1), (7, 5, True, None)])
def test_experiment_kernel_is_the_scheme_and_within_its_bound(count, bits, double, chunk):
    """Ragged K (300: a short second half under double_row), two stationary tiles (M = 130), three
    (S = 9: 256-column) or two moving tiles (N = 600); chunk=1 runs the TwoSum over chunks."""
    rng = np.random.default_rng(count + bits)
    k, m, n = 300, 130, 600
    x = rng.standard_normal((k, m)) * 10.0 ** rng.uniform(-6, 0, (k, m))
    y = rng.standard_normal((k, n)) * 10.0 ** rng.uniform(-6, 0, (k, n))
    value, trace, _ = bench.fp8_product(x, y, count, bits, double, chunk)
    xd, ex = bench.fp8_digits(x, count, bits)
    yd, ey = bench.fp8_digits(y, count, bits)
    scale = np.exp2(ex)[:, None] * np.exp2(ey)[None, :]
    exact = bench.scheme_value(xd, yd, bits) * scale  # Python-integer group sums: independent of the kernel
    assert np.abs(value - exact).max() <= 2.0 ** -44 * np.abs(exact).max()
    error = np.abs(value - x.T @ y)
    assert (error <= k * scale * bench.truncation_bound(count, bits) * 1.001).all()
    assert error.max() / np.abs(x.T @ y).max() < 1e-8
    key = "float8_e4m3fn/double_row" if double else "float8_e4m3fn"
    assert set(trace.matmul_columns_by_dtype) == {key}
