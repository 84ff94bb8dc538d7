"""What every backend provides: the one protocol the driver, pipeline, linalg, storage and bench call.

Backends: `TorchBackend` (cpu, cuda) and `NkiBackend` (trn1, trn2, trn3, or their emulator). Arrays are
the backend's tensors ("device" tensors); host arrays are numpy. Shapes in the docstrings of each
backend's methods; energies in Hartree. Nothing outside this protocol is for callers: what a
result records about the backend comes from `record()`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class PlanHints:
    """A backend's preferences for the memory plan (the budget still decides).

    aux_block_bytes: size of one fp64 (mn|P) block the transform likes (None: as large as fits);
    pair_rows: (i, a) rows of one pair-energy call; occ_block_limit: most occupied orbitals one
    pair call can take (None: no limit); pair_scratch_bytes(nb, nvir): memory one pair call
    needs beyond its two B blocks."""

    aux_block_bytes: int | None
    pair_rows: int
    occ_block_limit: int | None
    pair_scratch_bytes: Callable[[int, int], int]


@dataclass(frozen=True)
class BackendRecord:
    """What a backend was and what it ran, for a result record (a snapshot: `Backend.record()`).

    name: "torch" or "nki"; device: cpu, cuda, trn1, trn2 or trn3; description: the device in words
    (`describe()`); precision: fp64 or fp32 (GEMMs); transform: the AO->MO arithmetic (fp64,
    exact or fp32); simulated: NKI kernels on dfmp2's emulator; nki_api: the NKI release whose
    rules applied ("0.2" ... "0.7"; None on torch); neuron_versions: installed Neuron package ->
    version on a Trainium host (None elsewhere); calls: kernel (or host:* / device:* step) ->
    count; notes: announcements for the result; specializations: kernel -> set of argument
    shape tuples it was launched with ({} on torch); modelled_seconds: PEAK MODEL seconds per
    target, modelled: calibrated MODEL per target (seconds, breakdown, launches, ...), trace:
    the summed emulator trace (Trace.as_dict()): the three only when simulated, else None.
    """

    name: str
    device: str
    description: str
    precision: str
    transform: str
    simulated: bool
    nki_api: str | None
    neuron_versions: dict | None
    calls: dict
    notes: tuple
    specializations: dict
    modelled_seconds: dict | None
    modelled: dict | None
    trace: dict | None
    lnc: int | None = None  # NKI: the logical NeuronCore degree its kernels were compiled at (None on torch)


@runtime_checkable
class Backend(Protocol):
    """The operations of the four steps (and the density) on one device, plus data movement and
    what ran. Per member, one line; shapes in [brackets], B = whitened (ia|P)."""

    name: str  # "torch" or "nki"
    device_name: str  # cpu, cuda, trn1, trn2, trn3
    device: object  # the torch.device its tensors live on (cpu for the emulator, the XLA device on Trainium)
    precision: str  # fp64 or fp32 (GEMMs)
    compute_dtype: object  # torch dtype of its GEMMs: float64 or float32
    transform: str  # AO->MO arithmetic: fp64 (torch), exact or fp32 (NKI)
    itemsize: int  # bytes per element of the stored (ia|P) / B: 8 or 4
    has_fp64: bool  # fp64 arithmetic on the device (False on a NeuronCore)
    batches_gemm: bool  # gemm multiplies [nb, m, k] x [nb, k, n] in one call (torch); False: [m, k] x [k, n] only (NKI)
    forms_amplitudes: bool  # pair_energy can fill t_out (t2; False: the pair kernel keeps (ia|jb) on chip)
    streams_densities: bool  # density_block takes B of all i in several row blocks (B out of core)
    screens: frozenset  # the steps with block-sparse operations (dfmp2.sparse): "mp2" (screened_ao2mo), "scf" (screened fitted_store)
    fitted_store_on_disk: bool  # fitted_store also takes B as a scratch.RowFile (the SCF's B out of core)
    on_host: bool  # its tensors are host memory (torch on a CPU); False on a GPU, a NeuronCore and the NKI emulator (HBM modelled)
    makes_integrals_on_device: bool  # torch makes tensors in place on its device (a GPU): `dfmp2 bench --integrals device`
    calls: Counter  # kernel (or host:* / device:* step) -> times run; a step outside a kernel through count()
    notes: list  # announcements (str) recorded in the result, e.g. a disputed nki/target pair

    # data movement
    def to_device(self, array, fp64=False):
        """Host array -> device tensor, same shape, compute dtype (fp64=True: fp64; on NKI a host tensor)."""

    def to_host(self, tensor):
        """Device tensor -> numpy array of the same shape and dtype."""

    def zeros(self, shape):
        """A zero device tensor of `shape` in the storage dtype."""

    def rows_gram_fp64(self, flat, rows):
        """sum_n flat[n]^T rows[n]: host fp64 flat [n, r] against device or host rows (any shape of
        n * r elements) -> host fp64 [r, r] (`rows_gram`; the density's Gbar contraction)."""

    def synchronize(self) -> None:
        """Wait for queued device work (cuda, XLA); a no-op elsewhere."""

    def ovL_layout(self, shape):
        """Device storage for B [nocc, nvir, naux], returned as a [nocc, nvir, naux] view."""

    def copy_into(self, dst, src) -> None:
        """dst[...] = src for a device dst and a device or host src of the same shape."""

    # planning
    def memory_limit_bytes(self) -> int | None:
        """Free device memory in bytes (a GPU), or None: the caller's budget applies."""

    def plan_hints(self, nvir: int, naux: int) -> PlanHints:
        """Block sizes this backend prefers for a problem of nvir virtuals and naux auxiliaries."""

    def prepare(self, plan) -> None:
        """Told the run's memory plan before the first kernel (e.g. the largest aux block)."""

    def describe(self) -> str:
        """The device in words (model, memory; emulator and NKI release on Trainium)."""

    def record(self) -> BackendRecord:
        """What this backend is and has run so far, as a frozen snapshot."""

    def count(self, step: str) -> None:
        """A host or device step that ran outside a kernel (e.g. "host:eigh"), recorded in record().calls."""

    def modelled(self) -> dict:
        """Calibrated MODEL of what ran so far per target (as BackendRecord.modelled); {} where nothing
        is modelled (torch; NKI on a Trainium host)."""

    def peak_memory_bytes(self) -> int | None:
        """The most device memory its tensors have held so far (a GPU's allocator), or None where untracked."""

    # the steps
    def gemm(self, a, b):
        """a [m, k] @ b [k, n] -> [m, n]."""

    def cholesky(self, metric):
        """Lower L with metric = L L^T, factorised in fp64 (metric: fp64 numpy [n, n]) -> device tensor, or None if not positive definite."""

    def solve_lower_transposed(self, lower, x):
        """x [..., naux] L^-T for lower-triangular L [naux, naux] -> same shape as x."""

    def syrk(self, c, panel):
        """C [n, n] - P P^T for a panel P [n, w] (at least its lower triangle) -> [n, n] (linalg.potrf)."""

    def exact_fp64_product(self, a, b):
        """A^T B of host fp64 a [k, m], b [k, n] -> host fp64 [m, n] (linalg.exact_product): in fp64 where
        has_fp64, else from Ozaki slices (to ~2^-35 of each column's largest product)."""

    def ao2mo(self, ao_block, c_occ, c_vir):
        """(mn|P) [nP, nao, nao], C_occ [nao, nocc], C_vir [nao, nvir] -> (ia|P) [nocc, nvir, nP]."""

    def screened_ao2mo(self, screened, c_occ, c_vir):
        """Block-sparse (mn|P) (a dfmp2.sparse.ScreenedMNP on the device) -> (ia|P) [nocc, nvir, nP].
        Only where "mp2" is in `screens`."""

    def screened_layout(self, pattern) -> dict:
        """What screened_ao2mo streams of a dfmp2.sparse.ScreenedPattern ("unit", "kept_fraction"):
        for the result's screening record."""

    def pair_energy(self, b_i, b_j, e_i, e_j, e_vir, e_vir_j=None, t_out=None, antisymmetrize=False):
        """B_i [ni, nvir, naux], B_j [nj, nvir_j, naux], energies in Eh -> (E_os, E_ss) in Eh."""

    def laplace_accumulator(self, points, naux):
        """Z(t_k) of `points` Laplace quadrature points, zero, on the device (torch: fp64 [points, naux,
        naux]; NKI: fp32, padded, in HBM)."""

    def laplace_z(self, z, b, e_occ, e_vir, exponents):
        """Z_k += sum_ia B_ia^T B_ia exp(-(e_a - e_i) t_k) for the rows of b [n, nvir, naux] (e_occ [n],
        e_vir [nvir]: host fp64, Eh; exponents t_k in 1/Eh) -> the accumulator (updated, or a new one)."""

    def laplace_energy(self, z_a, z_b):
        """sum_PQ Z^a_k[P, Q] Z^b_k[P, Q] per point k -> numpy fp64 [points]."""

    def density_block(self, b_occ, b_k, e_occ, e_k, e_vir, scaling=(1.0, 1.0), spin_case="closed", e_vir_k=None,
                      with_gamma=False):
        """B [nocc, nvir, naux] (or its row blocks in order, an iterable: B streamed from disk),
        B_k [nk, nvir_k, naux] -> the i side's unrelaxed (P_oo [nocc, nocc], P_vv [nvir, nvir]),
        and with_gamma the pairs' share of the whitened three-index density of the k block, G
        [nk, nvir_k, nkept] fp64, else None); spin_case "closed" (restricted), or
        "same"/"opposite" (k of the same or the other spin of an unrestricted reference;
        kernels.torch.backend.density_block has the formulas)."""



class FittedStore(Protocol):
    """A backend's copy of the whitened JK-fit integrals B for one SCF, and its builds
    (`dfmp2.chem.jk` holds the policy; kernels.torch.fitted.TorchFittedStore, kernels.nki.fitted.NkiFittedStore)."""

    exact_kind: str  # the kind of anchors and strict builds: "fp64" (torch) or "exact" (NKI)
    coulomb_follows_kind: bool  # False: J is built in exact_kind whatever the build's kind
    storage: str  # where and how B is kept, in words

    orbital_increments: bool  # True: build_increment (below); False: increments are ordinary builds
    # of D - D_anchor's eigenvectors

    def build(self, dms, factors, kind, with_j, with_k, anchor=False):
        """dms [nset, nao, nao] host fp64, factors [(L [nao, r], R [nao, r] or None, w [r] or
        None)] with D = L diag(w) R^T, kind "fp32" or exact_kind -> (J or None, K or None), host
        fp64 [nset, nao, nao]. anchor: increments will start from these densities (the store
        may keep what they reuse)."""

    def build_increment(self, deltas, anchor_factors, steps, with_j, with_k):
        """J and K of D - D_anchor (deltas [nset, nao, nao] host fp64) where D_anchor = L_a L_a^T
        had the factors anchor_factors [(L_a, None, None)] in an anchor build and D = L L^T with
        L Q = L_a + E, steps [E [nao, r]]: fp32 GEMMs, errors proportional to E -> (J or None,
        K or None), host fp64 [nset, nao, nao]; `increment_form` says in words how K was built.
        Only where orbital_increments."""

    def close(self) -> None:
        """Release B."""


@runtime_checkable
class FittedBuildsBackend(Protocol):
    """A backend that builds the SCF's Coulomb and exchange matrices from whitened JK-fit
    integrals (`dfmp2.chem.jk`): torch (cpu, cuda) and NKI (trn1, trn2, trn3, emulated or not)."""

    def fitted_store(self, rows, nao, kinds, free_bytes) -> FittedStore:
        """rows [naux, npair] host fp64 (B^P_(mn), m >= n), nao, kinds: the build kinds the run
        will use ("fp32" and/or the store's exact_kind), free_bytes(): what the process's budget
        leaves -> the store (B uploaded once where the backend computes). A backend with
        `fitted_store_on_disk` also takes rows as a scratch.RowFile (out of core). Screened B (a
        LowerPanels, or a RowFile of its flat rows): dfmp2.sparse.fitted_store."""


class ScreenedBuildsBackend(Protocol):
    """A backend whose `screens` hold "scf": the SCF's builds on screened B (`dfmp2.sparse.scf_store`,
    `sparse.block_sparse_product`): torch (cpu, cuda)."""

    def screened_half_transform(self, screened, factor):
        """X [nao, nP, r] = sum_n (mn|P) F_nr over the kept pair blocks of a ScreenedMNP."""

    def screened_exchange_product(self, x, z, weights=None):
        """K_mn = sum_(P, r) X_(m, P, r) w_r Z_(n, P, r): x, z [nao, nP, r] -> [nao, nao]."""

    def screened_fit_density(self, lower, dms):
        """rho_P = sum_(mn kept) (mn|P) D_mn of a LowerPanels: dms [nset, nao, nao] -> [nset, nP]."""

    def screened_coulomb(self, lower, rho):
        """J_mn = sum_P rho_P (mn|P) over the kept pair blocks of a LowerPanels: rho [nset, nP] -> [nset, nao, nao]."""


def fp64_pair_temporaries_bytes(nb: int, nvir: int) -> int:
    """~5 fp64 [nb, nvir, nb, nvir] temporaries: (ia|jb), the denominators, the amplitudes and
    their exchange partners of one pair-energy call (the torch backend's; the plan's default)."""
    return 5 * nb * nb * nvir * nvir * 8


def rows_gram(flat, rows_host) -> np.ndarray:
    """sum_n flat[n]^T rows[n] in fp64 on the host: flat [n, r] fp64, rows_host n * r elements
    of any float dtype -> [r, r]. Every backend's rows_gram_fp64 (no device has fp64 for it)."""
    return flat.T @ np.asarray(rows_host, dtype=np.float64).reshape(flat.shape)
