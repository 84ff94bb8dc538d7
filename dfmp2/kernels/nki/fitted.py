"""The SCF's Coulomb and exchange builds on the NKI backend (trn1, trn2, trn3, or their emulator): its
`FittedStore`. A NeuronCore has no fp64, so the builds come in two kinds:

  fp32   one launch of fitted_jk_kernel per density (J and K together, fp32 throughout);
  exact  Ozaki-sliced products (kernels.nki.kernels.exact_matmul_kernel), every slice product and its
         PSUM sum exact, hi + lo back to the host, which adds them in fp64: errors of about
         2^-35 of each auxiliary function's largest |B^P_mn| instead of fp32's rounding.
         Three launches: the half transform H = B [L | R] (all densities at once), J from
         the fitted density, and K per density; rho and the slicing of H run on the host.

    half transform   H^P = B^P R, G^P = B^P L               (exact: one launch for every column)
    fitted density   rho_P = sum_(m, i) L_mi w_i H^P_mi       (exact: host, fp64)
    Coulomb          J = sum_P rho_P B^P
    exchange         K = sum_(P, i) G^P_mi w_i H^P_ni

Storage, uploaded once and kept in device HBM for the whole SCF: B square in fp32 [naux, nao,
nao] (the fp32 builds) and its INPUT_SLICES int8 digits [S, naux, nao, nao] with one power of
two per auxiliary function (the exact builds): 9 bytes per element.
"""

from __future__ import annotations

import numpy as np
import torch

from nki_emulator.core import TARGETS

from ...util.errors import MemoryBudgetError, option
from ...util.system_memory import MB
from .ozaki import INPUT_SLICES, column_digits, column_slices
from .tiles import SLICE_BITS, jk_columns

# HBM per chip: 32 GiB trn1, 96 GiB trn2 (nki-facts.md), 144 GiB trn3 (AWS's Trainium3 page)
HBM_BYTES_PER_CHIP = {"trn1": 32 * 2**30, "trn2": 96 * 2**30, "trn3": 144 * 2**30}
RANK_STEP = 32  # factor columns are padded with zeros to a multiple of this, then to the largest
# count a kernel ran with (KernelLauncher.bucket): few shapes, so few compilations on a host
DIGIT_WEIGHTS = np.array([2.0 ** (-SLICE_BITS * (s + 1)) for s in range(INPUT_SLICES)])


def hbm_bytes_per_launch_core(target: str, lnc: int) -> int:
    """HBM of the physical cores one launch uses: `lnc` of them (the run's logical NeuronCore degree:
    1 on trn1 and under nki 0.7, 2 on trn2/trn3 under earlier releases), each its share of the chip's."""
    t = TARGETS[target]
    return HBM_BYTES_PER_CHIP[target] // t.cores_per_chip * lnc


def aux_digits(square: np.ndarray):
    """fp64 B [nP, nao, nao] -> (int8 digits [S, nP, nao, nao], 2^e [nP] fp64): one exponent per
    auxiliary function, e = ceil(log2(max |B^P| 128/127)), B^P = 2^e sum_s d_s 2^(-7 (s + 1))."""
    nP, nao, _ = square.shape
    digits, scale = column_digits(square.reshape(nP, nao * nao, 1), INPUT_SLICES)
    return digits.reshape(INPUT_SLICES, nP, nao, nao), scale.reshape(nP).astype(np.float64)


