"""NKI kernels for the DF-MP2 pipeline, valid unchanged under NKI 0.2 (Neuron SDK 2.28, the
last release documented for trn1) and 0.3-0.7 (SDK 2.29-2.33, trn2 and trn3).

Long (every kernel in one source file, which `kernels.nki.launch.load_kernels` loads from its path with
the emulator standing in for the `nki` modules; the kernels share their private tile helpers).

The same source runs on a Trainium host (real `nki`) and, with --simulate, on dfmp2's
emulator, which stands in for the `nki` modules while this file is loaded.

Conventions for every kernel:
  - arguments and outputs are float32 tensors in HBM; outputs are nl.shared_hbm;
  - tile sizes (defined once, in tiles.py): P = 128 partitions, FREE = 512 fp32 columns (one
    2 KiB PSUM bank);
  - on-chip tiles have the partition axis first (<= P partitions): the contraction index (K,
    the auxiliary index Q, the AO index n or m) or the output rows; the free axes follow;
  - nc_matmul contracts over the partition axis: dst[M, N] = stationary[K, M].T @ moving[K, N]
    with K <= P, M <= P, N <= FREE, dst in one PSUM bank;
  - the API subset common to 0.2 and 0.3+: no `accumulate=` on nc_matmul (each accumulator
    is a fresh PSUM tile: its first matmul overwrites, later ones add, in every release), no
    DMA out of PSUM (tensor_copy to SBUF first), memset with a float for float tiles, no `*`
    in signatures and no `is`;
  - gemm and syrk take tile multiples (the backend pads and buckets their calls); trsm, ao2mo,
    pair energies and density take any shapes (ragged last tiles; the backend pads ao2mo's
    auxiliary count only, to one size per run);
  - SPMD: gemm, syrk, trsm, ao2mo, pair energies and the Laplace Z(t) and its contraction split
    their work over the programs of a
    launch grid (`nl.program_id`; on trn2/trn3 the two physical cores of a logical NeuronCore,
    LNC=2; kernels.nki.support.TWO_PROGRAM_KERNELS); the others run as one program.
"""

import nki
import nki.isa as nisa
import nki.language as nl

# relative: resolves to dfmp2.kernels.nki.tiles both when this file is imported as
# dfmp2.kernels.nki.kernels and when launch.load_kernels loads it from its path for the emulator
from .tiles import (FREE, GAMMA_B_BYTES, GAMMA_G_BYTES, GAMMA_ROWS_BYTES, GAMMA_X_BYTES, SLICE_BITS, VV_RESIDENT_BYTES,
                    P, jk_k_resident, laplace_row_group)

CHUNK = 4  # 128-tiles of contraction per exact PSUM sum in ao2mo_kernel (7-bit slices: <= 512 terms)
H_SLICES = 6  # slices of the half-transformed H cut on the device in ao2mo_kernel
SLICE_STEP = 2.0**-SLICE_BITS  # weight between consecutive 7-bit slices
DIGIT_WEIGHTS = tuple(2.0**(-SLICE_BITS * (s + 1)) for s in range(8))  # slice s of (mn|p) = digit * 2^(e - 7(s+1))


