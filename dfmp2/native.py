"""Drop-ins for pyscf.mp.dfmp2_native and pyscf.mp.dfump2_native, with their conventions:

    from dfmp2.native import DFMP2, SCSMP2   # instead of: from pyscf.mp.dfmp2_native import DFMP2, SCSMP2
    with DFMP2(mf, frozen=2) as pt:          # DFMP2(mf, frozen=None, auxbasis=None)
        e_corr = pt.kernel()                 # a float; no t2
        natocc, natorb = pt.make_natorbs()   # RHF and UHF (relaxed: with the gradients)

The auxiliary basis is the MP2-fit set of the orbital basis unless `auxbasis` names one; the
SCS classes report e_corr = ps E_os + pt E_ss (6/5, 1/3) and the density of that energy; SOSMP2
(dfmp2's, not PySCF's) e_corr = ps E_os (1.3) with E_os through the Laplace transform. The
reference (RHF, UHF, ROHF) chooses the method, so DFUMP2 and SCSUMP2 are the same classes.
"""

from .api.pyscf_native import NativeDFMP2 as DFMP2
from .api.pyscf_native import NativeSCSMP2 as SCSMP2
from .api.pyscf_native import NativeSOSMP2 as SOSMP2

DFRMP2 = DFUMP2 = DFMP2
SCSDFRMP2 = SCSUMP2 = SCSDFUMP2 = SCSMP2

__all__ = ["DFMP2", "DFRMP2", "DFUMP2", "SCSMP2", "SCSDFRMP2", "SCSUMP2", "SCSDFUMP2", "SOSMP2"]
