"""dfmp2: density-fitted MP2 (RI-MP2) correlation energies on CPUs, NVIDIA GPUs and (soon) Trainium.

    from dfmp2 import DFMP2
    pt = DFMP2(mf).run()        # mf: a converged PySCF RHF
    pt.e_corr, pt.e_tot
"""

import os as _os

__version__ = "0.1.0"

# torch and PySCF each load their own OpenMP runtime. With OpenMP's default "active" wait
# policy the idle pool of one spins on the cores the other needs: on 2 cores the integral and
# transform steps ran 1.5-3x slower. Passive waiting removes that; an explicit setting wins.
# Effective only if set before torch/PySCF load (true for the CLI; a PySCF script that imports
# pyscf before dfmp2 can export OMP_WAIT_POLICY=PASSIVE itself).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .errors import ComputationError, DFMP2Error, InputError, MemoryBudgetError  # noqa: E402


def __getattr__(name):
    # The PySCF plugin imports torch and PySCF; load it on first use only.
    if name in ("DFMP2", "DFUMP2", "DFROMP2", "use_dfmp2_jk"):
        from . import pyscf_plugin

        return getattr(pyscf_plugin, name)
    raise AttributeError(f"module 'dfmp2' has no attribute {name!r}")


__all__ = ["DFMP2", "DFUMP2", "DFROMP2", "use_dfmp2_jk", "DFMP2Error", "InputError", "MemoryBudgetError", "ComputationError",
           "__version__"]
