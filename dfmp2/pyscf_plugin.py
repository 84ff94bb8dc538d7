"""PySCF plugin: a drop-in for pyscf.mp.dfmp2.DFMP2 (RHF) and pyscf.mp.dfump2.DFUMP2 (UHF),
and ROHF-MBPT(2) for ROHF references (semicanonical orbitals, singles included, as Psi4).

    from dfmp2 import DFMP2                          # instead of: from pyscf.mp.dfmp2 import DFMP2
    pt = DFMP2(mf, frozen=1)                         # device="cuda" / "trn1" + simulate=True, ...
    e_corr, t2 = pt.kernel()                         # t2 None unless kernel(with_t2=True)
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_scs, pt.e_tot, pt.e_corr_singles (ROHF)
    dm = pt.make_rdm1(); natocc, natorb = pt.make_natorbs()
    pt.checkpoint = "ck"                             # keep B and finished pair blocks; rerun resumes

Under torchrun the object joins the process group and splits the work over the ranks (every
rank's script makes its own SCF; rank 0's orbitals are used).

The MP2 auxiliary basis: `pt.with_df` when the user sets it (its auxiliary basis, as PySCF
would build it), else `auxbasis=`, else the MP2-fit (RI) set for the orbital basis, also when
the SCF was density-fitted with a JK-fit basis (which PySCF's own DFMP2 would reuse).
"""

from __future__ import annotations

import numpy as np
from pyscf import lib
from pyscf.lib import logger

from .distributed import Team, launched_ranks
from .driver import run_mean_field
from .errors import InputError
from .pipeline import natural_orbitals
from .settings import Settings


