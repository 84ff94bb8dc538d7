"""The SCF's Coulomb and exchange builds on dfmp2's backends (PySCF's driver keeps the guess,
DIIS, damping, level shifts and convergence; `chem.use_fitted_builds` plugs these builds into it).

    whitening, once   B^P_mn = sum_Q [L^-1]_PQ (Q|mn),  (P|Q) = L L^T     whiten_fitted_integrals
    a density         D = L diag(w) R^T  (occupied orbitals, chem.density_factors; else density_factor)
    fitted density    rho_P = sum_(m>=n) B^P_(mn) D'_(mn)  (D' = D + D^T, diagonal once)  backend.fit_density
    Coulomb           J_mn = sum_P rho_P B^P_mn                           backend.coulomb_block
    exchange          K_mn = sum_P sum_r (L^T B^P)_rm w_r (R^T B^P)_rn    backend.exchange_block

The whitened lower triangle (fp64) is kept for J; square copies for K (fp64, fp32) as the budget
allows, else K's blocks are unpacked from the triangle. Precision ("mixed", the default where the
device has fp64): J in fp64; K in fp32 while the density still moves, then from an fp64 anchor
plus an fp32 increment K(D - D_anchor) whose error scales with the (small) change, re-anchored
when that error would reach the size of the SCF's steps; "fp64": every build fp64; "fp32": every
build fp32 (a device without fp64). docs/scf.md has the measurements.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import InputError, MemoryBudgetError
from .kernels.protocol import FittedBuildsBackend
from .linalg import factor_metric, whiten
from .memory import MB, budget_bytes, release_freed_memory, resident_bytes
from .steps import block_ranges

SCF_BACKENDS = ("device", "pyscf")  # device: these builds on the run's backend; pyscf: PySCF's own
SCF_PRECISIONS = ("mixed", "fp64", "fp32")
ANCHOR_BELOW = 1e-2  # mixed: the first fp64 exchange once max |D_n - D_(n-1)| is below this
FP32_RELATIVE_ERROR = 1e-3  # mixed: a new fp64 anchor once this times |D - D_anchor| exceeds |D_n - D_(n-1)|
INCREMENT_RANK_DROP = 1e-6  # mixed: eigenvalues of D - D_anchor below this times the largest are left out
# of the fp32 increment (an error of the order of the increment's own fp32 rounding)
BLOCK_BYTES = 32 * 10**6  # the largest temporary of a build or of the whitening (fp64 bytes)
MAX_AUX_ROWS = 256  # auxiliary functions per build block at most


def scf_builds_for(settings, backend, integrals_of, range_separated=False):
    """The Coulomb/exchange builds a run's SCF uses: a FittedCoulombExchange on `backend`, or
    None for PySCF's own. settings.scf_backend None: device where it can run (a density-fitted
    SCF on cpu or cuda), else pyscf (conventional integrals, range-separated exchange, or
    trn1/trn2, whose NKI builds are not written yet); an explicit "device" that cannot run is an
    InputError. integrals_of(): the JK-fit integrals (called only when the builds are made);
    range_separated: the functional has long-range exchange (omega)."""
    choice, precision = settings.scf_backend, settings.scf_precision
    if choice is not None and choice not in SCF_BACKENDS:
        raise InputError(f"unknown SCF backend {choice!r} (use one of: {', '.join(SCF_BACKENDS)})")
    if precision is not None and precision not in SCF_PRECISIONS[:2]:
        raise InputError(f"unknown SCF precision {precision!r} (use one of: {', '.join(SCF_PRECISIONS[:2])})")
    reasons = [why for why, applies in (
        ("the conventional SCF (--scf exact) builds J and K from four-center integrals in PySCF",
         settings.scf == "exact"),
        (f"SCF builds on {backend.device_name} (NKI) are not written yet",
         not isinstance(backend, FittedBuildsBackend)),
        ("range-separated exchange (omega) is not built by dfmp2", range_separated)) if applies]
    if choice is None:
        choice = "pyscf" if reasons else "device"
    if choice == "pyscf":
        if precision is not None:
            raise InputError("--scf-precision applies to dfmp2's SCF builds, not to --scf-backend pyscf")
        return None
    if reasons:
        raise InputError(f"--scf-backend device: {reasons[0]}; use --scf-backend pyscf")
    return FittedCoulombExchange(backend, integrals_of(), precision, settings.max_memory)


@dataclass
class BuildRecord:
    """What the builds ran: precision per build, seconds per build, storage of B, kernel calls."""

    backend: str
    precision: str
    storage: str = ""
    naux: int = 0
    builds: list = field(default_factory=list)  # precision of each build, in order
    seconds: list = field(default_factory=list)  # wall seconds of each build
    setup_seconds: float = 0.0  # integrals + whitening + storage
    increment_ranks: list = field(default_factory=list)  # columns of each incremental build's factors
    metric: str = ""  # how (P|Q) was factorised

    def as_dict(self) -> dict:
        return {"backend": self.backend, "precision": self.precision, "storage": self.storage,
                "naux": self.naux, "builds": len(self.builds),
                **{f"{kind}_builds": self.builds.count(kind) for kind in ("fp32", "fp64", "incremental", "coulomb")},
                "build_seconds": [round(s, 4) for s in self.seconds],
                "setup_seconds": round(self.setup_seconds, 4), "increment_ranks": list(self.increment_ranks)}


def whiten_fitted_integrals(backend, integrals):
    """B^P_(mn) = sum_Q [L^-1]_PQ (Q|mn) over the pairs m >= n: host fp64 [nkept, npair] (whitened
    in place of the packed integrals, in column blocks of BLOCK_BYTES) and the metric factor."""
    packed = integrals.packed()  # [naux, npair], fp64
    factor = factor_metric(backend, integrals.metric())
    npair = packed.shape[1]
    columns = max(64, BLOCK_BYTES // (8 * packed.shape[0]))
    rows = np.empty((factor.nkept, npair)) if factor.nkept != packed.shape[0] else packed
    for c0, c1 in block_ranges(npair, columns):
        # B^T = X^T L^-T  on a block of pair columns
        x = backend.to_device(packed[:, c0:c1].T, fp64=True)  # a transposed view: no copy
        rows[:, c0:c1] = backend.to_host(whiten(backend, factor, x)).T
    return rows, factor


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


class FittedCoulombExchange:
    """J and K of the SCF from whitened JK-fit integrals, on one backend.

    backend: a dfmp2 backend (`kernels.backend_for`); integrals: the JK-fit IntegralProvider
    (nao, naux, metric(), packed()); precision: mixed, fp64 or fp32 (SCF_PRECISIONS; fp32 only
    without fp64 arithmetic); max_memory: the run's budget (MB, None: 80% of free RAM).
    Built on the first call (`get_jk`), released by `close()`."""

    def __init__(self, backend, integrals, precision=None, max_memory=None):
        precision = precision or ("mixed" if backend.has_fp64 else "fp32")
        if precision not in SCF_PRECISIONS:
            raise InputError(f"unknown SCF precision {precision!r} (use one of: {', '.join(SCF_PRECISIONS)})")
        if precision != "fp32" and not backend.has_fp64:
            raise InputError(f"{backend.device_name} has no fp64 arithmetic: its SCF builds are fp32")
        self.backend, self.integrals, self.max_memory = backend, integrals, max_memory
        self.record = BuildRecord(backend=backend.name, precision=precision)
        self._square = {}  # dtype -> [naux, nao, nao] device tensor
        self._packed = None  # [naux, npair] fp64 device tensor, when the squares are not all kept
        self._unpack = None
        self._last = None  # the previous call's densities (mixed precision)
        self._anchor = None  # (densities, their fp64 K) the incremental builds start from

    # ---- set-up ------------------------------------------------------------------------
    def _build(self):
        start = time.perf_counter()
        backend, integrals = self.backend, self.integrals
        self.nao = nao = integrals.nao
        triangle = integrals.naux * nao * (nao + 1) // 2 * 8
        free = self._free_bytes()
        if triangle + 4 * BLOCK_BYTES > free:
            raise MemoryBudgetError(
                f"dfmp2's SCF builds keep the whitened JK-fit integrals in memory ({triangle / MB:.0f} MB, "
                f"{free / MB:.0f} MB left in the budget): raise --max-memory or use --scf-backend pyscf")
        rows, factor = whiten_fitted_integrals(backend, integrals)
        self.naux = naux = rows.shape[0]
        self._packed = backend.to_device(rows, fp64=backend.has_fp64)  # J's (and fp64 K's) source
        del rows
        self._unpack = TriangleBlocks(nao, backend.device)
        for dtype in sorted(self._square_dtypes(naux, nao), key=lambda d: -torch.finfo(d).bits):
            square = torch.empty((naux, nao, nao), dtype=dtype, device=backend.device)
            source = self._square.get(torch.float64)  # fp32 copied from the fp64 square where kept
            for p0, p1 in block_ranges(naux, self._block_rows(0)):
                square[p0:p1] = source[p0:p1] if source is not None else self._unpack.square(self._packed[p0:p1], dtype)
            self._square[dtype] = square
        release_freed_memory()
        self.record.storage = " + ".join([f"square {str(d)[-2:]}" for d in self._square] + ["fp64 triangle"])
        self.record.naux = naux
        self.record.metric = factor.describe()
        self.record.setup_seconds = time.perf_counter() - start

    def _free_bytes(self):
        """What the budget leaves: the process's (--max-memory), and on a GPU also 90% of its free memory."""
        free = budget_bytes(self.max_memory) - resident_bytes()
        device_free = self.backend.memory_limit_bytes()
        return free if device_free is None else min(free, int(0.9 * device_free))

    def _square_dtypes(self, naux, nao):
        """The square copies of B kept beside the triangle: fp32 (for the fp32 exchange builds)
        and fp64, each where the budget still holds it (else K's blocks are unpacked per build)."""
        wanted = {"mixed": [torch.float32, torch.float64], "fp64": [torch.float64],
                  "fp32": [torch.float32]}[self.record.precision]
        free = self._free_bytes() - 4 * BLOCK_BYTES  # the builds' temporaries
        kept = []
        for dtype in wanted:
            size = naux * nao * nao * (torch.finfo(dtype).bits // 8)
            if size <= free:
                kept.append(dtype)
                free -= size
        return kept

    # ---- builds ------------------------------------------------------------------------
    def _exchange_plan(self, dms):
        """How to build K of `dms` (the precision policy, module docstring): ("fp32", None),
        ("fp64", None) or ("incremental", anchor)."""
        precision = self.record.precision
        if precision != "mixed":
            return precision, None
        last, self._last = self._last, np.array(dms)
        anchor = self._anchor
        if last is None or last.shape != dms.shape:
            return ("fp32", None) if anchor is None or anchor[0].shape != dms.shape else ("fp64", None)
        step = float(np.abs(dms - last).max())
        if anchor is None:
            return ("fp64", "anchor") if step < ANCHOR_BELOW else ("fp32", None)
        drift = float(np.abs(dms - anchor[0]).max())
        return ("fp64", "anchor") if drift * FP32_RELATIVE_ERROR > step else ("incremental", anchor)

    def exchange_with_policy(self, dms, factors):
        """K of dms (factors D = L R^T) as the precision policy plans it; returns (vk, label)."""
        how, anchor = self._exchange_plan(dms)
        if how == "incremental":
            # K(D) = K_fp64(D_anchor) + K_fp32(D - D_anchor): the fp32 error scales with |D - D_anchor|
            _, k_anchor = anchor
            delta = [symmetric_factors(d, INCREMENT_RANK_DROP) for d in dms - anchor[0]]  # D - D_a = V diag(sign) V^T
            self.record.increment_ranks.append(sum(left.shape[1] for left, _, _ in delta))
            return k_anchor + self.exchange(delta, torch.float32), "incremental"
        vk = self.exchange(factors, torch.float32 if how == "fp32" else torch.float64)
        if anchor == "anchor":
            self._anchor = (np.array(dms), vk.copy())
        return vk, how

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

    def coulomb(self, dms):
        """J [nset, nao, nao] (host fp64) of dms [nset, nao, nao], in the triangle's precision:
          rho_P = sum_(m>=n) B^P_(mn) D'_(mn)  (D' = D + D^T, diagonal once),  J_(mn) = sum_P rho_P B^P_(mn)"""
        backend, nao = self.backend, self.nao
        sym = dms + dms.transpose(0, 2, 1)
        sym[:, np.arange(nao), np.arange(nao)] /= 2
        d_rows = backend.to_device(sym.reshape(len(dms), -1)[:, self._unpack.pairs], fp64=backend.has_fp64)
        rho = backend.fit_density(self._packed, d_rows)
        return backend.to_host(self._unpack.square(backend.coulomb_block(self._packed, rho), torch.float64))

    def exchange(self, factors, dtype):
        """K [nset, nao, nao] (host fp64) of the densities D = L diag(w) R^T in `factors`
        [(L, R or None, w or None)], GEMMs in dtype."""
        backend = self.backend

        def on_device(array):
            return None if array is None else backend.to_device(array).to(dtype)
        sets = [tuple(on_device(a) for a in factor) for factor in factors]
        vk = np.zeros((len(factors), self.nao, self.nao))
        for block in self._square_blocks(dtype, sum(factor[0].shape[1] for factor in factors)):
            for s, (left, right, weights) in enumerate(sets):
                vk[s] += backend.to_host(backend.exchange_block(block, left, right, weights))
        return vk

    def get_jk(self, dms, factors, with_j=True, with_k=True, hermi=1):
        """J and K of densities dms [nset, nao, nao] (host fp64), each given as factors (L [nao, r],
        R [nao, r] or None, w [r] or None) with D = L diag(w) R^T, or None: factored here
        (`density_factor`; hermi=0: not symmetric). Returns (vj, vk) host fp64 [nset, nao, nao]
        (None where not asked). J in fp64 (fp32 without fp64 arithmetic); K in the policy's precision."""
        if self._unpack is None:
            self._build()
        start = time.perf_counter()
        factors = [f if f is not None else density_factor(d, hermi) for f, d in zip(factors, dms)]
        vj = self.coulomb(dms) if with_j else None
        vk, how = self.exchange_with_policy(dms, factors) if with_k else (None, "coulomb")
        self.backend.synchronize()
        release_freed_memory()  # the unpacked blocks' pages, or the heap keeps growing build by build
        self.record.builds.append(how)
        self.record.seconds.append(time.perf_counter() - start)
        return vj, vk

    def reset(self, integrals):
        """Use `integrals` (another molecule's) from the next build on."""
        self.close()
        self.integrals = integrals

    def close(self):
        """Release B (the SCF is done; a later get_jk builds it again)."""
        self._square.clear()
        self._packed = self._unpack = self._last = self._anchor = None
        release_freed_memory()


def symmetric_factors(d, drop=1e-14, floor=0.0):
    """(L [nao, r], None, w [r]) with L diag(w) L^T = d for a symmetric d [nao, nao]: eigenvectors
    scaled by |eigenvalue|^1/2, w the eigenvalues' signs; eigenvalues at most drop times
    max(floor, the largest |eigenvalue|) left out (all of them for d = 0)."""
    w, v = np.linalg.eigh(d)
    largest = max(floor, float(np.abs(w).max()))
    keep = np.abs(w) > drop * largest if largest > 0 else np.zeros(len(w), dtype=bool)
    return v[:, keep] * np.sqrt(np.abs(w[keep])), None, np.sign(w[keep])


def density_factor(d, hermi=1, drop=1e-14):
    """Factors (L, R or None, w or None) with D = L diag(w) R^T of a density d [nao, nao] that came
    without orbitals: eigenvectors if it is symmetric (hermi=1, or equal to its transpose), else
    singular vectors; components below drop (relative to max(1, the largest)) left out."""
    if hermi == 1 or np.allclose(d, d.T, rtol=0, atol=1e-13):
        return symmetric_factors((d + d.T) / 2, drop, floor=1.0)
    u, s, vt = np.linalg.svd(d)
    keep = s > drop * max(1.0, s.max())
    return u[:, keep] * s[keep], np.ascontiguousarray(vt[keep].T), None
