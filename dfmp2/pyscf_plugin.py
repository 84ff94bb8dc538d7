"""PySCF plugin: a drop-in for pyscf.mp.dfmp2.DFMP2 (RHF) and pyscf.mp.dfump2.DFUMP2 (UHF),
and ROHF-MBPT(2) for ROHF references (semicanonical orbitals, singles included, as Psi4).

    from dfmp2 import DFMP2
    pt = DFMP2(mf, frozen=1, device="cpu", precision="fp64")
    pt = DFMP2(mf, device="trn1", simulate=True)   # NKI kernels on the emulator
    e_corr = pt.kernel()      # or pt.run() -> pt
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_scs, pt.e_tot, pt.e_corr_singles (ROHF)

The MP2 auxiliary basis defaults to the MP2-fit (RI) set for the orbital basis, also when the
SCF was density-fitted with a JK-fit basis (which PySCF's own DFMP2 would reuse).
"""

from __future__ import annotations

import numpy as np

from .driver import run_mean_field
from .pipeline import natural_orbitals


class DFMP2:
    """Options for one DF-MP2 calculation on a converged RHF, UHF or ROHF `mf` (density-fitted
    or not); `kernel()` runs it, the method following the object.

    frozen: None, an int (lowest orbitals, of each spin), a list of orbital indices (the same
    for both spins) or, for UHF/ROHF, a pair of lists [[alpha...], [beta...]] (PySCF convention).
    e_corr_ss is the sum of the alpha-alpha and beta-beta parts; e_corr includes the ROHF
    singles (e_corr_singles, 0 otherwise).
    max_memory: MB (default: mf.max_memory). Energies are in Hartree.
    """

    def __init__(self, mf, frozen=None, auxbasis=None, device="cpu", precision=None, simulate=False,
                 nki_api=None, transform=None, allow_non_aufbau=False):
        self._scf = mf
        self.mol = mf.mol
        self.frozen = frozen
        self.auxbasis = auxbasis
        self.device = device
        self.precision = precision  # None: fp64, or fp32 on trn1/trn2
        self.simulate = simulate  # trn1/trn2 only: run the NKI kernels on dfmp2's emulator
        self.nki_api = nki_api  # with simulate: the NKI release the emulator follows (None: newest)
        self.allow_non_aufbau = allow_non_aufbau  # accept a deliberately non-aufbau reference
        self.transform = transform  # trn1/trn2: AO->MO transform "exact" (None: default) or "fp32"
        self.max_memory = getattr(mf, "max_memory", None)
        self.verbose = getattr(mf, "verbose", 0)
        self.result = None
        self.e_hf = None  # None for a Kohn-Sham reference (its energy is e_ref)
        self.e_ref = None
        self.e_corr = None
        self.e_corr_os = None
        self.e_corr_ss = None
        self.e_corr_singles = None
        self.reference = None
        self.spin_square = None

    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_ref + self.e_corr

    @property
    def e_scs(self):
        return None if self.result is None else self.result.e_scs

    def kernel(self, with_rdm1=False):
        """Compute and return the DF-MP2 correlation energy (Eh); with_rdm1: also the unrelaxed
        density (make_rdm1 asks for it)."""
        self.result = run_mean_field(self._scf, auxbasis=self.auxbasis, frozen=self.frozen,
                                     device=self.device, precision=self.precision,
                                     simulate=self.simulate, max_memory=self.max_memory,
                                     nki_api=self.nki_api, transform=self.transform,
                                     allow_non_aufbau=self.allow_non_aufbau, with_rdm1=with_rdm1)
        self.e_hf = self.result.e_hf
        self.e_ref = self.result.e_ref
        self.e_corr = self.result.e_corr
        self.e_corr_os = self.result.e_corr_os
        self.e_corr_ss = self.result.e_corr_ss
        self.e_corr_singles = self.result.e_corr_singles
        self.reference = self.result.reference  # rhf, uhf or rohf
        self.spin_square = self.result.spin_square  # <S^2> of the reference
        return self.e_corr

    def make_rdm1(self, relaxed=False, ao_repr=False):
        """The unrelaxed DF-MP2 one-particle density (PySCF dfmp2_native's conventions): MO basis
        [nmo, nmo] by default (AO with ao_repr), reference occupations plus the MP2 correction,
        trace = electron count; built blockwise from the (ia|kb) blocks (no t2 stored).
        Restricted references; relaxed=True (Z-vector) is not implemented."""
        from .errors import InputError

        if relaxed:
            raise InputError("the relaxed MP2 density (Z-vector) is not implemented; use relaxed=False")
        if self.result is None or self.result.correlation.rdm1_active is None:
            self.kernel(with_rdm1=True)
        return self.result.make_rdm1(np.asarray(self._scf.mo_coeff), self._scf.mo_occ, ao_repr)

    def make_natorbs(self, rdm1_mo=None, relaxed=False):
        """(natocc, natorb): natural occupations, descending, and natural orbitals [nao, nmo] (AO
        coefficients) of `rdm1_mo` (default: make_rdm1(relaxed))."""
        dm = self.make_rdm1(relaxed=relaxed) if rdm1_mo is None else np.asarray(rdm1_mo)
        return natural_orbitals(dm, np.asarray(self._scf.mo_coeff))

    def double_hybrid_energy(self, xc=None, c_os=None, c_ss=None):
        """E_KS + c_os E_os + c_ss E_ss (Eh) of the Kohn-Sham reference this object ran on: xc
        names a double hybrid (`dfmp2.functionals`; its KS part must be the reference's xc), or
        give c_os and c_ss for a custom one. Runs kernel() first if needed."""
        from .errors import InputError
        from .functionals import double_hybrid

        if self.result is None:
            self.kernel()
        if not self.result.reference.endswith("ks"):
            raise InputError(f"a double hybrid needs a Kohn-Sham reference, not {self.result.reference.upper()}")
        dh = double_hybrid(xc if xc is not None else self._scf.xc, c_os, c_ss)
        if dh.name != "custom" and _xc_key(dh.xc) != _xc_key(self._scf.xc):
            raise InputError(f"{dh.name}'s KS part is {dh.xc!r}, but the reference used xc {self._scf.xc!r}")
        return self.e_ref + dh.c_os * self.e_corr_os + dh.c_ss * self.e_corr_ss

    def run(self, **options):
        """Set any of the constructor's options, run `kernel()`, return self."""
        for name, value in options.items():
            if name not in ("frozen", "auxbasis", "device", "precision", "simulate", "nki_api", "transform", "allow_non_aufbau",
                            "max_memory", "verbose"):
                raise TypeError(f"DFMP2.run() got an unknown option {name!r}")
            setattr(self, name, value)
        self.kernel()
        return self


def _xc_key(xc: str) -> str:
    return "".join(str(xc).upper().split())