class DFMP2(lib.StreamObject):
    """DF-MP2 on a converged RHF, UHF or ROHF `mf` (or RKS/UKS/ROKS; density-fitted or not),
    with PySCF's conventions: `kernel()` returns (e_corr, t2), `run()` returns self, `verbose`
    and `stdout` drive `pyscf.lib.logger`.

    frozen: None, an int (lowest orbitals, of each spin), a list of orbital indices (the same
    for both spins) or, for UHF/ROHF, a pair of lists [[alpha...], [beta...]].
    mo_coeff, mo_occ (and kernel's mo_energy): orbitals to use instead of the mean field's.
    e_corr_ss is the sum of the alpha-alpha and beta-beta parts; e_corr includes the ROHF
    singles (e_corr_singles, 0 otherwise). max_memory: MB (default: mf.max_memory).
    device, precision, simulate, nki_api, transform: where and how the kernels run (dfmp2).
    """

    _keys = {"frozen", "auxbasis", "device", "precision", "simulate", "nki_api", "transform",
             "allow_non_aufbau", "with_df", "mo_coeff", "mo_occ", "mo_energy", "result", "e_hf",
             "e_ref", "e_corr", "e_corr_os", "e_corr_ss", "e_corr_singles", "reference",
             "spin_square", "t2", "max_memory", "mol", "stdout", "verbose", "checkpoint",
             "checkpoint_allow_other_files"}

    def __init__(self, mf, frozen=None, mo_coeff=None, mo_occ=None, auxbasis=None, device="cpu",
                 precision=None, simulate=False, nki_api=None, transform=None, allow_non_aufbau=False):
        mf, self._moved = _host_mean_field(mf)
        self._scf = mf
        self.mol = mf.mol
        self.stdout = mf.stdout
        self.verbose = mf.verbose
        self.max_memory = getattr(mf, "max_memory", None)
        self.frozen = frozen
        self.mo_coeff = mf.mo_coeff if mo_coeff is None else mo_coeff
        self.mo_occ = mf.mo_occ if mo_occ is None else mo_occ
        self.mo_energy = mf.mo_energy
        self.with_df = None  # set it to choose the MP2 auxiliary basis as in PySCF
        self.auxbasis = auxbasis
        self.device = device
        self.precision = precision  # None: fp64, or fp32 on trn1/trn2
        self.simulate = simulate  # trn1/trn2 only: run the NKI kernels on dfmp2's emulator
        self.nki_api = nki_api  # with simulate: the NKI release the emulator follows (None: newest)
        self.transform = transform  # trn1/trn2: AO->MO transform "exact" (None: default) or "fp32"
        self.allow_non_aufbau = allow_non_aufbau  # accept a deliberately non-aufbau reference
        self.checkpoint = None  # a directory: keep B and finished pair tasks, resume from them
        self.checkpoint_allow_other_files = False  # use a checkpoint directory holding other files
        self.result = None
        self.e_hf = None  # None for a Kohn-Sham reference (its energy is e_ref)
        self.e_ref = None
        self.e_corr = None
        self.e_corr_os = None
        self.e_corr_ss = None
        self.e_corr_singles = None
        self.reference = None
        self.spin_square = None
        self.t2 = None

    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_ref + self.e_corr

    @property
    def e_scs(self):
        return None if self.result is None else self.result.e_scs

    def dump_flags(self, verbose=None):
        log = logger.new_logger(self, verbose)
        log.info("")
        log.info("******** %s (dfmp2) ********", self.__class__.__name__)
        log.info("frozen orbitals = %s", self.frozen)
        log.info("device = %s, precision = %s%s", self.device, self.precision or "default",
                 " (emulated)" if self.simulate else "")
        log.info("auxiliary basis = %s", self._auxbasis_choice() or "MP2-fit set for the orbital basis")
        log.info("max_memory %s MB", self.max_memory)
        return self

    def settings(self, **changes) -> Settings:
        """This object's options as dfmp2 Settings (keyword `changes` on top)."""
        return Settings(auxbasis=self._auxbasis_choice(), frozen=self.frozen, device=self.device,
                        precision=self.precision, simulate=self.simulate, nki_api=self.nki_api,
                        transform=self.transform, allow_non_aufbau=self.allow_non_aufbau,
                        max_memory=self.max_memory, checkpoint=self.checkpoint,
                        checkpoint_allow_other_files=self.checkpoint_allow_other_files).replace(**changes)

    def _auxbasis_choice(self):
        """with_df if the user set one (its auxmol, or the basis it would build), else auxbasis."""
        if self.with_df is None:
            return self.auxbasis
        if getattr(self.with_df, "auxmol", None) is not None:
            return self.with_df.auxmol._basis
        if self.with_df.auxbasis is not None:
            return self.with_df.auxbasis
        from .chem import fitting_basis

        return fitting_basis(self.mol, mp2fit=False).basis  # what an unset pyscf.df.DF builds: JK-fit

    def kernel(self, mo_energy=None, mo_coeff=None, eris=None, with_t2=False, with_rdm1=False):
        """Compute the DF-MP2 correlation energy (Eh); returns (e_corr, t2) as PySCF does, t2
        [nocc, nocc, nvir, nvir] (active orbitals) only with with_t2=True (restricted references,
        refused when it would not fit in what the memory budget leaves), else None. with_rdm1: also the
        unrelaxed density (make_rdm1 asks for it)."""
        if eris is not None:
            raise InputError("eris= is not used by dfmp2 (the DF integrals are made by the kernels)")
        log = logger.new_logger(self)
        if self.verbose >= logger.INFO:
            self.dump_flags()
        cput = (logger.process_clock(), logger.perf_counter())
        mf = self._scf
        if mo_coeff is not None or mo_energy is not None or self.mo_coeff is not mf.mo_coeff \
                or self.mo_occ is not mf.mo_occ:
            mf = mf.copy()
            mf.mo_coeff = self.mo_coeff if mo_coeff is None else mo_coeff
            mf.mo_energy = self.mo_energy if mo_energy is None else mo_energy
            mf.mo_occ = self.mo_occ
        team = Team.join(self.device, self.simulate) if launched_ranks() > 1 else None  # under torchrun
        self.result = run_mean_field(mf, self.settings(with_rdm1=with_rdm1, with_t2=with_t2, team=team))
        if self._moved:
            self.result.notes.append(self._moved)
        for name in ("e_hf", "e_ref", "e_corr", "e_corr_os", "e_corr_ss", "e_corr_singles",
                     "reference", "spin_square"):
            setattr(self, name, getattr(self.result, name))
        self.t2 = self.result.correlation.t2
        log.note("E(%s) = %.15g  E_corr = %.15g", self.__class__.__name__, self.e_tot, self.e_corr)
        log.note("E(SCS-%s) = %.15g  E_corr = %.15g", self.__class__.__name__,
                 self.e_ref + self.e_scs, self.e_scs)
        log.timer(self.__class__.__name__, *cput)
        return self.e_corr, self.t2

    def make_rdm1(self, relaxed=False, ao_repr=False):
        """The unrelaxed DF-MP2 one-particle density (PySCF dfmp2_native's conventions): MO basis
        [nmo, nmo] by default (AO with ao_repr), reference occupations plus the MP2 correction,
        trace = electron count; built blockwise from the (ia|kb) blocks (no t2 stored).
        Restricted references; relaxed=True (Z-vector) is not implemented."""
        if relaxed:
            raise InputError("the relaxed MP2 density (Z-vector) is not implemented; use relaxed=False")
        if self.result is None or self.result.correlation.rdm1_active is None:
            self.kernel(with_rdm1=True)
        return self.result.make_rdm1(np.asarray(self.mo_coeff), self.mo_occ, ao_repr)

    def make_natorbs(self, rdm1_mo=None, relaxed=False):
        """(natocc, natorb): natural occupations, descending, and natural orbitals [nao, nmo] (AO
        coefficients) of `rdm1_mo` (default: make_rdm1(relaxed))."""
        dm = self.make_rdm1(relaxed=relaxed) if rdm1_mo is None else np.asarray(rdm1_mo)
        return natural_orbitals(dm, np.asarray(self.mo_coeff))

    def double_hybrid_energy(self, xc=None, c_os=None, c_ss=None):
        """E_KS + c_os E_os + c_ss E_ss (Eh) of the Kohn-Sham reference this object ran on: xc
        names a double hybrid (`dfmp2.functionals`; its KS part must be the reference's xc), or
        give c_os and c_ss for a custom one. Runs kernel() first if needed."""
        from .functionals import double_hybrid

        if self.result is None:
            self.kernel()
        if not self.result.reference.endswith("ks"):
            raise InputError(f"a double hybrid needs a Kohn-Sham reference, not {self.result.reference.upper()}")
        dh = double_hybrid(xc if xc is not None else self._scf.xc, c_os, c_ss)
        if dh.name != "custom" and _xc_key(dh.xc) != _xc_key(self._scf.xc):
            raise InputError(f"{dh.name}'s KS part is {dh.xc!r}, but the reference used xc {self._scf.xc!r}")
        return self.e_ref + dh.c_os * self.e_corr_os + dh.c_ss * self.e_corr_ss


DFUMP2 = DFMP2  # the method follows the mean field (UHF objects give PySCF's DFUMP2 energies)


def _host_mean_field(mf):
    """A gpu4pyscf mean field (`mf.to_gpu()`) is moved to the CPU with its own `to_cpu()` (the
    integrals and orbitals dfmp2 reads are host arrays); returns (mf, note or None)."""
    module = type(mf).__module__ or ""
    if module.startswith("gpu4pyscf"):
        if not hasattr(mf, "to_cpu"):
            raise InputError(f"{type(mf).__name__} from gpu4pyscf has no to_cpu(): pass the PySCF (CPU) mean field")
        return mf.to_cpu(), f"gpu4pyscf mean field {type(mf).__name__} moved to the CPU with to_cpu()"
    return mf, None


def _xc_key(xc: str) -> str:
    return "".join(str(xc).upper().split())


__all__ = ["DFMP2", "DFUMP2"]
