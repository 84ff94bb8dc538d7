"""The pair energies' epilogue on an NVIDIA GPU as one fused Triton kernel.

After the pair GEMM (ia|jb) = sum_P B_ia^P B_jb^P [ni*nvir, nj*nvir_j] (fp64 or fp32), the
energy needs, per element and in fp64,

    D = e_i + e_j - e_a - e_b (spin_cases.pair_denominators),   e_os += (ia|jb)^2 / D,   e_x += (ia|jb) (ib|ja) / D

In torch ops that is six passes over fp64 [ni, nvir, nj, nvir_j] temporaries (the cast, the
denominators, the division, a transposed copy and two dot products): about 80 bytes of memory
traffic per element, 20-25% of the pair stage on an H100 in fp64. This kernel reads each
element of (ia|jb) twice (as itself and as the exchange partner (ib|ja)), forms D from the
orbital energies in registers, and writes two fp64 partial sums per program.

Layout: program (pair, tile) takes the occupied pair p = i * nj + j and TILE_A rows a of it;
it walks b in TILE_B columns: x[a, b] = (ia|jb) at row i*nvir + a, column j*nvir_j + b
(contiguous along b), and with EXCHANGE x~[a, b] = (ib|ja) at row i*nvir + b, column
j*nvir + a (contiguous along a). Sums: fp64 in registers, one partial per program, added by
torch in a fixed order (the energy is the same in every pass).
"""

from __future__ import annotations

import torch
import triton  # shipped with CUDA builds of torch on Linux (kernels.torch.backend imports this module only then)
import triton.language as tl

TILE_A = 32  # virtual rows a per program
TILE_B = 64  # virtual columns b per step


@triton.jit
def _pair_energy_partials(iajb_ptr, e_i_ptr, e_j_ptr, e_vir_ptr, e_vir_j_ptr, out_ptr,
                          nj, nvir, nvir_j, a_tiles,
                          EXCHANGE: tl.constexpr, TILE_A: tl.constexpr, TILE_B: tl.constexpr):
    pair = tl.program_id(0)
    tile = tl.program_id(1)
    i = pair // nj
    j = pair % nj
    row_stride = nj * nvir_j
    a = tile * TILE_A + tl.arange(0, TILE_A)
    a_ok = a < nvir
    e_ij = tl.load(e_i_ptr + i).to(tl.float64) + tl.load(e_j_ptr + j).to(tl.float64)
    e_a = tl.load(e_vir_ptr + a, mask=a_ok, other=0.0).to(tl.float64)
    rows = (i * nvir + a).to(tl.int64) * row_stride  # (ia| rows
    os_sum = tl.zeros((TILE_A, TILE_B), dtype=tl.float64)
    x_sum = tl.zeros((TILE_A, TILE_B), dtype=tl.float64)
    for b0 in range(0, nvir_j, TILE_B):
        b = b0 + tl.arange(0, TILE_B)
        b_ok = b < nvir_j
        ok = a_ok[:, None] & b_ok[None, :]
        e_b = tl.load(e_vir_j_ptr + b, mask=b_ok, other=0.0).to(tl.float64)
        iajb = tl.load(iajb_ptr + rows[:, None] + (j * nvir_j + b)[None, :], mask=ok, other=0.0)
        iajb = iajb.to(tl.float64)
        denominator = tl.where(ok, e_ij - e_a[:, None] - e_b[None, :], 1.0)
        t = iajb / denominator  # t_ij^ab = (ia|jb) / D_ijab
        os_sum += t * iajb
        if EXCHANGE:  # (ib|ja): row i*nvir + b, column j*nvir + a
            ibja = tl.load(iajb_ptr + (i * nvir + b).to(tl.int64)[None, :] * row_stride
                           + (j * nvir + a)[:, None], mask=ok, other=0.0)
            x_sum += t * ibja.to(tl.float64)
    out = out_ptr + 2 * (pair * a_tiles + tile)
    tl.store(out, tl.sum(tl.sum(os_sum, axis=1), axis=0))
    tl.store(out + 1, tl.sum(tl.sum(x_sum, axis=1), axis=0))


def pair_energy_sums(iajb, e_i, e_j, e_vir, e_vir_j, exchange: bool):
    """(sum (ia|jb)^2 / D, sum (ia|jb) (ib|ja) / D) in fp64 of one pair GEMM's output.

    iajb [ni*nvir, nj*nvir_j] contiguous (fp64 or fp32, on the GPU); e_i [ni], e_j [nj],
    e_vir [nvir], e_vir_j [nvir_j] (Eh, on the GPU); exchange: b_j shares b_i's virtuals
    (nvir_j == nvir), else the second sum is 0. Returns two fp64 0-d tensors (no sync)."""
    ni, nj, nvir, nvir_j = e_i.shape[0], e_j.shape[0], e_vir.shape[0], e_vir_j.shape[0]
    assert iajb.is_contiguous() and iajb.shape == (ni * nvir, nj * nvir_j)
    a_tiles = triton.cdiv(nvir, TILE_A)
    partials = torch.empty((ni * nj * a_tiles, 2), dtype=torch.float64, device=iajb.device)
    _pair_energy_partials[(ni * nj, a_tiles)](iajb, e_i, e_j, e_vir, e_vir_j, partials, nj, nvir, nvir_j, a_tiles,
                                             EXCHANGE=exchange, TILE_A=TILE_A, TILE_B=TILE_B)
    sums = partials.sum(dim=0)
    return sums[0], sums[1]
