"""dfmp2 as a drop-in for PySCF's DFMP2 on a converged RHF.

    python examples/pyscf_plugin.py
"""

from pyscf import gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

from dfmp2 import DFMP2

mol = gto.M(atom="examples/water.xyz", basis="cc-pvtz", verbose=0)
mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11)  # SCF with the JK-fit basis

# As PySCF's DFMP2, the default reuses the SCF's JK-fit basis (the log says so); the MP2-fit
# basis is made for MP2: ask for it.
pt = DFMP2(mf, frozen=1, auxbasis="cc-pvtz-ri", precision="fp64")
e_corr, t2 = pt.kernel()  # t2 kept, as PySCF keeps it
print(f"dfmp2    E_corr = {pt.e_corr:.10f}  (os {pt.e_corr_os:.10f}, ss {pt.e_corr_ss:.10f})")
print(f"         E_tot  = {pt.e_tot:.10f}  E_scs = {pt.emp2_scs:.10f}  t2 {t2.shape}")
print(f"         ran on {pt.result.device} ({pt.result.backend}), kernels {pt.result.kernels}")

from pyscf import df  # noqa: E402

ref = pyscf_dfmp2.DFMP2(mf, frozen=1)
ref.with_df = df.DF(mol, auxbasis="cc-pvtz-ri")
ref.kernel()
print(f"pyscf    E_corr = {ref.e_corr:.10f}  difference {pt.e_corr - ref.e_corr:.1e} Eh")
