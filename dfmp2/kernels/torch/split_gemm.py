"""Split-precision GEMMs for the pair stage: each fp32 operand as a high and a low part in a
tensor-core format (TF32 or BF16), three products accumulated in fp32.

    x = hi(x) + lo(x),  hi = round(x),  lo = round(x - hi)     (round: to the format, nearest-even)
    A B^T ~= hi(A) hi(B)^T + hi(A) lo(B)^T + lo(A) hi(B)^T     (the lo lo term is dropped)

The three products are one GEMM over a tripled inner dimension: [hi A, hi A, lo A] [hi B, lo B,
hi B]^T. Each product of two format values is exact in fp32 (11 + 11 or 8 + 8 significant bits),
so the result differs from an fp32 GEMM only by the dropped lo lo term (relative 2^-22 for TF32,
2^-16 for BF16) and the order of the fp32 sums.

On a GPU the GEMM runs on the tensor cores (TF32: an fp32 GEMM with TF32 allowed, on operands
already rounded to TF32, so the hardware's own conversion changes nothing; BF16: a bf16 GEMM with
an fp32 output). On a CPU the same rounded operands go through an fp32 GEMM: the emulation CI uses
to measure the modes' accuracy (the products are exact either way; only the summation order of
the fp32 accumulation differs).
"""

from __future__ import annotations

import contextlib

import torch

SPLIT_FORMATS = {"tf32x3": 10, "bf16x3": 7}  # precision -> explicit mantissa bits of its format


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 x rounded to `bits` explicit mantissa bits (nearest, ties to even), still fp32.
    TF32 keeps 10, BF16 7; the exponent range is fp32's in both."""
    drop = 23 - bits
    u = x.contiguous().view(torch.int32)
    keep_lsb = (u >> drop) & 1
    rounded = (u + ((1 << (drop - 1)) - 1) + keep_lsb) & ~((1 << drop) - 1)
    return rounded.view(torch.float32)


def split_operand(x: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 x [rows, k] -> (hi, lo), both fp32 holding values of the format of `precision`."""
    bits = SPLIT_FORMATS[precision]
    hi = round_mantissa(x, bits)
    return hi, round_mantissa(x - hi, bits)


@contextlib.contextmanager
def _tf32_allowed():
    """TF32 tensor-core GEMMs for fp32 operands inside the block, the previous setting after."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def split_product(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """A B^T for fp32 a [m, k], b [n, k] by three split-precision products -> fp32 [m, n]."""
    a_hi, a_lo = split_operand(a, precision)
    b_hi, b_lo = split_operand(b, precision)
    # [hi A, hi A, lo A] [hi B, lo B, hi B]^T = hi hi^T + hi lo^T + lo hi^T
    left = torch.cat((a_hi, a_hi, a_lo), dim=1)
    right = torch.cat((b_hi, b_lo, b_hi), dim=1)
    del a_hi, a_lo, b_hi, b_lo
    if a.device.type != "cuda":  # CPU emulation: the same exact products, fp32 sums
        return torch.matmul(left, right.transpose(0, 1))
    if precision == "tf32x3":
        with _tf32_allowed():
            return torch.matmul(left, right.transpose(0, 1))
    # bf16 operands are exact (rounded above); fp32 accumulation and output on the tensor cores
    return torch.mm(left.to(torch.bfloat16), right.to(torch.bfloat16).transpose(0, 1), out_dtype=torch.float32)
