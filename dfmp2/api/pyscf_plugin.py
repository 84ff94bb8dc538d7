"""PySCF plugin: drop-ins for PySCF's DF-MP2 classes, with PySCF's conventions.

    from dfmp2 import DFMP2            # instead of: from pyscf.mp.dfmp2 import DFMP2 (or dfump2's DFUMP2)
    pt = DFMP2(mf, frozen=1)           # device="cuda" / "trn1" + simulate=True, ...
    e_corr, t2 = pt.kernel()           # t2 kept when the memory budget allows it (PySCF's default)
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.emp2_scs, pt.e_tot, pt.e_corr_singles (ROHF)
    eris = pt.ao2mo(ovL_to_save="ovL.h5"); pt.kernel(eris=eris)    # keep / reuse (ia|P)
    dm = pt.make_rdm1(); natocc, natorb = pt.make_natorbs()       # RHF and UHF

    from dfmp2.native import DFMP2, SCSMP2   # instead of pyscf.mp.dfmp2_native (kernel() -> e_corr)

One class per convention, whatever the reference: `DFMP2` (= `DFUMP2` = `DFROMP2`) follows the
mean field (RHF, UHF, ROHF or their Kohn-Sham counterparts, molecular or periodic at the gamma
point); ROHF references get ROHF-MBPT(2) (semicanonical orbitals, singles included unless
include_singles=False, as PySCF's DFROMP2 and Psi4).

The auxiliary basis, as PySCF chooses it: `pt.with_df` is the mean field's when it has one (a
density-fitted SCF's JK-fit set: the note in the log says how to ask for the MP2-fit set, the
better choice for MP2), else a `pyscf.df.DF` with the MP2-fit set of the orbital basis;
`auxbasis=` replaces it. `pyscf.mp.dfmp2_native`'s classes always take the MP2-fit set (or
`auxbasis`). Periodic mean fields use their GDF three-center integrals as they are.

Under torchrun the object joins the process group and splits the work over the ranks (every
rank's script makes its own SCF; rank 0's orbitals are used).
"""

from __future__ import annotations

import os

import numpy as np
from pyscf.lib import logger

from .. import chem
from ..mp2.b import open_ovl, write_ovl
from ..run.settings import IF_ROOM
from ..util.deprecated import MISSING, renamed
from ..util.errors import InputError
from ..util.files import display
from ..util.provenance import mismatch
from .driver import ovL_of_mean_field
from .pyscf_base import ROHF_DENSITIES_PENDING, SETTINGS_OF_ATTRIBUTES, PySCFMP2Base
from .pyscf_native import NativeDFMP2, NativeSCSMP2


