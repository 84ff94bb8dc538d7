"""The settings of a run: one object from the CLI or the plugin down to the pipeline.

    settings = Settings(basis="cc-pvtz", frozen_core=True, device="trn1", simulate=True)
    run_xyz("water.xyz", settings)                  # or run_xyz("water.xyz", basis="cc-pvtz", ...)
    backend = backend_for(settings)                 # dfmp2.kernels: the backend they ask for

Groups: the chemistry (molecule set-up and SCF: used by `run_xyz` only), the correlation step,
the hardware (which backend), the resources (memory budget in MB, scratch and checkpoint
directories). What a run uses beside them (the distributed team, a progress callback, the
timer) is its context, `dfmp2.run.context.RunContext`, built once at the entry points.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from numbers import Integral

import numpy as np

from ..util.errors import InputError, option

SCF_MAX_CYCLE = 100
IF_ROOM = "if_room"  # with_t2: keep t2 when the memory budget holds it (the plugin's default)
METHODS = ("mp2", "sos-mp2")  # canonical DF-MP2 (and SCS from its parts); SOS-MP2, E = c_os E_os
SOS_C_OS = 1.3  # SOS-MP2's opposite-spin scaling (Jung, Lochan, Dutoi, Head-Gordon 2004)
LAPLACE_MOST_POINTS = 40  # the most Laplace quadrature points a run takes (--laplace N)


# settings whose values are keywords: any case is accepted (`Settings.__post_init__`)
KEYWORDS = ("device", "precision", "reference", "scf", "scf_backend", "scf_precision", "transform", "screening",
            "method", "laplace")


@dataclass(frozen=True)
class Settings:
    """What a DF-MP2 run is asked to do (see the module docstring)."""

    # chemistry: molecule and SCF (run_xyz)
    basis: str = "cc-pvdz"  # a name, or per element: "O:aug-cc-pvtz,H:cc-pvdz" (chem.basis.basis_by_element)
    ecp: str = "auto"  # auto: the ECPs the basis carries (def2: Rb-Rn); none: all-electron; or a name
    auxbasis: str | None = None  # MP2 auxiliary basis, a name or per element (None: the MP2-fit set for `basis`)
    jk_auxbasis: str | None = None  # the SCF's JK-fit set, a name or per element (None: PySCF's JK-fit choice)
    cartesian: bool = False  # Cartesian d, f, ... functions (6d, 10f) instead of spherical (5d, 7f)
    charge: int = 0
    spin: int = 0  # 2S
    reference: str | None = None  # rhf, uhf, rohf (None: rhf for spin 0, else uhf)
    scf: str = "df"  # df (JK-fit) or exact
    scf_max_cycle: int = SCF_MAX_CYCLE
    scf_backend: str | None = None  # device: J/K on the run's backend (dfmp2.chem.jk); pyscf: PySCF's own
    # (None: device for scf="df" on cpu/cuda, pyscf for scf="exact" and on trn1/trn2/trn3)
    scf_precision: str | None = None  # the device builds': mixed (default on cpu/cuda) or fp64 (dfmp2.chem.jk)
    screening: object = "auto"  # off, auto, or a threshold: screened block-sparse (mn|P) for the SCF's
    # builds and the MP2 transform (dfmp2.sparse; auto: where the kept blocks make it pay)
    frozen_core: bool = False  # freeze PySCF's chemical core (run_xyz)
    xc: str | None = None  # a double hybrid's name, or a PySCF xc string with c_os, c_ss
    c_os: float | None = None
    c_ss: float | None = None
    # the correlation step
    method: str = "mp2"  # mp2 (canonical; SCS-MP2 from its parts) or sos-mp2: E = E_HF + c_os E_os (c_os: 1.3)
    laplace: object = None  # off, auto, or a number of points: E_os through the Laplace transform of 1/Delta
    # (dfmp2.mp2.laplace_energy); None: auto where no same-spin term is asked for (sos-mp2), else off
    frozen: object = None  # None, an int, a list of indices, or [[alpha...], [beta...]]
    allow_non_aufbau: bool = False
    with_rdm1: bool = False  # also the unrelaxed MP2 density (RHF or UHF)
    gradient: bool = False  # also the analytic nuclear gradient (dfmp2.mp2.gradient; RHF and UHF)
    properties: tuple = ()  # from the relaxed density (dfmp2.mp2.response.PROPERTIES): ("dipole",)
    with_gamma: bool = False  # also the three-index two-particle density (relaxed densities; with with_rdm1)
    rdm1_scaling: tuple = (1.0, 1.0)  # (c_os, c_ss): the density of c_os E_os + c_ss E_ss (SCS-MP2)
    with_t2: object = False  # True, False, or IF_ROOM: kept when the memory budget allows it
    include_singles: bool = True  # ROHF-MBPT(2): the singles in e_corr (False: e_corr_singles 0, as PySCF)
    # hardware
    device: str = "cpu"
    precision: str | None = None  # None: fp64, or fp32 on trn1/trn2/trn3
    simulate: bool = False  # trn1/trn2/trn3: NKI kernels on the emulator
    model_only: bool = False  # with simulate: emulate each kernel shape once (bench)
    nki_api: str | None = None
    transform: str | None = None  # trn1/trn2/trn3: exact (default) or fp32
    warm_kernels: bool = False  # take the kernels fastest once loaded whatever their one-time load cost
    # (dfmp2 bench, which times warm passes); else only where the run amortises it (a GPU's fused epilogue)
    # resources
    max_memory: float | None = None  # MB (10^6 bytes) for the whole process; None: budget.memory_budget's
    scratch: str | None = None  # directory of the out-of-core scratch file
    force_outcore: bool = False  # keep (ia|P) on disk whatever the budget (PySCF's force_outcore)
    checkpoint: str | None = None  # directory that keeps B and the pair-loop progress across runs
    checkpoint_allow_other_files: bool = False  # a non-empty checkpoint directory without a manifest is
    # refused unless this is set (dfmp2 then writes beside the files there, never over them)

    def __post_init__(self):
        """The one check of each setting's kind: keywords (device, precision, reference, ...) in
        any case, lower-cased here; frozen's structure (`frozen_per_spin`); max_memory a
        number of MB (`budget.check_max_memory`); a switch (a bool field) True or False. What a value may be beyond its kind (a device
        this machine has, a frozen index inside the orbitals) is checked where it is known."""
        from .budget import check_max_memory
        from .settings import frozen_per_spin

        for name in KEYWORDS:
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, value.strip().lower())
        if isinstance(self.properties, str):
            object.__setattr__(self, "properties", (self.properties,))
        object.__setattr__(self, "properties", tuple(str(p).strip().lower() for p in self.properties))
        for field in fields(self):  # a switch is True or False: frozen_core="no" must not freeze the core
            value = getattr(self, field.name)
            if field.type == "bool" and not isinstance(value, (bool, np.bool_)):
                raise InputError(f"{field.name} must be True or False, got {value!r:.60}")
            if field.type == "bool":
                object.__setattr__(self, field.name, bool(value))
        for name in ("charge", "spin"):  # whole numbers (numpy's too, made ints), or None: the file's lines decide
            value = getattr(self, name)
            if value is not None and (isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral)):
                raise InputError(f"{name} must be a whole number{' (2S)' if name == 'spin' else ''}, got {value!r:.60}")
            object.__setattr__(self, name, None if value is None else int(value))
        frozen_per_spin(self.frozen, 2)
        object.__setattr__(self, "max_memory", check_max_memory(self.max_memory))
        if self.method not in METHODS:
            raise InputError(f"{option('method', self.method)}: use one of {', '.join(METHODS)}")
        object.__setattr__(self, "laplace", laplace_points(self.laplace))

    def replace(self, **changes) -> Settings:
        """A copy with `changes`; unknown names are a TypeError naming them."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(unknown)}")
        return replace(self, **changes)


