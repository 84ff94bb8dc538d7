"""A stream's words made on a NeuronCore: rng/nki_philox.py launched through an NKI backend's
launcher (kernels.nki.launch), the same bits as the host's `philox.random_words`."""

from __future__ import annotations

import os

import numpy as np
import torch

from .philox import random_words

KERNEL = "philox_kernel"


def nki_philox_file() -> str:
    """The path of the NKI generator's source (loaded with or without the real `nki`)."""
    return os.path.join(os.path.dirname(__file__), "nki_philox.py")


def reference_words(grid, counters, blocks, tiles):
    """philox_kernel's output on `grid` programs from the host's generator (a model-only repeat):
    the words its counters name ([grid 128, COLUMNS]: first's limbs, the stream's, round 0's key),
    as [grid 128, tiles blocks 16] little-endian bytes."""
    row = [int(v) for v in np.asarray(counters)[0]]
    number = lambda limbs: sum(limb << (8 * k) for k, limb in enumerate(limbs))  # noqa: E731
    first, stream, key0, key1 = number(row[0:8]), number(row[8:12]), number(row[12:16]), number(row[16:20])
    rows = grid * 128
    words = random_words((key1 << 32) | key0, stream, first * 4, rows * tiles * blocks * 4)
    return words.astype("<u4").view(np.uint8).reshape(rows, tiles * blocks * 16)


def nki_random_words(nki_backend, seed: int, stream: int, start: int, count: int, max_blocks: int | None = None,
                     max_tiles: int | None = None):
    """Words [start, start + count) of Philox stream `stream` < 2^32 under `seed` < 2^64 made on the
    NKI backend's NeuronCore (an NkiBackend, not any Backend: its launcher, ledger and LNC degree):
    uint32 [count] on the host (a device -> host transfer in its ledger).
    Each launch runs on the logical core's physical cores (the backend's LNC degree): tiles (at most
    max_tiles <= MAX_TILES) of at most max_blocks (<= FREE) counter blocks of 4 words a partition;
    the counter, stream and key go as a small run-time argument (one specialization per shape)."""
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    launcher = nki_backend.launcher
    kernels = launcher.add_kernels(nki_philox_file(), "dfmp2.rng._nki_philox", {KERNEL: reference_words})
    for name, value, most in (("max_blocks", max_blocks, kernels.FREE), ("max_tiles", max_tiles, kernels.MAX_TILES)):
        if value is not None and not 1 <= value <= most:
            raise ValueError(f"nki_random_words: {name} must be between 1 and {most}, got {value}")
    if not (0 <= seed < 1 << 64 and 0 <= stream < 1 << 32 and start >= 0):
        raise ValueError(f"nki_random_words: seed {seed} (< 2^64), stream {stream} (< 2^32), start {start} (>= 0)")
    first, last = start // 4, (start + count - 1) // 4
    grid, key0, key1 = nki_backend.lnc, seed & 0xFFFFFFFF, seed >> 32
    rows, needed = grid * 128, last - first + 1
    blocks = min(max_blocks or kernels.FREE, -(-needed // rows))
    tiles = min(max_tiles or kernels.MAX_TILES, -(-needed // (rows * blocks)))
    parts = []
    for block in range(first, last + 1, rows * tiles * blocks):
        counters = torch.tensor(kernels.counter_columns(block, stream, key0, key1, grid, tiles * blocks),
                                dtype=torch.int32)
        out = launcher.launch(KERNEL, (counters, blocks, tiles), 0, counters.numel() * 4, grid)
        data = out if isinstance(out, np.ndarray) else out.cpu().numpy()
        nki_backend.ledger.transfer(0, data.nbytes)  # the words come back to the host
        parts.append(np.ascontiguousarray(data).view("<u4").reshape(-1))
    words = np.concatenate(parts).astype(np.uint32)
    offset = start - first * 4
    return words[offset:offset + count]
