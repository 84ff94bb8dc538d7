"""dfmp2's J/K builds in a user's PySCF mean field (`use_dfmp2_jk`)."""

from __future__ import annotations

from contextlib import nullcontext

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
    builds = FittedCoulombExchange(backend, integrals, precision, *_budget_of(mf, max_memory))
    return chem.use_fitted_builds(mf, builds)


def _budget_of(mf, max_memory) -> tuple:
    """(max_memory, scratch, metric_factor, rule) of the builds: max_memory where given (the user's
    figure), else mf.max_memory where the user set it; PySCF's own default (pyscf.lib.param.MAX_MEMORY,
    which nobody chose) is one more limit of the budget instead (`budget.caller_limit`, as the drop-in
    takes it), never above the system's limits and warned of by none."""
    from functools import partial

    from pyscf import lib

    from ..run.budget import caller_limit
    from ..util.system_memory import MB

    if max_memory is not None:
        return max_memory, None, None, nullcontext
    figure = getattr(mf, "max_memory", None)
    if figure is None or figure != lib.param.MAX_MEMORY:
        return figure, None, None, nullcontext
    return None, None, None, partial(caller_limit, int(figure * MB), f"PySCF's default max_memory: {figure:g} MB")