def laplace_points(value):
    """The one check of a --laplace value: None, "off", "auto", or a whole number of quadrature
    points from 1 to LAPLACE_MOST_POINTS (a numeric string, as the command line gives it, taken
    as one) -> None, "off", "auto" or an int; InputError otherwise."""
    if value is None or value in ("off", "auto"):
        return value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral) or not 1 <= value <= LAPLACE_MOST_POINTS:
        raise InputError(f"{option('laplace', value)}: use off, auto, or a number of points from 1 to {LAPLACE_MOST_POINTS}")
    return int(value)


def settings_from(settings: Settings | None = None, **changes) -> Settings:
    """`settings` (default: Settings()) with keyword `changes` applied."""
    return (settings or Settings()).replace(**changes)


def frozen_per_spin(frozen, nspin) -> list:
    """The one check of a `frozen` setting (PySCF's conventions): None, an int n (the n lowest
    orbitals, of each spin), a list of orbital indices (the same for both spins), or for an
    unrestricted reference a pair of lists [[alpha...], [beta...]]. Returns one `frozen` per spin
    channel: None, an int or a list of ints. Anything else (a string, a float, a bool, a list
    holding one) is an InputError naming it: frozen='1' must not quietly freeze orbital 1."""
    shown = f"frozen={frozen!r}"
    if frozen is None:
        return [None] * nspin
    count = _orbital_index(frozen)
    if count is not None:
        return [count] * nspin
    indices = _index_list(frozen)
    if indices is not None:
        return [indices] * nspin
    per_spin = [_index_list(item) for item in frozen] if isinstance(frozen, (list, tuple)) else []
    if len(per_spin) == 2 and all(item is not None for item in per_spin):
        if nspin == 1:
            raise InputError(f"{shown}: per-spin frozen orbitals ([[alpha...], [beta...]]) need an unrestricted "
                             "reference; this one is restricted: give one list of orbital indices")
        return per_spin
    raise InputError(f"{shown}: expected None, an int, a list of int orbital indices"
                     + (", or two lists [[alpha...], [beta...]]" if nspin == 2 else ""))


def _orbital_index(value) -> int | None:
    """value as an orbital index if it is an integer (Python or numpy, not a bool), else None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def _index_list(frozen) -> list | None:
    """frozen as a list of orbital indices if it is a list, tuple or 1-D integer array of
    integers, else None (a string, a float, a nested list, ... is not)."""
    if isinstance(frozen, np.ndarray):
        if frozen.ndim != 1 or not (frozen.size == 0 or np.issubdtype(frozen.dtype, np.integer)):
            return None
        return [int(p) for p in frozen]
    if not isinstance(frozen, (list, tuple, range)):
        return None
    indices = [_orbital_index(p) for p in frozen]
    return None if any(p is None for p in indices) else indices
