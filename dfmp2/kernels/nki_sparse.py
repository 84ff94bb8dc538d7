"""Block-sparse (mn|P) as the NKI transform's 128 x 128 tiles: the kept tiles only, packed on the
host in fp64 for ao2mo_kernel's block-sparse layout (see the kernel).

    tile (m, n)   rows [m P, m P + P), columns [n P, n P + P) of (mn|P), P = 128 (the partitions)
    kept          when any kept pair block of the pattern (`dfmp2.sparse.ScreenedPattern`, whose
                  atom blocks need not align with the tiles) overlaps it; symmetric, with every
                  diagonal tile
    packed        [nP, R, P]: the kept tiles stacked along the rows in the order of n, then m
                  (m on the rows; R = their rows, a ragged last row tile's rows only), zero where
                  the pattern dropped a block inside a kept tile or beyond nao (the columns of a
                  ragged last column tile)
    digits        as `ozaki.column_digits`, with each column's power of two taken over its kept
                  tiles (the contraction index m of the kernel's first half)

Pure functions and a frozen map, no state; nothing of a dropped tile is formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .ozaki import digit_exponent, split_digits
from .tiles import P


@dataclass(frozen=True)
class TileMap:
    """The kept 128 x 128 tiles of an nao x nao (mn|P): kept[n] = the kept row tiles m of column
    tile n, ascending; bits: the kernel's compile-time `tile_map`, bit m * nm + n per kept (m, n)."""

    nao: int
    kept: tuple

    @classmethod
    def from_pattern(cls, pattern) -> TileMap:
        """Every tile a kept pair block (M, N) of `pattern` overlaps, in both orientations."""
        nm = -(-pattern.nao // P)
        kept = np.eye(nm, dtype=bool)
        for m, n in pattern.pairs:
            (a0, a1), (b0, b1) = pattern.blocks[m][:2], pattern.blocks[n][:2]
            kept[a0 // P:(a1 - 1) // P + 1, b0 // P:(b1 - 1) // P + 1] = True
        kept |= kept.T
        return cls(pattern.nao, tuple(tuple(int(m) for m in np.flatnonzero(kept[:, n])) for n in range(nm)))

    @classmethod
    def from_bits(cls, bits: int, nao: int) -> TileMap:
        nm = -(-nao // P)
        return cls(nao, tuple(tuple(m for m in range(nm) if (bits >> (m * nm + n)) & 1) for n in range(nm)))

    @property
    def nm(self) -> int:
        return len(self.kept)

    @property
    def bits(self) -> int:
        return sum(1 << (m * self.nm + n) for n, rows in enumerate(self.kept) for m in rows)

    @property
    def ntiles(self) -> int:
        return sum(len(rows) for rows in self.kept)

    def height(self, m) -> int:
        """Rows of row tile m (the last one ragged)."""
        return min(P, self.nao - m * P)

    def row_offsets(self) -> list:
        """offsets[n][k]: the packed row where tile (kept[n][k], n) starts; offsets[n][-1]: where
        column tile n's tiles end (offsets[-1][-1]: the packed rows R)."""
        offsets, row = [], 0
        for rows in self.kept:
            offsets.append([row])
            for m in rows:
                row += self.height(m)
                offsets[-1].append(row)
        return offsets

    def record(self) -> dict:
        """The tiles the kernel streams, against the dense nm^2."""
        return {"tile": P, "tiles": self.nm ** 2, "kept_tiles": self.ntiles,
                "kept_fraction": round(self.ntiles / self.nm ** 2, 6)}


def pack_tiles(screened, tiles: TileMap) -> np.ndarray:
    """The kept tiles of a ScreenedThreeCenter (host fp64 panels) -> [nP, R, P] fp64."""
    pattern, nP = screened.pattern, screened.naux
    offsets = tiles.row_offsets()
    packed = np.zeros((nP, offsets[-1][-1], P))
    start = {(m, n): offsets[n][k] for n, rows in enumerate(tiles.kept) for k, m in enumerate(rows)}
    for b, panel in enumerate(screened.panels):
        panel = np.asarray(panel)
        a0, a1 = pattern.blocks[b][:2]
        cols = pattern.columns(b)
        for m in range(a0 // P, (a1 - 1) // P + 1):
            r0, r1 = max(a0, m * P), min(a1, m * P + P)
            rows = np.arange(r0 - a0, r1 - a0)
            for n in np.unique(cols // P):
                mask = cols // P == n
                t0 = start[(m, int(n))] + r0 - m * P
                packed[:, t0:t0 + r1 - r0, cols[mask] - n * P] = panel[:, rows][:, :, mask]
    return packed


def tile_digits(packed: np.ndarray, tiles: TileMap, count: int):
    """(int8 digits [count, nP, R, P], fp32 2^e [nP, nao, 1]) of packed tiles, e per column over
    that column's kept tiles (`ozaki.column_digits` of the dense tensor, restricted to them)."""
    nP, offsets = packed.shape[0], tiles.row_offsets()
    exponent = np.empty((nP, packed.shape[1], P))
    scale = np.empty((nP, tiles.nm * P))
    for n in range(tiles.nm):
        r0, r1 = offsets[n][0], offsets[n][-1]
        column = digit_exponent(np.abs(packed[:, r0:r1]).max(axis=1))  # [nP, P]: over column n's kept tiles
        exponent[:, r0:r1] = column[:, None, :]
        scale[:, n * P:n * P + P] = np.exp2(column)
    return split_digits(packed, exponent, count), scale[:, :tiles.nao, None].astype(np.float32)


def unpack_tiles(packed: torch.Tensor, tiles: TileMap) -> torch.Tensor:
    """[..., R, P] packed tiles -> [..., nao, nao] (zero outside them); host reference math."""
    lead, nao, offsets = packed.shape[:-2], tiles.nao, tiles.row_offsets()
    out = packed.new_zeros(lead + (tiles.nm * P, tiles.nm * P))
    for n, rows in enumerate(tiles.kept):
        for k, m in enumerate(rows):
            r0, h = offsets[n][k], tiles.height(m)
            out[..., m * P:m * P + h, n * P:n * P + P] = packed[..., r0:r0 + h, :]
    return out[..., :nao, :nao]
