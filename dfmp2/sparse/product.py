"""The block-sparse product of the sparse layer, the one both users of screened (mn|P) call:

    X_(m, P, r) = sum_(n kept with m) (mn|P) F_(n r)      panels [nP, nM, ncols_M] x F [nao, r] -> [nao, nP, r]

- the MP2 transform: (ia|P) = sum_n C_(n a) X_(n, P, i) with F = C_occ (`ao2mo`: the product, then one
  dense GEMM; on a NeuronCore one fused ao2mo_kernel launch over the kept 128 x 128 tiles, whose first
  half is this product);
- the SCF's exchange builds: X with F = a density's factors (fitted_store.ScreenedFittedStore).
The backends hold the arithmetic (torch: one GEMM per row panel, kernels/torch/sparse.py; NKI: the tile
map of kernels/nki/sparse.py); this module is their one entry, and `banded_pattern` the synthetic
pattern of `dfmp2 bench --kernel spmm`.
"""

from __future__ import annotations

import numpy as np

from .screening import ScreenedPattern


def block_sparse_product(backend, screened, factor):
    """X [nao, nP, r] = sum_n (mn|P) F_(n r) over the kept pair blocks of `screened` (a
    ScreenedMNP on the backend's device); factor [nao, r] in the panels' dtype.
    Backends whose `screens` hold "scf" (torch: cpu, cuda)."""
    if "scf" not in backend.screens:
        raise ValueError(f"block_sparse_product: the {backend.name} backend has no block-sparse half transform "
                         "(its screened (mn|P) is used by ao2mo only)")
    return backend.screened_half_transform(screened, factor)


def ao2mo(backend, screened, c_occ, c_vir):
    """(ia|P) = sum_mn C_(m i) C_(n a) (mn|P) over the kept pair blocks -> [nocc, nvir, nP]: the
    block-sparse product with C_occ, then sum_n C_(n a) X_(n, P, i) (fused on a NeuronCore)."""
    return backend.screened_ao2mo(screened, c_occ, c_vir)


def banded_pattern(nao: int, block: int, band: int) -> ScreenedPattern:
    """A synthetic pattern: nao AOs in blocks of `block`, the pair blocks (M, N) with |M - N| <= band
    kept (an extended chain's shape: each block couples to its neighbours only)."""
    edges = list(range(0, nao, block)) + [nao]
    blocks = tuple((a0, a1, m, m + 1) for m, (a0, a1) in enumerate(zip(edges, edges[1:])))
    pairs = tuple((m, n) for m in range(len(blocks)) for n in range(max(0, m - band), m + 1))
    return ScreenedPattern(0.0, nao, blocks, pairs)


def random_screened(pattern: ScreenedPattern, naux: int, seed: int = 0):
    """Random fp64 (mn|P) on the kept blocks of `pattern`, symmetric in m, n: a ScreenedMNP
    of naux auxiliary functions (host), for benchmarks and tests."""
    from .formats import LowerPanels

    rng = np.random.default_rng(seed)

    def run(m, n0, n1):
        width = pattern.blocks[n1 - 1][1] - pattern.blocks[n0][0]
        return rng.standard_normal((naux, pattern.width(m), width))

    lower = LowerPanels.from_runs(pattern, naux, run)
    for m, panel in enumerate(lower.panels):  # the diagonal block symmetric, as (mn|P) is
        w = pattern.width(m)
        diagonal = panel[:, :, -w:]
        panel[:, :, -w:] = (diagonal + diagonal.swapaxes(1, 2)) / 2
    return lower.expand()
