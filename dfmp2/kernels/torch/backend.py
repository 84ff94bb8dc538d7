"""Torch backend: the pipeline's kernels in plain torch, on the CPU or an NVIDIA GPU.

Long (one class, TorchBackend, a method per entry of the Backend protocol; issue 74 splits kernels by backend).

Precision: GEMM-type kernels run in `compute_dtype` (fp64 or fp32); the metric
factorisation always runs in fp64; (ia|jb) leaves its GEMM as fp64, so the energy
expression and every energy sum are fp64. tf32x3 and bf16x3 are fp32 runs whose (ia|jb)
GEMMs are split-precision tensor-core products (split_gemm.py; emulated on a CPU).
"""

from __future__ import annotations

import importlib.util
import platform
from collections import Counter

import numpy as np
import torch

from ...util.blocks import block_ranges
from . import cpu_gemm, cpu_solves
from . import sparse as torch_sparse
from .pinned_staging import STAGING
from ..protocol import BackendRecord, PlanHints, fp64_pair_temporaries_bytes, rows_gram
from ..spin_cases import combine_amplitudes, density_weights, pair_denominators
from .split_gemm import SPLIT_FORMATS, split_product
from .products import symmetric_product

_DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "tf32x3": torch.float32, "bf16x3": torch.float32}
HALF_ROW_ELEMENTS = 2**24  # elements of B per product of an m-major half transform (half_transform_m_major)
PINNED_UPLOAD_MIN_BYTES = 16 * 2**20  # host arrays from this size on go to a GPU through the pinned buffers


# A GPU's fused pair epilogue (kernels.torch.cuda_pair) costs each process about 0.5 s to load with Triton's disk
# cache warm (2.2 s to compile it the first time), measured on an H100, and saves about 22-29 ps
# per (ia|jb) element against the torch ops (the large shape in fp64, the medium one in fp32). It
# pays in a run whose pair stage forms at least this many elements (some 20 s of pair stage), or
# once it is loaded.
FUSED_EPILOGUE_MIN_ELEMENTS = 2 * 10**10
_FUSED_EPILOGUE_LOADED = []  # [True] once this process has launched it


def fused_epilogue_pays(pair_elements: int, warm_kernels: bool) -> bool:
    """Whether a GPU run whose pair stage forms `pair_elements` (ia|jb) elements takes the fused
    epilogue: where it is loaded already, where the run amortises the load, or where the caller
    times warm passes (warm_kernels: `dfmp2 bench`)."""
    return bool(_FUSED_EPILOGUE_LOADED) or warm_kernels or pair_elements >= FUSED_EPILOGUE_MIN_ELEMENTS


def cuda_available() -> bool:
    return torch.cuda.is_available()


def cuda_description() -> str:
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"


# Subnormal fp32 results (|x| < 1.2e-38: products of the tails of an extended molecule's
# integrals) cost a microcode assist each on x86 CPUs: C16H34/cc-pVDZ's fp32 exchange builds took
# 1.9-2.1 s each with them, 0.5 s flushed to zero, the energy the same to the last digit (a
# flushed value is below 1e-38 of the values it is summed with). The flag (FTZ/DAZ) is a thread's
# own and a new thread copies its creator's, so it is set before torch's thread pool starts.
SUBNORMAL_PROBE = 1e-21  # a [512, 512] GEMM of this value sums 512 products of 1e-42: subnormal


def flush_subnormals() -> bool:
    """Set flush-to-zero for subnormal floats in this thread (torch's worker threads started
    later inherit it) and check that a threaded fp32 GEMM, whose every result is subnormal,
    gives zeros in every thread. False where torch's pool started before the flag (in a script
    that used torch first): its workers keep computing subnormals, slowly."""
    if not torch.set_flush_denormal(True):
        return False  # (a CPU without the flags: none of x86's assists either)
    tiny = torch.full((512, 512), SUBNORMAL_PROBE, dtype=torch.float32)
    return not bool(torch.count_nonzero(tiny @ tiny))


_SUBNORMALS_FLUSHED = []  # [bool] once this process has set and probed the flag


def subnormals_flushed() -> bool:
    """flush_subnormals(), once per process."""
    if not _SUBNORMALS_FLUSHED:
        _SUBNORMALS_FLUSHED.append(flush_subnormals())
    return _SUBNORMALS_FLUSHED[0]