@nki.jit
def gemm_kernel(a_t, b):
    """out[M, N] = a_t[K, M]^T @ b[K, N].

    Tiles: K on partitions in 128s (contraction), M in 128s (stationary), N in FN = min(N, 512)
    (moving, one PSUM bank). The B panel of one N chunk is loaded once and kept in SBUF while
    every M tile passes (A is read once per N chunk: N / 512 times in all).
    SPMD: program p of n takes the M tiles p, p + n, ... (each loads the B panels).
    Shapes: K, M multiples of 128; N a multiple of 128 up to 512, of 512 above.
    """
    K, M = a_t.shape
    N = b.shape[1]
    FN = min(N, FREE)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    programs = nl.num_programs()
    pid = nl.program_id(0)
    for n in nl.affine_range(N // FN):
        b_panel = nl.ndarray((P, K // P, FN), dtype=nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(K // P):
            nisa.dma_copy(dst=b_panel[:, k, :], src=b[k * P:(k + 1) * P, n * FN:(n + 1) * FN])
        for m in range(pid, M // P, programs):
            acc = nl.ndarray((P, FN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // P):
                a_tile = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=a_tile, src=a_t[k * P:(k + 1) * P, m * P:(m + 1) * P])
                nisa.nc_matmul(dst=acc, stationary=a_tile, moving=b_panel[:, k, :])
            res = nl.ndarray((P, FN), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * P:(m + 1) * P, n * FN:(n + 1) * FN], src=res)
    return out


@nki.jit
def syrk_kernel(c, p_t):
    """out = c - p_t^T p_t on the lower triangle of [N, N] tiles; other tiles copy c.

    c [N, N], p_t [K, N] (a panel transposed: K on partitions). Tiles: 128 rows x 512 columns;
    a tile gets the update if it holds any element on or below the diagonal.
    SPMD: program p of n takes the row tiles p, p + n, ... (each loads the panel).
    Shapes: K multiple of 128; N a multiple of 512.
    """
    K, N = p_t.shape
    out = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
    panel = nl.ndarray((P, K // P, N), dtype=nl.float32, buffer=nl.sbuf)  # all of p_t, loaded once
    for k in nl.affine_range(K // P):
        nisa.dma_copy(dst=panel[:, k, :], src=p_t[k * P:(k + 1) * P, :])
    programs = nl.num_programs()
    pid = nl.program_id(0)
    for m in range(pid, N // P, programs):
        for n in nl.affine_range(N // FREE):
            c_tile = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=c_tile, src=c[m * P:(m + 1) * P, n * FREE:(n + 1) * FREE])
            if (m + 1) * P > n * FREE:  # tile touches the lower triangle
                acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                for k in nl.affine_range(K // P):
                    nisa.nc_matmul(dst=acc, stationary=panel[:, k, m * P:(m + 1) * P],
                                   moving=panel[:, k, n * FREE:(n + 1) * FREE])
                res = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=res, data1=c_tile, data2=acc, op=nl.subtract)
                nisa.dma_copy(dst=out[m * P:(m + 1) * P, n * FREE:(n + 1) * FREE], src=res)
            else:
                nisa.dma_copy(dst=out[m * P:(m + 1) * P, n * FREE:(n + 1) * FREE], src=c_tile)
    return out


L_RESIDENT_BYTES = 96 * 1024  # per partition: L's lower blocks up to this stay in SBUF for a launch


@nki.jit
def trsm_kernel(x, l_t, linv_t):
    """Whitening by blocked forward substitution: y_i = L^-1 x_i for every i, i.e. B_i^T for
    B_i = X_i L^-T, in the pair kernel's layout.

    x [NI, N, NVIR] ((ia|P) with the auxiliary index on the rows), l_t [N, N] = L^T,
    linv_t [N, 128]: the transposed inverses of L's diagonal blocks (block k in rows
    128k..128k+r and its first r columns; inverted on the host in fp64). Any N, NVIR, NI.
    For each block k:  y_k = Linv_kk (x_k - sum_{j<k} L_kj y_j).
    Tiles: N in 128-blocks on partitions (ragged last); columns a of one i in chunks of <= 512
    (one PSUM bank; ragged last); the y blocks of a chunk stay in SBUF. L's blocks below the
    diagonal are loaded once per launch when they fit L_RESIDENT_BYTES (else once per chunk).
    SPMD: program p of n takes the rows i = p, p + n, ...
    Long (the kernel's loop nest is its tile schedule, kept whole): cutting it into helpers
    would move where tiles die (on-chip memory peaks, recorded in the trace).
    """
    NI, N, NVIR = x.shape
    nb = (N + P - 1) // P
    resident = nb * (nb + 1) // 2 * P * 4 <= L_RESIDENT_BYTES
    out = nl.ndarray((NI, N, NVIR), dtype=nl.float32, buffer=nl.shared_hbm)
    if resident:
        l_sb = nl.ndarray((P, nb * (nb + 1) // 2, P), dtype=nl.float32, buffer=nl.sbuf)
        inv_sb = nl.ndarray((P, nb, P), dtype=nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(nb):
            rk = min(P, N - k * P)
            nisa.dma_copy(dst=inv_sb[0:rk, k, 0:rk], src=linv_t[k * P:k * P + rk, 0:rk])
            for j in nl.affine_range(k):
                nisa.dma_copy(dst=l_sb[:, k * (k + 1) // 2 + j, 0:rk], src=l_t[j * P:(j + 1) * P, k * P:k * P + rk])
    programs = nl.num_programs()
    pid = nl.program_id(0)
    for i in range(pid, NI, programs):
        for c0 in range(0, NVIR, FREE):
            w = min(FREE, NVIR - c0)
            y = nl.ndarray((P, nb, FREE), dtype=nl.float32, buffer=nl.sbuf)
            for k in nl.sequential_range(nb):
                rk = min(P, N - k * P)
                x_k = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=x_k[0:rk, 0:w], src=x[i, k * P:k * P + rk, c0:c0 + w])
                rhs = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                if k > 0:
                    acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                    for j in nl.affine_range(k):  # sum_{j<k} L_kj y_j
                        if resident:
                            l_tile = l_sb[:, k * (k + 1) // 2 + j, 0:rk]
                        else:
                            l_tile = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
                            nisa.dma_copy(dst=l_tile[:, 0:rk], src=l_t[j * P:(j + 1) * P, k * P:k * P + rk])
                            l_tile = l_tile[:, 0:rk]
                        nisa.nc_matmul(dst=acc[0:rk, 0:w], stationary=l_tile, moving=y[:, j, 0:w])
                    nisa.tensor_tensor(dst=rhs[0:rk, 0:w], data1=x_k[0:rk, 0:w], data2=acc[0:rk, 0:w],
                                       op=nl.subtract)
                else:
                    nisa.tensor_copy(dst=rhs[0:rk, 0:w], src=x_k[0:rk, 0:w])
                if resident:
                    inv_tile = inv_sb[0:rk, k, 0:rk]
                else:
                    inv_tile = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=inv_tile[0:rk, 0:rk], src=linv_t[k * P:k * P + rk, 0:rk])
                    inv_tile = inv_tile[0:rk, 0:rk]
                solved = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=solved[0:rk, 0:w], stationary=inv_tile, moving=rhs[0:rk, 0:w])
                nisa.tensor_copy(dst=y[0:rk, k, 0:w], src=solved[0:rk, 0:w])
                nisa.dma_copy(dst=out[i, k * P:k * P + rk, c0:c0 + w], src=y[0:rk, k, 0:w])
    return out


TRANSFORM_RESIDENT_BYTES = 112 * 1024  # per partition: C_occ's slices of one chunk + one batch's H slices


def transform_blocking(nao, nocc, slices, h_slices, functions, itemsize=4):
    """(W, NB): occupied columns per chunk and auxiliary functions per batch of ao2mo_kernel.

    Resident per 128 partitions: C_occ's `slices` slices of a W-column chunk (all nao rows) and
    the `h_slices` slices of H for NB functions side by side, (slices + NB h_slices) x nm x W x
    itemsize bytes (nm = ceil(nao / 128); 2 for the exact transform's bf16 slices), within TRANSFORM_RESIDENT_BYTES; NB W <= FREE columns (the
    second half's moving operand). W takes as many occupied orbitals as fit, in equal chunks;
    NB as many of the call's `functions` as fit."""
    nm = (nao + P - 1) // P
    column_bytes = itemsize * nm
    widest = min(nocc, FREE, TRANSFORM_RESIDENT_BYTES // ((slices + h_slices) * column_bytes))
    assert widest >= 1, f"ao2mo_kernel: nao {nao} leaves no room for one occupied column in SBUF"
    chunks = (nocc + widest - 1) // widest
    W = (nocc + chunks - 1) // chunks
    room = (TRANSFORM_RESIDENT_BYTES - slices * column_bytes * W) // (h_slices * column_bytes * W)
    return W, max(1, min(FREE // W, room, functions))


@nki.jit
def ao2mo_kernel(x_digits, x_scale, c_occ_slices, c_vir_slices, h_grid, tile_map, symmetric):
    """Batched two-sided transform: out[p, a, i] = sum_mn C_mi C_na (mn|p), with exact fp32
    products (S > 1 slices, the default) or plain fp32 products (S == 1).

    Why exact: fp32 accumulation of these sums loses 1 uEh to 25 mEh of the MP2 energy to
    cancellation (AO coefficients of both signs; diffuse and quadruple-zeta sets are worst). Every
    operand arrives as S slices, each an integer of at most 7 bits times a power of two shared
    along the contraction (Ozaki's scheme), so each slice product and its accumulation in PSUM
    over up to 512 terms (CHUNK tiles) are exact; only the truncation of the slices remains.

    x_digits [SX, NP, NAO, NAO] (tile_map 0: every tile), or block-sparse [SX, NP, R, P]: only the
    kept 128 x 128 tiles (m, n) of (mn|p), stacked along the rows in the order of n then m (each
    tile's rows, m on the rows; a ragged last column tile zero-padded); tile_map: 0 (dense), or
    the kept tiles as a compile-time int, bit m * nm + n for tile (m, n) (symmetric, every
    diagonal tile kept); symmetric = 1 (exact, packed): only the kept tiles with m >= n are
    uploaded, with one exponent per function (the digits of (mn|p) symmetric, x_scale constant
    per function), and each tile above the diagonal is its mirror's transpose, turned on chip
    (`_load_mirrored`): about half the bytes cross from the host. Each output column tile n of H issues one
    matmul per slice pair per kept tile (m, n) only: a dropped tile is never uploaded or multiplied.
    S > 1 (S slices of C, SX <= S digits of (mn|p): ozaki.X_DIGITS = 4 of INPUT_SLICES = 5, the
    measured trade, docs/trainium.md): int8, the slices of (mn|p) as integers d_s (|d_s| <= 127),
    slice s = d_s 2^(e_pn - 7 (s + 1)); x_scale [NP, NAO, 1]: 2^(e_pn) per column n (1 byte per
    slice element crosses from the host, not 4). The kernel makes X_s = d_s 2^(-7 (s + 1)) (exact,
    on the Scalar Engine) and applies 2^(e_pn) to row n of H (exact, a power of two).
    S == 1: fp32 (mn|p) itself and C itself as the one "slice"; x_scale and h_grid are not read;
    one product per half, accumulated in PSUM over the whole contraction (no TwoSum).
    c_occ_slices [S, NAO, NOCC], c_vir_slices [S, NAO, NVIR]: fp32 slices per column (host-sliced
    from fp64). h_grid [NP, 1, NOCC]: 1.5 * 2^23 * 2^(E_pi - 7), E_pi >= log2 max_n |H[n, i]| (a
    host bound); broadcast to the partitions on the Tensor Engine and scaled by 2^(-7 (u - 1)):
    adding and subtracting it rounds to the grid of slice u (the Vector Engine's fp32
    round-to-nearest).
      H[n, i] = sum_m (mn|p) C_mi   = sum_{s+t<=S+1} X_s^T C_t   (s <= SX, t <= S; groups g = s + t in PSUM,
                                      exact per 512-term chunk; groups and chunks combined by
                                      TwoSum into H_hi + H_lo)
      H_u     = slices of H_hi + H_lo per column i (rounding trick, u = 1..SH), cut per row tile n
      T[a, i] = sum_n C_na H[n, i]  = sum_{u+t<=SH+1} Cvir_t^T H_u   (same grouping)
    Tiles and residency (any NAO, NOCC, NVIR, NP; every last tile ragged, no padding):
      - occupied orbitals in chunks of W columns, functions in batches of NB
        (`transform_blocking`): per chunk, C_occ's slices stay in SBUF (n, m on partitions in
        128s); per batch, the H slices of its NB functions sit side by side in SBUF (row n on
        the partitions, NB x W columns);
      - first half, per function and row tile n: (mn|p) streamed in 128 x 128 tiles (each read
        once per chunk), the moving operand C_occ's W columns; H's tile n is sliced at once;
      - second half, per batch: C_vir streamed in 128 x 128 tiles (n on partitions, a the
        stationary columns), each read once per batch and multiplied by all NB x W columns of
        the batch's H slices (the moving operand), so C_vir crosses HBM once per NB functions.
    The first half's tile loops are Python loops over the kept tiles (a trace-time list, unrolled).
    SPMD: program q of n takes the batches q, q + n, ...
    Long (the kernel's loop nest is its tile schedule, kept whole): cutting it into helpers
    would move where tiles die (on-chip memory peaks, recorded in the trace).
    """
    SX, NP = x_digits.shape[0], x_digits.shape[1]  # digits of (mn|p)
    S = c_occ_slices.shape[0]  # slices of C_occ and C_vir
    exact = S > 1
    SH = H_SLICES if exact else 1
    NAO, NOCC = c_occ_slices.shape[1], c_occ_slices.shape[2]
    NVIR = c_vir_slices.shape[2]
    nm = (NAO + P - 1) // P
    # the kept row tiles m of each column tile n, and (block-sparse layout) where each is packed
    kept = [[m for m in range(nm) if tile_map == 0 or (tile_map >> (m * nm + n)) & 1] for n in range(nm)]
    assert all(n in kept[n] for n in range(nm)), "ao2mo_kernel: every diagonal tile is kept"
    assert not symmetric or (exact and tile_map != 0), "ao2mo_kernel: a symmetric upload is packed exact digits"
    where, row = {}, 0  # the packed row of each stored tile (m, n): with symmetric, m >= n only
    for n in range(nm):
        for m in kept[n]:
            if m >= n or not symmetric:
                where[(m, n)] = row
                row += min(P, NAO - m * P)
    chunk = CHUNK if exact else nm  # exact PSUM sums need contractions of <= 512 terms
    OP = nl.bfloat16 if exact else nl.float32  # the slices' dtype: each is exact in bf16 (8 significant bits)
    W, NB = transform_blocking(NAO, NOCC, S, SH, NP, 2 if exact else 4)
    GW = 256 if NB * W <= 256 else FREE  # PSUM columns per group: two groups share a bank when they fit
    out = nl.ndarray((NP, NVIR, NOCC), dtype=nl.float32, buffer=nl.shared_hbm)
    if exact:
        ones = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)  # broadcasts a row to 128 partitions
        nisa.memset(dst=ones, value=1.0)
    for i0 in range(0, NOCC, W):  # occupied chunk: columns i0 .. i0 + w
        w = min(W, NOCC - i0)
        c_occ_sb = nl.ndarray((P, S * nm, W), dtype=OP, buffer=nl.sbuf)  # fp32 in HBM, cast by the DMA (exact)
        for t in nl.affine_range(S):
            for m in nl.affine_range(nm):
                rm = min(P, NAO - m * P)
                nisa.dma_copy(dst=c_occ_sb[0:rm, t * nm + m, 0:w], src=c_occ_slices[t, m * P:m * P + rm, i0:i0 + w])
        for b in range(nl.program_id(0), (NP + NB - 1) // NB, nl.num_programs()):
            p0 = b * NB
            nb = min(NB, NP - p0)
            F = nb * w  # the batch's H columns: function p0 + j in columns j w .. (j + 1) w
            h_slices = nl.ndarray((P, SH * nm, NB * W), dtype=OP, buffer=nl.sbuf)
            for j in range(nb):  # first half, one function at a time
                p = p0 + j
                if exact:
                    scale = nl.ndarray((P, nm), dtype=nl.float32, buffer=nl.sbuf)  # 2^(e_pn), n on partitions
                    for n in nl.affine_range(nm):
                        rn = min(P, NAO - n * P)
                        nisa.dma_copy(dst=scale[0:rn, n:n + 1], src=x_scale[p, n * P:n * P + rn, :])
                    grid_row = nl.ndarray((1, W), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=grid_row[0:1, 0:w], src=h_grid[p, :, i0:i0 + w])
                    grid_psum = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_matmul(dst=grid_psum[0:P, 0:w], stationary=ones, moving=grid_row[0:1, 0:w])
                    grids = nl.ndarray((P, SH, W), dtype=nl.float32, buffer=nl.sbuf)  # slice u's grid: 2^(-7u) finer
                    nisa.tensor_copy(dst=grids[0:P, 0, 0:w], src=grid_psum[0:P, 0:w])
                    for u in range(1, SH):
                        nisa.tensor_scalar(dst=grids[0:P, u, 0:w], data=grids[0:P, u - 1, 0:w], op0=nl.multiply,
                                           operand0=SLICE_STEP)
                for n in range(nm):
                    rn = min(P, NAO - n * P)
                    h_hi = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)  # H[n, i], n on partitions
                    h_lo = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
                    for c0 in range(0, len(kept[n]), chunk):
                        groups = _psum_tiles(S, FREE)  # a bank per group
                        for k in range(c0, min(c0 + chunk, len(kept[n]))):
                            m = kept[n][k]
                            rm = min(P, NAO - m * P)
                            # tile (m, n): rows and columns of x_digits (dense), or the packed rows of
                            # the stored tile, (n, m) for a mirror above the diagonal (symmetric)
                            mirrored = symmetric and m < n
                            stored = (n, m) if mirrored else (m, n)
                            r0, q0 = (m * P, n * P) if tile_map == 0 else (where[stored], 0)
                            x_tiles = nl.ndarray((P, SX, P), dtype=OP, buffer=nl.sbuf)
                            if mirrored:  # stored tile (n, m), transposed
                                _load_mirrored(x_digits, p, r0, rn, rm, x_tiles, SX)
                            elif exact:
                                digits = nl.ndarray((P, SX, P), dtype=nl.int8, buffer=nl.sbuf)
                                for s in range(SX):
                                    nisa.dma_copy(dst=digits[0:rm, s, 0:rn], src=x_digits[s, p, r0:r0 + rm, q0:q0 + rn])
                                    nisa.activation(dst=x_tiles[0:rm, s, 0:rn], op=nl.copy,
                                                    data=digits[0:rm, s, 0:rn], scale=DIGIT_WEIGHTS[s])
                            else:
                                nisa.dma_copy(dst=x_tiles[0:rm, 0, 0:rn], src=x_digits[0, p, r0:r0 + rm, q0:q0 + rn])
                            for s in range(SX):
                                for t in range(S - s):  # slice pairs with s + t <= S - 1 (0-based)
                                    nisa.nc_matmul(dst=groups[s + t][0:rn, 0:w], stationary=x_tiles[0:rm, s, 0:rn],
                                                   moving=c_occ_sb[0:rm, t * nm + m, 0:w])
                        if exact:
                            _add_groups(groups, S, h_hi[0:rn, 0:w], h_lo[0:rn, 0:w], w, c0 == 0)
                        else:
                            nisa.tensor_copy(dst=h_slices[0:rn, n, j * w:j * w + w], src=groups[0][0:rn, 0:w])
                    if exact:
                        for part in (h_hi, h_lo):  # H rows times 2^(e_pn): exact
                            nisa.tensor_scalar(dst=part[0:rn, 0:w], data=part[0:rn, 0:w], op0=nl.multiply,
                                               operand0=scale[0:rn, n:n + 1])
                        for u in range(SH):
                            _peel_slice(h_hi[0:rn, 0:w], h_lo[0:rn, 0:w], grids[0:rn, u, 0:w],
                                        h_slices[0:rn, u * nm + n, j * w:j * w + w], w)
            for a0 in range(0, NVIR, P):  # second half: T^T[a, i], virtuals on the output partitions
                ma = min(P, NVIR - a0)
                t_hi = nl.ndarray((P, NB * W), dtype=nl.float32, buffer=nl.sbuf)
                if exact:
                    t_lo = nl.ndarray((P, NB * W), dtype=nl.float32, buffer=nl.sbuf)
                for c0 in range(0, nm, chunk):
                    groups = _psum_tiles(SH, GW)
                    for n in nl.affine_range(c0, min(c0 + chunk, nm)):
                        rn = min(P, NAO - n * P)
                        c_vir_tile = nl.ndarray((P, S, P), dtype=OP, buffer=nl.sbuf)  # streamed
                        for t in range(S):
                            nisa.dma_copy(dst=c_vir_tile[0:rn, t, 0:ma], src=c_vir_slices[t, n * P:n * P + rn, a0:a0 + ma])
                        for u in range(SH):
                            for t in range(min(S, SH - u)):  # u + t <= SH - 1 (0-based)
                                nisa.nc_matmul(dst=groups[u + t][0:ma, 0:F], stationary=c_vir_tile[0:rn, t, 0:ma],
                                               moving=h_slices[0:rn, u * nm + n, 0:F])
                    if exact:
                        _add_groups(groups, SH, t_hi[0:ma, 0:F], t_lo[0:ma, 0:F], F, c0 == 0)
                    else:
                        nisa.tensor_copy(dst=t_hi[0:ma, 0:F], src=groups[0][0:ma, 0:F])
                if exact:
                    nisa.tensor_tensor(dst=t_hi[0:ma, 0:F], data1=t_hi[0:ma, 0:F], data2=t_lo[0:ma, 0:F], op=nl.add)
                for j in range(nb):
                    nisa.dma_copy(dst=out[p0 + j, a0:a0 + ma, i0:i0 + w], src=t_hi[0:ma, j * w:j * w + w])
    return out


def _load_mirrored(x_digits, p, r0, rn, rm, x_tiles, SX):
    """x_tiles[0:rm, s, 0:rn] = X_s of tile (m, n), m < n, from the stored tile (n, m) (rows
    r0 .. r0 + rn of the packed digits, columns 0:rm): X_s[m, n] = X_s[n, m]^T (symmetric digits,
    one exponent per function), each slice turned on the Tensor Engine (fp32, exact) through PSUM."""
    digits = nl.ndarray((P, SX, P), dtype=nl.int8, buffer=nl.sbuf)
    for s in range(SX):
        nisa.dma_copy(dst=digits[0:rn, s, 0:rm], src=x_digits[s, p, r0:r0 + rn, 0:rm])
        flat = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)  # X_s[n, m], n on partitions
        nisa.activation(dst=flat[0:rn, 0:rm], op=nl.copy, data=digits[0:rn, s, 0:rm], scale=DIGIT_WEIGHTS[s])
        turned = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=turned[0:rm, 0:rn], data=flat[0:rn, 0:rm])
        nisa.tensor_copy(dst=x_tiles[0:rm, s, 0:rn], src=turned[0:rm, 0:rn])


def _psum_tiles(count, width):
    """count PSUM accumulators [128, width], FREE // width of them side by side in each one-bank
    (2 KiB) tile: a list of views (width divides FREE)."""
    per_bank = FREE // width
    banks = [nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum) for _ in range((count + per_bank - 1) // per_bank)]
    return [banks[g // per_bank][:, (g % per_bank) * width:(g % per_bank + 1) * width] for g in range(count)]


def _add_groups(groups, count, hi, lo, F, first):
    """hi + lo (+)= the PSUM group tiles groups[k][0:R, 0:F] (k < count, largest first; R = hi's
    partitions), by TwoSum on the Vector Engine: s = hi + g; b = s - hi;
    e = (hi - (s - b)) + (g - b); lo += e; hi = s. first: hi, lo start from the first group and zero."""
    R = hi.shape[0]
    if first:
        nisa.tensor_copy(dst=hi, src=groups[0][0:R, 0:F])
        nisa.memset(dst=lo, value=0.0)
    g = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    b_virtual = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    a_virtual = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    err = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    for k in range(1 if first else 0, count):
        nisa.tensor_copy(dst=g[0:R], src=groups[k][0:R, 0:F])
        nisa.tensor_tensor(dst=total[0:R], data1=hi, data2=g[0:R], op=nl.add)
        nisa.tensor_tensor(dst=b_virtual[0:R], data1=total[0:R], data2=hi, op=nl.subtract)
        nisa.tensor_tensor(dst=a_virtual[0:R], data1=total[0:R], data2=b_virtual[0:R], op=nl.subtract)
        nisa.tensor_tensor(dst=a_virtual[0:R], data1=hi, data2=a_virtual[0:R], op=nl.subtract)
        nisa.tensor_tensor(dst=err[0:R], data1=g[0:R], data2=b_virtual[0:R], op=nl.subtract)
        nisa.tensor_tensor(dst=err[0:R], data1=a_virtual[0:R], data2=err[0:R], op=nl.add)
        nisa.tensor_tensor(dst=lo, data1=lo, data2=err[0:R], op=nl.add)
        nisa.tensor_copy(dst=hi, src=total[0:R])


def _peel_slice(hi, lo, grid, piece, F):
    """piece = hi rounded to the grid whose rounding constant is `grid` ((hi + c) - c, in fp32);
    then hi + lo -= piece, renormalised (FastTwoSum), all in place (R = hi's partitions). A bf16
    piece is written from the fp32 rounding on the Scalar Engine (exact: <= 8 significant bits)."""
    R = hi.shape[0]
    rounded = piece
    if piece.dtype != nl.float32:
        rounded = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)[0:R, 0:piece.shape[1]]
    nisa.tensor_tensor(dst=rounded, data1=hi, data2=grid, op=nl.add)
    nisa.tensor_tensor(dst=rounded, data1=rounded, data2=grid, op=nl.subtract)
    nisa.tensor_tensor(dst=hi, data1=hi, data2=rounded, op=nl.subtract)  # exact
    if rounded is not piece:
        nisa.activation(dst=piece, op=nl.copy, data=rounded)
    total = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total[0:R], data1=hi, data2=lo, op=nl.add)
    back = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=back[0:R], data1=total[0:R], data2=hi, op=nl.subtract)
    nisa.tensor_tensor(dst=lo, data1=lo, data2=back[0:R], op=nl.subtract)
    nisa.tensor_copy(dst=hi, src=total[0:R])


RESIDENT_BYTES = 64 * 1024  # per partition: a B_j row up to this size is loaded once per pair
GROUP = 3  # PSUM banks of V (and as many of X) accumulated at once: 2 x 3 + 1 transpose <= 8 banks


@nki.jit
def pair_energy_kernel(b_i, b_j, e_i_rows, e_j_rows, e_vir_col, neg_e_vir_rows, triangle, exchange):
    """MP2 pair energies of a block of occupied pairs; each (ia|jb) is formed once, on chip.

    b_i [NI, NAUX, NVIR], b_j [NJ, NAUX, NVB]: whitened B, occupied-major, auxiliary index on
    the rows (any sizes: ragged last tiles, no padding). e_i_rows [128, NI], e_j_rows [128, NJ]:
    occupied energies on every partition; e_vir_col [NVIR, 1]: e_a; neg_e_vir_rows [128, NVB]:
    -e_b. triangle = 1: b_j is b_i and only the pairs j <= i are formed (a diagonal block I = J).
    exchange = 1: i and j have the same spin (a and b the same virtuals, NVB = NVIR); exchange = 0:
    opposite spins (an alpha-beta block of an unrestricted reference): V = (ia|jb) for all b, no
    exchange sum (its partials stay 0), and NVB may differ from NVIR.

    Per pair (i, j), 128-row block A of virtuals a (ragged last block of MA rows):
        V[A, b] = (ia|jb) = sum_Q B_i[Q, a] B_j[Q, b]     for b >= A's first virtual
        X[A, b] = (ib|ja) = sum_Q B_j[Q, a] B_i[Q, b]     for b past A's block (the transposes of
                                                          V's blocks below the diagonal)
        V[A, A]^T                                          nc_transpose (the diagonal block)
    so every 128 x 128 block of V is computed once, as itself or as its transpose, and with
    T = V / D, D = e_i + e_j - e_a - e_b (symmetric under a <-> b; spin_cases.pair_denominators on chip):
        os += sum T V + sum X^2 / D                       (all of sum_ab (ia|jb)^2 / D)
        ex += sum_AA T V^T + 2 sum X T                    (all of sum_ab (ia|jb)(ib|ja) / D)
    Tiles: Q on partitions in 128s (contraction; ragged last); a in 128-row blocks (stationary);
    b in 512-column chunks (moving; one PSUM bank each), GROUP chunks of V and of X accumulated
    at once. B_i stays in SBUF for its row of pairs; B_j is loaded once per pair when its row
    fits RESIDENT_BYTES, else streamed over Q per (block, column group): any NAUX and NVIR run.
    SPMD: with a launch grid of n programs (trn2/trn3 LNC=2: two physical cores), program p takes
    the rows i of `_program_rows` (balanced for triangles).
    Returns partials [128, 2 * NI * NJ]: column 2 (i NJ + j) holds the opposite-spin sum per
    partition, the next one the exchange sum (zero for j > i in a triangle); the host adds
    them in fp64 (E_os = sum os, E_ss = E_os - sum ex).
    """
    NI, NAUX, NVIR = b_i.shape
    NJ, NVB = b_j.shape[0], b_j.shape[2]
    nq = (NAUX + P - 1) // P
    resident = nq * NVB * 4 <= RESIDENT_BYTES
    out = nl.ndarray((P, 2 * NI * NJ), dtype=nl.float32, buffer=nl.shared_hbm)
    ei = nl.ndarray((P, NI), dtype=nl.float32, buffer=nl.sbuf)
    ej = nl.ndarray((P, NJ), dtype=nl.float32, buffer=nl.sbuf)
    neg_eb = nl.ndarray((P, NVB), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ei, src=e_i_rows)
    nisa.dma_copy(dst=ej, src=e_j_rows)
    nisa.dma_copy(dst=neg_eb, src=neg_e_vir_rows)
    ea = _vir_column(e_vir_col)
    for i in _program_rows(NI, nl.num_programs(), nl.program_id(0), triangle):
        bi = nl.ndarray((P, nq, NVIR), dtype=nl.float32, buffer=nl.sbuf)  # B_i, resident
        for q in nl.affine_range(nq):
            qs = min(P, NAUX - q * P)
            nisa.dma_copy(dst=bi[0:qs, q, :], src=b_i[i, q * P:q * P + qs, :])
        sums = nl.ndarray((P, 2 * NJ), dtype=nl.float32, buffer=nl.sbuf)  # (os, ex) per pair of row i
        nisa.memset(dst=sums, value=0.0)
        for j in range(i + 1 if triangle == 1 else NJ):
            _pair_sums(bi, b_j, i, j, triangle == 1 and j == i, resident, exchange == 1, ei, ej, ea,
                       neg_eb, sums[:, 2 * j:2 * j + 2])
        nisa.dma_copy(dst=out[:, 2 * i * NJ:2 * (i + 1) * NJ], src=sums)
    return out


def _pair_sums(bi, b_j, i, j, same, resident, exchange, ei, ej, ea, neg_eb, sums):
    """sums [128, 2] += per-partition (os, ex) of pair (i, j); bi: B_i in SBUF [128, nq, NVIR];
    same: j == i in a triangle (B_j is B_i); exchange: same spin (else only os, over all b).
    A function, so that its tiles die when it returns. Long (the V, X and transpose PSUM tiles
    of one (A, column group) live together): splitting them over more helpers would move where
    tiles die (on-chip memory peaks, recorded in the trace)."""
    NAUX, NVIR, NVB = b_j.shape[1], bi.shape[2], b_j.shape[2]
    nq = (NAUX + P - 1) // P
    na = (NVIR + P - 1) // P
    bj = bi
    if resident and not same:
        bj = nl.ndarray((P, nq, NVB), dtype=nl.float32, buffer=nl.sbuf)
        for q in nl.affine_range(nq):
            qs = min(P, NAUX - q * P)
            nisa.dma_copy(dst=bj[0:qs, q, :], src=b_j[j, q * P:q * P + qs, :])
    streamed = not resident and not same
    eij = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=eij, data1=ei[:, i:i + 1], data2=ej[:, j:j + 1], op=nl.add)
    for a in range(na):
        a0 = a * P
        ma = min(P, NVIR - a0)
        shift = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # e_i + e_j - e_a
        nisa.tensor_tensor(dst=shift[0:ma], data1=eij[0:ma], data2=ea[0:ma, a:a + 1],
                           op=nl.subtract)
        # same spin: b from A's first virtual on (the blocks below are X's transposes); across
        # spins: every b
        first = a0 if exchange else 0
        chunks = [(c0, min(c0 + FREE, NVB)) for c0 in range(first, NVB, FREE)]
        for g0 in range(0, len(chunks), GROUP):
            group = chunks[g0:g0 + GROUP]
            span0, span1 = group[0][0], group[-1][1]  # columns of this group
            v = _psum_tiles(GROUP, FREE)
            if exchange:
                x = _psum_tiles(GROUP, FREE)
            for q in nl.affine_range(nq):
                qs = min(P, NAUX - q * P)
                if streamed:  # B_j[Q, span0:span1] for this block and group only
                    tile = nl.ndarray((P, span1 - span0), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=tile[0:qs, :], src=b_j[j, q * P:q * P + qs, span0:span1])
                    if exchange:  # span0 = a0: B_j[Q, A] is the tile's first columns
                        bj_stat = tile[0:qs, 0:ma]
                elif exchange:
                    bj_stat = bj[0:qs, q, a0:a0 + ma]
                for c in range(len(group)):
                    c0, c1 = group[c]
                    bj_move = tile[0:qs, c0 - span0:c1 - span0] if streamed else bj[0:qs, q, c0:c1]
                    nisa.nc_matmul(dst=v[c][0:ma, 0:c1 - c0], stationary=bi[0:qs, q, a0:a0 + ma],
                                   moving=bj_move)
                    x0 = max(c0, a0 + ma)
                    if exchange and x0 < c1:
                        nisa.nc_matmul(dst=x[c][0:ma, x0 - c0:c1 - c0], stationary=bj_stat,
                                       moving=bi[0:qs, q, x0:c1])
            for c in range(len(group)):
                c0, c1 = group[c]
                w = c1 - c0
                inv_d = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)  # 1 / D
                nisa.tensor_scalar(dst=inv_d[0:ma, 0:w], data=neg_eb[0:ma, c0:c1], op0=nl.add,
                                   operand0=shift[0:ma])
                nisa.reciprocal(dst=inv_d[0:ma, 0:w], data=inv_d[0:ma, 0:w])
                t = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)  # T = V / D
                nisa.tensor_tensor(dst=t[0:ma, 0:w], data1=inv_d[0:ma, 0:w], data2=v[c][0:ma, 0:w],
                                   op=nl.multiply)
                os_col = sums[0:ma, 0:1]
                ex_col = sums[0:ma, 1:2]
                _add_dot(os_col, t[0:ma, 0:w], v[c][0:ma, 0:w], 1.0)  # sum T V
                o = max(c0, a0 + ma) - c0
                if exchange and o < w:
                    tx = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)  # X / D
                    nisa.tensor_tensor(dst=tx[0:ma, o:w], data1=inv_d[0:ma, o:w],
                                       data2=x[c][0:ma, o:w], op=nl.multiply)
                    _add_dot(os_col, tx[0:ma, o:w], x[c][0:ma, o:w], 1.0)  # sum X^2 / D
                    _add_dot(ex_col, t[0:ma, o:w], x[c][0:ma, o:w], 2.0)  # 2 sum T X
                if exchange and g0 + c == 0:  # the diagonal block V[A, A], transposed on the Tensor Engine
                    v_diag = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=v_diag[0:ma, 0:ma], src=v[0][0:ma, 0:ma])
                    v_diag_t = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_transpose(dst=v_diag_t[0:ma, 0:ma], data=v_diag[0:ma, 0:ma])
                    _add_dot(ex_col, t[0:ma, 0:ma], v_diag_t[0:ma, 0:ma], 1.0)  # sum T V^T


def _program_rows(n, programs, pid, triangle):
    """Rows i of a pair block that program `pid` of `programs` forms: every `programs`-th row
    of a rectangle; for a triangle (row i has i + 1 pairs) rows folded from both ends, so the
    programs' pair counts differ by at most about n / 2."""
    if programs == 1:
        return list(range(n))
    if triangle == 1:
        period = 2 * programs
        return [i for i in range(n) if i % period == pid or i % period == period - 1 - pid]
    return [i for i in range(n) if i % programs == pid]


def _load_rows(b, row, nq):
    """B[row] [NAUX, NVIR] into SBUF [128, nq, NVIR] (auxiliary index on the partitions)."""
    NAUX, NVIR = b.shape[1], b.shape[2]
    tile = nl.ndarray((P, nq, NVIR), dtype=nl.float32, buffer=nl.sbuf)
    for q in nl.affine_range(nq):
        qs = min(P, NAUX - q * P)
        nisa.dma_copy(dst=tile[0:qs, q, :], src=b[row, q * P:q * P + qs, :])
    return tile


def _vir_column(e_vir_col):
    """e_vir_col [NVIR, 1] in SBUF as [128, ceil(NVIR / 128)]: virtual 128 t + p on partition p,
    column t (one per-partition scalar per 128-row block of virtuals)."""
    NVIR = e_vir_col.shape[0]
    n = (NVIR + P - 1) // P
    column = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    for t in nl.affine_range(n):
        rows = min(P, NVIR - t * P)
        nisa.dma_copy(dst=column[0:rows, t:t + 1], src=e_vir_col[t * P:t * P + rows, :])
    return column


def _add_dot(column, a, b, scale=1.0):
    """column [MA, 1] += scale * sum over the free axis of a * b (a, b [MA, W], any W; b may be
    PSUM)."""
    rows = a.shape[0]
    width = a.shape[1]
    prod = nl.ndarray((P, max(FREE, width)), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[0:rows, 0:width], data1=a, data2=b, op=nl.multiply)
    part = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=part[0:rows], op=nl.add, data=prod[0:rows, 0:width], axis=(1,))
    if scale != 1.0:
        nisa.tensor_scalar(dst=part[0:rows], data=part[0:rows], op0=nl.multiply, operand0=scale)
    nisa.tensor_tensor(dst=column, data1=column, data2=part[0:rows], op=nl.add)


@nki.jit
def density_kernel(b_i, b_j, b_k, e_i_rows, e_j_rows, e_k_rows, e_vir_k_col, neg_e_vir_rows, with_vv,
                   x_w, x_u, y_w, y_u):
    """Unrelaxed MP2 density contributions of the pairs (i, k) and (j, k), i in block I, j in
    block J, k in block K, any spin case and scaling, any size; the amplitudes never leave the chip.

    b_i [NI, NAUX, NVIR], b_j [NJ, NAUX, NVIR], b_k [NK, NAUX, NVIRK]: whitened B, auxiliary index
    on the rows (k may be the other spin: NVIRK may differ). e_*_rows [128, N*]: occupied
    energies on every partition; e_vir_k_col [NVIRK, 1]: k's virtual energies e_c;
    neg_e_vir_rows [128, NVIR]: -e_a. with_vv = 1 (a diagonal launch, J = I): also P_vv.
    (x_w, x_u), (y_w, y_u): compile-time weights of the two amplitude combinations (x_u, y_u
    nonzero only for NVIRK = NVIR). Per k and per block of 128 of k's virtuals c (partitions),
    for every i of I and j of J, a in 512-column chunks:
        W[c, a] = (ia|kc) = sum_Q B_k[Q, c] B_i[Q, a]      U[c, a] = (ic|ka) = sum_Q B_i[Q, c] B_k[Q, a]
        X^T[c, a] = (x_w W - x_u U) / D,   Y^T[c, a] = (y_w W - y_u U) / D,   D = e_i + e_k - e_a - e_c (spin_cases)
    (closed shell: X = t, Y = (c_os + c_ss) t - c_ss t^T; same spin: X = Y = t - t^T; opposite
    spin: X = Y = t; spin_cases.density_weights), so that
        oo[i, j]  += sum_{c, a} X_ik^T[c, a] Y_jk^T[c, a]    (host: P_ij = -w sum_k oo)
        vv[a, b]  += sum_c X_ik^T[c, a] Y_ik^T[c, b]         (host: P_ab = w sum vv; J = I only)
    A diagonal launch forms W and U once per (i, k, c block) and both X and Y from them (Y is X
    itself when the weights agree). Residency: the amplitudes of one c block for all rows of the
    launch ((NI + NJ) NVIR fp32 per partition, NkiBackend.density_rows) and B_k's and B_i's columns c (stationary, [128, nq, 128]);
    the moving B rows are streamed in [128, 512] tiles; vv stays in SBUF up to VV_RESIDENT_BYTES,
    beyond it its partial sums are added into vv_out in HBM per c block.
    Returns (oo partials [128, NI * NJ] per partition, vv [NVIR, NVIR]).
    Long (the kernel's loop nest is its tile schedule, kept whole): cutting it into helpers
    would move where tiles die (on-chip memory peaks, recorded in the trace).
    """
    NI, NAUX, NVIR = b_i.shape
    NJ, NK, NVIRK = b_j.shape[0], b_k.shape[0], b_k.shape[2]
    nc = (NVIRK + P - 1) // P  # blocks of k's virtuals c (the partitions of the amplitudes)
    na = (NVIR + P - 1) // P  # blocks of i's virtuals a (the partitions of vv)
    vv_resident = na * NVIR * 4 <= VV_RESIDENT_BYTES
    oo_out = nl.ndarray((P, NI * NJ), dtype=nl.float32, buffer=nl.shared_hbm)
    vv_out = nl.ndarray((NVIR, NVIR), dtype=nl.float32, buffer=nl.shared_hbm)
    ei = nl.ndarray((P, NI), dtype=nl.float32, buffer=nl.sbuf)
    ej = nl.ndarray((P, NJ), dtype=nl.float32, buffer=nl.sbuf)
    ek = nl.ndarray((P, NK), dtype=nl.float32, buffer=nl.sbuf)
    neg_ea = nl.ndarray((P, NVIR), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ei, src=e_i_rows)
    nisa.dma_copy(dst=ej, src=e_j_rows)
    nisa.dma_copy(dst=ek, src=e_k_rows)
    nisa.dma_copy(dst=neg_ea, src=neg_e_vir_rows)
    ec = _vir_column(e_vir_k_col)
    oo = nl.ndarray((P, NI * NJ), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=oo, value=0.0)
    if vv_resident:
        vv = nl.ndarray((P, na, NVIR), dtype=nl.float32, buffer=nl.sbuf)  # vv[a, b], a on partitions
        nisa.memset(dst=vv, value=0.0)
    else:  # vv_out starts at zero and takes each c block's partial sums
        zeros = nl.ndarray((P, NVIR), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
        for a in nl.affine_range(na):
            ma = min(P, NVIR - a * P)
            nisa.dma_copy(dst=vv_out[a * P:a * P + ma, :], src=zeros[0:ma, :])
    for k in range(NK):
        for c in range(nc):
            mc = min(P, NVIRK - c * P)
            bk_c = _load_columns(b_k, k, c * P, mc)  # B_k[Q, c]: W's stationary
            x_i = nl.ndarray((P, NI, NVIR), dtype=nl.float32, buffer=nl.sbuf)  # X^T of (i, k), rows c
            # Y^T of (j, k), rows c: X^T itself when J = I and the weights agree (same and opposite spin)
            same_y = with_vv == 1 and (y_w, y_u) == (x_w, x_u)
            y_j = x_i if same_y else nl.ndarray((P, NJ, NVIR), dtype=nl.float32, buffer=nl.sbuf)
            for i in range(NI):  # J = I: Y from the same (ia|kc), (ic|ka) as X
                both = with_vv == 1 and not same_y
                _amplitude_block(b_i, i, b_k, k, bk_c, c, mc, ei[:, i:i + 1], ek[:, k:k + 1], ec, neg_ea,
                                 [(x_i[:, i, :], (x_w, x_u))] + ([(y_j[:, i, :], (y_w, y_u))] if both else []))
            for j in range(NJ if with_vv != 1 else 0):
                _amplitude_block(b_j, j, b_k, k, bk_c, c, mc, ej[:, j:j + 1], ek[:, k:k + 1], ec, neg_ea,
                                 [(y_j[:, j, :], (y_w, y_u))])
            for i in range(NI):
                for j in range(NJ):
                    _add_dot(oo[0:mc, i * NJ + j:i * NJ + j + 1], x_i[0:mc, i, :], y_j[0:mc, j, :])
            if with_vv == 1:  # J = I: vv[a, b] += sum_i sum_c X_i^T[c, a] Y_i^T[c, b]
                for a in range(na):
                    ma = min(P, NVIR - a * P)
                    for b0 in range(0, NVIR, FREE):
                        b1 = min(b0 + FREE, NVIR)
                        acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                        for i in range(NI):
                            nisa.nc_matmul(dst=acc[0:ma, 0:b1 - b0], stationary=x_i[0:mc, i, a * P:a * P + ma],
                                           moving=y_j[0:mc, i, b0:b1])
                        part = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.tensor_copy(dst=part[0:ma, 0:b1 - b0], src=acc[0:ma, 0:b1 - b0])
                        if vv_resident:
                            nisa.tensor_tensor(dst=vv[0:ma, a, b0:b1], data1=vv[0:ma, a, b0:b1],
                                               data2=part[0:ma, 0:b1 - b0], op=nl.add)
                        else:
                            held = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                            nisa.dma_copy(dst=held[0:ma, 0:b1 - b0], src=vv_out[a * P:a * P + ma, b0:b1])
                            nisa.tensor_tensor(dst=held[0:ma, 0:b1 - b0], data1=held[0:ma, 0:b1 - b0],
                                               data2=part[0:ma, 0:b1 - b0], op=nl.add)
                            nisa.dma_copy(dst=vv_out[a * P:a * P + ma, b0:b1], src=held[0:ma, 0:b1 - b0])
    nisa.dma_copy(dst=oo_out, src=oo)
    if vv_resident:
        for a in nl.affine_range(na):
            ma = min(P, NVIR - a * P)
            nisa.dma_copy(dst=vv_out[a * P:a * P + ma, :], src=vv[0:ma, a, :])
    return oo_out, vv_out


def _load_columns(b, row, c0, mc):
    """B[row][:, c0:c0 + mc] [NAUX, mc] into SBUF [128, nq, 128] (auxiliary index on the partitions)."""
    NAUX = b.shape[1]
    nq = (NAUX + P - 1) // P
    tile = nl.ndarray((P, nq, P), dtype=nl.float32, buffer=nl.sbuf)
    for q in nl.affine_range(nq):
        qs = min(P, NAUX - q * P)
        nisa.dma_copy(dst=tile[0:qs, q, 0:mc], src=b[row, q * P:q * P + qs, c0:c0 + mc])
    return tile


def _amplitude_block(b_i, i, b_k, k, bk_c, c, mc, e_i, e_k, ec, neg_ea, outs, span=None, held=(None, None)):
    """X^T[c, a] = (c_w (ia|kc) - c_u (ic|ka)) / D for one block of 128 of k's virtuals c (rows
    c P .. c P + mc, on the partitions) and i's virtuals a in span = (lo, hi) (all of them by
    default), into each out [128, hi - lo] of outs [(out, (c_w, c_u)), ...], all from the same W
    and U (formed once).
    bk_c [128, nq, 128]: B_k's columns c in SBUF (W's stationary); the moving rows B_i[Q, a] (and,
    for U, B_k[Q, a] with B_i's columns c stationary) are streamed in [128, 512] tiles from HBM,
    or read from held = (B_i rows, B_k rows) [128, nq, NVIR] where the caller keeps them in SBUF.
    U only where some c_u != 0 (then k's virtuals are i's; otherwise they may differ)."""
    NAUX, NVIR = b_i.shape[1], b_i.shape[2]
    lo, hi = (0, NVIR) if span is None else span
    nq = (NAUX + P - 1) // P
    with_u = any(weights[1] != 0.0 for _, weights in outs)
    if with_u:
        bi_c = _load_columns(b_i, i, c * P, mc)  # B_i[Q, c]: U's stationary
    shift = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)  # e_i + e_k - e_c
    nisa.tensor_tensor(dst=shift[0:mc], data1=e_i[0:mc], data2=e_k[0:mc], op=nl.add)
    nisa.tensor_tensor(dst=shift[0:mc], data1=shift[0:mc], data2=ec[0:mc, c:c + 1], op=nl.subtract)
    for a0 in range(lo, hi, FREE):
        a1 = min(a0 + FREE, hi)
        w = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
        u = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum) if with_u else w  # w: not read
        for q in range(nq):
            qs = min(P, NAUX - q * P)
            bi_rows = _moving_rows(b_i, i, held[0], q, qs, a0, a1)
            nisa.nc_matmul(dst=w[0:mc, 0:a1 - a0], stationary=bk_c[0:qs, q, 0:mc], moving=bi_rows)
            if with_u:
                bk_rows = _moving_rows(b_k, k, held[1], q, qs, a0, a1)
                nisa.nc_matmul(dst=u[0:mc, 0:a1 - a0], stationary=bi_c[0:qs, q, 0:mc], moving=bk_rows)
        inv_d = _inverse_denominator(neg_ea[0:mc, a0:a1], shift[0:mc])
        for out, weights in outs:
            _combine_over_denominator(w[0:mc, 0:a1 - a0], u[0:mc, 0:a1 - a0], inv_d, weights, out[0:mc, a0 - lo:a1 - lo])


def _moving_rows(b, row, held, q, qs, a0, a1):
    """B[row][q P .. q P + qs, a0:a1]: a view of held [128, nq, NVIR] (the rows kept in SBUF),
    or streamed from HBM into a [128, 512] tile."""
    if held is not None:
        return held[0:qs, q, a0:a1]
    tile = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[0:qs, 0:a1 - a0], src=b[row, q * P:q * P + qs, a0:a1])
    return tile[0:qs, 0:a1 - a0]


def _inverse_denominator(neg_ea, shift):
    """1 / (shift - e_a) [R, F] in SBUF (in a [128, 512] tile) on the Vector Engine: neg_ea [R, F] = -e_a,
    shift [R, 1] = e_i + e_k - e_c."""
    R, F = neg_ea.shape
    inv_d = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=inv_d[0:R, 0:F], data=neg_ea, op0=nl.add, operand0=shift)
    nisa.reciprocal(dst=inv_d[0:R, 0:F], data=inv_d[0:R, 0:F])
    return inv_d[0:R, 0:F]


def _combine_over_denominator(w, u, inv_d, weights, out):
    """out = (c_w W - c_u U) inv_d on the Vector Engine: W, U [R, F] in PSUM, inv_d [R, F] from
    _inverse_denominator; c_w W goes to SBUF first even for c_w = 1 when U is subtracted
    (tensor_tensor takes at most one PSUM operand)."""
    R, F = w.shape
    c_w, c_u = weights
    numerator = w  # c_w W - c_u U (W itself for t)
    if c_w != 1.0 or c_u != 0.0:
        combined = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=combined[0:R, 0:F], data=w, op0=nl.multiply, operand0=c_w)
        if c_u != 0.0:
            u_part = u
            if c_u != 1.0:
                scaled = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=scaled[0:R, 0:F], data=u, op0=nl.multiply, operand0=c_u)
                u_part = scaled[0:R, 0:F]
            nisa.tensor_tensor(dst=combined[0:R, 0:F], data1=combined[0:R, 0:F], data2=u_part, op=nl.subtract)
        numerator = combined[0:R, 0:F]
    nisa.tensor_tensor(dst=out, data1=numerator, data2=inv_d, op=nl.multiply)


