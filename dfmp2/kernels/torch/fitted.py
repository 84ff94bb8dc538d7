"""The SCF's Coulomb and exchange builds on the torch backend (cpu, cuda): its `FittedStore`.

Long (one store with both square layouts, m-major on a CPU and P-major, and the increments; issue 74 splits it).

Storage: the whitened lower triangle B^P_(mn), m >= n [naux, npair], in fp64 (J's source, and
the source of K's blocks in a kind without a square copy); one square copy [naux, nao, nao] for
K in the kind most builds use (fp32 in mixed precision, fp64 in fp64) as the budget allows; the
anchor build's fp32 half transforms [naux, nocc, nao] for the incremental builds, as it allows.
Where the budget does not hold the triangle, it is a scratch file (scratch.RowFile) read once per
build in blocks of auxiliary functions (the next block read on a thread while this one is
used), J's and K's work on each block done as it is read.

    fitted density    rho_P = sum_(m>=n) B^P_(mn) D'_(mn)   (D' = D + D^T, diagonal once)
    Coulomb           J_(mn) = sum_P rho_P B^P_(mn)          always fp64 (a GEMV: fp32 gains nothing)
    (cpu, in memory, with K: rho from K's half transforms, rho_P = sum_(r, n) X^P_rn w_r R_nr, in the
    build's kind (increments: rho_P(D - D_a) = sum_(r, n) (2 X_a^P + Y^P)_rn E_nr, an error
    proportional to the step), so that J is one fp64 pass over B instead of two)
    exchange          K_mn = sum_P sum_r (L^T B^P)_rm w_r (R^T B^P)_rn    in the build's kind
    (cpu, a kept square: B m-major, [nao, naux, nao] = B^P_mn at (m, P, n), so that the half transforms
    X_(m, P, r) = sum_n B^P_mn L_nr are one 2-D product [nao naux, nao] x [nao, r] and K one
    [nao, naux r] x [naux r, nao] product over every P at once, into buffers kept from build to build)
    increment         K(D) - K(D_a) = M + M^T,  M = sum_(P, r) (X_a^P + Y^P / 2)_rm Y^P_rn   fp32
                      X_a^P = L_a^T B^P, Y^P = E^T B^P, L Q = L_a + E (aligned orbitals)
"""

from __future__ import annotations

import numpy as np
import torch

from ...util.blocks import block_ranges
from ...util.cpu_config import choice
from ...util.scratch import RowFile
from ...util.system_memory import release_freed_memory

BLOCK_BYTES = 32 * 10**6  # the largest temporary of a build (fp64 bytes)
WHOLE_HALVES_SHARE = 4  # cpu, m-major: the half transforms of every P at once where their buffers take at
# most 1/4 of what the budget leaves (else blocks of P, batched over m)
MAX_AUX_ROWS = 256  # auxiliary functions per build block at most
KIND_DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "exact": torch.float64}  # exact: this store's exact kind, fp64


class TriangleBlocks:
    """Unpack rows of a lower-triangle store [naux, npair] into square [nP, nao, nao] tensors."""

    def __init__(self, nao, device):
        rows, cols = np.tril_indices(nao)
        self.nao, self.device = nao, torch.device(device)
        self.pairs = rows * nao + cols  # host: the flat [nao * nao] index of each pair m >= n
        self.lower = torch.as_tensor(self.pairs, device=device)
        self.upper = torch.as_tensor(cols * nao + rows, device=device)
        self._gather = None  # [nao * nao]: the pair of each square element (fp32 on a CPU, made on first use)

    def square(self, packed_rows, dtype, out=None):
        """packed_rows [nP, npair] (a device tensor) -> [nP, nao, nao] in dtype (into `out`,
        [>= nP, nao, nao], where given: a reused buffer, whose pages are already mapped). fp32 on a
        CPU gathers each square row from its pairs (half the time of the two scatters, which stay
        faster in fp64: measured on an AMD EPYC, 412 functions)."""
        packed_rows = packed_rows.to(dtype)
        if out is None:
            out = torch.empty((packed_rows.shape[0], self.nao * self.nao), dtype=dtype, device=packed_rows.device)
        else:
            out = out[:packed_rows.shape[0]].view(packed_rows.shape[0], self.nao * self.nao)
        if dtype == torch.float32 and self.device.type == "cpu":
            if self._gather is None:  # element (m, n) and its mirror (n, m) <- pair m >= n
                self._gather = torch.empty(self.nao * self.nao, dtype=torch.int64)
                self._gather[self.lower] = self._gather[self.upper] = torch.arange(len(self.pairs))
            torch.index_select(packed_rows, 1, self._gather, out=out)
        else:
            out.index_copy_(1, self.upper, packed_rows)
            out.index_copy_(1, self.lower, packed_rows)
        return out.view(-1, self.nao, self.nao)