class DFMP2(PySCFMP2Base):
    """DF-MP2 on a converged RHF, UHF or ROHF `mf` (or RKS/UKS/ROKS; density-fitted or not;
    periodic at the gamma point) with pyscf.mp.dfmp2.DFMP2's conventions: `kernel()` returns
    (e_corr, t2), `run()` returns self, `with_df` chooses the auxiliary basis, `verbose` and
    `stdout` drive `pyscf.lib.logger`.

    frozen: None, an int (lowest orbitals, of each spin), a list of orbital indices (the same
    for both spins) or, for UHF/ROHF, a pair of lists [[alpha...], [beta...]].
    mo_coeff, mo_occ, mo_energy: orbitals to use instead of the mean field's.
    e_corr_ss is the sum of the alpha-alpha and beta-beta parts; e_corr includes the ROHF
    singles (e_corr_singles; include_singles=False leaves them out). max_memory: MB (default:
    mf.max_memory; PySCF's own default is a limit, not the user's figure: `_budget_rule`). auxbasis: the
    MP2 auxiliary basis (replaces with_df).
    device, precision, simulate, nki_api, transform: where and how the kernels run (dfmp2).
    """

    def __init__(self, mf, frozen=None, mo_coeff=None, mo_occ=None, mo_energy=None, **options):
        super().__init__(mf, frozen, mo_coeff, mo_occ, mo_energy, **options)
        if self.auxbasis is not None:
            self.with_df = _fitting(self._scf, self.auxbasis)
        elif getattr(self._scf, "with_df", None):  # PySCF's choice: the SCF's own fitting (JK-fit)
            self.with_df = self._scf.with_df
        else:
            self.with_df = _fitting(self._scf, chem.pyscf_fitting_choice(self.mol, mp2fit=True))

    def _integrals(self):
        """The three-center integrals of with_df: those it holds already (a density-fitted SCF's,
        a periodic GDF's, or a user's `_cderi`) read as they are, as PySCF's DFMP2 reads them;
        else made in its auxiliary basis (its auxmol's, its auxbasis, or the JK-fit set an unset
        DF object builds). The first time the SCF's own fitting is used, the log names the MP2-fit
        set and how to ask for it."""
        if self.with_df is None:
            raise InputError("with_df is None: set it to a pyscf.df.DF object (or pass auxbasis=)")
        if chem.is_periodic(self._scf):
            chem.check_gamma_point(self._scf)
        if chem.is_periodic(self._scf) or getattr(self.with_df, "_cderi", None) is not None:
            integrals = chem.CholeskyVectors(self.with_df)
        elif getattr(self.with_df, "auxmol", None) is not None:
            integrals = chem.MNPIntegrals(self.mol, self.with_df.auxmol.basis)  # as asked for (names)
        elif self.with_df.auxbasis is not None:
            integrals = chem.MNPIntegrals(self.mol, self.with_df.auxbasis)
        else:  # what an unset pyscf.df.DF builds
            integrals = chem.MNPIntegrals(self.mol, chem.fitting_basis(self.mol, mp2fit=False).basis)
        if self.with_df is getattr(self._scf, "with_df", None) and not self._noted_jk_fit:
            better = chem.fitting_basis(self.mol, mp2fit=True).describe()
            if integrals.basis_name != better:
                logger.note(self, "dfmp2: DF-MP2 uses the mean field's fitting set %s (as PySCF's DFMP2 does); "
                            "the MP2-fit set %s is made for MP2 and more accurate: DFMP2(mf, auxbasis=%r) or "
                            "pt.with_df = pyscf.df.DF(mol, auxbasis=%r)", integrals.basis_name, better, better, better)
            self._noted_jk_fit = True
        return integrals

    def density_fit(self, auxbasis=None, with_df=None):
        """A new DFMP2 with this one's options and orbitals, as PySCF's MP2.density_fit makes it:
        `with_df` if given (else PySCF's choice), set to `auxbasis` (a copy of it if the basis
        differs; None: the JK-fit set an unset DF object builds, as in PySCF)."""
        new = DFMP2(self._scf, self.frozen, self.mo_coeff, self.mo_occ, self.mo_energy)
        for name in _OPTIONS:
            setattr(new, name, getattr(self, name))
        if with_df is not None:
            new.with_df = with_df
        if new.with_df.auxbasis != auxbasis:
            new.with_df = new.with_df.copy()
            new.with_df.auxbasis = auxbasis
        return new

    def kernel(self, mo_energy=None, mo_coeff=None, eris=None, with_t2=IF_ROOM):
        """Compute the DF-MP2 correlation energy (Eh); returns (e_corr, t2) as PySCF does.
        t2: [nocc, nocc, nvir, nvir] of the active orbitals (restricted) or (t2aa, t2ab, t2bb)
        (unrestricted; ROHF: semicanonical orbitals); with_t2 IF_ROOM (default) keeps it when the
        memory budget allows it (else None and a note says why), True insists (MemoryError if it
        does not fit), False skips it. eris: from ao2mo() (or PySCF's, anything with .ovL):
        the (ia|P) integrals are taken from it instead of being made."""
        given = notes = None
        if eris is not None:  # vouched for as ao2mo(ovL=FILE) is (`_check_eris`)
            given = _ovl_per_spin(eris.ovL)
            notes = self._check_eris(eris, self._integrals(), mo_coeff, getattr(eris, "source", None) or "eris")
        self._run(mo_energy, mo_coeff, with_t2=with_t2, given=given, notes=notes or [])
        if notes:
            for note in notes:
                logger.note(self, "dfmp2: %s", note)
        self.t2 = self.result.correlation.t2
        return self.e_corr, self.t2

    def ao2mo(self, mo_coeff=None, ovL=None, ovL_to_save=None):
        """The whitened (ia|P) integrals of the active orbitals as PySCF's eris: `.ovL` [nocc * nvir,
        naux] (a list of two for UHF/ROHF). ovL: take them as given (an array, a list of two, or
        the path of an HDF5 file written with ovL_to_save, PySCF's or dfmp2's); ovL_to_save: also
        write them to that HDF5 file (datasets 'ovL', or 'ovL0' and 'ovL1')."""
        integrals = self._integrals()
        if ovL is not None:
            if isinstance(ovL, (str, os.PathLike)):
                eris = OvLEris(*open_ovl(ovL), source=f"ovL {display(ovL)}")
                try:
                    self._check_eris(eris, integrals, mo_coeff, f"ovL {display(ovL)}")
                except BaseException:
                    eris.close()
                    raise
                return eris
            return OvLEris(ovL)
        mf = self._mean_field(mo_coeff)
        identity, orbitals = self._ovl_identity(integrals, mo_coeff)
        if ovL_to_save is None:  # in memory
            with self._budget_rule():
                ovl = ovL_of_mean_field(mf, self.settings(), integrals)
            return OvLEris(ovl[0] if len(ovl) == 1 else ovl, identity=identity, orbitals=orbitals)
        with self._budget_rule():
            write_ovl(ovL_to_save, lambda out: ovL_of_mean_field(mf, self.settings(), integrals, out=out),
                      identity, orbitals, directories=[self.checkpoint])
        return OvLEris(*open_ovl(ovL_to_save), source=f"ovL {display(ovL_to_save)}")

    def _ovl_identity(self, integrals, mo_coeff=None) -> tuple:
        """(identity, [(C_occ, C_vir) per spin]) of the (ia|P) this object makes: the molecule
        (atoms in bohr, basis and its AO labels), the auxiliary basis, the active orbitals'
        indices (frozen); and the active orbitals themselves, compared numerically on reading."""
        import hashlib

        mol = self.mol
        coeffs = np.asarray(self.mo_coeff if mo_coeff is None else mo_coeff)
        coeffs = coeffs[None] if coeffs.ndim == 2 else coeffs
        active = self._active()
        if len(coeffs) != len(active):  # ROHF: the same orbitals for both spins (semicanonical when made)
            coeffs = np.array([coeffs[0]] * len(active))
        identity = {
            "kind": "ovL", "atoms": [[mol.atom_symbol(i), *np.round(mol.atom_coord(i), 8).tolist()]
                                     for i in range(mol.natm)],
            "basis": chem.basis_name(mol), "nao": int(mol.nao_nr()),
            "ao_labels": hashlib.sha256("\n".join(mol.ao_labels()).encode()).hexdigest()[:16],
            "auxbasis": str(integrals.auxbasis), "naux": int(integrals.naux),
            "active": [[occ.tolist(), vir.tolist()] for occ, vir, _ in active]}
        return identity, [(c[:, occ], c[:, vir]) for c, (occ, vir, _) in zip(coeffs, active)]

    def _check_eris(self, eris, integrals, mo_coeff, label) -> list:
        """Vouch for (ia|P) read back (ao2mo(ovL=FILE), kernel(eris=)): made by dfmp2 for this
        molecule, bases, active orbitals and orbitals (identity, then orbitals to 1e-6 up to their
        signs), else InputError naming the difference; made elsewhere (PySCF's ovL, an array): its
        shapes against the active spaces and the auxiliary basis, and a note saying that only
        they could be checked. Returns the notes."""
        blocks = _ovl_per_spin(eris.ovL)
        identity, orbitals = self._ovl_identity(integrals, mo_coeff)
        if getattr(eris, "identity", None) is not None:
            reason = mismatch(eris.identity, identity)
            if reason is None:
                for (occ, vir), (occ_now, vir_now) in zip(eris.orbitals, orbitals):
                    worst = max(_largest_change(occ, occ_now), _largest_change(vir, vir_now))
                    if worst > 1e-6:
                        reason = (f"it was made with other orbitals (a coefficient differs by {worst:.2g}; a new SCF "
                                  "may rotate them)")
                        break
            if reason is not None:
                raise InputError(f"{label}: {reason}; make them from these orbitals with ao2mo()")
            return []
        spaces = [(len(occ), len(vir)) for occ, vir, _ in self._active()]
        if len(blocks) != len(spaces) or any(
                len(b.shape) != 2 or b.shape[0] != o * v or not 0 < b.shape[1] <= integrals.naux
                for b, (o, v) in zip(blocks, spaces)):
            raise InputError(f"{label}: shapes {[tuple(b.shape) for b in blocks]} are not [nocc * nvir, naux <= "
                             f"{integrals.naux}] of the active orbitals {spaces}: made with other orbitals, frozen "
                             "orbitals or auxiliary basis")
        return [f"{label} was not made by dfmp2 (it records no orbitals): only its shapes could be checked against "
                "this molecule's active orbitals and auxiliary basis"]

    def make_rdm1(self, t2=None, ao_repr=False, with_frozen=True, relaxed=False):
        """The unrelaxed DF-MP2 one-particle density with pyscf.mp.dfmp2's signature: MO basis
        [nmo, nmo] (AO with ao_repr; the active orbitals only with with_frozen=False), built
        blockwise from (ia|kb), or by PySCF's formula from `t2` when one is given. UHF: the tuple
        (alpha, beta), as PySCF's DFUMP2; relaxed=True comes with the analytic gradients."""
        from pyscf.mp import mp2, ump2

        kind = chem.reference_kind(self._scf)
        if kind == "rohf":
            raise NotImplementedError(ROHF_DENSITIES_PENDING)
        if t2 is not None:
            return (mp2 if kind == "rhf" else ump2).make_rdm1(self, t2, ao_repr=ao_repr, with_frozen=with_frozen)
        dms = super().make_rdm1(relaxed=relaxed)
        masks, coeffs = self.get_frozen_mask(), np.asarray(self.mo_coeff)
        if kind == "rhf":
            dms, masks, coeffs = dms[None], [masks], coeffs[None]
        out = []
        for dm, mask, coeff in zip(dms, masks, coeffs):
            keep = np.ones(len(dm), dtype=bool) if with_frozen else np.asarray(mask)
            dm, coeff = dm[np.ix_(keep, keep)], coeff[:, keep]
            out.append(coeff @ dm @ coeff.T if ao_repr else dm)
        return out[0] if kind == "rhf" else tuple(out)

    def make_rdm2(self, t2=None, ao_repr=False):
        """The unrelaxed MP2 two-particle density of a closed-shell (RHF) reference from t2
        (default: the kept one), as PySCF's make_rdm2 builds it ([nmo]*4, O(nmo^4) memory)."""
        from pyscf.mp import mp2

        if chem.reference_kind(self._scf) != "rhf":
            raise NotImplementedError("the MP2 2-RDM of open-shell references is not implemented in dfmp2")
        if t2 is None:
            if self.t2 is None:
                self.kernel(with_t2=True)
            t2 = self.t2
        return mp2.make_rdm2(self, t2, ao_repr=ao_repr)


