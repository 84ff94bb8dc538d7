"""dfmp2: density-fitted MP2 (RI-MP2) correlation energies on CPUs, NVIDIA GPUs and AWS Trainium
(NKI kernels; emulated where no Trainium is present).

    from dfmp2 import DFMP2
    pt = DFMP2(mf).run()        # mf: a converged PySCF RHF, UHF or ROHF
    pt.e_corr, pt.e_tot

    import dfmp2
    result = dfmp2.run_xyz("water.xyz", basis="cc-pvtz", frozen_core=True)   # as `dfmp2 run`
    result.e_tot, result.as_dict()
"""

import os as _os

from .util.version import __version__  # noqa: E402, F401 (re-exported: dfmp2.__version__)

# torch and PySCF each load their own OpenMP runtime. With OpenMP's default "active" wait
# policy the idle pool of one spins on the cores the other needs: on 2 cores the integral and
# transform steps ran 1.5-3x slower. Passive waiting removes that; an explicit setting wins.
# Effective only if set before torch/PySCF load (true for the CLI; a PySCF script that imports
# pyscf before dfmp2 can export OMP_WAIT_POLICY=PASSIVE itself).
from .util.cpu_config import set_thread_defaults as _set_thread_defaults  # noqa: E402

_set_thread_defaults()  # OMP_WAIT_POLICY=PASSIVE, unless the user set it (recorded: util.cpu_config)
# The same for OpenBLAS (numpy's and SciPy's are two libraries with a thread pool each): its
# idle threads spin for 2^28 cycles (~0.1 s) after every call, against torch's and each other's
# work; 2^4 lets them sleep at once. Measured on 2 cores: PySCF's eigensolver in the SCF 0.5 s
# against 1.1 s, the whole `dfmp2 run` of naphthalene/cc-pVTZ 13.6-14.2 s against 15.6-17.2 s.
# (OPENBLAS_THREAD_TIMEOUT=4, set by the same call)

from .util.errors import ComputationError, DFMP2Error, InputError, MemoryBudgetError  # noqa: E402


_LAZY = {  # name -> module: these import torch and PySCF, so they load on first use only
    "DFMP2": "api.pyscf_plugin", "DFUMP2": "api.pyscf_plugin", "DFROMP2": "api.pyscf_plugin",
    "use_dfmp2_jk": "api.pyscf_jk",
    "run_xyz": "api.driver", "run_atoms": "api.driver", "run_mean_field": "api.driver", "DFMP2Result": "api.result",
    "Settings": "run.settings",
    "run_qcschema": "api.qcschema",
}


def register_qcengine():
    """Register dfmp2 with QCEngine as program "dfmp2" (idempotent; imports qcengine, which
    `import dfmp2` does not): `dfmp2.api.qcengine_harness`."""
    from .api.qcengine_harness import register

    return register()


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'dfmp2' has no attribute {name!r}")


__all__ = [*_LAZY, "register_qcengine", "DFMP2Error", "InputError", "MemoryBudgetError", "ComputationError",
           "__version__"]
