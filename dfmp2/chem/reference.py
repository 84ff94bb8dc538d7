"""The mean field as MP2 takes it: checks of the reference, its orbitals, frozen core."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..util.errors import InputError
from .basis import atomic_number
from .molecule import is_ghost


@dataclass
class MeanField:
    """A reference for MP2. RHF: orbitals C [nao, nmo], energies e [nmo] (Eh), occupations [nmo]
    (0/2). UHF and ROHF: each per spin, [2, nao, nmo], [2, nmo], [2, nmo] (0/1); ROHF's are the
    semicanonical orbitals, with fock_mo [2, nmo, nmo] (Eh) their Fock matrices (off-diagonal
    occupied-virtual blocks: the singles). spin_square: <S^2> of the reference."""

    reference: str  # rhf, uhf or rohf; rks, uks or roks for Kohn-Sham orbitals
    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    mo_occ: np.ndarray
    e_ref: float  # the reference's total energy (HF or KS), Eh
    nelectron: int
    spin_square: float = 0.0
    fock_mo: np.ndarray | None = None
    xc: str | None = None  # the functional of a Kohn-Sham reference


def _reference_class(mf) -> tuple:
    """(rhf, uhf or rohf, the Kohn-Sham classes of mf's kind (molecular or periodic)) of a PySCF
    mean field; InputError for GHF and for what is not a mean field."""
    from pyscf import scf as pyscf_scf
    from pyscf.dft.rks import KohnShamDFT

    kinds = (pyscf_scf.ghf.GHF, pyscf_scf.rohf.ROHF, pyscf_scf.uhf.UHF, pyscf_scf.hf.RHF)
    ks_kinds = (KohnShamDFT,)
    if is_periodic(mf):  # gamma-point PBC mean fields: their own classes
        from pyscf.pbc import scf as pbc_scf
        from pyscf.pbc.dft.rks import KohnShamDFT as PeriodicKohnShamDFT

        check_gamma_point(mf)
        kinds = (pbc_scf.ghf.GHF, pbc_scf.rohf.ROHF, pbc_scf.uhf.UHF, pbc_scf.hf.RHF)
        ks_kinds = (PeriodicKohnShamDFT,)
    if isinstance(mf, kinds[0]):
        raise InputError(f"{type(mf).__name__} is a generalized (GHF) reference: dfmp2 takes RHF, UHF or ROHF")
    if isinstance(mf, kinds[1]):
        reference = "rohf"
    elif isinstance(mf, kinds[2]):
        reference = "uhf"
    elif isinstance(mf, kinds[3]):
        reference = "rhf"
    else:
        raise InputError(f"{type(mf).__name__} is not a PySCF RHF, UHF or ROHF object (molecular, or periodic at "
                         "the gamma point)")
    return reference, ks_kinds


def mean_field_orbitals(mf, allow_non_aufbau: bool = False) -> MeanField:
    """Extract the reference from a converged PySCF RHF, UHF or ROHF object, or their Kohn-Sham
    counterparts (RKS, UKS, ROKS: `reference` rks/uks/roks, energy `e_ref`), density-fitted or
    not, refusing what DF-MP2 here cannot use: GHF, complex orbitals, unconverged SCF,
    occupations other than 0/2 (restricted) or 0/1 per spin summing to the electron count, and
    (unless allow_non_aufbau) a highest occupied orbital energy not below the lowest virtual."""
    reference, ks_kinds = _reference_class(mf)
    if mf.mo_coeff is None or not getattr(mf, "converged", False):
        raise InputError(f"the {reference.upper()} mean field is not converged: run mf.kernel() to "
                         "convergence first")
    label = reference.replace("hf", "ks") if isinstance(mf, ks_kinds) else reference
    if np.iscomplexobj(mf.mo_coeff):
        raise InputError("complex orbitals: dfmp2 takes real RHF, UHF or ROHF references")
    if reference == "rhf" and mf.mol.spin != 0:
        raise InputError(f"molecule has spin {mf.mol.spin}: RHF needs a closed shell (use UHF or ROHF)")
    mo_coeff = np.asarray(mf.mo_coeff, dtype=np.float64)
    if mo_coeff.ndim != (3 if reference == "uhf" else 2):
        raise InputError(f"mo_coeff has shape {mo_coeff.shape}, not that of a {reference.upper()} reference")
    _check_occupations(np.asarray(mf.mo_occ, dtype=np.float64), reference, mf.mol)
    common = dict(reference=label, e_ref=float(mf.e_tot), nelectron=int(mf.mol.nelectron),
                  xc=getattr(mf, "xc", None) if isinstance(mf, ks_kinds) else None)
    if reference == "rhf":
        out = MeanField(mo_coeff=mo_coeff, mo_energy=np.asarray(mf.mo_energy, dtype=np.float64),
                        mo_occ=np.asarray(mf.mo_occ, dtype=np.float64), **common)
    elif reference == "uhf":
        out = MeanField(mo_coeff=mo_coeff, mo_energy=np.asarray(mf.mo_energy, dtype=np.float64),
                        mo_occ=np.asarray(mf.mo_occ, dtype=np.float64),
                        spin_square=float(mf.spin_square()[0]), **common)
    elif not np.any(np.asarray(mf.mo_occ) == 1):  # a closed-shell ROHF: its canonical orbitals for both
        # spins (the RHF arithmetic; semicanonical ones would re-diagonalise the last Fock build)
        occ = np.asarray(mf.mo_occ, dtype=np.float64) / 2
        energy = np.asarray(mf.mo_energy, dtype=np.float64)
        out = MeanField(mo_coeff=np.array([mo_coeff, mo_coeff]), mo_energy=np.array([energy, energy]),
                        mo_occ=np.array([occ, occ]), **common)
    else:
        out = MeanField(**semicanonical_orbitals(mf), spin_square=float(mf.spin_square()[0]), **common)
    if not allow_non_aufbau:
        _check_aufbau(out)
    return out


def with_orbitals(mf, mo_coeff, mo_occ, mo_energy=None):
    """A copy of the mean field `mf` holding other orbitals, as PySCF's DFMP2 takes them: their
    energies the diagonal of the Fock matrix they make (unless `mo_energy` is given) and e_tot
    the energy of their density."""
    dm = mf.make_rdm1(mo_coeff, mo_occ)
    vhf = mf.get_veff(mf.mol, dm)
    other = mf.copy()
    other.mo_coeff, other.mo_occ = mo_coeff, mo_occ
    if mo_energy is None:
        coeff, fock = np.asarray(mo_coeff), np.asarray(mf.get_fock(vhf=vhf, dm=dm))
        mo_energy = np.einsum("...mi,...mn,...ni->...i", coeff, fock, coeff)
    other.mo_energy = mo_energy
    other.e_tot = float(mf.energy_tot(dm=dm, vhf=vhf))
    return other


def overlap_matrix(mol) -> np.ndarray:
    """The AO overlap S [nao, nao]."""
    return mol.intor_symmetric("int1e_ovlp")


def reference_kind(mf) -> str:
    """'rhf', 'uhf' or 'rohf' of a PySCF mean field (Kohn-Sham ones too), by its class."""
    from pyscf import scf as pyscf_scf

    if mf.istype("ROHF"):
        return "rohf"
    if mf.istype("UHF") or isinstance(mf, pyscf_scf.uhf.UHF):
        return "uhf"
    return "rhf"


def is_kohn_sham(mf) -> bool:
    """True for a Kohn-Sham mean field (RKS, UKS, ROKS; molecular or periodic)."""
    from pyscf.dft.rks import KohnShamDFT

    return isinstance(mf, KohnShamDFT)


def _check_occupations(mo_occ, reference, mol):
    """Occupations 0/2 (RHF), 0/1 per spin (UHF), 0/1/2 with 2S singly occupied (ROHF), summing
    to the electron count; InputError naming the first problem otherwise."""
    nalpha, nbeta = mol.nelec
    allowed = {"rhf": (0.0, 2.0), "uhf": (0.0, 1.0), "rohf": (0.0, 1.0, 2.0)}[reference]
    channels = [("alpha ", mo_occ[0]), ("beta ", mo_occ[1])] if reference == "uhf" else [("", mo_occ)]
    for name, occ in channels:
        bad = [k for k, n in enumerate(occ) if min(abs(n - a) for a in allowed) > 1e-8]
        if bad:
            raise InputError(f"{name}orbital {bad[0]} has occupation {occ[bad[0]]:g}: a {reference.upper()} "
                             f"reference needs occupations {' or '.join(f'{a:g}' for a in allowed)}")
    expected = {"rhf": [mol.nelectron], "uhf": [nalpha, nbeta], "rohf": [mol.nelectron]}[reference]
    for (name, occ), n in zip(channels, expected):
        if abs(occ.sum() - n) > 1e-8:
            raise InputError(f"the {name}occupations sum to {occ.sum():g}, but the molecule has {n} "
                             f"{name}electrons")
    if reference == "rohf" and int(round(np.sum(np.abs(mo_occ - 1.0) < 1e-8))) != nalpha - nbeta:
        raise InputError(f"{int(round(np.sum(np.abs(mo_occ - 1.0) < 1e-8)))} singly occupied orbitals, "
                         f"but 2S = {nalpha - nbeta}")


def _check_aufbau(ref):
    """InputError unless every spin channel's highest occupied orbital energy is below its lowest
    virtual one (a non-aufbau reference, e.g. swapped occupations, is refused unless asked for)."""
    channels = [(ref.mo_energy, ref.mo_occ, "")] if ref.mo_coeff.ndim == 2 else \
        [(ref.mo_energy[s], ref.mo_occ[s], ("alpha ", "beta ")[s]) for s in range(2)]
    for energy, occ, name in channels:
        occupied, virtual = energy[occ > 0], energy[occ == 0]
        if occupied.size and virtual.size and occupied.max() >= virtual.min():
            homo, lumo = int(np.flatnonzero(occ > 0)[np.argmax(occupied)]), int(np.flatnonzero(occ == 0)[np.argmin(virtual)])
            raise InputError(
                f"not an aufbau reference: {name}occupied orbital {homo} ({occupied.max():.6f} Eh) is not below "
                f"virtual orbital {lumo} ({virtual.min():.6f} Eh); pass allow_non_aufbau=True if that is "
                "deliberate")


def semicanonical_orbitals(mf) -> dict:
    """ROHF -> semicanonical orbitals per spin (as Psi4's ROHF-MBPT(2)): the alpha (beta) Fock
    matrix F^s diagonalised separately in that spin's occupied and virtual spaces (alpha
    occupied: doubly and singly occupied; beta occupied: doubly occupied).
    Returns mo_coeff [2, nao, nmo], mo_energy [2, nmo], mo_occ [2, nmo] (occupied first, each
    space in ascending energy) and fock_mo [2, nmo, nmo] = C_s^T F^s C_s."""
    coeff = np.asarray(mf.mo_coeff, dtype=np.float64)
    fock = mf.get_fock(dm=mf.make_rdm1())  # ROHF: tagged with the spin Fock matrices
    out = {"mo_coeff": [], "mo_energy": [], "mo_occ": [], "fock_mo": []}
    for fock_ao, occupied in ((fock.focka, mf.mo_occ > 0), (fock.fockb, mf.mo_occ > 1)):
        fock_ao = np.asarray(fock_ao, dtype=np.float64)
        blocks = []
        for space in (np.flatnonzero(occupied), np.flatnonzero(~occupied)):
            c = coeff[:, space]
            e, u = np.linalg.eigh(c.T @ fock_ao @ c)  # F^s_pq in this space, diagonalised
            blocks.append((c @ u, e))
        c_s = np.hstack([blocks[0][0], blocks[1][0]])
        out["mo_coeff"].append(c_s)
        out["mo_energy"].append(np.concatenate([blocks[0][1], blocks[1][1]]))
        out["mo_occ"].append(np.concatenate([np.ones(blocks[0][1].size), np.zeros(blocks[1][1].size)]))
        out["fock_mo"].append(c_s.T @ fock_ao @ c_s)
    return {key: np.asarray(value) for key, value in out.items()}


NOBLE_GAS_CORES = (0, 2, 10, 18, 36, 54, 86, 118)  # electrons of the closed shells He ... Og


def frozen_core_count(mol) -> int:
    """Core orbitals to freeze. Atoms without an ECP: PySCF's `chemcore` table (0 for H-Be, 1 for
    B-Mg, 5 for Al-Ca, ...). Atoms with an ECP: Psi4's rule, the previous noble-gas core (and
    the 4f shell from Hf on) less the electrons the ECP replaces: 4 orbitals for every def2-ECP
    element (e.g. I: 36 - 28 = 8 electrons)."""
    from pyscf.data.elements import chemcore_atm

    frozen = 0
    for i in range(mol.natm):
        if is_ghost(mol, i):  # no electrons
            continue
        z = atomic_number(mol.atom_pure_symbol(i))
        ecp_electrons = mol.atom_nelec_core(i)
        if not ecp_electrons:
            frozen += chemcore_atm[z]
            continue
        period = next(n for n, closed in enumerate(NOBLE_GAS_CORES) if z <= closed)
        core = NOBLE_GAS_CORES[period - 1]
        if period >= 6 and z - core >= 18:  # the (n-2)f shell, full from Hf on
            core += 14
        frozen += max(core - ecp_electrons, 0) // 2
    return frozen


def check_gamma_point(mf) -> None:
    """InputError unless the periodic mean field `mf` is at the gamma point alone."""
    from pyscf.pbc import scf as pbc_scf

    if isinstance(mf, pbc_scf.khf.KSCF) or (isinstance(mf, pbc_scf.hf.SCF) and np.any(mf.kpt != 0)):
        raise InputError(f"{type(mf).__name__} samples k-points other than gamma: dfmp2 takes gamma-point "
                         "periodic mean fields (pyscf.pbc.scf.RHF/UHF/ROHF at kpt 0) only")


def is_periodic(mf) -> bool:
    """True for a PySCF PBC mean field (its `mol` is a pyscf.pbc Cell)."""
    return hasattr(getattr(mf, "mol", None), "lattice_vectors")


def write_molden(mol, path, mo_coeff, occupations) -> None:
    """Orbitals [nao, nmo] with their occupations to a Molden file at `path` (PySCF's writer;
    dfmp2.util.files stages it and puts it in place)."""
    from pyscf.tools import molden

    molden.from_mo(mol, path, mo_coeff, occ=occupations)


def per_spin_orbitals(mf) -> tuple:
    """(mo_coeff per spin, mo_occ per spin) of an RHF (one spin) or UHF (two) mean field."""
    coeff, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    return ([coeff], [occ]) if coeff.ndim == 2 else (list(coeff), list(occ))


def dipole_moment(mol, dm_ao) -> np.ndarray:
    """Dipole moment [x, y, z] (a.u., e a0) of the total AO density dm_ao and the nuclei, about
    the coordinate origin."""
    from pyscf.scf import hf

    return np.asarray(hf.dip_moment(mol, dm_ao, unit="AU", verbose=0))