DFUMP2 = DFROMP2 = DFMP2  # the method follows the mean field (UHF: DFUMP2's energies; ROHF: DFROMP2's)


class OvLEris:
    """B (the whitened (ia|P)) of one run's active orbitals, PySCF's eris layout: `ovL`
    [nocc * nvir, naux] (restricted) or [ovL_alpha, ovL_beta]; arrays or HDF5 datasets (then
    `close()` closes their file)."""

    def __init__(self, ovL, handle=None, identity=None, orbitals=None, source=None):  # noqa: N803 (PySCF's name)
        self.ovL = ovL
        self._handle = handle
        self.source = source  # where they were read from, for messages ("ovL FILE"), or None
        self.identity = identity  # what they were made from (DFMP2._ovl_identity); None: not made by dfmp2
        self.orbitals = orbitals  # [(C_occ, C_vir) per spin] they were made from

    @property
    def naux(self):
        return int(_ovl_per_spin(self.ovL)[0].shape[-1])

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _largest_change(before, now) -> float:
    """The largest change of a coefficient between two orbital sets [nao, n], each orbital's
    sign as `now` has it (a sign does not change (ia|P)'s energies); inf if the shapes differ."""
    before, now = np.asarray(before), np.asarray(now)
    if before.shape != now.shape:
        return float("inf")
    if before.size == 0:
        return 0.0
    signs = np.where(np.einsum("mk,mk->k", before, now) < 0, -1.0, 1.0)
    return float(np.abs(before * signs - now).max())