def gamma_blocking(nvir, nvir_j, naux):
    """(WB, QW, g_resident) of gamma_kernel: j's virtuals per block (a multiple of 128, X[a, b]
    of all a tiles within GAMMA_X_BYTES), auxiliary columns per chunk of the held B_i[a, Q]
    (within GAMMA_B_BYTES, <= FREE) and whether G_j [ceil(nvir_j / 128), naux] fits GAMMA_G_BYTES."""
    na = (nvir + P - 1) // P
    tiles = min((nvir_j + P - 1) // P, GAMMA_X_BYTES // (na * P * 4))
    qw = min(FREE, naux, GAMMA_B_BYTES // (na * 4))
    assert tiles >= 1 and qw >= 1, f"gamma_kernel: nvir {nvir} leaves no room for one block of X in SBUF"
    return tiles * P, qw, (nvir_j + P - 1) // P * naux * 4 <= GAMMA_G_BYTES


@nki.jit
def gamma_kernel(b_i, b_i_cols, b_j, e_i_rows, e_j_rows, e_vir_col, neg_e_vir_j_rows, c_w, c_u):
    """The three-index two-particle density of the pairs (i, j), i in block I, j in block J,
    whitened, at any size; the amplitudes never leave the chip.

    b_i [NI, NAUX, NVIR] and b_j [NJ, NAUX, NVIRJ]: B with the auxiliary index on the rows;
    b_i_cols [NI, NVIR, NAUX]: B_i with the virtual index on the rows. e_*_rows [128, N*]: the
    occupied energies on every partition; e_vir_col [NVIR, 1]: i's virtual energies e_a;
    neg_e_vir_j_rows [128, NVIRJ]: -e_b of j's virtuals. c_w, c_u: compile-time weights. Per pair
    (i, j) and block of WB of j's virtuals b (gamma_blocking), a on partitions in 128s:
        W[a, b] = (ia|jb) = sum_Q B_i[Q, a] B_j[Q, b]      U[a, b] = (ib|ja) = sum_Q B_j[Q, a] B_i[Q, b]
        X[a, b] = (c_w W - c_u U) / D,   D = e_i + e_j - e_a - e_b (spin_cases.pair_denominators; U only for c_u != 0: NVIRJ = NVIR)
    (density_kernel's _amplitude_block with i and j's roles swapped), then, b on partitions in
    128s, Q in chunks of QW columns:
        G_j[b, Q] += sum_a X[a, b] B_i[a, Q]
    Returns G [NJ, NVIRJ, NAUX] (summed over the launch's i). SBUF: X of one pair and block
    [128, na, WB], B_i[a, Q] of one Q chunk [128, na, QW], B_i's columns a and (for U) B_j's
    [128, nq, 128]; the moving B rows streamed in [128, 512] tiles; G_j of one j in SBUF when it
    fits GAMMA_G_BYTES, else its partial sums are added into g_out in HBM per pair.
    Long (the kernel's loop nest is its tile schedule, kept whole).
    """
    NI, NAUX, NVIR = b_i.shape
    NJ, NVIRJ = b_j.shape[0], b_j.shape[2]
    na = (NVIR + P - 1) // P
    nb = (NVIRJ + P - 1) // P
    WB, QW, g_resident = gamma_blocking(NVIR, NVIRJ, NAUX)
    nq = (NAUX + P - 1) // P
    hold = nq * (NVIRJ + (NVIR if c_u != 0.0 else 0)) * 4 <= GAMMA_ROWS_BYTES  # B_j (and B_i) rows in SBUF
    g_out = nl.ndarray((NJ, NVIRJ, NAUX), dtype=nl.float32, buffer=nl.shared_hbm)
    ei = nl.ndarray((P, NI), dtype=nl.float32, buffer=nl.sbuf)
    ej = nl.ndarray((P, NJ), dtype=nl.float32, buffer=nl.sbuf)
    neg_eb = nl.ndarray((P, NVIRJ), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ei, src=e_i_rows)
    nisa.dma_copy(dst=ej, src=e_j_rows)
    nisa.dma_copy(dst=neg_eb, src=neg_e_vir_j_rows)
    ea = _vir_column(e_vir_col)
    zeros = nl.ndarray((P, NAUX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    for j in range(NJ):
        bj_rows = _load_rows(b_j, j, nq) if hold else None  # B_j[Q, b]: W's moving rows
        g = nl.ndarray((P, nb, NAUX), dtype=nl.float32, buffer=nl.sbuf) if g_resident else None  # G_j[b, Q]
        for r in nl.affine_range(nb):
            mb = min(P, NVIRJ - r * P)
            if g_resident:
                nisa.memset(dst=g[:, r, :], value=0.0)
            else:
                nisa.dma_copy(dst=g_out[j, r * P:r * P + mb, :], src=zeros[0:mb, :])
        for i in range(NI):
            bi_rows = _load_rows(b_i, i, nq) if hold and c_u != 0.0 else None  # B_i[Q, b]: U's moving rows
            for b0 in range(0, NVIRJ, WB):
                b1 = min(b0 + WB, NVIRJ)
                x = nl.ndarray((P, na, WB), dtype=nl.float32, buffer=nl.sbuf)  # X[a, b], a on partitions
                for t in range(na):
                    ma = min(P, NVIR - t * P)
                    bi_t = _load_columns(b_i, i, t * P, ma)  # B_i[Q, a]: W's stationary
                    _amplitude_block(b_j, j, b_i, i, bi_t, t, ma, ej[:, j:j + 1], ei[:, i:i + 1], ea, neg_eb,
                                     [(x[:, t, :], (c_w, c_u))], (b0, b1), (bj_rows, bi_rows))
                for q0 in range(0, NAUX, QW):  # G_j[b, Q] += sum_a X[a, b] B_i[a, Q]
                    q1 = min(q0 + QW, NAUX)
                    bic = nl.ndarray((P, na, QW), dtype=nl.float32, buffer=nl.sbuf)  # B_i[a, Q], a on partitions
                    for t in nl.affine_range(na):
                        ma = min(P, NVIR - t * P)
                        nisa.dma_copy(dst=bic[0:ma, t, 0:q1 - q0], src=b_i_cols[i, t * P:t * P + ma, q0:q1])
                    for r0 in range(b0, b1, P):
                        mb = min(P, b1 - r0)
                        acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                        for t in range(na):
                            ma = min(P, NVIR - t * P)
                            nisa.nc_matmul(dst=acc[0:mb, 0:q1 - q0], stationary=x[0:ma, t, r0 - b0:r0 - b0 + mb],
                                           moving=bic[0:ma, t, 0:q1 - q0])
                        if g_resident:
                            g_rq = g[0:mb, r0 // P, q0:q1]
                        else:
                            g_rq = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)[0:mb, 0:q1 - q0]
                            nisa.dma_copy(dst=g_rq, src=g_out[j, r0:r0 + mb, q0:q1])
                        nisa.tensor_tensor(dst=g_rq, data1=g_rq, data2=acc[0:mb, 0:q1 - q0], op=nl.add)
                        if not g_resident:
                            nisa.dma_copy(dst=g_out[j, r0:r0 + mb, q0:q1], src=g_rq)
        if g_resident:
            for r in nl.affine_range(nb):
                mb = min(P, NVIRJ - r * P)
                nisa.dma_copy(dst=g_out[j, r * P:r * P + mb, :], src=g[0:mb, r, :])
    return g_out


# ---- the SCF's Coulomb and exchange builds (dfmp2.chem.jk; the backend side in fitted.py) ------------

@nki.jit
def fitted_jk_kernel(b, left, right, left_t, w_col, same, with_k):
    """One fp32 SCF build of one density D = L diag(w) R^T from the whitened JK-fit integrals, at
    any nao:
      H^P = B^P R diag(w),  G^P = B^P L         half transforms (G = B^P R when same: R is L)
      rho_P = sum_(m, i) L_mi H^P_mi            the fitted density (= sum_mn B^P_mn D_mn)
      K = sum_P G^P H^P^T                       exchange (with_k)
      J = sum_P rho_P B^P                       Coulomb: a second pass over B, once rho is whole
    b [NP, NAO, NAO] (B^P symmetric), left, right [NAO, R], left_t [R, NAO] = L^T, w_col [R, 1];
    out [2, NAO, NAO]: J, K (K zero without with_k). R within jk_columns(NAO, same) (<= 512).
    Tiles: pass 1, per P and 512-column chunk of B^P (streamed, [128, nn, 512], each B^P read
    once): the AO index n on partitions for the half transforms, whose results H^T, G^T [i, m]
    have the orbital index i on partitions (128s) for K's contraction; w is applied as H leaves
    PSUM. Resident per launch: R (and L) [128, nn, R], L^T [128, ni, NAO], w; per P: H^T, G^T.
    K accumulates in SBUF when it fits (jk_k_resident), else its partial sums are added into
    out[1] in HBM per P. Pass 2: J's contraction over P on partitions (128s), J's flattened
    rows m as 512-column moving tiles.
    Long (the kernel's loop nest is its tile schedule, kept whole).
    """
    NP, NAO, _ = b.shape
    R = left.shape[1]
    nn = (NAO + P - 1) // P
    ni = (R + P - 1) // P
    k_resident = jk_k_resident(NAO, R, same)
    out = nl.ndarray((2, NAO, NAO), dtype=nl.float32, buffer=nl.shared_hbm)
    r_sb = nl.ndarray((P, nn, R), dtype=nl.float32, buffer=nl.sbuf)
    l_sb = r_sb if same else nl.ndarray((P, nn, R), dtype=nl.float32, buffer=nl.sbuf)
    for n in nl.affine_range(nn):
        rn = min(P, NAO - n * P)
        nisa.dma_copy(dst=r_sb[0:rn, n, :], src=right[n * P:n * P + rn, :])
        if not same:
            nisa.dma_copy(dst=l_sb[0:rn, n, :], src=left[n * P:n * P + rn, :])
    lt_sb = nl.ndarray((P, ni, NAO), dtype=nl.float32, buffer=nl.sbuf)
    w_sb = nl.ndarray((P, ni), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.affine_range(ni):
        ri = min(P, R - i * P)
        nisa.dma_copy(dst=lt_sb[0:ri, i, :], src=left_t[i * P:i * P + ri, :])
        nisa.dma_copy(dst=w_sb[0:ri, i:i + 1], src=w_col[i * P:i * P + ri, :])
    ones = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    if with_k and k_resident:
        k_sb = nl.ndarray((P, nn, NAO), dtype=nl.float32, buffer=nl.sbuf)
        for m in nl.affine_range(nn):
            nisa.memset(dst=k_sb[:, m, :], value=0.0)
    else:  # out[1] starts at zero (and takes each P's partial sums with_k)
        zeros = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
        for m in nl.affine_range(nn):
            rm = min(P, NAO - m * P)
            for c0 in range(0, NAO, FREE):
                nisa.dma_copy(dst=out[1, m * P:m * P + rm, c0:min(c0 + FREE, NAO)],
                              src=zeros[0:rm, 0:min(FREE, NAO - c0)])
    npt = (NP + P - 1) // P
    rho_col = nl.ndarray((P, npt), dtype=nl.float32, buffer=nl.sbuf)  # rho_P at [P mod 128, P // 128]
    for pt in range(npt):
        for pp in nl.sequential_range(min(P, NP - pt * P)):
            p = pt * P + pp
            h_t = nl.ndarray((P, ni, NAO), dtype=nl.float32, buffer=nl.sbuf)  # w_i (B^P R)^T: i on partitions
            g_t = nl.ndarray((P, ni, NAO), dtype=nl.float32, buffer=nl.sbuf) if with_k else None  # (B^P L)^T
            for c0 in range(0, NAO, FREE):
                w = min(FREE, NAO - c0)
                bp = nl.ndarray((P, nn, FREE), dtype=nl.float32, buffer=nl.sbuf)  # B^P[n, c0:c0 + w]
                for n in nl.affine_range(nn):
                    rn = min(P, NAO - n * P)
                    nisa.dma_copy(dst=bp[0:rn, n, 0:w], src=b[p, n * P:n * P + rn, c0:c0 + w])
                for i in nl.affine_range(ni):
                    ri = min(P, R - i * P)
                    halves = ((r_sb, True),) + (((l_sb, False),) if with_k and not same else ())
                    for ops, weighted in halves:
                        acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                        for n in nl.affine_range(nn):
                            rn = min(P, NAO - n * P)
                            nisa.nc_matmul(dst=acc[0:ri, 0:w], stationary=ops[0:rn, n, i * P:i * P + ri],
                                           moving=bp[0:rn, n, 0:w])
                        if weighted:  # H^T = w_i (B^P R)^T; when same, G^T = (B^P R)^T from the same sums
                            nisa.tensor_scalar(dst=h_t[0:ri, i, c0:c0 + w], data=acc[0:ri, 0:w], op0=nl.multiply,
                                               operand0=w_sb[0:ri, i:i + 1])
                        if with_k and same == weighted:
                            nisa.tensor_copy(dst=g_t[0:ri, i, c0:c0 + w], src=acc[0:ri, 0:w])
            # rho_P = sum_i sum_m L^T[i, m] H^T[i, m]: row sums on the Vector Engine, the sum over the
            # partitions i on the Tensor Engine
            rho_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
            for i in nl.affine_range(ni):
                ri = min(P, R - i * P)
                prod = nl.ndarray((P, NAO), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=prod[0:ri], data1=lt_sb[0:ri, i, :], data2=h_t[0:ri, i, :], op=nl.multiply)
                row_sum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_reduce(dst=row_sum[0:ri], op=nl.add, data=prod[0:ri], axis=1)
                nisa.nc_matmul(dst=rho_ps, stationary=row_sum[0:ri], moving=ones[0:ri])
            rho_p = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=rho_p, src=rho_ps)
            nisa.dma_copy(dst=rho_col[pp:pp + 1, pt:pt + 1], src=rho_p)  # onto partition P mod 128
            for m in range(nn if with_k else 0):  # K[m, n] += sum_i G^T[i, m] H^T[i, n]
                rm = min(P, NAO - m * P)
                for c0 in range(0, NAO, FREE):
                    w = min(FREE, NAO - c0)
                    acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                    for i in nl.affine_range(ni):
                        ri = min(P, R - i * P)
                        nisa.nc_matmul(dst=acc[0:rm, 0:w], stationary=g_t[0:ri, i, m * P:m * P + rm],
                                       moving=h_t[0:ri, i, c0:c0 + w])
                    if k_resident:
                        k_mc = k_sb[0:rm, m, c0:c0 + w]
                    else:
                        k_mc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)[0:rm, 0:w]
                        nisa.dma_copy(dst=k_mc, src=out[1, m * P:m * P + rm, c0:c0 + w])
                    nisa.tensor_tensor(dst=k_mc, data1=k_mc, data2=acc[0:rm, 0:w], op=nl.add)
                    if not k_resident:
                        nisa.dma_copy(dst=out[1, m * P:m * P + rm, c0:c0 + w], src=k_mc)
    for m in nl.affine_range(nn if with_k and k_resident else 0):
        rm = min(P, NAO - m * P)
        nisa.dma_copy(dst=out[1, m * P:m * P + rm, :], src=k_sb[0:rm, m, :])
    # pass 2: J[m, :] = sum_P rho_P B^P[m, :], P on partitions
    for m in nl.affine_range(NAO):
        for c0 in range(0, NAO, FREE):
            w = min(FREE, NAO - c0)
            acc = nl.ndarray((1, FREE), dtype=nl.float32, buffer=nl.psum)
            for q in nl.affine_range(npt):
                rq = min(P, NP - q * P)
                b_tile = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=b_tile[0:rq, 0:w], src=b[q * P:q * P + rq, m, c0:c0 + w])
                nisa.nc_matmul(dst=acc[0:1, 0:w], stationary=rho_col[0:rq, q:q + 1], moving=b_tile[0:rq, 0:w])
            j_row = nl.ndarray((1, FREE), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=j_row[0:1, 0:w], src=acc[0:1, 0:w])
            nisa.dma_copy(dst=out[0, m:m + 1, c0:c0 + w], src=j_row[0:1, 0:w])
    return out


EXACT_RESIDENT_BYTES = 64 * 1024  # per partition: a shared moving operand up to this stays in SBUF


@nki.jit
def exact_matmul_kernel(x, y):
    """out[0, b] + out[1, b] = X[b]^T Y[b] with exact slice products (Ozaki's scheme, as in
    ao2mo_kernel): X [S, NBX, K, MX] (stationary), Y [S, NBY, K, NY] (moving), NBX, NBY = NB or 1
    (an operand shared by every b). Either operand comes as int8 digits (slice s = d_s 2^(-7 (s + 1)),
    made exact fp32 on the Scalar Engine) or as fp32 slices (values): each slice an integer of at
    most 7 bits (+ sign) times a power of two shared along the contraction K. Products of slice
    pairs s + t <= S - 1 go to PSUM group s + t, exact over CHUNK 128-tiles (<= 512 terms); the
    groups and the chunks are combined by TwoSum into out[0] (hi) + out[1] (lo) [2, NB, MX, NY].
    Tiles: K on partitions (128s, ragged last); X's columns mx in 128-row stationary tiles, Y's
    columns in moving tiles of <= 512 (one PSUM bank per group, S <= 8 banks); a shared Y is
    loaded once per launch when it fits EXACT_RESIDENT_BYTES, else per tile. The slices sit in
    SBUF as bf16 (each is exact in bf16's 8 significant bits: the products at the bf16 rate).
    """
    S, NBX, K, MX = x.shape
    NBY, NY = y.shape[1], y.shape[3]
    NB = max(NBX, NBY)
    nk = (K + P - 1) // P
    out = nl.ndarray((2, NB, MX, NY), dtype=nl.float32, buffer=nl.shared_hbm)
    resident = NBY == 1 and S * nk * NY * 2 <= EXACT_RESIDENT_BYTES
    if resident:
        y_sb = nl.ndarray((P, S * nk, NY), dtype=nl.bfloat16, buffer=nl.sbuf)
        for k in nl.affine_range(nk):
            rk = min(P, K - k * P)
            _load_slices(y, 0, k * P, rk, 0, NY, y_sb, k, nk, S)
    for bt in nl.affine_range(NB):
        bx = bt if NBX > 1 else 0
        by = bt if NBY > 1 else 0
        for c0 in range(0, NY, FREE):
            w = min(FREE, NY - c0)
            for m0 in range(0, MX, P):
                rm = min(P, MX - m0)
                hi = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                lo = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                for k0 in range(0, nk, CHUNK):
                    groups = _psum_tiles(S, FREE)
                    for k in nl.affine_range(k0, min(k0 + CHUNK, nk)):
                        rk = min(P, K - k * P)
                        x_sb = nl.ndarray((P, S, P), dtype=nl.bfloat16, buffer=nl.sbuf)
                        _load_slices(x, bx, k * P, rk, m0, rm, x_sb, 0, 1, S)
                        if resident:
                            y_tiles, y0, ys = y_sb, k, nk
                        else:
                            y_tiles = nl.ndarray((P, S, FREE), dtype=nl.bfloat16, buffer=nl.sbuf)
                            _load_slices(y, by, k * P, rk, c0, w, y_tiles, 0, 1, S)
                            y0, ys = 0, 1
                        for s in range(S):
                            for t in range(S - s):  # slice pairs with s + t <= S - 1 (0-based)
                                ycol = c0 if resident else 0
                                nisa.nc_matmul(dst=groups[s + t][0:rm, 0:w], stationary=x_sb[0:rk, s, 0:rm],
                                               moving=y_tiles[0:rk, t * ys + y0, ycol:ycol + w])
                    _add_groups(groups, S, hi[0:rm, 0:w], lo[0:rm, 0:w], w, k0 == 0)
                nisa.dma_copy(dst=out[0, bt, m0:m0 + rm, c0:c0 + w], src=hi[0:rm, 0:w])
                nisa.dma_copy(dst=out[1, bt, m0:m0 + rm, c0:c0 + w], src=lo[0:rm, 0:w])
    return out


def _load_slices(src, batch, k0, rk, c0, w, dst, first, stride, S):
    """dst[0:rk, s * stride + first, 0:w] = slice s of src[:, batch, k0:k0 + rk, c0:c0 + w] in dst's
    dtype (bf16 or fp32; exact in either): int8 digits scaled by 2^(-7 (s + 1)) on the Scalar
    Engine, fp32 slices cast by the DMA."""
    for s in range(S):
        if src.dtype == nl.int8:
            digits = nl.ndarray((P, w), dtype=nl.int8, buffer=nl.sbuf)
            nisa.dma_copy(dst=digits[0:rk, 0:w], src=src[s, batch, k0:k0 + rk, c0:c0 + w])
            nisa.activation(dst=dst[0:rk, s * stride + first, 0:w], op=nl.copy, data=digits[0:rk, 0:w],
                            scale=DIGIT_WEIGHTS[s])
        else:
            nisa.dma_copy(dst=dst[0:rk, s * stride + first, 0:w], src=src[s, batch, k0:k0 + rk, c0:c0 + w])


@nki.jit
def laplace_z_kernel(z, rows, scales):
    """Z_k[P, Q] += sum_r B[r, P] s_k[r] B[r, Q] (the Laplace SOS-MP2 Z(t_k)) on every tile that
    touches the lower triangle; the other tiles copy z.

    z [NK, N, N]: Z of the NK quadrature points so far; rows [R, N]: B of (i, a) rows, the
    auxiliary index on the free axis; scales [R, NK]: s_k[r] = exp(-(e_a - e_i) t_k).
    Tiles: the rows r (the contraction) on partitions in 128s, RG of them at a time in SBUF
    (`tiles.laplace_row_group`); the stationary operand is 128 auxiliary columns (an M tile)
    of the rows scaled by s_k on the Vector Engine, the moving one 512 columns of the raw rows
    (one PSUM bank). A tile gets the update if it holds any element on or below the diagonal;
    each group's sum is added to the tile read back from HBM (z for the first group).
    SPMD: program p of n takes the M tiles p, p + n, ... (each reads every row group).
    Shapes: R a multiple of 128; N a multiple of 512.
    """
    NK, N = z.shape[0], z.shape[1]
    nr = rows.shape[0] // P
    RG = laplace_row_group(nr, N)
    out = nl.ndarray((NK, N, N), dtype=nl.float32, buffer=nl.shared_hbm)
    programs = nl.num_programs()
    pid = nl.program_id(0)
    for g0 in range(0, nr, RG):
        rg = min(RG, nr - g0)
        raw = nl.ndarray((P, RG, N), dtype=nl.float32, buffer=nl.sbuf)
        scale = nl.ndarray((P, RG, NK), dtype=nl.float32, buffer=nl.sbuf)
        for r in nl.affine_range(rg):
            nisa.dma_copy(dst=raw[:, r, :], src=rows[(g0 + r) * P:(g0 + r + 1) * P, :])
            nisa.dma_copy(dst=scale[:, r, :], src=scales[(g0 + r) * P:(g0 + r + 1) * P, :])
        for m in range(pid, N // P, programs):
            for k in range(NK):
                stationary = nl.ndarray((P, RG, P), dtype=nl.float32, buffer=nl.sbuf)  # s_k B[:, M]
                for r in nl.affine_range(rg):
                    nisa.tensor_scalar(dst=stationary[:, r, :], data=raw[:, r, m * P:(m + 1) * P],
                                       op0=nl.multiply, operand0=scale[:, r, k:k + 1])
                for n in range(N // FREE):
                    before = z if g0 == 0 else out
                    tile = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=tile, src=before[k, m * P:(m + 1) * P, n * FREE:(n + 1) * FREE])
                    if (m + 1) * P > n * FREE:  # the tile touches the lower triangle
                        acc = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.psum)
                        for r in nl.affine_range(rg):
                            nisa.nc_matmul(dst=acc, stationary=stationary[:, r, :],
                                           moving=raw[:, r, n * FREE:(n + 1) * FREE])
                        nisa.tensor_tensor(dst=tile, data1=tile, data2=acc, op=nl.add)
                        nisa.dma_copy(dst=out[k, m * P:(m + 1) * P, n * FREE:(n + 1) * FREE], src=tile)
                    elif g0 == 0:
                        nisa.dma_copy(dst=out[k, m * P:(m + 1) * P, n * FREE:(n + 1) * FREE], src=tile)
    return out


@nki.jit
def laplace_energy_kernel(z_a, z_b, masks):
    """Per-partition sums of sum_PQ Z^a_k[P, Q] Z^b_k[P, Q] over the lower triangle of each
    symmetric Z_k (strictly lower elements twice, the diagonal once): the Laplace E_os's
    contraction, with Z left in HBM.

    z_a, z_b [NK, N, N] (z_b is z_a for a restricted reference), lower triangle valid (tiles
    as laplace_z_kernel writes them); masks [128, (FREE / 128) FREE]: for d = 0..3 the weights
    (2 below, 1 on, 0 above the diagonal) of a 128 x 512 tile whose first row is d 128 rows
    past its first column. Tiles: 128 rows x 512 columns, only those touching the lower
    triangle read. SPMD: program p of n takes the M tiles p, p + n, ... and writes its own
    partials. Returns partials [128, n NK] (program p's in columns p NK to (p + 1) NK); the host
    adds them in fp64. Shapes: N a multiple of 512.
    """
    NK, N = z_a.shape[0], z_a.shape[1]
    nd = FREE // P
    programs = nl.num_programs()
    pid = nl.program_id(0)
    out = nl.ndarray((P, programs * NK), dtype=nl.float32, buffer=nl.shared_hbm)
    weights = nl.ndarray((P, nd * FREE), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=weights, src=masks)
    sums = nl.ndarray((P, NK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=sums, value=0.0)
    for k in range(NK):
        for m in range(pid, N // P, programs):
            for n in range(N // FREE):
                if (m + 1) * P > n * FREE:
                    a = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                    b = nl.ndarray((P, FREE), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=a, src=z_a[k, m * P:(m + 1) * P, n * FREE:(n + 1) * FREE])
                    nisa.dma_copy(dst=b, src=z_b[k, m * P:(m + 1) * P, n * FREE:(n + 1) * FREE])
                    if (n + 1) * FREE <= m * P:  # wholly below the diagonal: every element twice
                        _add_dot(sums[:, k:k + 1], a, b, 2.0)
                    else:  # the diagonal runs through it: weighted by its mask
                        d = (m * P - n * FREE) // P
                        nisa.tensor_tensor(dst=a, data1=a, data2=weights[:, d * FREE:(d + 1) * FREE], op=nl.multiply)
                        _add_dot(sums[:, k:k + 1], a, b, 1.0)
    nisa.dma_copy(dst=out[:, pid * NK:(pid + 1) * NK], src=sums)
    return out

