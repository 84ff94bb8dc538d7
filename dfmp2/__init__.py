"""dfmp2: density-fitted MP2 (RI-MP2) correlation energies on CPUs, NVIDIA GPUs and (soon) Trainium.

    from dfmp2 import DFMP2
    pt = DFMP2(mf).run()        # mf: a converged PySCF RHF
    pt.e_corr, pt.e_tot
"""

__version__ = "0.1.0"

from .errors import ComputationError, DFMP2Error, InputError  # noqa: E402


def __getattr__(name):
    # The PySCF plugin imports torch and PySCF; load it on first use only.
    if name == "DFMP2":
        from .pyscf_plugin import DFMP2

        return DFMP2
    raise AttributeError(f"module 'dfmp2' has no attribute {name!r}")


__all__ = ["DFMP2", "DFMP2Error", "InputError", "ComputationError", "__version__"]
