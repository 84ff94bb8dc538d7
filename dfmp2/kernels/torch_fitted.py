"""The SCF's Coulomb and exchange builds on the torch backend (cpu, cuda): its `FittedStore`.

Storage: the whitened lower triangle B^P_(mn), m >= n [naux, npair], in fp64 (J's source, and
fp64 K's where no square copy fits); square copies [naux, nao, nao] in fp32 and fp64 for K, each
as the budget allows (else K's blocks are unpacked from the triangle per build).

    fitted density    rho_P = sum_(m>=n) B^P_(mn) D'_(mn)   (D' = D + D^T, diagonal once)
    Coulomb           J_(mn) = sum_P rho_P B^P_(mn)          always fp64 (a GEMV: fp32 gains nothing)
    exchange          K_mn = sum_P sum_r (L^T B^P)_rm w_r (R^T B^P)_rn    in the build's kind
"""

from __future__ import annotations

import numpy as np
import torch

from ..memory import release_freed_memory
from ..steps import block_ranges

BLOCK_BYTES = 32 * 10**6  # the largest temporary of a build (fp64 bytes)
MAX_AUX_ROWS = 256  # auxiliary functions per build block at most
KIND_DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "exact": torch.float64}  # exact: this store's exact kind, fp64


class TriangleBlocks:
    """Unpack rows of a lower-triangle store [naux, npair] into square [nP, nao, nao] tensors."""

    def __init__(self, nao, device):
        rows, cols = np.tril_indices(nao)
        self.nao = nao
        self.pairs = rows * nao + cols  # host: the flat [nao * nao] index of each pair m >= n
        self.lower = torch.as_tensor(self.pairs, device=device)
        self.upper = torch.as_tensor(cols * nao + rows, device=device)

    def square(self, packed_rows, dtype):
        """packed_rows [nP, npair] (a device tensor) -> [nP, nao, nao] in dtype."""
        packed_rows = packed_rows.to(dtype)
        out = torch.empty((packed_rows.shape[0], self.nao * self.nao), dtype=dtype, device=packed_rows.device)
        out.index_copy_(1, self.upper, packed_rows)
        out.index_copy_(1, self.lower, packed_rows)
        return out.view(-1, self.nao, self.nao)


class TorchFittedStore:
    """B for the SCF's builds on a torch backend. rows [naux, npair] host fp64 (whitened lower
    triangles), nao, kinds: the build kinds the run will ask for ("fp32", "fp64"), free_bytes():
    what the budget leaves once the triangle is in place (process memory; on a GPU also 90% of
    its free memory): a square copy is kept where it fits, else K's blocks are unpacked."""

    exact_kind = "fp64"  # the kind of anchors and strict builds
    coulomb_follows_kind = False  # J is fp64 whatever the build's kind

    def __init__(self, backend, rows, nao, kinds, free_bytes):
        naux = rows.shape[0]
        self.backend, self.nao, self.naux = backend, nao, naux
        self._packed = backend.to_device(rows, fp64=True)
        self._unpack = TriangleBlocks(nao, backend.device)
        self._square = {}  # dtype -> [naux, nao, nao] device tensor
        free = free_bytes() - 4 * BLOCK_BYTES  # the builds' temporaries
        for dtype in sorted((KIND_DTYPES[k] for k in kinds), key=lambda d: -torch.finfo(d).bits):
            size = naux * nao * nao * (torch.finfo(dtype).bits // 8)
            if size > free:
                continue
            free -= size
            square = torch.empty((naux, nao, nao), dtype=dtype, device=backend.device)
            source = self._square.get(torch.float64)  # fp32 copied from the fp64 square where kept
            for p0, p1 in block_ranges(naux, self._block_rows(0)):
                square[p0:p1] = source[p0:p1] if source is not None else self._unpack.square(self._packed[p0:p1], dtype)
            self._square[dtype] = square
        release_freed_memory()
        self.storage = " + ".join([f"square {str(d)[-2:]}" for d in self._square] + ["fp64 triangle"])

    def _block_rows(self, rank):
        """Auxiliary functions per build block: its temporaries ([nP, r, nao] half transforms, an
        unpacked [nP, nao, nao] block) within BLOCK_BYTES."""
        return max(1, min(MAX_AUX_ROWS, BLOCK_BYTES // (8 * self.nao * max(self.nao, 2 * rank))))

    def _square_blocks(self, dtype, rank):
        """[nP, nao, nao] blocks of B in dtype over the auxiliary range (kept, or unpacked)."""
        for p0, p1 in block_ranges(self.naux, self._block_rows(rank)):
            if dtype in self._square:
                yield self._square[dtype][p0:p1]
            else:
                yield self._unpack.square(self._packed[p0:p1], dtype)

    def build(self, dms, factors, kind, with_j, with_k):
        """(J or None, K or None) [nset, nao, nao] host fp64 of densities dms [nset, nao, nao] given
        as factors [(L, R or None, w or None)] with D = L diag(w) R^T; K's GEMMs in `kind`."""
        vj = self.coulomb(dms) if with_j else None
        vk = self.exchange(factors, KIND_DTYPES[kind]) if with_k else None
        self.backend.synchronize()
        release_freed_memory()  # the unpacked blocks' pages, or the heap keeps growing build by build
        return vj, vk

    def coulomb(self, dms):
        """J [nset, nao, nao] (host fp64) of dms, in fp64:
          rho_P = sum_(m>=n) B^P_(mn) D'_(mn)  (D' = D + D^T, diagonal once),  J_(mn) = sum_P rho_P B^P_(mn)"""
        backend, nao = self.backend, self.nao
        sym = dms + dms.transpose(0, 2, 1)
        sym[:, np.arange(nao), np.arange(nao)] /= 2
        d_rows = backend.to_device(sym.reshape(len(dms), -1)[:, self._unpack.pairs], fp64=True)
        rho = backend.fit_density(self._packed, d_rows)
        return backend.to_host(self._unpack.square(backend.coulomb_block(self._packed, rho), torch.float64))

    def exchange(self, factors, dtype):
        """K [nset, nao, nao] (host fp64) of the densities D = L diag(w) R^T in `factors`, GEMMs in dtype."""
        backend = self.backend

        def on_device(array):  # fp64 first: the backend's compute dtype (fp32 in an fp32 MP2 run) must not round them
            return None if array is None else backend.to_device(array, fp64=True).to(dtype)
        sets = [tuple(on_device(a) for a in factor) for factor in factors]
        vk = np.zeros((len(factors), self.nao, self.nao))
        for block in self._square_blocks(dtype, sum(factor[0].shape[1] for factor in factors)):
            for s, (left, right, weights) in enumerate(sets):
                vk[s] += backend.to_host(backend.exchange_block(block, left, right, weights))
        return vk

    def close(self):
        self._square.clear()
        self._packed = self._unpack = None