class TorchFittedStore:
    """B for the SCF's builds on a torch backend. rows [naux, npair] host fp64 (whitened lower
    triangles), nao, kinds: the build kinds the run will ask for ("fp32", "fp64"), the kind most
    builds use first; free_bytes(): what the budget leaves once the triangle is in place (process
    memory; on a GPU also 90% of its free memory). Square copies of B are kept where they fit
    (`_squares_that_fit`: the first kind's, then the other's; a kind without one unpacks blocks of
    the triangle per build); an anchor build keeps its fp32 half transforms where they fit."""

    exact_kind = "fp64"  # the kind of anchors and strict builds
    half_aux_dim = 0  # the auxiliary index of a half transform X ([nP, r, nao]; screened [nao, nP, r])
    coulomb_follows_kind = False  # J is fp64 whatever the build's kind
    orbital_increments = True  # build_increment from the orbitals' step
    m_major = False  # the kept squares as [nao, naux, nao] (set per store: a CPU's, where one is kept)

    def __init__(self, backend, rows, nao, kinds, free_bytes):
        naux = rows.shape[0]
        self.backend, self.nao, self.naux, self._free_bytes = backend, nao, naux, free_bytes
        self._file = rows if isinstance(rows, RowFile) else None  # out of core: B on disk
        self._packed = None if self._file is not None else backend.to_device(rows, fp64=True)
        self._unpack = TriangleBlocks(nao, backend.device)
        self._square = {}  # dtype -> [naux, nao, nao] device tensor
        self._anchor = None  # (the anchor's factors, [{(p0, p1): X^P = L^T B^P, fp32} per density])
        self._on_rows = None  # a Coulomb sum fed by the exchange's pass over B on disk (`_with_coulomb`)
        self.increment_form = ""
        # J's fitted density from K's half transforms (one pass over B for J instead of two): measured on a
        # CPU (docs/benchmarking.md, the per-step account); not yet run on a GPU, which keeps two passes
        self._rho_from_halves = self._file is None and backend.device.type == "cpu"
        self.coulomb_form = "rho from K's half transforms, one fp64 pass" if self._rho_from_halves \
            else "two fp64 passes"
        if self._file is not None:
            self.storage = f"fp64 triangle on disk ({self._file.nbytes / 1e6:.0f} MB, read once per build)"
            return
        wanted, self.square_choice = [KIND_DTYPES[kind] for kind in dict.fromkeys(kinds)], None
        if backend.device.type == "cpu" and wanted[1:] == [torch.float64]:  # the anchors' fp64 square: per CPU
            self.square_choice = choice("scf_fp64_square")
            wanted = wanted if self.square_choice.value else wanted[:1]
        kept = self._squares_that_fit(wanted, free_bytes())
        # m-major squares on a CPU (measured there: docs/benchmarking.md); a GPU keeps [naux, nao, nao]
        self.m_major = bool(kept) and backend.device.type == "cpu"
        self.half_aux_dim = 1 if self.m_major else 0  # X [nao, nP, r] or [nP, r, nao]
        self._work = {}  # (role, shape, dtype) -> a buffer the builds reuse (its pages mapped once)
        for dtype in sorted(kept, key=lambda d: -torch.finfo(d).bits):  # fp64 first: fp32 is its rounding
            shape = (nao, naux, nao) if self.m_major else (naux, nao, nao)
            square = torch.empty(shape, dtype=dtype, device=backend.device)
            wider = self._square.get(torch.float64)
            rows = self._block_rows(0)
            unpacked = None if wider is not None or not self.m_major else \
                torch.empty((min(rows, naux), nao, nao), dtype=dtype, device=backend.device)
            for p0, p1 in block_ranges(naux, rows):
                if wider is not None:  # a contiguous conversion, cheaper than a second unpacking
                    square[p0:p1].copy_(wider[p0:p1])
                elif self.m_major:  # a block [nP, nao, nao] unpacked into a reused buffer, placed as (m, P, n)
                    square[:, p0:p1].copy_(self._unpack.square(self._packed[p0:p1], dtype, unpacked).transpose(0, 1))
                else:
                    self._unpack.square(self._packed[p0:p1], dtype, square[p0:p1])
            self._square[dtype] = square
        release_freed_memory()
        self.storage = " + ".join([f"square {str(d)[-2:]}" for d in self._square] + ["fp64 triangle"])
        self.square_layout = ("m-major [nao, naux, nao]" if self.m_major else "[naux, nao, nao]") if self._square else ""

    def _squares_that_fit(self, dtypes, free):
        """The kinds (dtypes, most builds' first) whose square copy [naux, nao, nao] is kept: the
        first where it fits beside the builds' blocks; each other (an fp64 one spares every anchor
        the unpacking of the triangle, about as long as its GEMMs) where it takes at most half of
        what is then left, so that the anchor's half transforms still find room."""
        kept, room = [], free - 4 * BLOCK_BYTES
        for n, dtype in enumerate(dtypes):
            size = self.naux * self.nao * self.nao * (torch.finfo(dtype).bits // 8)
            if size <= (room if n == 0 else room // 2):
                kept.append(dtype)
                room -= size
            elif n == 0:
                break
        return kept

    def _block_rows(self, rank):
        """Auxiliary functions per build block: its temporaries ([nP, r, nao] half transforms, an
        unpacked [nP, nao, nao] block) within BLOCK_BYTES (out of core, and its read and the next
        one's, within an eighth of what the budget leaves, if less)."""
        limit = BLOCK_BYTES if self._file is None else min(BLOCK_BYTES, max(10**6, self._free_bytes() // 8))
        return max(1, min(MAX_AUX_ROWS, limit // (8 * self.nao * max(self.nao, 2 * rank))))

    def _square_blocks(self, dtype, rank):
        """(p0, p1, [nP, nao, nao] block of B in dtype) over the auxiliary range (kept, or unpacked
        from the triangle's rows, which feed a Coulomb sum on the way where one is waiting)."""
        rows = self._block_rows(rank)
        kept = self._square.get(dtype)
        buffer = None if kept is not None else \
            torch.empty((min(rows, self.naux), self.nao, self.nao), dtype=dtype, device=self.backend.device)
        if kept is not None and self.m_major:
            for p0, p1 in block_ranges(self.naux, self._m_major_rows(rank, dtype)):
                yield p0, p1, kept[:, p0:p1]
            return
        if kept is not None:
            for p0, p1 in block_ranges(self.naux, rows):
                yield p0, p1, kept[p0:p1]
            return
        for p0, p1, packed in self._over_rows(block_ranges(self.naux, rows)):
            yield p0, p1, self._unpack.square(packed, dtype, buffer)

    def _in_m_major(self, dtype):
        """Whether the builds in dtype run on an m-major square (kept): their half transforms are then
        [nao, nP, r], else [nP, r, nao] (`_in_layout`)."""
        return self.m_major and dtype in self._square

    def _in_layout(self, x, m_major):
        """Half transforms x of one block in the layout of the kept ones (`half_aux_dim`): a P-major
        build's [nP, r, nao] in a store with m-major squares as [nao, nP, r] (a view), else x."""
        if m_major or not self.m_major:  # (a screened store's are in its own layout)
            return x
        return x.permute(2, 0, 1)  # [nP, r, nao] -> [nao, nP, r]

    def _m_major_rows(self, rank, dtype):
        """Auxiliary functions per block of an m-major square: all of them where the block's half
        transforms ([nao, nP, r], three of them kept between builds) take at most 1/WHOLE_HALVES_SHARE
        of what the budget leaves, else as many as do (at least BLOCK_BYTES' worth)."""
        per_row = 3 * self.nao * max(rank, 1) * (torch.finfo(dtype).bits // 8)
        limit = max(BLOCK_BYTES, self._free_bytes() // WHOLE_HALVES_SHARE + self._work_bytes())
        return max(1, min(self.naux, limit // per_row))

    def _work_bytes(self):
        return sum(t.numel() * t.element_size() for t in self._work.values())

    def _buffer(self, role, shape, dtype):
        """The builds' reused buffer for `role` ("x", "y", "middle") of that shape and dtype: a block of
        every P (the same each build) is kept; a smaller block's is not (None: the product allocates)."""
        if shape[1] != self.naux:  # (m-major shapes [nao, nP, r])
            return None
        key = (role, tuple(shape), dtype)
        if key not in self._work:
            self._work = {k: v for k, v in self._work.items() if k[0] != role}  # one per role
            self._work[key] = torch.empty(shape, dtype=dtype, device=self.backend.device)
        return self._work[key]

    def _rows(self, p0, p1):
        """Rows [p0, p1) of B in memory, on the device (the fp64 triangle's [nP, npair])."""
        return self._packed[p0:p1]

    def _device_rows(self, host):
        """Rows of B read from its file [nP, ncols] host fp64 -> on the device, in `_rows`' layout."""
        return self.backend.to_device(host, fp64=True)

    def _over_rows(self, ranges):
        """(p0, p1, rows [p0, p1) of B on the device, `_rows`' layout) over `ranges`, each fed to
        the Coulomb sum waiting on this pass, if any (`_with_coulomb`); out of core the next
        block's read runs on a thread while this one is used (positioned reads release the GIL),
        so the disk and the GEMMs overlap."""
        for p0, p1, rows in self._read_rows(list(ranges)):
            if self._on_rows is not None:
                self._on_rows(rows)
            yield p0, p1, rows

    def _read_rows(self, ranges):
        """`_over_rows` without the Coulomb sum."""
        if self._file is None:
            for p0, p1 in ranges:
                yield p0, p1, self._rows(p0, p1)
            return
        from concurrent.futures import ThreadPoolExecutor

        if not ranges:
            return
        # two host buffers, alternating: block k + 1 is read into one while block k (in the other)
        # is used; block k's is read into again only once the consumer has moved past it
        rows = max(p1 - p0 for p0, p1 in ranges)
        buffers = [np.empty((rows, self._file.shape[1]), dtype=self._file.dtype) for _ in range(2)]
        with ThreadPoolExecutor(1, thread_name_prefix="dfmp2-scf-read") as reader:
            ahead = reader.submit(self._file.read_rows, *ranges[0], buffers[0])
            for k, (p0, p1) in enumerate(ranges):
                host = ahead.result()
                if k + 1 < len(ranges):
                    ahead = reader.submit(self._file.read_rows, *ranges[k + 1], buffers[(k + 1) % 2])
                yield p0, p1, self._device_rows(host)
                del host

    def _coulomb_density(self, dms):
        """The densities in the layout of B's rows (`CoulombSum`): D' = D + D^T, diagonal once, on
        the pairs m >= n [nset, npair], device fp64."""
        nao = self.nao
        sym = dms + dms.transpose(0, 2, 1)
        sym[:, np.arange(nao), np.arange(nao)] /= 2
        return self.backend.to_device(sym.reshape(len(dms), -1)[:, self._unpack.pairs], fp64=True)

    def _coulomb_part(self, rows, density):
        """sum_(P in rows) rho_P B^P [nset, npair]:  rho_P = sum_(m>=n) B^P_(mn) D'_(mn)"""
        return self.backend.coulomb_block(rows, self.backend.fit_density(rows, density))

    def _coulomb_result(self, total):
        """J [nset, nao, nao] host fp64 of the summed parts."""
        return self.backend.to_host(self._unpack.square(total, torch.float64))

    def _row_blocks(self):
        """(p0, p1) blocks of B's rows for a pass of J alone: all of it in memory, blocks of
        BLOCK_BYTES on disk."""
        if self._file is None:
            return [(0, self.naux)]
        return block_ranges(self.naux, max(1, BLOCK_BYTES // (8 * self._file.shape[1])))

    def _with_coulomb(self, dms, with_j, exchange_pass):
        """(J or None, exchange_pass()): on disk J's sums ride on the exchange's pass over B (one
        read per build), else J is its own GEMV pass."""
        if not with_j:
            return None, exchange_pass()
        if self._file is None:
            return self.coulomb(dms), exchange_pass()
        coulomb = CoulombSum(self, dms)
        self._on_rows = coulomb.add
        try:
            result = exchange_pass()
        finally:
            self._on_rows = None
        return coulomb.result(), result

    def _on_device(self, array, dtype):
        """A host fp64 factor on the device in dtype (fp64 first: the backend's compute dtype,
        fp32 in an fp32 MP2 run, must not round it)."""
        return None if array is None else self.backend.to_device(array, fp64=True).to(dtype)

    def build(self, dms, factors, kind, with_j, with_k, anchor=False):
        """(J or None, K or None) [nset, nao, nao] host fp64 of densities dms [nset, nao, nao] given
        as factors [(L, R or None, w or None)] with D = L diag(w) R^T; K's GEMMs in `kind`.
        anchor: increments will start from these densities (`build_increment`): their fp32 half
        transforms L^T B^P are kept where the budget allows (orbital factors only, D = L L^T)."""
        vj = vk = None
        if with_k:
            halves = self.naux * self.nao * sum(left.shape[1] for left, _, _ in factors) * 4
            room = self._free_bytes() - 4 * BLOCK_BYTES
            keep = anchor and all(right is None and weights is None for _, right, weights in factors) and \
                halves <= (room if self._file is None else room // 2)  # out of core: half for the blocks read
            if anchor:
                self._anchor = None  # the previous anchor's halves go before the new ones are made
                release_freed_memory()
            if with_j and self._rho_from_halves:
                vk, halves, rho = self.exchange(factors, KIND_DTYPES[kind], keep, with_rho=True)
                vj = self._coulomb_of_rho(rho)
            else:
                vj, (vk, halves) = self._with_coulomb(dms, with_j,
                                                      lambda: self.exchange(factors, KIND_DTYPES[kind], keep))
            if keep:
                self._anchor = (factors, halves)
        elif with_j:
            vj = self.coulomb(dms)
        self.backend.synchronize()
        self._release_unpacked(KIND_DTYPES[kind])
        return vj, vk

    def _release_unpacked(self, dtype):
        """After a build in dtype: the unpacked blocks' pages go back to the system (or the heap
        keeps growing build by build); a build on a kept m-major square unpacked nothing, and its
        temporaries (the products' few-MB results) stay mapped for the next build: giving them back
        cost 0.03 s a build in re-mapping them (naphthalene/cc-pVTZ, Zen 5)."""
        if not (self._file is None and self._in_m_major(dtype)):
            release_freed_memory()

    def build_increment(self, deltas, anchor_factors, steps, with_j, with_k):
        """J and K of D - D_anchor = L L^T - L_a L_a^T, in fp32 GEMMs with an error proportional to
        the step: deltas [nset, nao, nao] host fp64; anchor_factors: the factors an anchor build
        had (L_a, None, None); steps [E [nao, r]] with L Q = L_a + E (the orbitals aligned to the
        anchor's, `dfmp2.chem.jk.orbital_steps`).
          Y^P = E^T B^P,  X_a^P = L_a^T B^P (kept by the anchor build, else made here)
          K(D) - K(D_a) = M + M^T,  M = sum_(P, r) (X_a^P + Y^P / 2)_rm Y^P_rn
        J(D - D_anchor) in fp64 from deltas. Returns (J or None, K or None) host fp64."""
        vj = vk = None
        if with_k and with_j and self._rho_from_halves:
            vk, rho = self._exchange_increment(anchor_factors, steps, with_rho=True)
            vj = self._coulomb_of_rho(rho)
        elif with_k:
            vj, vk = self._with_coulomb(deltas, with_j, lambda: self._exchange_increment(anchor_factors, steps))
        elif with_j:
            vj = self.coulomb(deltas)
        self.backend.synchronize()
        self._release_unpacked(torch.float32)
        return vj, vk

    def _exchange_increment(self, anchor_factors, steps, with_rho=False):
        """K(D) - K(D_anchor) of build_increment (host fp64 [nset, nao, nao]); with_rho also the
        fitted density of D - D_anchor from the same half transforms [nset, naux] (device fp64):
          rho_P = sum_(r, n) (2 X_a^P + Y^P)_rn E_nr   (D - D_a = L_a E^T + E L_a^T + E E^T)"""
        backend, fp32 = self.backend, torch.float32
        kept = self._anchor[1] if self._anchor is not None and self._anchor[0] is anchor_factors else None
        self.increment_form = "orbitals, kept anchor halves" if kept else "orbitals, anchor halves made"
        lefts = [self._on_device(left, fp32) for left, _, _ in anchor_factors]
        moves = [self._on_device(step, fp32) for step in steps]
        vk = np.zeros((len(steps), self.nao, self.nao))
        rho = torch.zeros((len(steps), self.naux), dtype=torch.float64, device=self.backend.device) if with_rho else None
        rank, m_major = sum(step.shape[1] for step in steps), self._in_m_major(fp32)
        for p0, p1, block in self._blocks(fp32, rank):
            for s, (left, move) in enumerate(zip(lefts, moves)):
                y = self._half_transform(block, move, "y", m_major=m_major)
                if kept:  # the anchor's, in the kept layout: as a view in this build's
                    x = kept[s].narrow(self.half_aux_dim, p0, p1 - p0)
                    if self.m_major and not m_major:  # [nao, nP, r] -> [nP, r, nao]
                        x = x.permute(1, 2, 0)
                else:
                    x = self._half_transform(block, left, "x", m_major=m_major)
                work = self._buffer("middle", x.shape, x.dtype) if m_major else None
                middle = torch.add(x, y, alpha=0.5, out=work) if work is not None else x + 0.5 * y
                vk[s] += backend.to_host(self._exchange_product(middle, y, m_major=m_major))
                if with_rho:
                    rho[s, p0:p1] = 2 * self._fitted_density(middle, move, m_major=m_major)
        vk += vk.transpose(0, 2, 1).copy()
        return (vk, rho) if with_rho else vk

    def _fitted_density(self, x, right, weights=None, m_major=False):
        """rho_P = sum_(r, n) X^P_rn w_r R_nr of one block's half transforms x ([nP, r, nao], or
        m-major [nao, nP, r]) and R [nao, r] (w [r] or None: all 1) -> [nP] fp64 (the products in
        x's dtype; m-major one GEMV per n, summed)."""
        if weights is not None:
            right = right * weights[None, :]
        if m_major:
            return torch.matmul(x, right.unsqueeze(-1)).sum(0).squeeze(-1).to(torch.float64)
        return torch.einsum("prn,nr->p", x, right).to(torch.float64)

    def _coulomb_of_rho(self, rho):
        """J [nset, nao, nao] (host fp64) of fitted densities rho [nset, naux]: one pass over the fp64
        triangle,  J_(mn) = sum_P rho_P B^P_(mn)"""
        return self._coulomb_result(self.backend.coulomb_block(self._packed, rho))

    def coulomb(self, dms):
        """J [nset, nao, nao] (host fp64) of dms, in fp64:
          rho_P = sum_(m>=n) B^P_(mn) D'_(mn)  (D' = D + D^T, diagonal once),  J_(mn) = sum_P rho_P B^P_(mn)"""
        return CoulombSum(self, dms).over_every_row()

    def exchange(self, factors, dtype, keep=False, with_rho=False):
        """K [nset, nao, nao] (host fp64) of the densities D = L diag(w) R^T in `factors`, GEMMs in
        dtype, and (keep) the half transforms L^T B^P in fp32 per density (one tensor over every
        P, its auxiliary index `half_aux_dim`: allocated once, not block by block, so that the
        many kept pieces do not pin the heap between the blocks' temporaries), else None; with_rho
        also J's fitted densities from the same half transforms [nset, naux] (device fp64),
          rho_P = sum_(m, n) B^P_mn D_mn = sum_(r, n) (L^T B^P)_rn w_r R_nr"""
        backend = self.backend
        sets = [tuple(self._on_device(a, dtype) for a in factor) for factor in factors]
        halves = [None for _ in sets] if keep else None
        vk = np.zeros((len(factors), self.nao, self.nao))
        rho = torch.zeros((len(factors), self.naux), dtype=torch.float64, device=backend.device) if with_rho else None
        m_major = self._in_m_major(dtype)
        for p0, p1, block in self._blocks(dtype, sum(factor[0].shape[1] for factor in factors)):
            for s, (left, right, weights) in enumerate(sets):
                x = self._half_transform(block, left, "x" if not keep else None, m_major=m_major)  # (kept: its own)
                z = x if right is None else self._half_transform(block, right, "y", m_major=m_major)
                vk[s] += backend.to_host(self._exchange_product(x, z, weights, m_major=m_major))
                if with_rho:
                    rho[s, p0:p1] = self._fitted_density(x, left if right is None else right, weights, m_major=m_major)
                x = self._in_layout(x, m_major)
                if keep and x.dtype == torch.float32 and x.shape[self.half_aux_dim] == self.naux and x.is_contiguous():
                    halves[s] = x  # every P at once, already fp32: kept as made
                elif keep:
                    if halves[s] is None:
                        shape = list(x.shape)
                        shape[self.half_aux_dim] = self.naux
                        halves[s] = torch.empty(shape, dtype=torch.float32, device=x.device)
                    halves[s].narrow(self.half_aux_dim, p0, p1 - p0).copy_(x)
        return (vk, halves, rho) if with_rho else (vk, halves)

    # ---- the layout of B: dense blocks here (dfmp2.sparse.ScreenedFittedStore: block-sparse panels) ----
    def _blocks(self, dtype, rank):
        """(p0, p1, block of B in dtype) over the auxiliary range (kept, or unpacked)."""
        yield from self._square_blocks(dtype, rank)

    def _half_transform(self, block, factor, role=None, m_major=False):
        """X^P = F^T B^P of one block: [nP, r, nao]; m-major (block [nao, nP, nao]) X [nao, nP, r],
        into the builds' buffer for `role` where one is kept (`_buffer`)."""
        if not m_major:
            return self.backend.half_transform(block, factor)
        shape = (block.shape[0], block.shape[1], factor.shape[1])
        out = self._buffer(role, shape, block.dtype) if role is not None else None
        return self.backend.half_transform_m_major(block, factor, out)

    def _exchange_product(self, x, z, weights=None, m_major=False):
        """K = sum_P X^P^T diag(w) Z^P of one block's half transforms: [nao, nao]."""
        if m_major:
            return self.backend.exchange_product_m_major(x, z, weights)
        return self.backend.exchange_product(x, z, weights)

    def close(self):
        self._square.clear()
        self._work = {}
        self._packed = self._unpack = self._anchor = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def io(self) -> dict:
        """Bytes of B read from and written to disk (out of core), else {}."""
        return self._file.io() if self._file is not None else {}


class CoulombSum:
    """J of densities dms [nset, nao, nao] (host fp64) summed over blocks of B's fp64 rows (the
    store's layout: `_coulomb_density`, `_coulomb_part`, `_coulomb_result`):
      rho_P = sum_mn B^P_mn D_mn,  J_mn = sum_P rho_P B^P_mn
    (each row's rho_P needs that row alone, so any blocks, in any order, give J)."""

    def __init__(self, store, dms):
        self._store, self._density, self._sum = store, store._coulomb_density(dms), None

    def add(self, rows):
        """The contribution of rows of B (device fp64, the store's layout)."""
        part = self._store._coulomb_part(rows, self._density)
        self._sum = part if self._sum is None else self._sum.add_(part)

    def over_every_row(self):
        """J over every row of the store's B (a pass of its own)."""
        for _, _, rows in self._store._over_rows(self._store._row_blocks()):
            self.add(rows)
        return self.result()

    def result(self):
        """J [nset, nao, nao] host fp64."""
        return self._store._coulomb_result(self._sum)
