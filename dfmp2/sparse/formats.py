"""Block-sparse (mn|P) over an auxiliary range: the kept pair blocks, in two layouts.

    LowerPanels           each kept block pair (M, N), N <= M, once: lower_M [nP, nM, nlow_M] holds
                          row block M against its kept N <= M, ascending (what the integrals
                          compute, and what the SCF keeps: half the bytes)
    ScreenedMNP           both orientations, (mn|P) = (nm|P): panel_M [nP, nM, ncols_M] holds row
                          block M against every kept N, ascending (`LowerPanels.expand`: a copy,
                          ~0.4 ns an element against libcint's ~10 ns), so that a half transform
                          is one GEMM per row block:
                              X_(m, P, r) = sum_(n in cols_M) (mn|P) F_(n r)   (kernels: screened_*)
Nothing of a dropped block is ever formed. Panels are host numpy arrays or device tensors.
"""

from __future__ import annotations

import numpy as np


def _empty_like(array, shape, dtype=None):
    """An uninitialised array of `shape` of the same kind (numpy or torch, device) as `array`."""
    if isinstance(array, np.ndarray):
        return np.empty(shape, dtype=dtype or array.dtype)
    return array.new_empty(shape, dtype=dtype or array.dtype)


def _nbytes(array) -> int:
    return int(array.nbytes) if isinstance(array, np.ndarray) else array.numel() * array.element_size()


class _Panels:
    """Row panels of one `ScreenedPattern` over nP auxiliary functions (the two layouts below)."""

    def __init__(self, pattern, panels):
        self.pattern = pattern
        self.panels = panels
        self.naux = int(panels[0].shape[0]) if panels else 0
        self.nao = pattern.nao

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(p) for p in self.panels)

    def map(self, function):
        """The same layout and pattern with function(panel) for each panel (an upload, a slice, a whitening)."""
        return type(self)(self.pattern, [function(p) for p in self.panels])


class LowerPanels(_Panels):
    """Each kept pair block once: panels[M] [nP, nM, nlow_M], row block M against its kept
    N <= M (ascending; the diagonal block whole). pattern: their `ScreenedPattern`."""

    @classmethod
    def from_runs(cls, pattern, naux, run):
        """The panels from run(M, N0, N1) -> (mn|P) [naux, nM, ncols] host fp64 of row block M
        against column blocks [N0, N1), each a contiguous run of its kept N <= M."""
        panels = []
        for m in range(len(pattern.rows)):
            runs = pattern.runs(m, lower=True)
            blocks = [run(m, n0, n1) for n0, n1 in runs]
            panels.append(blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=2))
        return cls(pattern, panels)

    @classmethod
    def from_flat(cls, pattern, rows):
        """The panels as views of rows [nP, lower_elements] (numpy or torch): `flat`'s inverse."""
        panels, c0 = [], 0
        for m in range(len(pattern.rows)):
            shape = (pattern.width(m), pattern.lower_width(m))
            panels.append(rows[:, c0:c0 + shape[0] * shape[1]].reshape(rows.shape[0], *shape))
            c0 += shape[0] * shape[1]
        return cls(pattern, panels)

    def flat(self):
        """The panels side by side, each flattened: [nP, lower_elements] (a row-major store of
        them, e.g. a scratch.RowFile; `from_flat` reads them back)."""
        if isinstance(self.panels[0], np.ndarray):
            return np.concatenate([p.reshape(p.shape[0], -1) for p in self.panels], axis=1)
        import torch

        return torch.cat([p.reshape(p.shape[0], -1) for p in self.panels], dim=1)

    def expand(self, p0=0, p1=None, dtype=None) -> ScreenedMNP:
        """Both orientations of auxiliary functions [p0, p1) (in dtype: default the panels')."""
        p1 = self.naux if p1 is None else p1
        pattern, full = self.pattern, []
        for m, row in enumerate(pattern.rows):
            low = self.panels[m][p0:p1]
            panel = _empty_like(low, (p1 - p0, pattern.width(m), sum(pattern.width(n) for n in row)), dtype)
            panel[:, :, :low.shape[2]] = low
            full.append(panel)
        for m in range(len(pattern.rows)):
            for n in pattern.rows[m]:
                if n >= m:
                    break
                c0, c1 = pattern.column_offsets(m)[n], pattern.column_offsets(n)[m]  # (nm|P) = (mn|P), transposed
                full[n][:, :, c1:c1 + pattern.width(m)] = \
                    self.panels[m][p0:p1, :, c0:c0 + pattern.width(n)].swapaxes(1, 2)
        return ScreenedMNP(pattern, full)


class ScreenedMNP(_Panels):
    """Kept pair blocks of (mn|P) in both orientations for nP auxiliary functions: panels
    [nP, nM, ncols_M] (host numpy fp64, or device tensors after `on_device`), pattern: their
    `ScreenedPattern`."""

    def on_device(self, backend, fp64=True):
        """The same panels as device tensors of `backend` (fp64 unless asked otherwise)."""
        return self.map(lambda p: backend.to_device(p, fp64=fp64))

    def aux_slice(self, p0, p1):
        """The panels of auxiliary functions [p0, p1) (views)."""
        return self.map(lambda p: p[p0:p1])

    def dense(self) -> np.ndarray:
        """(mn|P) [nP, nao, nao], zero outside the kept blocks (host; for checks)."""
        out = np.zeros((self.naux, self.nao, self.nao))
        for m, panel in enumerate(self.panels):
            a0, a1 = self.pattern.blocks[m][:2]
            out[:, a0:a1, self.pattern.columns(m)] = np.asarray(panel)
        return out
