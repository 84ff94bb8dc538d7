"""Block-sparse (mn|P) over an auxiliary range: the kept pair blocks in row panels.

    panel_M [nP, nM, ncols_M]    (mn|P) for m in block M, n in the kept blocks of row M
                                 (`ScreenedPattern.rows[M]`, ascending), P in the range
Each kept block pair (M, N), N <= M, is computed once (`from_tiles`) and written to panel M and,
transposed, to panel N: a half transform is then one GEMM per row block,
    X_(m, P, r) = sum_(n in cols_M) (mn|P) F_(n r)      (kernels: screened_half_transform)
and nothing of a dropped block is ever formed.
"""

from __future__ import annotations

import numpy as np


class ScreenedThreeCenter:
    """Kept pair blocks of (mn|P) for nP auxiliary functions: panels [nP, nM, ncols_M] (host
    numpy fp64, or device tensors after `on_device`), pattern: their `ScreenedPattern`."""

    def __init__(self, pattern, panels):
        self.pattern = pattern
        self.panels = panels
        self.naux = int(panels[0].shape[0]) if panels else 0
        self.nao = pattern.nao

    @classmethod
    def from_tiles(cls, pattern, naux, tile):
        """Assemble the panels from tile(M, N) -> (mn|P) [naux, nM, nN] host fp64 of each kept
        (M, N), N <= M (each called once)."""
        panels = [np.empty((naux, pattern.width(m), sum(pattern.width(n) for n in row)))
                  for m, row in enumerate(pattern.rows)]
        offsets = [pattern.column_offsets(m) for m in range(len(pattern.rows))]
        for m, n in pattern.pairs:
            block = tile(m, n)
            c0 = offsets[m][n]
            panels[m][:, :, c0:c0 + pattern.width(n)] = block
            if n != m:
                c0 = offsets[n][m]
                panels[n][:, :, c0:c0 + pattern.width(m)] = block.transpose(0, 2, 1)
        return cls(pattern, panels)

    @property
    def nbytes(self) -> int:
        return sum(int(p.nbytes) if hasattr(p, "nbytes") else p.numel() * p.element_size() for p in self.panels)

    def on_device(self, backend, fp64=True):
        """The same panels as device tensors of `backend` (fp64 unless asked otherwise)."""
        return ScreenedThreeCenter(self.pattern, [backend.to_device(p, fp64=fp64) for p in self.panels])

    def aux_slice(self, p0, p1):
        """The panels of auxiliary functions [p0, p1) (views)."""
        return ScreenedThreeCenter(self.pattern, [p[p0:p1] for p in self.panels])

    def dense(self) -> np.ndarray:
        """(mn|P) [nP, nao, nao], zero outside the kept blocks (host; for checks)."""
        out = np.zeros((self.naux, self.nao, self.nao))
        for m, panel in enumerate(self.panels):
            a0, a1 = self.pattern.blocks[m][:2]
            out[:, a0:a1, self.pattern.columns(m)] = np.asarray(panel)
        return out
