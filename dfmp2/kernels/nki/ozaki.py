"""Exact-product slices for the NKI AO->MO transform (Ozaki's scheme), cut on the host in fp64.

A NeuronCore has no fp64 and its fp32 sums of (mn|P) C products lose up to mEh of the MP2
energy to cancellation. So every operand of ao2mo_kernel is sent in slices (INPUT_SLICES of the
C's, X_DIGITS of (mn|P)), each an integer of at most SLICE_BITS bits (+ sign) times a power of two shared along the
contraction: every product of two slices is exact in fp32, and so is a sum of 512 of them
(see kernels.nki.kernels.ao2mo_kernel). Pure functions, no state.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .tiles import SLICE_BITS

INPUT_SLICES = 5  # slices of C_occ, C_vir (and of the SCF builds' operands): 35 bits below each column's largest
X_DIGITS = 5  # int8 digits of (mn|P) in the AO->MO transform: 35 bits below each function's largest element
ROUNDING_PAD = float(1.5 * 2.0**23 * 2.0**-67)  # first-slice rounding constant of padded (all-zero) columns
BLOCK_ELEMENTS = 1 << 16  # fp64 elements of a slicing block (512 KiB: the rest stays in L2 over the slices)

__all__ = ["SLICE_BITS", "INPUT_SLICES", "X_DIGITS", "ROUNDING_PAD", "column_slices", "column_digits", "digit_exponent",
           "split_digits", "half_transform_grid", "digits_value"]


def column_slices(a: np.ndarray, count: int) -> np.ndarray:
    """fp64 a [..., K, M] -> fp32 [count, ..., K, M] with sum(slices) = a to 2^(e_m - 7 count).

    e_m = ceil(log2 max_k |a[..., k, m]|) per column m (the contraction runs over K); slice s is
    an integer of at most 7 bits (+ sign) times 2^(e_m - 7 (s + 1)), so it is exact in fp32 (and in
    bf16), the product of two slices is exact, and so is a sum of 512 such products of equal weight.
    """
    largest = np.abs(a).max(axis=-2, keepdims=True)
    exponent = np.ceil(np.log2(np.where(largest > 0, largest, 1.0)))
    out = np.empty((count,) + a.shape, dtype=np.float32)
    _slice_by_blocks(a, exponent, out, digits=False)
    return out


def column_digits(a: np.ndarray, count: int):
    """fp64 a [..., K, M] -> (int8 digits [count, ..., K, M], fp32 2^e [..., M, 1]) with
    sum_s digits_s 2^(e_m - 7 (s + 1)) = a to 2^(e_m - 7 count) per column m.

    The same slices as `column_slices`, sent as 1-byte integers and one power of two per column
    (the kernel scales them back exactly). e_m = ceil(log2(max_k |a[..., k, m]| * 128 / 127)), so
    the first digit stays within int8 (<= 127); later digits are <= 64.
    """
    exponent = digit_exponent(np.abs(a).max(axis=-2, keepdims=True))
    scale = np.swapaxes(np.exp2(exponent), -1, -2).astype(np.float32)  # [..., M, 1]
    return split_digits(a, exponent, count), scale


def digit_exponent(largest: np.ndarray) -> np.ndarray:
    """e = ceil(log2(largest * 128 / 127)) (0 where largest is 0): the first digit of a value of
    magnitude <= largest in units of 2^(e - 7) stays within int8."""
    return np.ceil(np.log2(np.where(largest > 0, largest * (128.0 / 127.0), 1.0)))


def split_digits(a: np.ndarray, exponent: np.ndarray, count: int) -> np.ndarray:
    """fp64 a -> int8 digits [count, *a.shape], sum_s d_s 2^(e - 7 (s + 1)) = a to 2^(e - 7 count);
    exponent: e, broadcast against a (`digit_exponent` of a bound on |a| along the contraction)."""
    digits = np.empty((count,) + np.shape(a), dtype=np.int8)
    _slice_by_blocks(a, exponent, digits, digits=True)
    return digits


def _slice_by_blocks(a, exponent, out, digits: bool) -> None:
    """out[s] = slice s of fp64 a (digit d_s, or its value d_s 2^(e - 7 (s + 1)) when not `digits`):
    d_s = rint(rest_s / 2^(e - 7 (s + 1))), rest_(s+1) = rest_s - d_s 2^(e - 7 (s + 1)), rest_0 = a.
    Done in blocks of rows of a's first axis (BLOCK_ELEMENTS: the rest stays in cache over the
    slices) on the host's threads (torch.get_num_threads(); numpy's ufuncs release the GIL): every
    element's arithmetic is the same as in one pass, so the slices are bit for bit the same."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        a, out = a.reshape(1), out.reshape(out.shape[0], 1)
    exponent = np.asarray(exponent, dtype=np.float64)
    exponent = exponent.reshape((1,) * (a.ndim - exponent.ndim) + exponent.shape)
    shared = exponent.shape[0] == 1  # one exponent row for every row of a

    def block(start, stop):
        rest = np.array(a[start:stop], dtype=np.float64, copy=True)
        e = exponent if shared else exponent[start:stop]
        for s in range(out.shape[0]):
            grid = np.exp2(e - SLICE_BITS * (s + 1))
            piece = np.rint(rest / grid)
            if digits:
                out[s, start:stop] = piece
                piece *= grid
            else:
                piece *= grid
                out[s, start:stop] = piece
            rest -= piece

    rows = a.shape[0]
    per_row = max(1, a.size // max(rows, 1))
    step = max(1, BLOCK_ELEMENTS // per_row)
    ranges = [(r, min(r + step, rows)) for r in range(0, rows, step)]
    workers = min(torch.get_num_threads(), len(ranges))
    if workers <= 1:
        for start, stop in ranges:
            block(start, stop)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done in [pool.submit(block, start, stop) for start, stop in ranges]:
            done.result()


def half_transform_grid(x_max: np.ndarray, c_occ_l1: np.ndarray) -> np.ndarray:
    """Rounding constants of the first H slice, 1.5 * 2^23 * 2^(E - 7) [nP, 1, nocc], with
    2^E >= max|(mn|p)| * sum_m |C_mi| >= max_n |H[n, i]| (slice u: times 2^(-7 (u - 1)) on the device)."""
    bound = np.outer(x_max, c_occ_l1)
    exponent = np.maximum(np.ceil(np.log2(np.where(bound > 0, bound, 2.0**-60))), -60)
    return (1.5 * 2.0**23 * np.exp2(exponent - SLICE_BITS))[:, None, :].astype(np.float32)


def digits_value(digits, scale):
    """The value of `column_digits`' output as torch tensors, in fp64: sum_s digits_s
    2^(e_n - 7 (s + 1)) [NP, NAO, NAO] from digits [S, NP, NAO, NAO] and scale [NP, NAO, 1]
    (fp32 values instead of int8 digits: the one slice itself). For host reference math."""
    if digits.dtype != torch.int8:
        return digits[0].double()
    weights = torch.tensor([2.0 ** (-SLICE_BITS * (s + 1)) for s in range(digits.shape[0])], dtype=torch.float64)
    value = (digits.double() * weights[:, None, None, None]).sum(0)
    return value * scale.double()[:, :, 0][:, None, :]
