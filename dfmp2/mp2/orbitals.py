"""The orbitals a DF-MP2 run correlates: spin channels and their active spaces.

A restricted reference is one spin channel, an unrestricted (or ROHF, semicanonical) one two:
alpha and beta. Each channel's active occupied and virtual orbitals (PySCF's `frozen`
conventions) go to the device once, as a `SpinChannel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..run.settings import frozen_per_spin
from ..util.errors import InputError


def active_orbitals(mo_occ, frozen=None, spin=""):
    """Indices of active occupied and virtual orbitals of one spin channel.

    frozen: None/0, an int n (the n lowest orbitals), or a list of orbital indices (as
    `frozen_per_spin` returns them; anything else is an InputError).
    spin: 'alpha'/'beta' for the error messages of an unrestricted reference.
    Returns (occ_index, vir_index, nfrozen).
    """
    where = f" ({spin} spin)" if spin else ""
    mo_occ = np.asarray(mo_occ)
    nmo = mo_occ.size
    occupied = np.flatnonzero(mo_occ > 0)
    nocc = occupied.size
    (frozen,) = frozen_per_spin(frozen, 1)
    if frozen is None:
        frozen_set = set()
    elif isinstance(frozen, int):
        if frozen < 0 or frozen > nocc:
            raise InputError(f"frozen={frozen}: must be between 0 and the {nocc} occupied orbitals{where}")
        frozen_set = set(range(frozen))
    else:
        frozen_set = set(frozen)
        bad = sorted(p for p in frozen_set if p < 0 or p >= nmo)
        if bad:
            raise InputError(f"frozen orbital index {bad[0]} is outside 0..{nmo - 1}{where}")
    occ_index = np.array([p for p in occupied if p not in frozen_set], dtype=int)
    vir_index = np.array([p for p in np.flatnonzero(mo_occ == 0) if p not in frozen_set], dtype=int)
    if occ_index.size == 0:
        raise InputError(f"no active occupied orbitals left after freezing{where}")
    if vir_index.size == 0:
        raise InputError(f"no active virtual orbitals{where}: the basis has no virtual space")
    return occ_index, vir_index, len(frozen_set)


def spin_channels(mo_coeff, mo_energy, mo_occ):
    """Split a reference into spin channels [(C [nao, nmo], e [nmo], occ [nmo])]: one for a
    restricted reference (C 2-D), two (alpha, beta) for an unrestricted one (C [2, nao, nmo]
    or a pair of matrices, as PySCF's UHF holds them)."""
    if isinstance(mo_coeff, (list, tuple)) or np.asarray(mo_coeff).ndim == 3:
        return [(np.asarray(mo_coeff[s], dtype=np.float64), np.asarray(mo_energy[s], dtype=np.float64),
                 np.asarray(mo_occ[s], dtype=np.float64)) for s in range(2)]
    return [(np.asarray(mo_coeff, dtype=np.float64), np.asarray(mo_energy, dtype=np.float64),
             np.asarray(mo_occ, dtype=np.float64))]


@dataclass
class SpinChannel:
    """One spin channel's active orbitals: C_occ [nao, nocc], C_vir [nao, nvir] and e_occ,
    e_vir (Eh) on the device; the same energies on the host (fp64), and f_ov [nocc, nvir], the
    occupied-virtual Fock block of non-canonical (ROHF semicanonical) orbitals, or None."""

    name: str  # '' (restricted), 'alpha' or 'beta'
    c_occ: object
    c_vir: object
    e_occ: object
    e_vir: object
    e_occ_host: np.ndarray
    e_vir_host: np.ndarray
    f_ov: np.ndarray | None
    nfrozen: int

    @property
    def nocc(self):
        return self.e_occ_host.size

    @property
    def nvir(self):
        return self.e_vir_host.size


def active_spaces(refs, frozen) -> list:
    """[(occ_index, vir_index, nfrozen)] of each spin channel of `refs` (`spin_channels`) with
    `frozen` as `active_orbitals` and `frozen_per_spin` take it."""
    names = [""] if len(refs) == 1 else ["alpha", "beta"]
    return [active_orbitals(occ, f, name) for (_, _, occ), f, name
            in zip(refs, frozen_per_spin(frozen, len(refs)), names)]


def device_channels(backend, refs, selected, fock_mo=None) -> list:
    """The SpinChannel of each (C, e, occ) in `refs` with its active orbitals `selected`
    [(occ_index, vir_index, nfrozen)], on the device. The transform and the orbital energies
    stay fp64 in every precision: rounding (mn|P) to fp32 before the transform costs ~2e-6 Eh
    on benzene/cc-pVTZ (docs/method.md, precision)."""
    names = [""] if len(refs) == 1 else ["alpha", "beta"]
    channels = []
    for s, ((coeff, energy, _), (occ_index, vir_index, nfrozen)) in enumerate(zip(refs, selected)):
        f_ov = None if fock_mo is None else np.asarray(fock_mo[s], dtype=np.float64)[np.ix_(occ_index, vir_index)]
        channels.append(SpinChannel(
            name=names[s],
            c_occ=backend.to_device(coeff[:, occ_index], fp64=True),
            c_vir=backend.to_device(coeff[:, vir_index], fp64=True),
            e_occ=backend.to_device(energy[occ_index], fp64=True),
            e_vir=backend.to_device(energy[vir_index], fp64=True),
            e_occ_host=energy[occ_index], e_vir_host=energy[vir_index], f_ov=f_ov, nfrozen=nfrozen))
    return channels


def natural_orbitals(rdm1_mo, mo_coeff, overlap=None):
    """Eigen-decomposition of an MO-basis 1-RDM: (occupations in descending order [nmo],
    natural orbitals as AO coefficients [nao, nmo]). Unrestricted ([2, nmo, nmo] with mo_coeff
    [2, nao, nmo] and the AO overlap S): of the spin-summed density in the alpha basis,
      P = P_alpha + S_ab P_beta S_ab^T,  S_ab = C_alpha^T S C_beta"""
    if np.ndim(rdm1_mo) == 3:
        s_ab = mo_coeff[0].T @ overlap @ mo_coeff[1]
        rdm1_mo, mo_coeff = rdm1_mo[0] + s_ab @ rdm1_mo[1] @ s_ab.T, mo_coeff[0]
    occupations, vectors = np.linalg.eigh(rdm1_mo)
    return occupations[::-1], mo_coeff @ vectors[:, ::-1]