def _ovl_per_spin(ovl) -> list:
    """[ovL] of a restricted eris, [ovL_alpha, ovL_beta] of an unrestricted one."""
    if isinstance(ovl, (list, tuple)):
        return list(ovl)
    if getattr(ovl, "ndim", 2) == 3:  # a stacked [2, nocc * nvir, naux]
        return [ovl[0], ovl[1]]
    return [ovl]


# what density_fit copies to its new object (frozen: given to its constructor)
_OPTIONS = tuple(name for name in SETTINGS_OF_ATTRIBUTES if name != "frozen") + ("verbose", "stdout")


def _fitting(mf, auxbasis):
    """PySCF's density-fitting object for `mf` in `auxbasis`: pyscf.df.DF, or for a periodic mean
    field the Gaussian density fitting (pyscf.pbc.df.GDF) of its cell."""
    if chem.is_periodic(mf):
        from pyscf.pbc import df as pbc_df

        fitting = pbc_df.GDF(mf.mol)
        fitting.auxbasis = auxbasis
        return fitting
    from pyscf import df

    return df.DF(mf.mol, auxbasis=auxbasis)


OLD_NAMES = {"ThreeCenterMO": "OvLEris"}  # deprecated names (CHANGELOG.md) -> their new ones


def __getattr__(name):
    found = renamed(__name__, OLD_NAMES, name, globals())
    if found is MISSING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found


__all__ = ["DFMP2", "DFUMP2", "DFROMP2", "OvLEris", "NativeDFMP2", "NativeSCSMP2", "IF_ROOM"]


