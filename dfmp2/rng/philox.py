"""The host generator: Philox4x32-10 (Salmon et al., SC'11; Random123) with numpy, or torch on a GPU.

A counter block (c0, c1, c2, c3) and a key (k0, k1) give four 32-bit words, with no state:
any element of any stream can be generated on its own, in any order, on any machine, and
gives the same bits. dfmp2 lays out a stream as

    counter = (block mod 2^32, block div 2^32, stream, 0),   key = (seed mod 2^32, seed div 2^32)

so element e of a stream of 32-bit words lies in block e // 4, word e % 4. Uniform and
normal variates use one word each (normals by Box-Muller on consecutive word pairs).

Generation runs on the host with numpy (device=None), or with torch on a device (device="cuda":
the variates of a GPU integral engine's synthetic problem, made where they are used). The
words are the same bits either way: on torch, Philox's 32 x 32 -> 64-bit products are formed
from 16-bit halves, so that no intermediate leaves the 48 bits int64 holds exactly. The fp64
variates (log, cos, sin) may differ in the last bit between devices. A NeuronCore's words come
from rng/nki_philox.py, in 8-bit limbs (NKI's vector and scalar engines carry integers through
fp32, exact below 2^24 only).
"""

from __future__ import annotations

import numpy as np
import torch

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9  # key schedule (golden ratio)
PHILOX_W1 = 0xBB67AE85  # key schedule (sqrt(3) - 1)
ROUNDS = 10
_MASK16, _MASK32 = 0xFFFF, 0xFFFFFFFF


def _mulhilo32(m: int, x):
    """(m * x) >> 32 and (m * x) mod 2^32 for m < 2^32 and words x < 2^32: numpy's uint64 holds the
    product; torch's int64 does not, so there it is formed from x's 16-bit halves,
    m x = hi_part 2^16 + lo_part, each part below 2^48."""
    if isinstance(x, np.ndarray):
        product = np.uint64(m) * x
        return product >> np.uint64(32), product & np.uint64(_MASK32)
    lo_part = x & _MASK16
    lo_part = lo_part * m
    hi_part = (x >> 16) * m
    high = (hi_part + (lo_part >> 16)) >> 16
    low = (((hi_part & _MASK16) << 16) + lo_part) & _MASK32
    return high, low


def philox4x32(counters, key, rounds: int = ROUNDS):
    """Philox4x32-R of counter blocks [n, 4] (uint32 numpy, or int64 torch holding 32-bit words)
    under key (k0, k1) -> [n, 4] words (uint32 numpy, or int64 torch)."""
    if isinstance(counters, torch.Tensor):
        ctr = counters.reshape(-1, 4).to(torch.int64)
    else:
        ctr = np.asarray(counters, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (ctr[:, i] for i in range(4))
    k0, k1 = int(key[0]) & _MASK32, int(key[1]) & _MASK32
    for r in range(rounds):
        if r:
            k0 = (k0 + PHILOX_W0) & _MASK32  # bump the key between rounds
            k1 = (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    if isinstance(counters, torch.Tensor):
        return torch.stack([c0, c1, c2, c3], dim=1)
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def stream_key(seed: int) -> tuple:
    """Philox's key (k0, k1) of a seed < 2^64: (seed mod 2^32, seed div 2^32)."""
    return seed & _MASK32, (seed >> 32) & _MASK32


def random_words(seed: int, stream: int, start: int, count: int, device=None):
    """Words [start, start + count) of a stream: uint32 [count] (numpy), or on `device` int64 [count]
    (torch) holding the same 32-bit words."""
    if count <= 0:
        return np.zeros(0, dtype=np.uint32) if device is None else torch.zeros(0, dtype=torch.int64, device=device)
    first, last = start // 4, (start + count - 1) // 4
    if device is None:
        blocks = np.arange(first, last + 1, dtype=np.uint64)
        counters = np.zeros((blocks.size, 4), dtype=np.uint64)
    else:
        blocks = torch.arange(first, last + 1, dtype=torch.int64, device=device)
        counters = torch.zeros((blocks.shape[0], 4), dtype=torch.int64, device=device)
    counters[:, 0] = blocks & _MASK32
    counters[:, 1] = blocks >> 32
    counters[:, 2] = stream & _MASK32
    words = philox4x32(counters, stream_key(seed)).reshape(-1)
    offset = start - first * 4
    return words[offset:offset + count]


def uniform(seed: int, stream: int, start: int, count: int, device=None):
    """Uniform variates in (0, 1), fp64: (word + 1/2) / 2^32 (numpy, or a torch tensor on `device`)."""
    words = random_words(seed, stream, start, count, device)
    words = words.astype(np.float64) if device is None else words.to(torch.float64)
    return (words + 0.5) * 2.0**-32


def normal(seed: int, stream: int, start: int, count: int, device=None):
    """Standard normal variates, fp64: Box-Muller on word pairs (2k, 2k+1) -> elements 2k, 2k+1
    (numpy, or a torch tensor on `device`)."""
    xp = np if device is None else torch
    if count <= 0:
        return np.zeros(0) if device is None else torch.zeros(0, dtype=torch.float64, device=device)
    first = start - start % 2
    n = start + count - first
    n += n % 2
    u = uniform(seed, stream, first, n, device).reshape(-1, 2)
    radius = xp.sqrt(-2.0 * xp.log(u[:, 0]))
    angle = 2.0 * np.pi * u[:, 1]
    pairs = xp.stack([radius * xp.cos(angle), radius * xp.sin(angle)], 1).reshape(-1)
    return pairs[start - first:start - first + count]
