"""What every backend provides: the one protocol the pipeline, linalg and storage call.

Backends: `TorchBackend` (cpu, cuda) and `NkiBackend` (trn1, trn2, or their emulator). Arrays are
the backend's tensors ("device" tensors); host arrays are numpy. Shapes in the docstrings of each
backend's methods; energies in Hartree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable


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


@runtime_checkable
class Backend(Protocol):
    """The operations of the four steps (and the density) on one device, plus data movement and
    what ran (`calls`: kernel name -> count, recorded in every result)."""

    name: str  # "torch" or "nki"
    device_name: str  # cpu, cuda, trn1, trn2
    precision: str  # fp64 or fp32 (GEMMs)
    transform: str  # AO->MO arithmetic: fp64 (torch), exact or fp32 (NKI)
    itemsize: int  # bytes per element of the stored (ia|P) / B
    has_fp64: bool
    forms_amplitudes: bool  # pair_energy can fill t_out (t2; False: the pair kernel keeps (ia|jb) on chip)

    # data movement
    def to_device(self, array, fp64=False): ...
    def to_host(self, tensor): ...
    def zeros(self, shape): ...
    def synchronize(self) -> None: ...
    def three_center_layout(self, shape): ...
    def copy_into(self, dst, src) -> None: ...

    # planning
    def memory_limit_bytes(self) -> int | None: ...
    def plan_hints(self, nvir: int, naux: int) -> PlanHints: ...
    def prepare(self, plan) -> None: ...
    def describe(self) -> str: ...

    # the steps
    def gemm(self, a, b): ...
    def syrk(self, c, panel): ...
    def solve_lower_transposed(self, lower, x): ...
    def ao2mo(self, ao_block, c_occ, c_vir): ...
    def pair_energy(self, b_i, b_j, e_i, e_j, e_vir, e_vir_j=None, t_out=None, antisymmetrize=False): ...
    def density_block(self, b_occ, b_k, e_occ, e_k, e_vir, scaling=(1.0, 1.0)): ...