class NkiFittedStore:
    """B for the SCF's builds on an NKI backend: rows [naux, npair] host fp64 (whitened lower
    triangles), nao; kinds and free_bytes as TorchFittedStore's (the host budget is not what
    limits here: device HBM is)."""

    exact_kind = "exact"
    coulomb_follows_kind = True  # J in the build's kind: fp32 J alone stalls the SCF (docs/scf.md)

    def __init__(self, backend, rows, nao, kinds, free_bytes):
        naux = rows.shape[0]
        need = naux * nao * nao * (4 + INPUT_SLICES)
        hbm = hbm_bytes_per_launch_core(backend.target, backend.lnc)
        if jk_columns(nao, False) < RANK_STEP:
            raise MemoryBudgetError(f"dfmp2's fp32 SCF builds on {backend.target} hold the factors' half transforms "
                                    f"of one auxiliary function on chip: nao {nao} leaves no room; "
                                    f"use {option('scf_backend', 'pyscf')}")
        if need > 0.8 * hbm:
            raise MemoryBudgetError(
                f"dfmp2's SCF builds on {backend.target} keep B in fp32 and as exact-product digits in device "
                f"memory ({need / MB:.0f} MB; {0.8 * hbm / MB:.0f} MB is 80% of the HBM of one launch's "
                f"cores): use {option('scf_backend', 'pyscf')}")
        self.backend, self.nao, self.naux = backend, nao, naux
        lower_r, lower_c = np.tril_indices(nao)
        square32 = torch.empty((naux, nao, nao), dtype=torch.float32)
        digits = torch.empty((INPUT_SLICES, naux, nao, nao), dtype=torch.int8)
        self.scale = np.empty(naux)
        block = max(1, (64 * 2**20) // (8 * nao * nao))
        for p0 in range(0, naux, block):  # unpacked on the host in blocks of ~64 MB
            p1 = min(naux, p0 + block)
            sq = np.zeros((p1 - p0, nao, nao))
            sq[:, lower_r, lower_c] = rows[p0:p1]
            sq[:, lower_c, lower_r] = rows[p0:p1]
            square32[p0:p1] = torch.from_numpy(sq.astype(np.float32))
            d, self.scale[p0:p1] = aux_digits(sq)
            digits[:, p0:p1] = torch.from_numpy(d)
        backend.count("host:slice_scf_operands")
        self._square32 = backend.upload(square32)  # host -> device once
        self._digits = backend.upload(digits)
        self.storage = f"square fp32 + {INPUT_SLICES} int8 digit slices in {backend.target} HBM"

    # the increments stay eigenvectors of D - D_anchor (symmetric, rank 2 nocc): the orbitals'
    # form (L R^T factors) would be a second fitted_jk_kernel shape to compile, for the same flops
    orbital_increments = False

    def build(self, dms, factors, kind, with_j, with_k, anchor=False):
        """(J or None, K or None) [nset, nao, nao] host fp64 of densities given as factors
        [(L, R or None, w or None)] (D = L diag(w) R^T; dms is not read: J comes from the factors).
        anchor: nothing is kept for the increments (B's half transforms are not stored in HBM)."""
        if kind == "exact":
            return self._exact(factors, with_j, with_k)
        nset = len(factors)
        vj = np.zeros((nset, self.nao, self.nao))
        vk = np.zeros((nset, self.nao, self.nao))
        backend = self.backend
        for s, (left, right, weights) in enumerate(factors):
            weights = np.ones(left.shape[1]) if weights is None else weights
            most = jk_columns(self.nao, right is None)  # columns per launch (tiles.jk_fixed_bytes)
            for c0 in range(0, left.shape[1], most):  # D = sum over column chunks of L w R^T
                c1 = min(left.shape[1], c0 + most)
                width = self._columns("fitted_jk_kernel", c1 - c0, most)
                lc = _padded(left[:, c0:c1], width)
                rc = lc if right is None else _padded(right[:, c0:c1], width)
                out = backend.fitted_jk(self._square32, lc, rc, _padded(weights[None, c0:c1], width)[0],
                                        right is None, with_k)
                vj[s] += out[0]
                vk[s] += out[1]
        return (vj if with_j else None), (vk if with_k else None)

    def _columns(self, kernel, count, most=None):
        """The padded column count of a launch: a multiple of RANK_STEP, bucketed (<= most, if given)."""
        width = -(-count // RANK_STEP) * RANK_STEP
        bucket = self.backend.launcher.bucket(f"{kernel}:columns", ((width,),))[0][0]
        return bucket if most is None or bucket <= most else width

    def _exact(self, factors, with_j, with_k):
        """Both kinds' formulas with exact products; see the module docstring."""
        backend, nao, naux = self.backend, self.nao, self.naux
        columns, where = [], []
        for left, right, weights in factors:  # one half transform for every density's L and R
            start = sum(c.shape[1] for c in columns)
            columns.append(left)
            if right is not None:
                columns.append(right)
            where.append((start, left.shape[1], right is not None))
        cols = np.concatenate(columns, axis=1)
        cols = _padded(cols, self._columns("exact_half_transform", cols.shape[1]))
        # H^P = B^P [L | R]: [naux, nao, ncols], 2^e_P applied on the host (exact)
        h = backend.exact_product(self._digits, column_slices(cols, INPUT_SLICES)[:, None])
        h *= self.scale[:, None, None]
        vj = vk = None
        rho = np.zeros((len(factors), naux))
        for s, ((left, right, weights), (start, r, two)) in enumerate(zip(factors, where)):
            weights = np.ones(r) if weights is None else weights
            width = self._columns("exact_exchange", r)  # zero columns: the same K, one shape
            h_l = _padded_last(h[:, :, start:start + r], width)
            h_r = _padded_last(h[:, :, start + r:start + 2 * r], width) if two else h_l
            weights = _padded(weights[None], width)[0]
            rho[s] = np.einsum("mi,i,pmi->p", left, weights[:r], h_r[:, :, :r])  # rho_P = sum L w (B^P R)
            if with_k:  # K = sum_(P, i) (G w)[(P, i), m] H[(P, i), n]
                vk = np.zeros((len(factors), nao, nao)) if vk is None else vk
                vk[s] = self._exact_exchange(h_l, h_r, weights, r, two)
        if with_j:  # J = sum_P rho_P B^P: rho 2^e_P as the stationary slices, B's digits moving
            x = column_slices((rho * self.scale[None, :]).T, INPUT_SLICES)[:, None]  # [S, 1, naux, nset]
            j = backend.exact_product(x, self._digits.reshape(INPUT_SLICES, 1, naux, nao * nao))
            vj = j[0].reshape(len(factors), nao, nao)
        return vj, vk

    def _exact_exchange(self, h_l, h_r, weights, r, two):
        """K [nao, nao] = sum_(P, i) G^P_mi w_i H^P_ni from the half transforms h_l (G), h_r (H)
        [naux, nao, width] host fp64, with exact products. Where G is H and every w_i is one power
        of two (closed and open shells' occupied orbitals), one slicing serves both operands: H's
        int8 digits, and as fp32 the same digits times their powers of two (a multiplication, where
        slicing H again costs ~4x as long); else G w and H are sliced apart."""
        backend, naux, (_, nao, width) = self.backend, self.naux, h_l.shape
        w0 = float(weights[0])
        one_operand = not two and w0 > 0 and np.all(weights[:r] == w0) and np.frexp(w0)[0] == 0.5

        def rows(h):  # [naux, nao, width] -> [(P, i), nao]: the contraction on the rows
            return np.ascontiguousarray(h.transpose(0, 2, 1)).reshape(naux * width, nao)

        backend.count("host:slice_scf_operands")
        if not one_operand:  # G w and H sliced apart
            return backend.exact_fp64_product(rows(h_l * weights), rows(h_r))
        digits, scale = column_digits(rows(h_l), INPUT_SLICES)  # scale [nao, 1]: 2^e_m per column
        # slice s of H = d_s 2^(e_n - 7 (s + 1)), exact in fp32
        weights_sn = torch.from_numpy((DIGIT_WEIGHTS[:, None, None] * scale.T[None]).astype(np.float32))
        y = torch.from_numpy(digits).to(torch.float32).mul_(weights_sn)
        k = backend.exact_product(torch.from_numpy(digits[:, None]), y[:, None])[0]
        return k * (scale * w0)  # row m times its 2^e_m, and w

    def close(self):
        self._square32 = self._digits = None


def _padded(a, width):
    """a [n, c] with zero columns up to [n, width] (contiguous)."""
    out = np.zeros((a.shape[0], width))
    out[:, :a.shape[1]] = a
    return out


def _padded_last(a, width):
    """a [..., c] with zeros up to [..., width]."""
    out = np.zeros(a.shape[:-1] + (width,))
    out[..., :a.shape[-1]] = a
    return out
