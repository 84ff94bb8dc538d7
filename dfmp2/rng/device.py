"""A stream's words made on a NeuronCore: rng/nki_philox.py launched through an NKI backend's
launcher (kernels.nki_launch), the same bits as the host's `philox.random_words`."""

from __future__ import annotations

import os

import numpy as np

from .philox import random_words

KERNEL = "philox_kernel"


def nki_philox_file() -> str:
    """The path of the NKI generator's source (loaded with or without the real `nki`)."""
    return os.path.join(os.path.dirname(__file__), "nki_philox.py")


def reference_words(grid, first, stream, key0, key1, blocks, tiles):
    """philox_kernel's output on `grid` programs from the host's generator: the words of blocks
    [first, first + grid 128 tiles blocks) as [grid 128, tiles blocks 16] little-endian bytes
    (a model-only repeat)."""
    rows = grid * 128
    words = random_words((key1 << 32) | key0, stream, first * 4, rows * tiles * blocks * 4)
    return words.astype("<u4").view(np.uint8).reshape(rows, tiles * blocks * 16)


def nki_random_words(backend, seed: int, stream: int, start: int, count: int, max_blocks: int | None = None,
                     max_tiles: int | None = None):
    """Words [start, start + count) of Philox stream `stream` under `seed` made on the NKI backend's
    NeuronCore: uint32 [count] on the host (a device -> host transfer in its ledger). Each launch
    runs on the logical core's physical cores (the backend's LNC degree): tiles (at most max_tiles,
    default MAX_TILES) of at most max_blocks (default FREE) counter blocks of 4 words a partition."""
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    launcher = backend.launcher
    kernels = launcher.add_kernels(nki_philox_file(), "dfmp2.rng._nki_philox", {KERNEL: reference_words})
    first, last = start // 4, (start + count - 1) // 4
    grid, key0, key1 = backend.lnc, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    rows, needed = grid * 128, last - first + 1
    blocks = max(1, min(max_blocks or kernels.FREE, -(-needed // rows)))
    tiles = max(1, min(max_tiles or kernels.MAX_TILES, -(-needed // (rows * blocks))))
    parts = []
    for block in range(first, last + 1, rows * tiles * blocks):
        out = launcher.launch(KERNEL, (block, stream & 0xFFFFFFFF, key0, key1, blocks, tiles), 0, 0, grid)
        data = out if isinstance(out, np.ndarray) else out.cpu().numpy()
        backend.ledger.transfer(0, data.nbytes)  # the words come back to the host
        parts.append(np.ascontiguousarray(data).view("<u4").reshape(-1))
    words = np.concatenate(parts).astype(np.uint32)
    offset = start - first * 4
    return words[offset:offset + count]

