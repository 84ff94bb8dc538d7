"""(mn|P) as the NKI transform's 128 x 128 tiles: the kept tiles only (every tile when dense), packed
on the host in fp64 for ao2mo_kernel's packed layout (see the kernel).

    tile (m, n)   rows [m P, m P + P), columns [n P, n P + P) of (mn|P), P = 128 (the partitions)
    kept          when any kept pair block of the pattern (`dfmp2.sparse.ScreenedPattern`, whose
                  atom blocks need not align with the tiles) overlaps it; symmetric, with every
                  diagonal tile
    packed        [nP, R, P]: the kept tiles stacked along the rows in the order of n, then m
                  (m on the rows; R = their rows, a ragged last row tile's rows only), zero where
                  the pattern dropped a block inside a kept tile or beyond nao (the columns of a
                  ragged last column tile)
    lower         the exact transform uploads only the kept tiles with m >= n (TileMap.lower):
                  (mn|P) is symmetric, and the kernel turns each for its mirror
    digits        `symmetric_digits`: int8 digits with one power of two per auxiliary function
                  (so the digits of (m, n) and (n, m) agree)

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
    def full(cls, nao: int) -> TileMap:
        """Every tile of a dense nao x nao (mn|P)."""
        nm = -(-nao // P)
        return cls(nao, tuple(tuple(range(nm)) for _ in range(nm)))

    def lower(self) -> TileMap:
        """The kept tiles on and below the diagonal (m >= n): what a symmetric upload holds."""
        return TileMap(self.nao, tuple(tuple(m for m in rows if m >= n) for n, rows in enumerate(self.kept)))

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
    """The kept tiles of a ScreenedMNP (host fp64 panels) -> [nP, R, P] fp64."""
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
                if (m, int(n)) not in start:  # an upper tile of a lower (symmetric) map
                    continue
                mask = cols // P == n
                t0 = start[(m, int(n))] + r0 - m * P
                packed[:, t0:t0 + r1 - r0, cols[mask] - n * P] = panel[:, rows][:, :, mask]
    return packed


def pack_dense_tiles(x: np.ndarray, tiles: TileMap) -> np.ndarray:
    """The tiles of `tiles` of a dense x [nP, nao, nao] -> [nP, R, P] (ragged columns zero)."""
    offsets = tiles.row_offsets()
    packed = np.zeros((x.shape[0], offsets[-1][-1], P))
    for n, rows in enumerate(tiles.kept):
        width = min(P, tiles.nao - n * P)
        for k, m in enumerate(rows):
            h = tiles.height(m)
            packed[:, offsets[n][k]:offsets[n][k] + h, :width] = x[:, m * P:m * P + h, n * P:n * P + width]
    return packed


def symmetric_digits(packed: np.ndarray, nao: int, count: int):
    """(int8 digits [count, nP, R, P], fp32 2^e [nP, nao, 1]) of the packed lower tiles of a
    symmetric (mn|P) with ONE exponent per auxiliary function (e = digit_exponent of its largest
    element): the digits of (m, n) and (n, m) are then the same, so the kernel can transpose a
    stored tile for its mirror (ao2mo_kernel, symmetric)."""
    exponent = digit_exponent(np.abs(packed).reshape(packed.shape[0], -1).max(axis=1))  # [nP]
    digits = split_digits(packed, exponent[:, None, None], count)
    scale = np.broadcast_to(np.exp2(exponent)[:, None, None], (packed.shape[0], nao, 1)).astype(np.float32)
    return digits, np.ascontiguousarray(scale)


def unpack_symmetric(packed: torch.Tensor, tiles: TileMap) -> torch.Tensor:
    """[..., R, P] packed lower tiles of `tiles` (TileMap.lower of the kept map) -> the symmetric
    [..., nao, nao]: each tile below the diagonal mirrored above it; host reference math."""
    low = unpack_tiles(packed, tiles)
    tile = torch.arange(tiles.nao) // P
    above = (tile[:, None] < tile[None, :]).to(low.dtype)
    return low + low.transpose(-1, -2) * above


def unpack_tiles(packed: torch.Tensor, tiles: TileMap) -> torch.Tensor:
    """[..., R, P] packed tiles -> [..., nao, nao] (zero outside them); host reference math."""
    lead, nao, offsets = packed.shape[:-2], tiles.nao, tiles.row_offsets()
    out = packed.new_zeros(lead + (tiles.nm * P, tiles.nm * P))
    for n, rows in enumerate(tiles.kept):
        for k, m in enumerate(rows):
            r0, h = offsets[n][k], tiles.height(m)
            out[..., m * P:m * P + h, n * P:n * P + P] = packed[..., r0:r0 + h, :]
    return out[..., :nao, :nao]
