"""NKI backend: the pipeline's kernels as NKI kernels on Trainium (trn1, trn2, trn3), or on the emulator.

Long (one class, NkiBackend, with a method per entry of the Backend protocol (`protocol.py`), as
TorchBackend has; the kernels, launches, ledger and SCF builds are in their own modules).

simulate=False: tensors live on the XLA device (torch-neuronx) and `dfmp2/kernels/nki/kernels.py`
is compiled by the real `nki.jit`. simulate=True: the same kernel source is executed with
dfmp2's emulator standing in for the `nki` modules, with the chosen target's limits.

Device arithmetic is fp32 (no fp64 on a NeuronCore); partial energies come back per pair and
are summed on the host in fp64. Host work that is not a kernel is named `host:*` in `calls`:
the 128 x 128 diagonal panels of the Cholesky factorisation (and their inverses) in fp64,
and the eigen-decomposition fallback for a singular metric.

Residency: B stays in device HBM from the transform to the end of the pair stage (stored
[nocc, naux, nvir], `ovL_layout`); the model charges host <-> device bytes where data
crosses (arguments not resident in HBM, `to_device`, `to_host`) and layout changes in HBM at
the DMA rate (`device:copy`).

Compile economy: gemm and syrk calls are padded to tile multiples and, when the result fits
inside a shape the kernel already ran with, up to that shape (`KernelLauncher.bucket`); ao2mo
calls only in their auxiliary count, to the run's largest auxiliary block (`prepare`); trsm,
pair energies and density take ragged shapes unpadded, the pair energies in blocks of at most
kernels.nki.launch.PAIR_BLOCK orbitals (at most 4 specializations).

This module is the protocol's implementation: HBM residency and the operands of each step. It
delegates launching to `kernels.nki.launch.KernelLauncher`, the accounting and time MODEL to
`kernels.nki.ledger.CostLedger`, the exact-product slicing to `ozaki`, and the release support checks
to `kernels.nki.support`.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

import nki_emulator as emulator
from nki_emulator.core import TARGETS

from ...util import environment
from ...util.errors import option
from .launch import KernelLauncher, pad_on_host, pair_blocks, round_up, round_up_free
from .ledger import CostLedger
from .sparse import TileMap, pack_dense_tiles, pack_tiles, symmetric_digits
from .support import (LNC_VARIABLE, checks_lnc, installed_nki_api, installed_versions, logical_core_degree,
                          release_name)
from .ozaki import INPUT_SLICES, ROUNDING_PAD, X_DIGITS, column_digits, column_slices, half_transform_grid
from ..protocol import BackendRecord, PlanHints, rows_gram
from ..spin_cases import density_weights
from .tiles import FREE, GAMMA_X_BYTES, VV_RESIDENT_BYTES, P, laplace_rows_per_launch


# the NeuronCore generation of each target (AWS's architecture pages)
CORE_NAMES = {"trn1": "NeuronCore-v2", "trn2": "NeuronCore-v3", "trn3": "NeuronCore-v4"}


class NkiBackend:
    """Kernels for target 'trn1', 'trn2' or 'trn3'; simulate=True runs them on the emulator.

    model_only (with simulate): each kernel specialization is emulated once (limits checked,
    trace recorded); later calls with the same shapes reuse that trace and compute their outputs
    by host reference math. nki_api (with simulate): the NKI release whose rules apply (default:
    the newest AWS documents for the target); on a host, the installed release. transform: the
    AO->MO arithmetic, "exact" or "fp32" (kernels.TRANSFORMS). notes: announcements for the result.
    """

    name = "nki"
    precision = "fp32"
    compute_dtype = torch.float32
    itemsize = 4
    has_fp64 = False  # no fp64 anywhere on a NeuronCore
    batches_gemm = False  # gemm_kernel takes one [m, k] x [k, n] product
    forms_amplitudes = False  # (ia|jb) never leaves the chip: no t2
    streams_densities = False  # density_kernel takes all of B at once: no out-of-core densities
    screens = frozenset({"mp2"})  # block-sparse AO->MO transform (ao2mo_kernel's tiles); SCF builds dense
    fitted_store_on_disk = False  # the SCF's B is uploaded whole
    on_host = False  # tensors in HBM (emulated: HBM residency modelled)
    makes_integrals_on_device = False  # torch does not compute on a NeuronCore

    def __init__(self, target: str, simulate: bool, model_only: bool = False, nki_api: str | None = None,
                 transform: str = "exact", lnc: int | None = None, notes=None):
        self.device_name = target
        self.target = target
        self.transform = transform  # kernels.TRANSFORMS
        # on a host: the installed Neuron packages (nki, neuronx-cc, ...), reported with the result
        self.neuron_versions = None if simulate else installed_versions()
        self.ledger = CostLedger()  # calls, trace, calibrated and peak MODEL
        api = (nki_api or emulator.NEWEST_API[target]) if simulate else installed_nki_api()
        # the logical NeuronCore degree every kernel is compiled at (physical cores per launch):
        # nki 0.7 checks it (EVRF066); kernels.nki.support.logical_core_degree
        self.lnc = lnc if lnc is not None else logical_core_degree(target, api, TARGETS[target].max_lnc)
        self.launcher = KernelLauncher(target, simulate, model_only, api, self.ledger, lnc=self.lnc)
        self.notes = list(notes or [])  # announcements recorded in the result (e.g. a disputed nki/target pair)
        if simulate:
            self.device = torch.device("cpu")
        else:
            if checks_lnc(api) and environment.set_default(LNC_VARIABLE, str(self.lnc)):  # before torch-neuronx compiles
                self.notes.append(f"{release_name(api)} checks every kernel's LNC degree against neuronx-cc's "
                                  f"(EVRF066): dfmp2 set {LNC_VARIABLE}={self.lnc} for this process")
            import torch_xla

            self.device = torch_xla.device()
        self._inverse_panels = None  # (factor tensor, stacked transposed inverses)
        self._operand_cache = {}  # operands made once per run (the orbital slices)
        self._aux_block = 0  # largest auxiliary block of the run (see prepare)
        # device HBM residency: storage address -> a tensor owning it. Kernel outputs, zeros()
        # and to_device() results live in HBM; an argument that does not is a host -> device
        # transfer at its launch, and to_host() of a resident tensor a device -> host one.
        self._on_device = weakref.WeakValueDictionary()

    # ---- configuration and accounting (owned by the launcher and the ledger) ----------------
    simulate = property(lambda self: self.launcher.simulate, doc="NKI kernels on the emulator")
    model_only = property(lambda self: self.launcher.model_only, doc="repeat shapes by host reference math")
    nki_api = property(lambda self: self.launcher.nki_api, doc="the NKI release whose rules apply")
    kernels = property(lambda self: self.launcher.kernels, doc="the kernel module (emulated or real)")
    specializations = property(lambda self: self.launcher.specializations,
                               doc="kernel -> set of argument shape tuples it ran with")
    calls = property(lambda self: self.ledger.calls, doc="kernel (or host:* / device:* step) -> count")
    trace = property(lambda self: self.ledger.trace, doc="the run's summed emulator Trace")

    def modelled_seconds(self) -> dict:
        """PEAK MODEL (uncalibrated, not measured) per target: see CostLedger.modelled_seconds."""
        return self.ledger.modelled_seconds()

    def modelled(self) -> dict:
        """Calibrated MODEL (not measured) per target: see CostLedger.modelled ({} on a Trainium host)."""
        return self.ledger.modelled() if self.simulate else {}

    def count(self, step: str) -> None:
        """A host or device step that ran outside a kernel, recorded in record().calls."""
        self.calls[step] += 1

    def peak_memory_bytes(self):
        """Not tracked on a NeuronCore: None."""
        return None

    def record(self) -> BackendRecord:
        """What this backend is and has run so far (models and trace only when simulated)."""
        simulated = self.simulate
        return BackendRecord(
            name=self.name, device=self.device_name, description=self.describe(),
            precision=self.precision, transform=self.transform, simulated=simulated,
            nki_api=self.nki_api,
            neuron_versions=dict(self.neuron_versions) if self.neuron_versions is not None else None,
            calls=dict(self.calls), notes=tuple(self.notes),
            specializations={kernel: set(shapes) for kernel, shapes in self.specializations.items()},
            modelled_seconds=self.modelled_seconds() if simulated else None,
            modelled=self.modelled() if simulated else None,
            trace=self.trace.as_dict() if simulated else None, lnc=self.lnc)

    # ---- data movement ---------------------------------------------------------------
    def to_device(self, array, fp64=False) -> torch.Tensor:
        """Host array -> fp32 tensor in device HBM (a host -> device transfer). fp64=True: there
        is no fp64 on a NeuronCore, so the array stays on the host in fp64, for the host-side
        slicing of the transform's operands (`column_slices`) and for the energies, which
        kernels take in fp32."""
        if fp64:
            return torch.as_tensor(np.asarray(array, dtype=np.float64))
        tensor = torch.as_tensor(np.asarray(array)).to(device=self.device, dtype=torch.float32)
        self.ledger.transfer(tensor.nbytes, 0)
        return self._resident(tensor)

    def zeros(self, shape) -> torch.Tensor:
        """A zero fp32 tensor of `shape` in device HBM."""
        return self._resident(torch.zeros(shape, device=self.device, dtype=torch.float32))

    def to_host(self, tensor: torch.Tensor) -> np.ndarray:
        """Tensor -> numpy (a device -> host transfer when the tensor is resident in HBM)."""
        if self.is_resident(tensor):
            self.ledger.transfer(0, tensor.nbytes)
        return tensor.detach().cpu().numpy()

    def rows_gram_fp64(self, flat, rows):
        return rows_gram(flat, self.to_host(rows))

    def is_resident(self, tensor) -> bool:
        """True for a tensor (or view) whose storage is in device HBM."""
        return isinstance(tensor, torch.Tensor) and \
            tensor.untyped_storage().data_ptr() in self._on_device

    def _resident(self, tensor: torch.Tensor) -> torch.Tensor:
        owner = tensor if tensor._base is None else tensor._base
        self._on_device[owner.untyped_storage().data_ptr()] = owner
        return tensor

    def _device_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A layout change or pad of a resident tensor, done in device HBM (an XLA copy on a
        host); the result is resident."""
        self.ledger.device_copy(tensor.nbytes)
        return self._resident(tensor)

    def synchronize(self) -> None:
        if not self.simulate:
            import torch_xla

            torch_xla.sync()

    def memory_limit_bytes(self):
        return None

    def describe(self) -> str:
        core = CORE_NAMES[self.target]
        transform = "exact-product" if self.transform == "exact" else "plain fp32"
        if self.simulate and self.model_only:
            return (f"{self.target} NKI emulator, model-only ({core} limits, nki {self.nki_api} rules; "
                    f"each kernel shape emulated once, repeats computed by host reference math; "
                    f"{transform} transform)")
        if self.simulate:
            return (f"{self.target} NKI emulator ({core} limits, nki {self.nki_api} rules; numpy on the "
                    f"host CPU; {transform} transform)")
        return f"{self.target} {core} via torch-neuronx ({self.device}), nki {self.nki_api}, {transform} transform"

    # ---- kernel calls ------------------------------------------------------------------
    def _launch(self, kernel_name, arrays, useful_flops, grid=1, prefetched=False):
        """Run one kernel on fp32 arrays on `grid` physical cores (KernelLauncher.launch):
        arguments not resident in device HBM are host -> device transfers (prefetched: uploaded
        while the previous kernel ran, kernels.nki.ledger); the outputs stay in HBM. `useful_flops`: the
        minimal matmul FLOPs of its unpadded work. Int arguments are compile-time constants."""
        host_bytes = sum(a.nbytes for a in arrays if isinstance(a, torch.Tensor) and not self.is_resident(a))
        out = self.launcher.launch(kernel_name, arrays, useful_flops, host_bytes, grid, prefetched)
        return self._outputs(out) if self.simulate else out

    def _outputs(self, out):
        """A kernel's output(s) (array or tuple of arrays) as tensors resident in device HBM."""
        if isinstance(out, tuple):
            return tuple(self._outputs(o) for o in out)
        return self._resident(out if isinstance(out, torch.Tensor) else torch.from_numpy(out))

    def _pad(self, tensor, shape, value=0.0):
        """tensor padded to `shape` (fp32, contiguous); done in HBM if the tensor is resident."""
        if tuple(tensor.shape) == tuple(shape) and tensor.dtype == torch.float32 and tensor.is_contiguous():
            return tensor
        out = torch.full(shape, value, dtype=torch.float32, device=tensor.device)
        out[tuple(slice(0, n) for n in tensor.shape)] = tensor
        return self._device_copy(out) if self.is_resident(tensor) else out

    # ---- the backend interface used by linalg and the pipeline ---------------------------
    def gemm(self, a, b):
        """C = A @ B for [m, k] x [k, n] via gemm_kernel (which takes A transposed)."""
        m, k = a.shape
        n = b.shape[1]
        (kp, mp), (_, np_) = self.launcher.bucket("gemm_kernel", ((round_up(k, P), round_up(m, P)),
                                                                  (round_up(k, P), round_up_free(n))))
        out = self._launch("gemm_kernel", (self._pad(a.T, (kp, mp)), self._pad(b, (kp, np_))), 2 * m * n * k,
                           grid=self.lnc)
        return out[:m, :n].to(self.device)

    def syrk(self, c, panel):
        """C - panel panel^T on (at least) the lower triangle; c [n, n], panel [n, w]."""
        n, w = panel.shape
        (np_, _), (wp, _) = self.launcher.bucket("syrk_kernel", ((round_up(n, FREE),) * 2,
                                                                 (round_up(w, P), round_up(n, FREE))))
        out = self._launch("syrk_kernel", (self._pad(c, (np_, np_)), self._pad(panel.T, (wp, np_))),
                           n * (n + 1) * w, grid=self.lnc)  # the lower triangle of panel panel^T
        return out[:n, :n].to(self.device)

    def cholesky(self, metric):
        """Lower L with metric = L L^T, factorised on the host in fp64 (no fp64 on a NeuronCore:
        fp32 updates would round an ill-conditioned metric), then on the device in fp32; None if
        the metric is not positive definite."""
        self.calls["host:cholesky"] += 1
        try:
            return self.to_device(np.linalg.cholesky(metric))
        except np.linalg.LinAlgError:
            return None

    def solve_lower_transposed(self, lower, x):
        """B = X L^-T via trsm_kernel: x [ni, nvir, naux] -> [ni, nvir, naux] (a view of the kernel's
        [ni, naux, nvir] result), or x [rows, naux] -> [rows, naux]. No padding: the kernel takes
        ragged tiles; L^T goes to the device once per factor."""
        flat = x.dim() == 2
        x3 = x[None] if flat else x
        ni, nvir, naux = x3.shape
        l_t, inverses = self._factor_operands(lower)
        out = self._launch("trsm_kernel", (self._aux_rows(x3), l_t, inverses),
                           ni * nvir * naux * naux, grid=self.lnc)  # triangular solve
        out = out.permute(0, 2, 1)
        return out[0] if flat else out

    def _factor_operands(self, lower):
        """(L^T, stacked transposed inverses of L's 128 x 128 diagonal blocks) on the device,
        made once per factor on the host in fp64 (the host factorised L and still holds it)."""
        if self._inverse_panels is not None and self._inverse_panels[0] is lower:
            return self._inverse_panels[1]
        host = lower.detach().cpu().numpy().astype(np.float64)  # the host's own L: no transfer
        naux = host.shape[0]
        stacked = np.zeros((naux, P))
        for k0 in range(0, naux, P):
            w = min(P, naux - k0)
            stacked[k0:k0 + w, :w] = np.linalg.inv(host[k0:k0 + w, k0:k0 + w]).T
            self.calls["host:invert_panel"] += 1
        operands = (self.to_device(np.ascontiguousarray(host.T)), self.to_device(stacked))
        self._inverse_panels = (lower, operands)
        return operands

    def ao2mo(self, ao_block, c_occ, c_vir):
        """(ia|P) = sum_mn C_mi C_na (mn|P) via ao2mo_kernel: [nP, nao, nao] -> [nocc, nvir, nP].

        transform "exact": the fp64 (mn|P) and C (host arrays: a NeuronCore has no fp64) are cut
        into 7-bit slices on the host (`kernels.nki.sparse.symmetric_digits` of (mn|P)'s lower tiles,
        `column_slices` of C), so the kernel's products and PSUM sums are exact (see the kernel). "fp32": (mn|P) and C rounded to fp32, one
        product per half. One call per block of functions (the kernel cuts the occupied
        orbitals and the functions into the chunks and batches that fit in SBUF).
        """
        x = np.asarray(self.to_host(ao_block), dtype=np.float64)
        nP, nao, _ = x.shape
        return self._transform(x, None, c_occ, c_vir, 2 * nP * nao * nao)

    def screened_ao2mo(self, screened, c_occ, c_vir):
        """(ia|P) over the kept pair blocks of a ScreenedMNP (host fp64 panels) via
        ao2mo_kernel's block-sparse layout: only the kept 128 x 128 tiles (`kernels.nki.sparse.TileMap`:
        those the kept blocks overlap) are packed, sliced, uploaded and multiplied; the second
        half is the dense one. -> [nocc, nvir, nP]."""
        tiles = self._tile_map(screened.pattern)
        self.calls["host:pack_tiles"] += 1
        # [nP, R, P]: the kept tiles stacked along the rows (exact: those on and below the diagonal)
        x = pack_tiles(screened, tiles.lower() if self.transform == "exact" else tiles)
        # first-half FLOPs of the kept pair blocks (the tiles' zeros are not useful work)
        return self._transform(x, tiles, c_occ, c_vir, 2 * screened.naux * screened.pattern.stored_elements)

    def screened_layout(self, pattern) -> dict:
        """What ao2mo_kernel streams of `pattern`: the 128 x 128 tiles its kept blocks overlap."""
        return {"unit": "128 x 128 tiles", **self._tile_map(pattern).record()}

    def _tile_map(self, pattern):
        """The kept tiles of a screening pattern (`kernels.nki.sparse.TileMap`), made once per pattern."""
        key = ("tiles", id(pattern))
        cached = self._operand_cache.get(key)
        if cached is None or cached[0] is not pattern:
            cached = self._operand_cache[key] = (pattern, TileMap.from_pattern(pattern))
        return cached[1]

    def _transform(self, x, tiles, c_occ, c_vir, first_half_flops):
        """ao2mo_kernel on host fp64 (mn|P): x [nP, nao, nao] (tiles None) or the kept tiles
        [nP, R, P] of `tiles` (exact: its lower tiles, TileMap.lower); first_half_flops: the first half's useful FLOPs per occupied
        orbital (2 nP times the (mn) elements it contracts). -> [nocc, nvir, nP]."""
        occ_slices, c_occ_l1, vir_slices = self._orbital_slices(c_occ, c_vir)  # on the device once per run
        nP, nao = x.shape[0], vir_slices.shape[1]
        nocc, nvir = occ_slices.shape[2], vir_slices.shape[2]
        tile_map, symmetric = (0 if tiles is None else tiles.bits), 0
        if self.transform == "exact":
            self.calls["host:slice_operands"] += 1
            x_max = np.abs(x).reshape(nP, -1).max(axis=1)
            # only the kept tiles on and below the diagonal cross, with symmetric digits (one
            # exponent per function): the kernel turns each for its mirror above the diagonal
            if tiles is None:  # dense (mn|P): every tile kept
                tiles = TileMap.full(nao)
                x = pack_dense_tiles(x, tiles.lower())
            tile_map, symmetric = tiles.bits, 1
            digits, scale = symmetric_digits(x, nao, X_DIGITS)
            x_digits, x_scale = torch.from_numpy(digits), torch.from_numpy(scale)
        else:
            x_digits = torch.from_numpy(x.astype(np.float32))[None]
        slices = x_digits.shape[0]
        # only the auxiliary index is padded (to the run's largest block: one specialization); the
        # kernel takes ragged nao, nocc and nvir and cuts the occupied orbitals into chunks itself
        pp = self.launcher.bucket("ao2mo_kernel", ((max(nP, self._aux_block),), (nao, nocc, nvir)))[0][0]
        if self.transform == "exact":
            grid = half_transform_grid(x_max, c_occ_l1)  # [nP, 1, nocc]
            scale_arg = self._pad(x_scale, (pp, nao, 1), 1.0)
            grid_arg = self._pad(torch.from_numpy(grid), (pp, 1, nocc), ROUNDING_PAD)
        else:  # not read by the kernel: placeholders that already live in HBM
            scale_arg, grid_arg = self._placeholder((pp, nao, 1)), self._placeholder((pp, 1, nocc))
        out = self._launch("ao2mo_kernel", (
            pad_on_host(x_digits, (slices, pp) + tuple(x_digits.shape[2:])),
            scale_arg,
            occ_slices,
            vir_slices,
            grid_arg,
            tile_map,
            symmetric),
            nocc * (first_half_flops + 2 * nP * nao * nvir), grid=self.lnc,  # both halves, done once
            prefetched=True)  # this block's digits cross while the previous block's kernel runs
        return out[:nP].permute(2, 1, 0)  # [nocc, nvir, nP] view of [nP, nvir, nocc]

    def _orbital_slices(self, c_occ, c_vir):
        """(slices of C_occ, sum_m |C_mi| per occupied column, slices of C_vir), the slices
        [S, nao, n] in device HBM, cut on the host from the fp64 C once per pair of coefficient
        tensors (one per spin channel of a run); transform "fp32": S = 1, C rounded to fp32."""
        key = ("orbitals", id(c_occ), id(c_vir))  # one entry per spin channel
        cached = self._operand_cache.get(key)
        if cached is not None and cached[0] is c_occ and cached[1] is c_vir:
            return cached[2]
        occ = np.asarray(self.to_host(c_occ), dtype=np.float64)
        vir = np.asarray(self.to_host(c_vir), dtype=np.float64)

        def cut(c):
            if self.transform == "exact":
                return self.to_device(column_slices(c, INPUT_SLICES))
            return self.to_device(c[None])

        slices = (cut(occ), np.abs(occ).sum(axis=0), cut(vir))
        self._operand_cache[key] = (c_occ, c_vir, slices)
        return slices

    def _placeholder(self, shape):
        """An fp32 tensor of `shape` in HBM (zeros, made once) for a kernel argument the kernel
        does not read in this configuration."""
        key = ("placeholder", tuple(shape))
        if key not in self._operand_cache:
            self._operand_cache[key] = self.zeros(shape)
        return self._operand_cache[key]

    def pair_energy(self, b_i, b_j, e_i, e_j, e_vir, e_vir_j=None, t_out=None, antisymmetrize=False):
        """(E_os, E_ss) summed over all i in b_i, j in b_j ([n, nvir, naux], [n, nvir_j, naux]; b_j
        is b_i for a diagonal block I = J; e_vir_j: b_j's virtual energies when b_j is the other
        spin, which has no exchange with b_i: E_ss = 0) via pair_energy_kernel, a launch per
        block of at most PAIR_BLOCK x PAIR_BLOCK pairs (only j <= i on the diagonal), on all
        physical cores of the logical core; B stays in device HBM and only the per-pair
        partials come back, summed in fp64."""
        from ...util.errors import ComputationError

        if t_out is not None:
            raise ComputationError(f"t2: the amplitudes are not formed on {self.target} (the pair kernel never "
                                   "leaves (ia|jb) the chip); run with device cpu or cuda")
        diagonal = b_j is b_i
        exchange = int(e_vir_j is None)
        ni, nvir, naux = b_i.shape
        nj, nvir_j = b_j.shape[0], b_j.shape[1]
        b_i = self._aux_rows(b_i)
        b_j = b_i if diagonal else self._aux_rows(b_j)
        e_vir_col = e_vir.to(torch.float32).reshape(nvir, 1).contiguous()
        neg_e_vir_rows = (-(e_vir if e_vir_j is None else e_vir_j).to(torch.float32)).expand(P, nvir_j).contiguous()
        e_os = e_ex = 0.0
        blocks_i, blocks_j = pair_blocks(ni), pair_blocks(nj)
        for bi, (i0, i1) in enumerate(blocks_i):
            for j0, j1 in (blocks_j[:bi + 1] if diagonal else blocks_j):
                triangle = int(diagonal and i0 == j0)
                n_i, n_j = i1 - i0, j1 - j0
                pairs = n_i * (n_i + 1) // 2 if triangle else n_i * n_j
                partials = self._launch("pair_energy_kernel", (
                    b_i[i0:i1], b_j[j0:j1],
                    e_i[i0:i1].to(torch.float32).expand(P, n_i).contiguous(),
                    e_j[j0:j1].to(torch.float32).expand(P, n_j).contiguous(),
                    e_vir_col, neg_e_vir_rows, triangle, exchange), 2 * pairs * nvir * nvir_j * naux,
                    grid=self.lnc)
                sums = self.to_host(partials).astype(np.float64).reshape(P, n_i, n_j, 2).sum(axis=0)
                weight = np.ones((n_i, n_j))
                if triangle:  # pairs j < i stand for (i, j) and (j, i); j > i were not formed
                    weight = 2.0 * np.tril(weight, -1) + np.eye(n_i)
                weight *= 2.0 if diagonal and not triangle else 1.0  # block (I, J) for (J, I) too
                e_os += float((weight * sums[..., 0]).sum())
                e_ex += float((weight * sums[..., 1]).sum())
        return (e_os, e_os - e_ex) if exchange else (e_os, 0.0)

    # ---- the Laplace opposite-spin energy (dfmp2.mp2.laplace_energy) ----------------------
    def laplace_accumulator(self, points, naux):
        """Z(t_k) of `points` quadrature points, zero: fp32 [points, N, N] in device HBM, N = naux
        padded to a multiple of 512 (the padding stays zero). Z never leaves the device."""
        n = round_up(naux, FREE)
        return self.zeros((points, n, n))

    def laplace_z(self, z, b, e_occ, e_vir, exponents):
        """z [NK, N, N] + the rows of b [n, nvir, naux] (whitened B, on the device): Z_k += sum_ia
        B_ia^T B_ia exp(-(e_a - e_i) t_k) via laplace_z_kernel on all physical cores of the
        logical core (the lower triangle's tiles; fp32 products and sums), in launches of at most
        `tiles.laplace_rows_per_launch` rows. The rows are laid out [(i, a), naux] and padded in device
        HBM; the scales exp(-(e_a - e_i) t_k) [(i, a), NK] are made there too. -> the new z (resident)."""
        n, nvir, naux = b.shape
        rows_n, npad = round_up(n * nvir, P), z.shape[1]
        flat = torch.zeros((rows_n, npad), dtype=torch.float32)
        flat[:n * nvir, :naux] = b.reshape(n * nvir, naux).to(torch.float32)
        gaps = torch.as_tensor(np.subtract.outer(e_vir, e_occ).T.reshape(-1, 1))  # e_a - e_i, fp64
        scales = torch.zeros((rows_n, len(exponents)), dtype=torch.float32)
        scales[:n * nvir] = torch.exp(-gaps * torch.as_tensor(exponents, dtype=torch.float64)[None, :]).float()
        resident = self.is_resident(b)
        flat = self._device_copy(flat) if resident else flat
        scales = self._device_copy(scales) if resident else scales
        step = P * laplace_rows_per_launch(rows_n // P, npad, len(exponents))  # (the compiler's instruction limit)
        for r0 in range(0, rows_n, step):
            useful = max(0, min(r0 + step, n * nvir) - r0)
            z = self._launch("laplace_z_kernel", (z, flat[r0:r0 + step], scales[r0:r0 + step]),
                             len(exponents) * useful * naux * (naux + 1), grid=self.lnc)
        return z

    def laplace_energy(self, z_a, z_b):
        """sum_PQ Z^a_k[P, Q] Z^b_k[P, Q] per point k (numpy fp64 [NK]) via laplace_energy_kernel:
        Z stays in HBM, only the per-partition partials come back, added here in fp64."""
        partials = self._launch("laplace_energy_kernel", (z_a, z_b, self._laplace_masks()), 0, grid=self.lnc)
        sums = self.to_host(partials).astype(np.float64)
        return sums.reshape(P, -1, z_a.shape[0]).sum(axis=(0, 1))

    def _laplace_masks(self):
        """laplace_energy_kernel's diagonal-tile weights [128, 4 * 512]: for d = 0..3, 2 where
        d 128 + p > j, 1 where equal, 0 above (made once, uploaded once)."""
        key = ("laplace_masks",)
        if key not in self._operand_cache:
            p, j = np.arange(P)[:, None], np.arange(FREE)[None, :]
            masks = np.concatenate([np.where(d * P + p > j, 2.0, np.where(d * P + p == j, 1.0, 0.0))
                                    for d in range(FREE // P)], axis=1)
            self._operand_cache[key] = self.to_device(masks)
        return self._operand_cache[key]

    def gamma_block(self, b_i, b_all, e_i, e_all, e_vir, scaling=(1.0, 1.0), spin_case="closed", e_vir_all=None):
        """The three-index two-particle density of the pairs (i, j), i in b_i, all j in b_all, via
        gamma_kernel (the amplitudes stay on chip), whitened: kernels.torch.backend.density_block's G of its
        k block, here the block of j (G_jb^Q = sum_ia B_ia^Q X_ij^ab):
        X = c_w t - c_u t^T = g Y (spin_cases.density_weights): (c_w, c_u) = (4 (c_os + c_ss), 4 c_ss) closed,
        (2 c_ss, 2 c_ss) same spin, (2 c_os, 0) opposite spin (e_vir_all: j's virtual energies). One launch per
        block of j (NkiBackend.gamma_rows); the partial G comes back and is kept in fp64. Returns [nall, nvir_all, nkept] (host)."""
        from ...util.errors import ComputationError

        _, (y_w, y_u), _, g = density_weights(scaling, spin_case)
        c_w, c_u = g * y_w, g * y_u  # X = g Y: 4 T for closed-shell MP2
        ni, nvir, naux = b_i.shape
        nall, nvir_all = b_all.shape[0], b_all.shape[1]
        rows = self.gamma_rows(nvir, nvir_all, naux)
        if rows < 1:
            raise ComputationError(f"the NKI gamma kernel holds one pair's amplitudes for 128 of j's virtuals in SBUF: "
                                   f"nvir {nvir} does not fit on {self.target}")
        b_i_rows, b_all_rows = self._aux_rows(b_i), self._aux_rows(b_all)
        b_i_cols = b_i.to(torch.float32).contiguous()
        e_vir_col = e_vir.to(torch.float32).reshape(nvir, 1).contiguous()
        e_vir_j = e_vir if e_vir_all is None else e_vir_all
        neg_e_vir_j_rows = (-e_vir_j.to(torch.float32)).expand(P, nvir_all).contiguous()
        e_i_rows = e_i.to(torch.float32).expand(P, ni).contiguous()
        out = np.empty((nall, nvir_all, naux))
        for j0 in range(0, nall, rows):
            j1 = min(nall, j0 + rows)
            useful = (2 if c_u == 0.0 else 3) * 2 * ni * (j1 - j0) * nvir * nvir_all * naux
            part = self._launch("gamma_kernel", (
                b_i_rows, b_i_cols, b_all_rows[j0:j1], e_i_rows,
                e_all[j0:j1].to(torch.float32).expand(P, j1 - j0).contiguous(),
                e_vir_col, neg_e_vir_j_rows, c_w, c_u), useful)
            out[j0:j1] = self.to_host(part).astype(np.float64)
        return torch.from_numpy(out)

    @staticmethod
    def gamma_rows(nvir, nvir_j, naux):
        """Occupied orbitals j per gamma launch (at most 32): gamma_kernel streams B and keeps one
        pair's X and one j's G on chip whatever the count, so the cap only bounds one launch's
        unrolled program; it refuses (0) only where one block of 128 of X[a, b] for every a tile
        does not fit its share of SBUF (kernels.nki.kernels.gamma_blocking: nvir above ~12,000)."""
        return 32 if -(-nvir // P) * P * 4 <= GAMMA_X_BYTES else 0

    def density_block(self, b_occ, b_k, e_occ, e_k, e_vir, scaling=(1.0, 1.0), spin_case="closed", e_vir_k=None,
                      with_gamma=False):
        """(P_oo, P_vv) of the pairs (i, k) from density_kernel (_density_kernel_block), and
        with_gamma the k block's share of the whitened three-index density G [nk, nvir_k, nkept]
        from gamma_kernel (gamma_block of all i against the k block), else None. The two kernels
        form the amplitudes each (the torch backend forms them once). b_occ: B of all i, or one
        row block of it in a list (out-of-core B in several blocks is refused: ComputationError)."""
        from ...util.errors import ComputationError

        if not torch.is_tensor(b_occ):
            chunks = list(b_occ)
            if len(chunks) != 1:
                raise ComputationError(f"out-of-core MP2 densities (B read from disk in slabs) are not implemented on "
                                       f"{self.target}: give the run the memory to hold B, or use {option('device', 'cpu')} or cuda")
            b_occ = chunks[0]
        p_oo, p_vv = self._density_kernel_block(b_occ, b_k, e_occ, e_k, e_vir, scaling, spin_case, e_vir_k)
        if not with_gamma:
            return p_oo, p_vv, None
        return p_oo, p_vv, self.gamma_block(b_occ, b_k, e_occ, e_k, e_vir, scaling, spin_case, e_vir_k)

    def _density_kernel_block(self, b_occ, b_k, e_occ, e_k, e_vir, scaling, spin_case, e_vir_k=None):
        """Unrelaxed MP2 density of the pairs (i, k), all i in b_occ, k in b_k (e_vir_k: k's
        virtual energies when k is the other spin), via density_kernel (the amplitudes stay on
        chip; spin_cases.density_weights): launches over occupied blocks I >= J of at most `density_rows`
        orbitals (P_oo is symmetric), P_vv from the diagonal ones; each launch forms the
        amplitudes of its I and J rows again (the price of keeping t2 on chip: about
        nocc / (2 rows) times the energy's Tensor Engine work). Partials come back and are summed
        in fp64: returns (P_oo [nocc, nocc], P_vv [nvir, nvir]) as host tensors (torch backend's
        formulas)."""
        from ...util.errors import ComputationError

        (x_w, x_u), (y_w, y_u), weight, _ = density_weights(scaling, spin_case)
        nocc, nvir, naux = b_occ.shape
        nk, nvir_k = b_k.shape[0], b_k.shape[1]
        rows = self.density_rows(nvir, naux)
        if rows < 1:
            raise ComputationError(f"the NKI density kernel holds one row's amplitudes per block of k's virtuals "
                                   f"(nvir fp32 per partition) in SBUF: nvir {nvir} with naux {naux} does not fit "
                                   f"on {self.target}")
        b_all, b_kk = self._aux_rows(b_occ), self._aux_rows(b_k)
        e_vir_k_col = (e_vir if e_vir_k is None else e_vir_k).to(torch.float32).reshape(nvir_k, 1).contiguous()
        neg_e_vir_rows = (-e_vir.to(torch.float32)).expand(P, nvir).contiguous()
        e_k_rows = e_k.to(torch.float32).expand(P, nk).contiguous()
        oo = np.zeros((nocc, nocc))
        vv = np.zeros((nvir, nvir))
        blocks = [(i0, min(i0 + rows, nocc)) for i0 in range(0, nocc, rows)]
        for bi, (i0, i1) in enumerate(blocks):
            for j0, j1 in blocks[:bi + 1]:
                diagonal = int(i0 == j0)
                useful = 2 * ((i1 - i0) + (0 if diagonal else j1 - j0)) * nk * nvir * nvir_k * naux \
                    + diagonal * 2 * (i1 - i0) * nk * nvir * nvir * nvir_k
                part_oo, part_vv = self._launch("density_kernel", (
                    b_all[i0:i1], b_all[j0:j1], b_kk,
                    e_occ[i0:i1].to(torch.float32).expand(P, i1 - i0).contiguous(),
                    e_occ[j0:j1].to(torch.float32).expand(P, j1 - j0).contiguous(),
                    e_k_rows, e_vir_k_col, neg_e_vir_rows, diagonal, x_w, x_u, y_w, y_u), useful)
                block = self.to_host(part_oo).astype(np.float64).sum(axis=0).reshape(i1 - i0, j1 - j0)
                oo[i0:i1, j0:j1] += block
                if not diagonal:
                    oo[j0:j1, i0:i1] += block.T
                else:
                    vv += self.to_host(part_vv).astype(np.float64)
        return torch.from_numpy(-weight * oo), torch.from_numpy(weight * vv)

    def density_rows(self, nvir, naux):
        """Occupied orbitals per side of one density launch (at most 32): the amplitudes of one
        block of 128 of k's virtuals for every row of both sides (nvir fp32 per partition each,
        whatever k's virtual count), their oo partials, beside P_vv's partial sums when they
        stay in SBUF (density_kernel's VV_RESIDENT_BYTES), B_k's and B_i's columns of the
        block, the streamed B tiles and the working tiles."""
        vv = -(-nvir // P) * nvir * 4
        vv = vv if vv <= VV_RESIDENT_BYTES else 0
        fixed = vv + 2 * -(-naux // P) * P * 4 + 2 * nvir * 4 + 32 * 1024
        room = TARGETS[self.target].sbuf_usable_bytes_per_partition - fixed
        return max(0, min(32, room // (2 * nvir * 4 + 2 * 32 * 4)))

    def _aux_rows(self, b):
        """B [n, nvir, naux] as the kernels' [n, naux, nvir] (auxiliary index on the rows): a view
        when the storage already has that layout, else one transposing copy in device HBM."""
        rows = b.permute(0, 2, 1)
        if rows.is_contiguous() and rows.dtype == torch.float32:
            return rows
        copy = rows.to(torch.float32).contiguous()
        return self._device_copy(copy) if self.is_resident(b) else copy

    # ---- the SCF's builds (FittedBuildsBackend; the store and its formulas in fitted.py) ----
    def fitted_store(self, rows, nao, kinds, free_bytes):
        """B for the SCF's Coulomb/exchange builds, uploaded once (kernels.nki.fitted.NkiFittedStore)."""
        from .fitted import NkiFittedStore

        return NkiFittedStore(self, rows, nao, kinds, free_bytes)

    def upload(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor (fp32 or int8 digits) copied into device HBM as it is (one transfer)."""
        self.ledger.transfer(tensor.nbytes, 0)
        return self._resident(tensor.to(self.device))

    def fitted_jk(self, square32, left, right, weights, same, with_k):
        """(J, K) [2, nao, nao] host fp64 of D = L diag(w) R^T (L, R [nao, r <= tiles.jk_columns] host fp64,
        same: R is L) from the resident fp32 B [naux, nao, nao]: one fitted_jk_kernel launch."""
        naux, nao, _ = square32.shape
        r = left.shape[1]
        f32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
        flops = naux * nao * nao * 2 * r * ((1 if same else 2) + (1 if with_k else 0)) + 4 * naux * nao * nao
        out = self._launch("fitted_jk_kernel", (square32, f32(left), f32(right), f32(left.T),
                                                f32(np.reshape(weights, (r, 1))), int(same), int(with_k)), flops)
        return self.to_host(out).astype(np.float64)

    def exact_product(self, x, y):
        """sum_k X[b, k, m] Y[b, k, n] -> host fp64 [NB, MX, NY] (hi + lo added on the host) via
        exact_matmul_kernel: x [S, NBX, K, MX], y [S, NBY, K, NY], int8 digits or fp32 slices
        (host numpy arrays or resident tensors)."""
        def arg(a):
            if isinstance(a, torch.Tensor):
                return a
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int8 if a.dtype == np.int8 else np.float32))
        x, y = arg(x), arg(y)
        slices, nbx, k, mx = x.shape
        nb, ny = max(nbx, y.shape[1]), y.shape[3]
        out = self.to_host(self._launch("exact_matmul_kernel", (x, y),
                                        2 * nb * k * mx * ny * slices * (slices + 1) // 2))
        return out[0].astype(np.float64) + out[1].astype(np.float64)

    def exact_fp64_product(self, a, b):
        """C = A^T B [m, n] host fp64 from host fp64 a [k, m], b [k, n] via exact_product: A as
        INPUT_SLICES int8 digits with a power of two per column, B as fp32 slices (ozaki)."""
        digits, scale = column_digits(a, INPUT_SLICES)  # scale [m, 1]: 2^e_m
        return self.exact_product(digits[:, None], column_slices(b, INPUT_SLICES)[:, None])[0] * scale

    def copy_into(self, dst, src) -> None:
        """dst[...] = src between device tensors (MODEL: a device-side copy), or from the host."""
        dst.copy_(src)
        if self.is_resident(src):
            self.ledger.device_copy(src.nbytes)
        else:
            self.ledger.transfer(src.nbytes, 0)

    def ovL_layout(self, shape):
        """Device storage for the [nocc, nvir, naux] tensor, laid out [nocc, naux, nvir] (the pair
        kernel's rows) and returned as a [nocc, nvir, naux] view."""
        nocc, nvir, naux = shape
        return self.zeros((nocc, naux, nvir)).permute(0, 2, 1)

    def prepare(self, plan) -> None:
        """The run's largest auxiliary block: every ao2mo call is padded to it, since
        shell-aligned blocks differ in size and a later one may be the largest."""
        self._aux_block = plan.aux_block

    def plan_hints(self, nvir: int, naux: int) -> PlanHints:
        """(mn|P) blocks of ~256 MB (each transform launch costs ~1 ms: fewer, larger ones); all
        occupied orbitals in one pair block (no limit: the pair kernel streams B over the
        auxiliary index and cuts any block into launches of PAIR_BLOCK orbitals, `pair_blocks`); no pair
        scratch beyond B (V never leaves the chip)."""
        return PlanHints(aux_block_bytes=256 * 2**20, pair_rows=1 << 40, occ_block_limit=None,
                         pair_scratch_bytes=lambda nb, nv: 0)
