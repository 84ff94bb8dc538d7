"""The numbers the NKI kernels (kernels.py) and the host side that pads, buckets and slices
their arguments (backend.py, launch.py, ozaki.py) must agree on; defined here only.

A NeuronCore's on-chip tiles have the partition axis first: P partitions (the contraction axis
of nc_matmul and the stationary operand's free size); the moving operand's free axis and a
matmul result take at most FREE fp32 columns (one 2 KiB PSUM bank).

Plain constants, the sizing rules both sides apply, and no imports: kernels.py imports this module both as part of the package
(on a Trainium host) and when it is loaded from its file with the emulator standing in for `nki`.
"""

P = 128  # partitions: contraction tiles and the stationary free size
FREE = 512  # moving free size = one PSUM bank of fp32
SLICE_BITS = 7  # exact-product transform: each slice an integer of <= 7 bits times a power of two
VV_RESIDENT_BYTES = 64 * 1024  # density_kernel: P_vv's partial sums up to this (per partition) stay in SBUF
GAMMA_X_BYTES = 48 * 1024  # gamma_kernel: one pair's X[a, b] of every a tile for a block of j's virtuals b
GAMMA_B_BYTES = 32 * 1024  # gamma_kernel: B_i[a, Q] of every a tile for one chunk of Q
GAMMA_G_BYTES = 32 * 1024  # gamma_kernel: G_j[b, Q] up to this stays in SBUF, beyond it in HBM
GAMMA_ROWS_BYTES = 32 * 1024  # gamma_kernel: B_j's rows (and B_i's, for U) up to this stay in SBUF per pair
JK_FIXED_BYTES = 120 * 1024  # fitted_jk_kernel: everything but K (see jk_fixed_bytes)
JK_RESIDENT_BYTES = 152 * 1024  # fitted_jk_kernel: K stays in SBUF when it fits beside the rest within this


def jk_fixed_bytes(nao, r, same):
    """fitted_jk_kernel's SBUF per partition apart from K, for nao functions and r factor columns:
    R (and L) [nn, r], L^T, H^T and G^T [ni, nao], one product row [nao], one streamed B^P chunk
    [nn, FREE], a zero tile [FREE] (nn = ceil(nao / P), ni = ceil(r / P)), fp32."""
    nn, ni = -(-nao // P), -(-r // P)
    return 4 * (nn * r * (1 if same else 2) + 3 * ni * nao + ni + nao + nn * FREE + FREE)


def jk_columns(nao, same):
    """The most factor columns (a multiple of 32, <= FREE) one fitted_jk_kernel launch takes at
    this nao: jk_fixed_bytes within JK_FIXED_BYTES; 0 if not even 32 fit (nao above ~3,000)."""
    return next((r for r in range(FREE, 0, -32) if jk_fixed_bytes(nao, r, same) <= JK_FIXED_BYTES), 0)


def jk_k_resident(nao, r, same):
    """Whether fitted_jk_kernel keeps K [ceil(nao / P), nao] in SBUF (else it adds into HBM per P)."""
    return jk_fixed_bytes(nao, r, same) + 4 * -(-nao // P) * nao <= JK_RESIDENT_BYTES
LAPLACE_ROWS_BYTES = 96 * 1024  # laplace_z_kernel: rows of B held in SBUF per group (per partition)


def laplace_row_group(nrow_tiles, naux_padded):
    """laplace_z_kernel's 128-row tiles of B per group: as many as LAPLACE_ROWS_BYTES holds of
    [naux_padded] fp32 rows per partition (at least one, at most nrow_tiles)."""
    return max(1, min(nrow_tiles, LAPLACE_ROWS_BYTES // (4 * naux_padded)))


LAPLACE_INSTRUCTIONS = 2_000_000  # laplace_z_kernel: unrolled instructions per launch at most (nki 0.3+ refuses 5M)


def laplace_rows_per_launch(nrow_tiles, naux_padded, points):
    """128-row tiles of B per laplace_z_kernel launch: whole row groups whose unrolled instructions
    (per group and M tile and point: RG scalings, and per 512-column chunk RG matmuls, two DMAs and
    an add) stay within LAPLACE_INSTRUCTIONS."""
    rg = laplace_row_group(nrow_tiles, naux_padded)
    per_group = 2 * rg + (naux_padded // P) * points * (rg + (naux_padded // FREE) * (rg + 3))
    return max(1, LAPLACE_INSTRUCTIONS // per_group) * rg