def cpu_description() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flushed = ", subnormals flushed to zero" if _SUBNORMALS_FLUSHED[:1] == [True] else ""  # as probed (a backend)
    return f"{name}, {torch.get_num_threads()} threads{flushed}"


def load_cuda_libraries(device) -> None:
    """Load the GPU libraries a run calls (cuBLAS and cuBLASLt in fp32 and fp64, cuSOLVER's potrf,
    TRSM) on `device` now rather than at their first call: their host pages (about 0.5 GB of
    resident set with CUDA 13) then count in the footprint the memory plan measures before the
    SCF, instead of appearing after it and pushing a run it passed over --max-memory."""
    for dtype in (torch.float32, torch.float64):
        square = torch.eye(64, device=device, dtype=dtype) * 2
        lower, _ = torch.linalg.cholesky_ex(square @ square)
        torch.linalg.solve_triangular(lower.transpose(0, 1), square, upper=True, left=False)
    torch.cuda.synchronize(device)


class TorchBackend:
    """Kernels on torch tensors. `device`: 'cpu' or 'cuda'; `precision`: 'fp64', 'fp32', or
    'tf32x3' / 'bf16x3' (fp32 with split-precision (ia|jb) GEMMs); warm_kernels: on a GPU, the
    fused pair epilogue whatever its one-time load (`prepare`)."""

    name = "torch"
    transform = "fp64"  # the AO->MO transform runs in fp64 in both precisions (see pipeline)
    has_fp64 = True
    batches_gemm = True  # torch.matmul batches over the leading axis
    forms_amplitudes = True
    streams_densities = True
    screens = frozenset({"mp2", "scf"})  # block-sparse AO->MO transform and SCF builds (kernels.torch.sparse)
    fitted_store_on_disk = True  # the SCF's B streams from a scratch file where the budget does not hold it

    def __init__(self, device: str, precision: str, notes=None, warm_kernels: bool = False):
        self.device_name = device
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" \
            else torch.device("cpu")
        self.on_host = self.device.type == "cpu"  # (the protocol's capabilities)
        self.makes_integrals_on_device = self.device.type == "cuda"
        self.precision = precision
        self.compute_dtype = _DTYPES[precision]
        self.itemsize = torch.finfo(self.compute_dtype).bits // 8
        self.calls = Counter()  # kernel (or host:* step) -> count
        self.notes = list(notes or [])  # announcements recorded in the result
        self._panel_index = torch_sparse.PanelIndex()  # block-sparse panels' column indices on this device
        self.warm_kernels = warm_kernels
        self._fused_pair_sums = None  # a GPU's fused pair-energy epilogue (kernels.torch.cuda_pair), where `prepare` takes it
        if self.device.type == "cuda":
            load_cuda_libraries(self.device)
        else:  # which library runs each product (kernels.torch.cpu_gemm): an untuned run or a foreign cache, announced
            self.notes.extend(note for note in cpu_gemm.notes() if note not in self.notes)
        if not subnormals_flushed():
            self.notes.append("subnormal fp32 results are not flushed to zero in torch's worker threads (its "
                              "thread pool started before dfmp2 set the flag): fp32 products that underflow, "
                              "common on extended molecules, run several times slower")

    def record(self) -> BackendRecord:
        """What this backend is and has run so far (no emulator: no models, trace or NKI release)."""
        return BackendRecord(
            name=self.name, device=self.device_name, description=self.describe(),
            precision=self.precision, transform=self.transform, simulated=False, nki_api=None,
            neuron_versions=None, calls=dict(self.calls), notes=tuple(self.notes), specializations={},
            modelled_seconds=None, modelled=None, trace=None)

    def count(self, step: str) -> None:
        """A host or device step that ran outside a kernel, recorded in record().calls."""
        self.calls[step] += 1

    def modelled(self) -> dict:
        """Nothing is modelled on torch: {}."""
        return {}

    def peak_memory_bytes(self):
        """The GPU allocator's peak so far (torch.cuda.max_memory_allocated), None on the host."""
        return torch.cuda.max_memory_allocated() if self.device.type == "cuda" else None

    # ---- data movement -------------------------------------------------------------
    def to_device(self, array, fp64=False) -> torch.Tensor:
        """Host array -> tensor on this backend's device, in the compute dtype (or fp64)."""
        dtype = torch.float64 if fp64 else self.compute_dtype
        if self.device.type == "cuda" and not isinstance(array, torch.Tensor) and \
                getattr(array, "nbytes", 0) >= PINNED_UPLOAD_MIN_BYTES:
            return STAGING.upload(array, self.device, dtype)  # large host blocks: the (mn|P) upload
        return torch.as_tensor(array).to(device=self.device, dtype=dtype)

    def zeros(self, shape) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.compute_dtype)

    @staticmethod
    def to_host(tensor: torch.Tensor) -> np.ndarray:
        return tensor.detach().cpu().numpy()

    def rows_gram_fp64(self, flat, rows):
        return rows_gram(flat, self.to_host(rows))

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def memory_limit_bytes(self):
        """Free device memory for a GPU, None for the host (the caller's budget applies)."""
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            return int(free)
        return None

    def describe(self) -> str:
        return cuda_description() if self.device.type == "cuda" else cpu_description()

    # ---- kernels ---------------------------------------------------------------------
    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """C = A @ B for [m, k] x [k, n] (or batched [..., m, k] x [..., k, n])."""
        self.calls["gemm"] += 1
        return cpu_gemm.matmul("gemm", a, b)

    def syrk(self, c, panel):
        """C - P P^T: c [n, n], panel [n, w] -> [n, n] (in full: one gemm)."""
        return c - self.gemm(panel, panel.transpose(0, 1))

    def exact_fp64_product(self, a, b):
        """A^T B of host fp64 a [k, m], b [k, n], in fp64 on this device -> host fp64 [m, n]."""
        c = cpu_gemm.matmul("exact", self.to_device(np.ascontiguousarray(a.T), fp64=True), self.to_device(b, fp64=True))
        return c.cpu().numpy()

    def ao2mo(self, ao_block: torch.Tensor, c_occ: torch.Tensor, c_vir: torch.Tensor) -> torch.Tensor:
        """(ia|P) = sum_mn C_mi C_na (mn|P): [nP, nao, nao] -> [nocc, nvir, nP]."""
        self.calls["ao2mo"] += 1
        nP, nao, _ = ao_block.shape
        nocc, nvir = c_occ.shape[1], c_vir.shape[1]
        # (i n|P) = sum_m C_mi (mn|P)          batched [nocc, nao] x [nP; nao, nao]
        half = cpu_gemm.matmul("transform_half", c_occ.transpose(0, 1), ao_block)
        # (i a|P) = sum_n (i n|P) C_na         [nP*nocc, nao] x [nao, nvir]
        full = cpu_gemm.matmul("transform", half.reshape(nP * nocc, nao), c_vir).view(nP, nocc, nvir)
        return full.permute(1, 2, 0)

    def screened_ao2mo(self, screened, c_occ, c_vir):
        """(ia|P) = sum_mn C_mi C_na (mn|P) over the kept pair blocks of a ScreenedMNP on
        this device (`dfmp2.sparse`): one GEMM per row panel, then one [nvir, nao] GEMM ->
        [nocc, nvir, nP] (kernels.torch.sparse.ao2mo)."""
        self.calls["screened_ao2mo"] += 1
        return torch_sparse.ao2mo(self._panel_index, screened, c_occ, c_vir)

    def screened_layout(self, pattern) -> dict:
        """What the block-sparse kernels stream of `pattern`: its kept pair blocks themselves."""
        return {"unit": "pair blocks", "kept_fraction": round(pattern.stored_elements / pattern.nao ** 2, 6)}

    def fitted_store(self, rows, nao, kinds, free_bytes):
        """B for the SCF's Coulomb/exchange builds: rows [naux, npair] host fp64 or a scratch.RowFile
        of them out of core (kernels.torch.fitted.TorchFittedStore; screened B: dfmp2.sparse.fitted_store)."""
        from .fitted import TorchFittedStore

        return TorchFittedStore(self, rows, nao, kinds, free_bytes)

    def screened_half_transform(self, screened, factor):
        """X [nao, nP, r] = sum_n (mn|P) F_nr over the kept pair blocks (one GEMM per row panel), in
        the panels' dtype (kernels.torch.sparse.half_transform)."""
        self.calls["screened_half_transform"] += 1
        return torch_sparse.half_transform(self._panel_index, screened, factor)

    def screened_exchange_product(self, x, z, weights=None):
        """K_mn = sum_(P, r) X_(m, P, r) w_r Z_(n, P, r): x, z [nao, nP, r] -> [nao, nao], one GEMM."""
        self.calls["screened_exchange_product"] += 1
        return torch_sparse.exchange_product(x, z, weights)

    def screened_fit_density(self, lower, dms):
        """rho_P = sum_(mn kept) (mn|P) D_mn from a LowerPanels (each kept pair block once):
        dms [nset, nao, nao] (device) -> [nset, nP]."""
        self.calls["screened_fit_density"] += 1
        return torch_sparse.fit_density(self._panel_index, lower, dms)

    def screened_coulomb(self, lower, rho):
        """J_mn = sum_P rho_P (mn|P) over the kept pair blocks of a LowerPanels: rho [nset, nP] ->
        [nset, nao, nao]."""
        self.calls["screened_coulomb"] += 1
        return torch_sparse.coulomb(self._panel_index, lower, rho)

    def half_transform(self, b_block, factor):
        """The SCF exchange's half transform X^P = F^T B^P (B^P symmetric): b_block [nP, nao, nao],
        factor [nao, r] -> [nP, r, nao], in their dtype: batched [r, nao] x [nP; nao, nao], or on a
        CPU stacked, [nP nao, nao] x [nao, r] transposed, whichever was measured faster here
        (kernels.torch.cpu_gemm.fastest_form)."""
        self.calls["half_transform"] += 1
        if self.device.type != "cpu" or not b_block.is_contiguous():
            return cpu_gemm.matmul("half", factor.transpose(0, 1), b_block)
        nP, nao, _ = b_block.shape

        def stacked():  # X^P = (B^P F)^T, B^P symmetric: one [nP nao, nao] x [nao, r] product
            return cpu_gemm.matmul("half_stacked", b_block.view(nP * nao, nao), factor).view(
                nP, nao, -1).transpose(1, 2).contiguous()

        return cpu_gemm.fastest_form("half", factor.transpose(0, 1), b_block, {
            "batched": lambda: cpu_gemm.matmul("half", factor.transpose(0, 1), b_block), "stacked": stacked})

    def half_transform_m_major(self, b_block, factor, out=None):
        """The SCF exchange's half transform of an m-major block, X_(m, P, r) = sum_n B^P_mn F_nr:
        b_block [nao, nP, nao] (a slice of an m-major square), factor [nao, r] -> [nao, nP, r] (into
        `out` where given). A slice of every P (contiguous): 2-D products [nm nP, nao] x [nao, r] over
        blocks of m rows (HALF_ROW_ELEMENTS of B each: at naphthalene/cc-pVTZ's shapes on a Zen 5,
        250 GF/s on oneDNN in blocks, 180 as one product); else batched over m."""
        self.calls["half_transform"] += 1
        nao, nP, n = b_block.shape
        r = factor.shape[1]
        if b_block.is_contiguous():
            out = out if out is not None else torch.empty((nao, nP, r), dtype=b_block.dtype, device=b_block.device)
            for m0, m1 in block_ranges(nao, max(1, HALF_ROW_ELEMENTS // (nP * n))):
                cpu_gemm.matmul("half_rows", b_block[m0:m1].view(-1, n), factor, out=out[m0:m1].view(-1, r))
            return out
        x = cpu_gemm.matmul("half_batched", b_block, factor)
        if out is None:
            return x
        return out.copy_(x)

    def exchange_product_m_major(self, x, z, weights=None):
        """K_mn = sum_(P, r) X_(m, P, r) w_r Z_(n, P, r) of m-major half transforms x, z [nao, nP, r]
        (half_transform_m_major): one [nao, nP r] x [nP r, nao] product (z is x: its lower block
        rows) -> [nao, nao]."""
        self.calls["exchange_product"] += 1
        return torch_sparse.exchange_product(x, z, weights)

    def exchange_product(self, x, z, weights=None):
        """K_mn = sum_P sum_r X^P_rm w_r Z^P_rn for x, z [nP, r, nao], weights [r] (None: all 1):
        one GEMM [nao, nP*r] x [nP*r, nao] (on a CPU, z is x: its lower block rows,
        kernels.torch.products.symmetric_product). Returns K [nao, nao] (the SCF's exchange, one
        auxiliary block)."""
        self.calls["exchange_product"] += 1
        nP, rank, nao = x.shape
        symmetric = z is x and self.device.type == "cpu"  # one density's K: its lower block rows (a GPU: not yet run)
        if weights is not None:
            z = z * weights[None, :, None]
        left, right = x.reshape(nP * rank, nao), z.reshape(nP * rank, nao)
        return symmetric_product(left, right) if symmetric else cpu_gemm.matmul("exchange", left.transpose(0, 1), right)

    def fit_density(self, b_rows, d_rows):
        """rho_P = sum_(m>=n) B^P_(mn) D'_(mn): b_rows [nP, npair] (lower triangles), d_rows
        [nset, npair] (D with its off-diagonal doubled) -> [nset, nP]."""
        self.calls["fit_density"] += 1
        return cpu_gemm.matmul("fit", d_rows, b_rows.transpose(0, 1))

    def coulomb_block(self, b_rows, rho):
        """J_(mn) = sum_P rho_P B^P_(mn): b_rows [nP, npair], rho [nset, nP] -> [nset, npair]."""
        self.calls["coulomb_block"] += 1
        return cpu_gemm.matmul("coulomb", rho, b_rows)

    def prepare(self, plan) -> None:
        """Torch takes any block shape. On a GPU, the pair energies' epilogue: the fused Triton
        kernel (`kernels.torch.cuda_pair`) where it pays for its one-time load in this process (the plan's
        pair_elements, or already loaded, or warm_kernels), else torch ops; an announced note
        where it would pay but Triton is missing."""
        self._fused_pair_sums = None
        if self.device.type != "cuda" or not fused_epilogue_pays(plan.pair_elements, self.warm_kernels):
            return
        if importlib.util.find_spec("triton") is None:
            if not any(note.startswith("Triton") for note in self.notes):
                self.notes.append("Triton is not importable: the pair energies' epilogue runs as torch ops "
                                  "(slower; CUDA builds of torch ship Triton)")
            return
        from . import cuda_pair

        self._fused_pair_sums = cuda_pair.pair_energy_sums

    def plan_hints(self, nvir: int, naux: int) -> PlanHints:
        """(mn|P) blocks cache-sized on a CPU (the first half-transform is bandwidth-bound),
        large on a GPU (fewer, bigger GEMMs); ~512 (i, a) rows per pair GEMM on a CPU (~3
        occupied orbitals: efficient GEMMs, cheap I = J blocks), 8192 on a GPU; no occupied
        limit; ~5 fp64 [nb, nvir, nb, nvir] temporaries per pair call."""
        cuda = self.device.type == "cuda"
        return PlanHints(aux_block_bytes=512 * 2**20 if cuda else 16 * 2**20,
                         pair_rows=8192 if cuda else 512, occ_block_limit=None,
                         pair_scratch_bytes=fp64_pair_temporaries_bytes)

    def ovL_layout(self, shape):
        """Device storage for the [nocc, nvir, naux] three-center tensor (plain, contiguous)."""
        return self.zeros(shape)

    @staticmethod
    def copy_into(dst, src) -> None:
        """dst[...] = src (storage writes)."""
        dst.copy_(src)

    def _pair_product(self, rows_i, rows_j):
        """(ia|jb) = sum_P B_ia^P B_jb^P: rows_i [m, naux] x rows_j [n, naux]^T -> [m, n], one GEMM
        in the compute dtype, or three split-precision products (tf32x3, bf16x3)."""
        if self.precision in SPLIT_FORMATS:
            return split_product(rows_i, rows_j, self.precision)
        return cpu_gemm.matmul("pair", rows_i, rows_j.transpose(0, 1))

    def _amplitude_block(self, b_i, b_j, e_i, e_j, e_vir, e_vir_j=None):
        """t[i, a, j, b] = (ia|jb) / D_ijab in fp64, (ia|jb) = sum_P B_ia^P B_jb^P as one GEMM;
        e_vir_j: b_j's virtual energies when they are another spin's (None: e_vir)."""
        ni, nvir, naux = b_i.shape
        nj, nvir_j = b_j.shape[0], b_j.shape[1]
        iajb = self._pair_product(b_i.reshape(ni * nvir, naux), b_j.reshape(nj * nvir_j, naux))
        iajb = iajb.to(torch.float64).view(ni, nvir, nj, nvir_j)
        return iajb / pair_denominators(e_i, e_j, e_vir, e_vir_j)

    # ---- the Laplace opposite-spin energy (dfmp2.mp2.laplace_energy) ----------------------
    def laplace_accumulator(self, points, naux):
        """Z(t_k) of `points` quadrature points, zero: fp64 [points, naux, naux] on the device."""
        return torch.zeros((points, naux, naux), dtype=torch.float64, device=self.device)

    def laplace_z(self, z, b, e_occ, e_vir, exponents):
        """z [NK, naux, naux] fp64 + the rows of b [n, nvir, naux]: for each t_k,
        Z_k += S^T S with S_ia = B_ia exp(-(e_a - e_i) t_k / 2): one Gram product per point in the
        compute dtype (the library measured for it, `cpu_gemm` kind "laplace"; split formats as
        the pair product), added in fp64. -> z (updated in place)."""
        self.calls["laplace_z"] += 1
        n, nvir, naux = b.shape
        rows = b.reshape(n * nvir, naux)
        gaps = torch.as_tensor(np.subtract.outer(e_vir, e_occ).T.reshape(-1, 1), device=rows.device)  # e_a - e_i
        for k, t in enumerate(exponents):
            scaled = rows * torch.exp(-0.5 * t * gaps).to(rows.dtype)  # S_ia = B_ia exp(-(e_a - e_i) t / 2)
            if self.precision in SPLIT_FORMATS:
                gram = split_product(scaled.transpose(0, 1), scaled.transpose(0, 1), self.precision)
            else:
                gram = cpu_gemm.matmul("laplace", scaled.transpose(0, 1), scaled)
            z[k] += gram.to(torch.float64)
        return z

    def laplace_energy(self, z_a, z_b):
        """sum_PQ Z^a_k[P, Q] Z^b_k[P, Q] per point k, fp64 -> numpy [NK]."""
        return (z_a * z_b).sum(dim=(1, 2)).cpu().numpy()

    def density_block(self, b_occ, b_k, e_occ, e_k, e_vir, scaling=(1.0, 1.0), spin_case="closed", e_vir_k=None,
                      with_gamma=False):
        """Unrelaxed MP2 density from the pairs (i, k), all i against one block of k, fp64, as
        the i side's (P_oo [nocc, nocc], P_vv [nvir, nvir]), and with_gamma the same amplitudes'
        share of the whitened three-index density of the k block, G [nk, nvir_k, nkept] (else None):
          t = (ia|kb) / D,   P_ij += -w sum_kab X_ik^ab Y_jk^ab,   P_ab += w sum_ikc X_ik^ac Y_ik^bc
          G_kb^Q += g sum_ia Y_ik^ab B_ia^Q      (Y_ki^ba = Y_ik^ab: the pairs whose first orbital is k)
        X, Y, w and g per spin_case ("closed", "same", "opposite": k the other spin, with virtual
        energies e_vir_k) and scaling (c_os, c_ss) as `spin_cases` defines them. b_occ: B of all i
        [nocc, nvir, naux], or its row blocks in order (an iterable: B read from disk a slab at a
        time; the amplitudes of every i against the k block are kept, never B); b_k [nk, nvir_k, naux]."""
        self.calls["density_block"] += 1
        x_weights, y_weights, w, g = density_weights(scaling, spin_case)
        xs, ys, p_vv, g_k, i0 = [], [], 0.0, None, 0
        for chunk in ([b_occ] if torch.is_tensor(b_occ) else b_occ):
            i1 = i0 + chunk.shape[0]
            t = self._amplitude_block(chunk, b_k, e_occ[i0:i1], e_k, e_vir, e_vir_k)
            t_swapped = t.transpose(1, 3)  # t^T: t[i, b, k, a], a view
            x = combine_amplitudes(t, t_swapped, x_weights)
            y = x if y_weights == x_weights else combine_amplitudes(t, t_swapped, y_weights)
            p_vv = p_vv + w * torch.einsum("iakc,ibkc->ab", x, y)
            if with_gamma:  # GEMMs [nk*nvir_k, rows*nvir] x [rows*nvir, nkept], B in fp64 a few rows at a time
                ni, nvir, nk, nvir_k = y.shape
                g_k = g_k if g_k is not None else torch.zeros((nk * nvir_k, chunk.shape[2]), dtype=torch.float64,
                                                              device=y.device)
                for r0 in range(0, ni, 8):
                    r1 = min(ni, r0 + 8)
                    g_k.addmm_(y[r0:r1].reshape((r1 - r0) * nvir, nk * nvir_k).T,
                               chunk[r0:r1].reshape((r1 - r0) * nvir, -1).to(torch.float64))
            xs.append(x)
            ys.append(y)
            i0, t, t_swapped, x, y, chunk = i1, None, None, None, None, None
        p_oo = -w * torch.cat([torch.cat([torch.einsum("iakb,jakb->ij", x, y) for y in ys], dim=1) for x in xs])
        if not with_gamma:
            return p_oo, p_vv, None
        return p_oo, p_vv, (g * g_k).view(b_k.shape[0], b_k.shape[1], -1)

    def cholesky(self, metric):
        """Lower L [n, n] with metric = L L^T (metric: fp64 numpy [n, n]), fp64 on this device as one
        LAPACK / cuSOLVER potrf, or None if it is not positive definite."""
        self.calls["cholesky"] += 1
        lower, info = torch.linalg.cholesky_ex(self.to_device(metric, fp64=True))
        return lower if int(info) == 0 else None

    def solve_lower_transposed(self, lower: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """B = X L^-T for X [..., n, naux], L [naux, naux] lower triangular (a right-side TRSM)."""
        self.calls["trsm"] += 1
        rows = x.reshape(-1, x.shape[-1])  # one large solve (a CPU's on the library measured fastest: kernels.torch.cpu_solves)
        return cpu_solves.solve_lower_transposed("trsm", lower, rows).view(x.shape)

    def pair_energy(self, b_i, b_j, e_i, e_j, e_vir, e_vir_j=None, t_out=None, antisymmetrize=False):
        """Opposite- and same-spin MP2 energy of one block of occupied pairs, in fp64.

        b_i [ni, nvir, naux], b_j [nj, nvir_j, naux]: whitened B; e_i [ni], e_j [nj], e_vir [nvir]
        (Eh, compute dtype); e_vir_j [nvir_j]: the virtual energies of b_j when b_j belongs to
        the other spin (None: b_j shares b_i's virtuals). Returns (e_os, e_ss) summed over all i
        in block I, j in block J:
          (ia|jb) = sum_P B_ia^P B_jb^P,  D = e_i + e_j - e_a - e_b
          e_os = sum (ia|jb)^2 / D,  e_ss = sum (ia|jb) [(ia|jb) - (ib|ja)] / D
        (e_ss = 0 across spins: no exchange between an alpha and a beta pair).
        t_out: a host fp64 array [ni, nj, nvir, nvir_j] that receives t_ij^ab = (ia|jb) / D
        (PySCF's t2 layout), antisymmetrised, t_ij^ab - t_ij^ba, with `antisymmetrize` (the
        same-spin blocks of an unrestricted reference).
        """
        self.calls["pair_energy"] += 1
        ni, nvir, naux = b_i.shape
        nj, nvir_j = b_j.shape[0], b_j.shape[1]
        # (ia|jb) = B_i B_j^T  as one GEMM  [ni*nvir, naux] x [naux, nj*nvir_j], then fp64
        iajb = self._pair_product(b_i.reshape(ni * nvir, naux), b_j.reshape(nj * nvir_j, naux))
        if self._fused_pair_sums is not None and t_out is None:  # GPU: D, t and both sums in one kernel
            self.calls["pair_epilogue_fused"] += 1
            _FUSED_EPILOGUE_LOADED[:] = [True]
            e_os, e_exchange = self._fused_pair_sums(iajb, e_i, e_j, e_vir, e_vir if e_vir_j is None else e_vir_j,
                                                     exchange=e_vir_j is None)
            return float(e_os), (0.0 if e_vir_j is not None else float(e_os - e_exchange))
        iajb = iajb.to(torch.float64).view(ni, nvir, nj, nvir_j)
        # t_iajb = (ia|jb) / D_ijab, built in one buffer
        t = pair_denominators(e_i, e_j, e_vir, e_vir_j)
        torch.div(iajb, t, out=t)
        if t_out is not None:  # t2 on the host, as it is formed
            self.calls["amplitudes"] += 1
            amplitudes = t - t.permute(0, 3, 2, 1) if antisymmetrize else t  # t_ij^ba = t[i, b, j, a]
            t_out[...] = amplitudes.permute(0, 2, 1, 3).cpu().numpy()
            del amplitudes
        e_os = torch.dot(t.view(-1), iajb.view(-1))
        if e_vir_j is not None:
            return float(e_os), 0.0
        ibja = iajb.permute(0, 3, 2, 1).contiguous()  # (ib|ja) in [i, a, j, b] order
        e_exchange = torch.dot(t.view(-1), ibja.view(-1))
        return float(e_os), float(e_os - e_exchange)
