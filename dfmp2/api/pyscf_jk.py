"""dfmp2's J/K builds in a user's PySCF mean field (`use_dfmp2_jk`)."""

from __future__ import annotations

from .. import chem
from ..util.errors import InputError


def use_dfmp2_jk(mf, device="cpu", precision=None, max_memory=None):
    """Make a density-fitted PySCF mean field `mf` (RHF, UHF, ROHF, RKS, UKS, ROKS) build its
    Coulomb and exchange matrices with dfmp2 on `device` (cpu or cuda), as gpu4pyscf's to_gpu()
    moves a whole SCF: PySCF's driver (DIIS, damping, convergence) and the exchange-correlation
    quadrature stay as they are. precision: mixed (default) or fp64 (`dfmp2.chem.jk`); max_memory:
    MB for the process (default: mf.max_memory). The JK-fit set is mf.with_df's. Returns mf
    (changed in place); dfmp2's DFMP2 on it records scf_backend "torch".

        mf = dfmp2.use_dfmp2_jk(scf.RHF(mol).density_fit(), device="cpu").run()
    """
    from ..chem.jk import FittedCoulombExchange, check_scf_precision
    from ..kernels import get_backend
    from ..kernels.protocol import FittedBuildsBackend

    if getattr(mf, "with_df", None) is None:
        raise InputError("use_dfmp2_jk needs a density-fitted mean field: call mf.density_fit() first")
    if precision is not None:
        precision = check_scf_precision(precision)  # before any integral is computed (any case, as Settings)
    backend = get_backend(device)
    if not isinstance(backend, FittedBuildsBackend):
        raise InputError(f"the {backend.name} backend ({device}) has no SCF builds")
    integrals = chem.jk_fitting_integrals(mf.mol, chem.jk_auxbasis_of(mf))
    builds = FittedCoulombExchange(backend, integrals, precision,
                                   max_memory if max_memory is not None else getattr(mf, "max_memory", None))
    return chem.use_fitted_builds(mf, builds)
