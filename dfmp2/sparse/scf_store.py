"""The SCF's builds with screened B (`--screening`, torch backends): `ScreenedFittedStore`, the
block-sparse layout of `kernels.torch.fitted.TorchFittedStore` (formats.LowerPanels; the same
builds and increments, each half transform the layer's block-sparse product; docs/sparse.md)."""

from __future__ import annotations

import torch

from ..util.blocks import block_ranges
from ..util.scratch import RowFile
from ..kernels.torch.fitted import KIND_DTYPES, MAX_AUX_ROWS, TorchFittedStore
from ..util.system_memory import release_freed_memory
from .formats import LowerPanels
from .product import block_sparse_product

SCREENED_BLOCK_BYTES = 128 * 10**6  # screened builds: an auxiliary block's panels in both orientations
# (their kind's bytes); 32 MB made blocks of ~6 auxiliary functions at 768 AOs, 1.8x slower builds


class ScreenedFittedStore(TorchFittedStore):
    """B for the SCF's builds, screened: each kept pair block once (a LowerPanels of
    whitened B, host fp64), kept on the device in fp64 (J's source; half the bytes of both
    orientations) and, where the budget allows, both orientations in the first build kind (K's
    panels; else expanded block by block per build, ~0.4 ns an element). Out of core: a
    scratch.RowFile of the panels' flat rows (LowerPanels.flat) and their `pattern`, read once per
    build in blocks of auxiliary functions, J's sums done on each block as it is read. The same
    builds and increments as TorchFittedStore, each block's half transform one GEMM per row panel:
        rho_P = sum_(mn kept) B^P_mn D_mn,   J_mn = sum_P rho_P B^P_mn        (kernels.torch.sparse, fp64)
        X_(m, P, r) = sum_n B^P_mn L_nr,     K_mn = sum_(P, r) X_(m, P, r) w_r Z_(n, P, r)"""

    half_aux_dim = 1  # X [nao, nP, r]

    def __init__(self, backend, lower, kinds, free_bytes, pattern=None):  # the dense layout's __init__ does not apply
        on_disk = isinstance(lower, RowFile)
        pattern = pattern if on_disk else lower.pattern
        self.backend, self.nao, self.naux, self._free_bytes = backend, pattern.nao, lower.shape[0] if on_disk \
            else lower.naux, free_bytes
        self._pattern, self._file = pattern, lower if on_disk else None
        self._lower = None if on_disk else lower.map(lambda p: backend.to_device(p, fp64=True))
        self._anchor, self._full, self._on_rows, self.increment_form = None, None, None, ""
        self._rho_from_halves, self.coulomb_form = False, "fp64 passes over the panels"
        dtype = KIND_DTYPES[kinds[0]]
        share = pattern.stored_elements / self.nao ** 2
        if on_disk:
            self.storage = (f"screened: each kept pair block once fp64 on disk ({lower.nbytes / 1e6:.0f} MB, read "
                            f"once per build; {share:.3f} of the dense elements)")
            return
        if self.naux * pattern.stored_elements * (torch.finfo(dtype).bits // 8) <= \
                free_bytes() - 4 * SCREENED_BLOCK_BYTES:
            self._full = self._lower.expand(dtype=dtype)
        release_freed_memory()
        self.storage = ("screened: each kept pair block once fp64" +
                        (f" + both orientations {str(dtype)[-2:]}" if self._full is not None else "") +
                        f" ({share:.3f} of the dense elements)")

    def _blocks(self, dtype, rank):
        """(p0, p1, both orientations of auxiliary functions [p0, p1) in dtype) over the auxiliary
        range (kept, or expanded from the fp64 panels, read from disk out of core: those rows feed
        a Coulomb sum on the way where one is waiting)."""
        stored, itemsize = self._pattern.stored_elements, torch.finfo(dtype).bits // 8
        if self._file is None:
            rows = SCREENED_BLOCK_BYTES // (itemsize * max(stored, self.nao * max(rank, 1)))
        else:  # a block's read (fp64, and the next one's), its expansion and three half transforms in half
            # of what the budget leaves
            limit = min(SCREENED_BLOCK_BYTES, max(8 * 10**6, self._free_bytes() // 2))
            rows = limit // (16 * self._file.shape[1] + itemsize * (stored + 3 * self.nao * max(rank, 1)))
        rows = max(1, min(MAX_AUX_ROWS, rows))
        kept = self._full if self._full is not None and self._full.panels[0].dtype == dtype else None
        if kept is not None:
            for p0, p1 in block_ranges(self.naux, rows):
                yield p0, p1, kept.aux_slice(p0, p1)
            return
        for p0, p1, lower in self._over_rows(block_ranges(self.naux, rows)):
            yield p0, p1, lower.expand(dtype=dtype)

    def _rows(self, p0, p1):
        """Auxiliary functions [p0, p1) of B's fp64 panels in memory, on the device (a LowerPanels)."""
        return self._lower if (p0, p1) == (0, self.naux) else self._lower.map(lambda p: p[p0:p1])

    def _device_rows(self, host):
        return LowerPanels.from_flat(self._pattern, self.backend.to_device(host, fp64=True))

    def _half_transform(self, block, factor, role=None, m_major=False):
        """X [nao, nP, r] = sum_n B^P_mn F_nr over the block's kept pairs."""
        return block_sparse_product(self.backend, block, factor)

    def _exchange_product(self, x, z, weights=None, m_major=False):
        return self.backend.screened_exchange_product(x, z, weights)

    def _coulomb_density(self, dms):
        return self.backend.to_device(dms, fp64=True)

    def _coulomb_part(self, lower, density):
        """sum_(P in lower) rho_P B^P_mn on the kept blocks [nset, nao, nao]:  rho_P = sum_mn B^P_mn D_mn"""
        backend = self.backend
        return backend.screened_coulomb(lower, backend.screened_fit_density(lower, density))

    def _coulomb_result(self, total):
        return self.backend.to_host(total)

    def close(self):
        self._lower = self._full = self._anchor = None
        if self._file is not None:
            self._file.close()
            self._file = None


def fitted_store(backend, rows, nao, kinds, free_bytes, pattern=None):
    """B for the SCF's builds on `backend`, whatever its layout: screened (rows a LowerPanels, or out of
    core a scratch.RowFile of its flat rows with their `pattern`) -> ScreenedFittedStore, on a backend
    whose `screens` hold "scf"; dense (rows [naux, npair] or their RowFile) -> backend.fitted_store."""
    if not isinstance(rows, LowerPanels) and pattern is None:
        return backend.fitted_store(rows, nao, kinds, free_bytes)
    if "scf" not in backend.screens:
        raise ValueError(f"fitted_store: the {backend.name} backend has no screened SCF builds")
    return ScreenedFittedStore(backend, rows, kinds, free_bytes, pattern)
