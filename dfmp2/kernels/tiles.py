"""The numbers the NKI kernels (nki_kernels.py) and the host side that pads, buckets and slices
their arguments (nki_backend.py, nki_launch.py, ozaki.py) must agree on; defined here only.

A NeuronCore's on-chip tiles have the partition axis first: P partitions (the contraction axis
of nc_matmul and the stationary operand's free size); the moving operand's free axis and a
matmul result take at most FREE fp32 columns (one 2 KiB PSUM bank).

Plain constants and no imports: nki_kernels.py imports this module both as part of the package
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
