"""Drop-ins for pyscf.mp.dfmp2_native's classes (`dfmp2.native` names them as PySCF does)."""

from __future__ import annotations

from ..mp2.pipeline import SCS_OS, SCS_SS
from ..run.settings import SOS_C_OS
from .pyscf_base import PySCFMP2Base


class NativeDFMP2(PySCFMP2Base):
    """pyscf.mp.dfmp2_native's conventions (`dfmp2.native.DFMP2`): DFMP2(mf, frozen, auxbasis),
    the auxiliary basis is the MP2-fit set for the orbital basis unless `auxbasis` names one
    (the mean field's with_df is not used), `kernel()` returns e_corr and keeps no t2, and the
    object can be used in a with-block. e_corr = ps E_os + pt E_ss (1, 1 for MP2; the SCS
    classes scale them), its density that of the same scaled energy."""

    _keys = PySCFMP2Base._keys | {"ps", "pt", "cphf_max_cycle", "cphf_tol", "e_scf"}

    def __init__(self, mf, frozen=None, auxbasis=None, **options):
        super().__init__(mf, frozen, auxbasis=auxbasis, **options)
        self.e_scf = mf.e_tot
        self.ps = 1.0  # opposite-spin scaling of e_corr and of the density
        self.pt = 1.0  # same-spin scaling
        self.cphf_max_cycle = 100  # the relaxed density's CPHF
        self.cphf_tol = getattr(mf, "conv_tol", 1e-9)

    @property
    def e_tot(self):
        return None if self.e_corr is None else self.e_scf + self.e_corr

    def kernel(self):
        """The (scaled) DF-MP2 correlation energy, Eh."""
        return self.calculate_energy()

    def calculate_energy(self):
        self._run(with_t2=False)
        return self.e_corr

    def _correlation_energy(self):
        """ps E_os + pt E_ss (+ the ROHF singles); pt = 0 needs no E_ss (SOS-MP2's Laplace path has none)."""
        return self.ps * self.e_corr_os + (self.pt * self.e_corr_ss if self.pt else 0.0) + self.e_corr_singles

    def _rdm1_scaling(self):
        return (self.ps, self.pt)

    def make_rdm1_unrelaxed(self, ao_repr=False):
        return self.make_rdm1(relaxed=False, ao_repr=ao_repr)

    def make_rdm1_relaxed(self, ao_repr=False):
        return self.make_rdm1(relaxed=True, ao_repr=ao_repr)


class NativeSCSMP2(NativeDFMP2):
    """Spin-component-scaled DF-MP2 with pyscf.mp.dfmp2_native's conventions: e_corr =
    ps E_os + pt E_ss (default 6/5 and 1/3, Grimme's) and the density of that energy."""

    def __init__(self, mf, ps=SCS_OS, pt=SCS_SS, *args, **kwargs):
        super().__init__(mf, *args, **kwargs)
        self.ps = ps
        self.pt = pt


class NativeSOSMP2(NativeDFMP2):
    """Scaled-opposite-spin DF-MP2 (Jung, Lochan, Dutoi, Head-Gordon 2004) with pyscf.mp.dfmp2_native's
    conventions: e_corr = ps E_os (default 1.3; + the ROHF singles), E_os through the Laplace transform
    of 1/Delta (`laplace`: "auto" unless set; "off": the canonical pair loop), its density (laplace off
    then, announced) that of the same energy."""

    def __init__(self, mf, ps=SOS_C_OS, *args, **kwargs):
        super().__init__(mf, *args, **kwargs)
        self.ps = ps
        self.pt = 0.0
        self.method = "sos-mp2"

    def _run(self, mo_energy=None, mo_coeff=None, **changes):
        return super()._run(mo_energy, mo_coeff, **{"c_os": float(self.ps), **changes})

