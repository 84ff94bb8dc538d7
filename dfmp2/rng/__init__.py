"""Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11; Random123).

A counter block (c0, c1, c2, c3) and a key (k0, k1) give four 32-bit words, with no state:
any element of any stream can be generated on its own, in any order, on any machine, and
gives the same bits. dfmp2 lays out a stream as

    counter = (block mod 2^32, block div 2^32, stream, 0),   key = (seed mod 2^32, seed div 2^32)

so element e of a stream of 32-bit words lies in block e // 4, word e % 4. Uniform and
normal variates use one word each (normals by Box-Muller on consecutive word pairs).

Generation runs on the host with numpy (uint64 products); every device receives the same
host-generated arrays, so a synthetic problem is bit-identical on cpu, cuda and the NKI path.
(No on-device NKI generator: NKI's vector and scalar engines compute in fp32, exact for
integers below 2^24 only, so Philox's exact 32 x 32 -> 64-bit products cannot be formed there.)
"""

from __future__ import annotations

import numpy as np

PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = 0x9E3779B9  # key schedule (golden ratio)
PHILOX_W1 = 0xBB67AE85  # key schedule (sqrt(3) - 1)
ROUNDS = 10
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32(counters, key, rounds: int = ROUNDS) -> np.ndarray:
    """Philox4x32-R of counter blocks [n, 4] (uint32) under key (k0, k1) -> [n, 4] uint32."""
    ctr = np.asarray(counters, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (ctr[:, i].copy() for i in range(4))
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(rounds):
        if r:
            k0 = (k0 + PHILOX_W0) & 0xFFFFFFFF  # bump the key between rounds
            k1 = (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0 = PHILOX_M0 * c0  # 32 x 32 -> 64-bit products
        p1 = PHILOX_M1 * c2
        hi0, lo0 = p0 >> _SHIFT32, p0 & _MASK32
        hi1, lo1 = p1 >> _SHIFT32, p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def random_words(seed: int, stream: int, start: int, count: int) -> np.ndarray:
    """Words [start, start + count) of a stream: uint32 [count]."""
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    first, last = start // 4, (start + count - 1) // 4
    blocks = np.arange(first, last + 1, dtype=np.uint64)
    counters = np.zeros((blocks.size, 4), dtype=np.uint64)
    counters[:, 0] = blocks & _MASK32
    counters[:, 1] = blocks >> _SHIFT32
    counters[:, 2] = np.uint64(stream & 0xFFFFFFFF)
    key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    words = philox4x32(counters, key).reshape(-1)
    offset = start - first * 4
    return words[offset:offset + count]


def uniform(seed: int, stream: int, start: int, count: int) -> np.ndarray:
    """Uniform variates in (0, 1), fp64: (word + 1/2) / 2^32."""
    return (random_words(seed, stream, start, count).astype(np.float64) + 0.5) * 2.0**-32


def normal(seed: int, stream: int, start: int, count: int) -> np.ndarray:
    """Standard normal variates, fp64: Box-Muller on word pairs (2k, 2k+1) -> elements 2k, 2k+1."""
    if count <= 0:
        return np.zeros(0)
    first = start - start % 2
    n = start + count - first
    n += n % 2
    u = uniform(seed, stream, first, n).reshape(-1, 2)
    radius = np.sqrt(-2.0 * np.log(u[:, 0]))
    angle = 2.0 * np.pi * u[:, 1]
    pairs = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)
    return pairs[start - first:start - first + count]
