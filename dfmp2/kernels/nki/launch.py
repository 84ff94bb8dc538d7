"""Launching the NKI kernels of kernels.py: emulated, model-only, or on a Trainium host.

simulate=False: the module is imported as is (the real `nki`) and a launch is the `nki.jit`
call. simulate=True: the same source is loaded with dfmp2's emulator standing in for the `nki`
modules and run under the target's limits and the chosen nki release's rules; every launch's
trace goes to the cost ledger. model_only (with simulate): each specialization (kernel,
argument shapes, grid) is emulated once; later launches with the same shapes reuse its trace (a
kernel's trace depends only on its shapes) and compute their outputs by host reference math
(`REFERENCE`, same inputs and outputs as the kernels).

Also the shapes of launches: the specializations a run compiled, bucketing of padded shapes
(`KernelLauncher.bucket`), tile rounding and the pair kernel's occupied blocks.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import torch

import nki_emulator as emulator

from ...util.errors import ComputationError
from .ledger import CostLedger
from ..spin_cases import combine_amplitudes, pair_denominators
from .support import checks_lnc, release_name
from .sparse import TileMap, unpack_symmetric, unpack_tiles
from .ozaki import digits_value
from .tiles import FREE, P

PAIR_BLOCK = 32  # occupied orbitals per side of one pair-energy launch (partials: 8 KiB per partition)

_KERNEL_FILE = os.path.join(os.path.dirname(__file__), "kernels.py")


def load_kernels(simulate: bool):
    """The kernel module, bound to the emulator (simulate) or to the real Neuron SDK."""
    if not simulate:
        from . import kernels  # imports the real `nki`; the caller checked it is installed

        return kernels
    return load_kernel_file(_KERNEL_FILE, "dfmp2.kernels.nki._kernels_emulated")


def load_kernel_file(path: str, name: str, simulate: bool = True):
    """The NKI kernel module at `path` loaded as `name`: with dfmp2's emulator standing in for the
    `nki` modules (simulate; restored afterwards), else with the real Neuron SDK."""
    def load():
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    if not simulate:
        return load()
    standing_in = ("nki", "nki.language", "nki.isa")
    saved = {module_name: sys.modules.get(module_name) for module_name in standing_in}
    sys.modules.update({"nki": emulator, "nki.language": emulator.language, "nki.isa": emulator.isa})
    try:
        return load()
    finally:
        for module_name, module_before in saved.items():
            if module_before is None:
                sys.modules.pop(module_name, None)
            else:
                sys.modules[module_name] = module_before


# ---- shapes of launches -------------------------------------------------------------------------
def pair_blocks(n: int) -> list:
    """[(start, stop)] cutting n occupied orbitals into the fewest blocks of <= PAIR_BLOCK, as
    even as possible (at most two block sizes, so at most four pair-kernel specializations)."""
    count = -(-n // PAIR_BLOCK)
    size = -(-n // count)
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple` (at least one multiple)."""
    return max(multiple, -(-n // multiple) * multiple)


def round_up_free(n: int) -> int:
    """A moving free size: a multiple of 128 up to 512, of 512 (one PSUM bank) above."""
    return round_up(n, P if n <= FREE else FREE)


def pad_on_host(tensor: torch.Tensor, shape) -> torch.Tensor:
    """A host tensor (e.g. (mn|P) digits, int8, or values, fp32) zero-padded to `shape` in its
    own dtype (on the host, where it was made); itself when it already has that shape."""
    if tuple(tensor.shape) == tuple(shape):
        return tensor
    out = torch.zeros(shape, dtype=tensor.dtype)
    out[tuple(slice(0, n) for n in tensor.shape)] = tensor
    return out


def _kernel_array(tensor: torch.Tensor) -> np.ndarray:
    """A kernel argument as numpy: int8 and int32 keep their dtype, everything else fp32."""
    array = tensor.detach().cpu().numpy()
    return np.ascontiguousarray(array, dtype=array.dtype if array.dtype in (np.int8, np.int32) else np.float32)


class KernelLauncher:
    """Runs the kernels for `target` ('trn1', 'trn2' or 'trn3'), emulated under nki `nki_api` rules at
    neuronx-cc's LNC degree `lnc` (simulate) or on the host's Neuron SDK, and keeps the run's
    specializations; costs go to `ledger`."""

    def __init__(self, target: str, simulate: bool, model_only: bool, nki_api: str | None,
                 ledger: CostLedger, lnc: int = 1):
        self.target = target
        self.lnc = lnc  # neuronx-cc's LNC degree for the run (the emulator checks launches against it)
        self.simulate = simulate
        self.model_only = model_only
        self.nki_api = nki_api
        self.ledger = ledger
        self.kernels = load_kernels(simulate)
        self.added = {}  # kernel name -> (kernel, host reference of (grid, *arguments)): `add_kernels`
        self._modules = {}  # module name -> the kernel module `add_kernels` loaded
        self.specializations = {}  # kernel -> set of padded argument shapes
        self._largest = {}  # kernel -> largest padded shapes so far (for bucketing)
        self._trace_cache = {}  # (kernel, shapes, grid) -> the trace of its first emulated launch

    def add_kernels(self, path: str, name: str, references: dict):
        """The kernels of another NKI source file (a layer above this one: rng's generator) as this
        launcher's own, loaded once (emulated or real): references maps each kernel's name to its
        host function of (grid, *arguments), which computes a model-only repeat. Returns the module
        (loaded on the first call with this name, the same one afterwards)."""
        if name not in self._modules:
            module = self._modules[name] = load_kernel_file(path, name, self.simulate)
            for kernel_name, reference in references.items():
                self.added[kernel_name] = (getattr(module, kernel_name), reference)
        return self._modules[name]

    def bucket(self, kernel_name, shapes):
        """Reuse the largest shapes this kernel ran with when the new ones fit inside them (else
        the elementwise maximum of both becomes the kernel's largest)."""
        largest = self._largest.get(kernel_name)
        if largest is not None and all(
                len(s) == len(b) and all(x <= y for x, y in zip(s, b)) for s, b in zip(shapes, largest)):
            return largest
        if largest is not None:
            shapes = tuple(tuple(max(x, y) for x, y in zip(s, b)) for s, b in zip(shapes, largest))
        self._largest[kernel_name] = shapes
        return shapes

    def launch(self, kernel_name, arrays, useful_flops, host_bytes, grid=1, prefetched=False):
        """Run one kernel on `arrays` (fp32 or int8 tensors; ints are compile-time constants) on
        `grid` physical cores; count the call and its specialization, and record its trace with
        `host_bytes` of arguments crossing from the host (prefetched: during the previous
        kernel, CostLedger.record). Returns the kernel's output(s): numpy
        arrays or tensors from the emulator or the reference math (simulate), the real kernel's
        tensors on a Trainium host."""
        if checks_lnc(self.nki_api) and grid != self.lnc:  # before the emulator's L14 or neuronx-cc's EVRF066
            raise ComputationError(
                f"{kernel_name} launched on {grid} core(s) in a run compiled at LNC={self.lnc}: {release_name(self.nki_api)} "
                f"wants every kernel at one LNC degree (EVRF066), and the run's kernels were declared wrongly "
                f"(kernels.get_backend's `kernels`). Nothing of this launch ran.")
        shapes = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in arrays)
        self.ledger.count_launch(kernel_name, useful_flops)
        self.specializations.setdefault(kernel_name, set()).add(shapes)
        kernel, reference = self.added.get(kernel_name, (getattr(self.kernels, kernel_name, None), None))
        key = (kernel_name, shapes, grid)
        if self.simulate and self.model_only and key in self._trace_cache:
            self.ledger.record(self._trace_cache[key], host_bytes, kernel_name, prefetched)
            if reference is not None:
                return reference(grid, *arrays)
            return REFERENCE[kernel_name](*(
                a.to(torch.float32) if isinstance(a, torch.Tensor) and a.dtype != torch.int8 else a for a in arrays))
        if self.simulate:
            with emulator.target(self.target, self.nki_api, lnc=self.lnc):
                launcher = kernel[grid] if grid > 1 else kernel
                out = launcher(*(_kernel_array(a) if isinstance(a, torch.Tensor) else a for a in arrays))
            self.ledger.record(kernel.last_trace, host_bytes, kernel_name, prefetched)
            self._trace_cache[key] = kernel.last_trace
            return out
        return (kernel[grid] if grid > 1 else kernel)(*arrays)


# ---- host reference math for model-only runs (same inputs and outputs as the kernels) ------------

def _ref_pair_energy(b_i, b_j, e_i_rows, e_j_rows, e_vir_col, neg_e_vir_rows, triangle, exchange):
    """Per-pair (os, exchange) sums in row 0 of the kernel's partials layout [128, NI, NJ, 2]."""
    iajb = torch.einsum("iqa,jqb->ijab", b_i, b_j)
    denom = pair_denominators(e_i_rows[0], e_j_rows[0], e_vir_col[:, 0], -neg_e_vir_rows[0]).permute(0, 2, 1, 3)
    t = (iajb / denom).float()
    ex = (t * iajb.transpose(2, 3)).sum(dim=(2, 3)) if exchange else torch.zeros(iajb.shape[:2])
    sums = torch.stack([(t * iajb).sum(dim=(2, 3)), ex], dim=-1)
    if triangle:
        sums *= torch.tril(torch.ones(sums.shape[:2]))[:, :, None]
    out = torch.zeros((P, sums.numel()), dtype=torch.float32)
    out[0] = sums.reshape(-1)
    return out


def _ref_density(b_i, b_j, b_k, e_i_rows, e_j_rows, e_k_rows, e_vir_k_col, neg_e_vir_rows, with_vv,
                 x_w, x_u, y_w, y_u):
    """density_kernel's outputs (oo partials in row 0, vv) by host math (model-only runs)."""
    neg_ea = neg_e_vir_rows[0].double()

    def amplitudes(b, e, c_w, c_u):
        v = torch.einsum("iqa,kqc->iakc", b.double(), b_k.double())
        d = pair_denominators(e, e_k_rows[0].double(), -neg_ea, e_vir_k_col[:, 0].double())
        return combine_amplitudes(v, v.permute(0, 3, 2, 1), (c_w, c_u)) / d

    x_i = amplitudes(b_i, e_i_rows[0].double(), x_w, x_u)
    y_j = amplitudes(b_j, e_j_rows[0].double(), y_w, y_u)
    oo = torch.zeros((P, b_i.shape[0] * b_j.shape[0]), dtype=torch.float32)
    oo[0] = torch.einsum("iakc,jakc->ij", x_i, y_j).reshape(-1).float()
    nvir = neg_ea.numel()
    vv = torch.einsum("iakc,ibkc->ab", x_i, y_j).float() if with_vv else torch.zeros((nvir, nvir), dtype=torch.float32)
    return oo, vv


def _ref_gamma(b_i, b_i_cols, b_j, e_i_rows, e_j_rows, e_vir_col, neg_e_vir_j_rows, c_w, c_u):
    """gamma_kernel's G [NJ, NVIRJ, NAUX] by fp64 host math (model-only runs)."""
    bi, bj = b_i.double(), b_j.double()
    w = torch.einsum("iqa,jqb->iajb", bi, bj)
    d = pair_denominators(e_i_rows[0].double(), e_j_rows[0].double(), e_vir_col[:, 0].double(),
                          -neg_e_vir_j_rows[0].double())
    x = combine_amplitudes(w, torch.einsum("iqb,jqa->iajb", bi, bj), (c_w, c_u))
    return torch.einsum("iajb,iqa->jbq", x / d, bi).float()


def _ref_fitted_jk(b, left, right, left_t, w_col, same, with_k):
    """fitted_jk_kernel's [J, K] by fp32 host math (model-only runs)."""
    h = torch.matmul(b, right)  # [NP, NAO, R]
    g = h if same else torch.matmul(b, left)
    rho = torch.einsum("mi,i,pmi->p", left, w_col[:, 0], h)
    j = torch.einsum("p,pmn->mn", rho, b)
    k = torch.einsum("pmi,i,pni->mn", g, w_col[:, 0], h) if with_k else torch.zeros_like(j)
    return torch.stack([j, k])


def _slices_value(a):
    """fp64 value of exact_matmul_kernel's operand [S, NB, K, M]: int8 digits d_s 2^(-7 (s + 1)), or
    fp32 slices; one slice at a time (an fp64 copy of all S slices of B would be 40 bytes an element)."""
    value = torch.zeros(a.shape[1:], dtype=torch.float64)
    for s in range(a.shape[0]):
        value += a[s].double() * (2.0 ** (-7 * (s + 1)) if a.dtype == torch.int8 else 1.0)
    return value


def _ref_exact_matmul(x, y, columns=1 << 16):
    """exact_matmul_kernel's [hi, lo] from fp64 host math (model-only runs), Y in column chunks."""
    x_value = _slices_value(x).transpose(1, 2)
    nb = max(x.shape[1], y.shape[1])
    out = torch.empty((2, nb, x.shape[3], y.shape[3]), dtype=torch.float32)
    for c0 in range(0, y.shape[3], columns):
        value = torch.matmul(x_value, _slices_value(y[..., c0:c0 + columns]))
        hi = value.float()
        out[0, :, :, c0:c0 + columns] = hi
        out[1, :, :, c0:c0 + columns] = (value - hi.double()).float()
    return out


def _ref_ao2mo(digits, scale, cos, cvs, grid, tile_map, symmetric):
    """ao2mo_kernel's output from fp64 host math (model-only runs); block-sparse digits unpacked
    (symmetric: the lower tiles mirrored)."""
    if tile_map:
        tiles = TileMap.from_bits(tile_map, cos.shape[1])
        digits = unpack_symmetric(digits, tiles.lower()) if symmetric else unpack_tiles(digits, tiles)
    return torch.einsum("pmn,mi,na->pai", digits_value(digits, scale), cos.double().sum(0), cvs.double().sum(0)).float()


def _ref_laplace_z(z, rows, scales):
    """laplace_z_kernel's output by fp32 host math (model-only runs): every tile updated."""
    return z + torch.einsum("rp,rk,rq->kpq", rows, scales, rows)


def _ref_laplace_energy(z_a, z_b, masks):
    """laplace_energy_kernel's partials (model-only runs): each point's sum_PQ Z^a Z^b in row 0
    (the kernel's lower triangle, weighted, is the full sum of a symmetric Z)."""
    z_a, z_b = torch.tril(z_a), torch.tril(z_b)
    lower = (z_a * z_b).sum(dim=(1, 2)) * 2 - (torch.diagonal(z_a, dim1=1, dim2=2) * torch.diagonal(z_b, dim1=1, dim2=2)).sum(1)
    out = torch.zeros((P, z_a.shape[0]), dtype=torch.float32)
    out[0] = lower
    return out


REFERENCE = {  # kernel name -> host function of the kernel's arguments, returning its outputs
    "gemm_kernel": lambda a_t, b: a_t.T @ b,
    "syrk_kernel": lambda c, p_t: c - p_t.T @ p_t,
    "trsm_kernel": lambda x_t, l_t, linv_t: torch.linalg.solve_triangular(l_t.T, x_t, upper=False),
    "ao2mo_kernel": _ref_ao2mo,
    "pair_energy_kernel": _ref_pair_energy,
    "density_kernel": _ref_density,
    "gamma_kernel": _ref_gamma,
    "fitted_jk_kernel": _ref_fitted_jk,
    "exact_matmul_kernel": _ref_exact_matmul,
    "laplace_z_kernel": _ref_laplace_z,
    "laplace_energy_kernel": _ref_laplace_energy,
}
