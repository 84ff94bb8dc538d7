"""Everything a run decides before its SCF (`driver` runs the flow after them): the offered
precision, the properties asked for, the request (`pipeline.check_request`, once per run), the
molecule (geometry, configuration, double hybrid, ECPs, basis, JK-fit set), the frozen core and
the memory budget. Each raises InputError (MemoryBudgetError for the budget) naming the first
problem, before anything expensive is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import chem
from ..chem.functionals import double_hybrid
from ..chem.jk import fitted_bytes
from ..kernels import SPLIT_PRECISIONS
from ..kernels.protocol import FittedBuildsBackend
from ..mp2.pipeline import check_request, sos_scaling
from ..mp2.response import PROPERTIES
from ..run.budget import limit_needed, pyscf_max_memory
from ..run.memory import RESPONSE_JK_GROWTH, gradient_least_bytes, plan_for
from ..run.settings import Settings, settings_from
from ..util import environment
from ..util.cpu_config import check_environment
from ..util.errors import InputError, MemoryBudgetError, option
from ..util.start_up import SCF_GROWTH, stages_to_come
from ..util.system_memory import MB


def offered_precision(settings: Settings) -> Settings:
    """settings, unless they ask for a split-precision mode (tf32x3, bf16x3) for energies: on an
    NVIDIA H200 those were up to 36 uEh from fp64 on the reference set (the tensor cores truncate
    their fp32 sums; benchmarks/results/reference_cuda.json), outside the 1 uEh they would need
    to be offered. `dfmp2 bench` still times them (InputError here)."""
    if settings.precision in SPLIT_PRECISIONS:
        raise InputError(f"{option('precision', settings.precision)} is not offered for energies: on an NVIDIA H200 it was "
                         "0.05-36 uEh from fp64 on the reference set (the tensor cores truncate their fp32 sums; "
                         f"docs/benchmarks.md); use fp32 or fp64. `dfmp2 bench --precision {settings.precision}` "
                         "times it")
    return settings


def with_properties(settings: Settings) -> Settings:
    """settings, with the densities the relaxed properties need (settings.properties: of
    PROPERTIES) asked for; InputError for an unknown property."""
    unknown = [name for name in settings.properties if name not in PROPERTIES]
    if unknown:
        raise InputError(f"unknown property {unknown[0]!r} (use one of: {', '.join(PROPERTIES)})")
    if settings.gradient and chem.choose_reference(settings.spin, settings.reference) == "rohf":
        raise InputError("analytic DF-MP2 gradients of ROHF references are not implemented (RHF and UHF are; "
                         f"use {option('reference', 'uhf')})")
    wanted = settings.properties or settings.gradient
    if wanted and settings.xc is not None:
        if chem.choose_reference(settings.spin, settings.reference) == "rohf":
            raise InputError("relaxed densities and gradients of ROKS double hybrids are not implemented (RKS and "
                             f"UKS double hybrids are: use {option('reference', 'uhf')})")
        dh = double_hybrid(settings.xc, settings.c_os, settings.c_ss)
        if chem.is_range_separated(dh.xc):  # refused here, before the SCF: not after it (and the MP2 step)
            raise InputError(f"analytic gradients and relaxed properties of range-separated functionals ({dh.xc}) "
                             "are not implemented; their energies are")
        settings = settings.replace(rdm1_scaling=(dh.c_os, dh.c_ss))  # the density of c_os E_os + c_ss E_ss
    if wanted and settings.method == "sos-mp2":  # SOS-MP2's: c_os E_os (through the pair loop: the amplitudes)
        settings = settings.replace(rdm1_scaling=(sos_scaling(settings), 0.0))
    return settings.replace(with_rdm1=True, with_gamma=True) if wanted else settings


def check_atoms(atoms, settings: Settings | None = None, **changes) -> None:
    """Every check run_atoms makes before its SCF that needs no device (the request, the geometry,
    charge and spin, ECPs, the basis and fitting sets, frozen core): InputError naming the first
    problem, nothing computed. A composite checks each of its systems so before any runs."""
    settings = with_properties(offered_precision(settings_from(settings, **changes)))
    chem.check_geometry(atoms)
    molecule = molecule_of(atoms, settings, ranks=1)
    chem.MNPIntegrals(molecule.mol, settings.auxbasis)  # the MP2-fit set for every element
    with_frozen_core(settings, molecule.mol, occupied_orbitals(molecule.mol, settings, molecule.reference))


def check_mean_field_request(settings, nspin, semicanonical, ranks, given=None) -> None:
    """`pipeline.check_request` for run_mean_field's reference: nspin spin channels (1 or 2),
    semicanonical (ROHF's semicanonical Fock matrix); given: B given by the caller."""
    check_request(settings, nspin, ranks, given, semicanonical=semicanonical)


def _check_molecule_request(settings, reference, ranks):
    """InputError for a request run_atoms cannot do (before anything is computed)."""
    check_request(settings, 1 if reference == "rhf" else 2, ranks, semicanonical=reference == "rohf")
    if settings.frozen_core and settings.frozen is not None:
        raise InputError("give frozen_core or frozen, not both")


@dataclass
class Molecule:
    """What run_atoms makes of its atoms before anything is computed."""
    reference: str  # rhf, uhf or rohf
    dh: object  # the double hybrid (chem.functionals), or None
    ecp: object  # chem.EffectiveCorePotentials
    mol: object  # the PySCF Mole
    jk_fitting: object  # the SCF's JK-fit set (None: exact integrals)


def molecule_of(atoms, settings, ranks) -> Molecule:
    """The checked request's molecule (`Molecule`): InputError before anything is computed."""
    check_environment()  # dfmp2's own configuration variables (util.cpu_config)
    environment.check_values()  # and the launch's numbers (ranks, Slurm's memory)
    reference = chem.choose_reference(settings.spin, settings.reference)
    _check_molecule_request(settings, reference, ranks)
    dh = double_hybrid(settings.xc, settings.c_os, settings.c_ss) if settings.xc is not None else None
    if dh is not None:
        chem.check_xc(dh.xc)
    # ghosts carry no ECP (Psi4); an ECP library named for a ghost's element covers something here
    ecp = chem.choose_ecp([a.symbol for a in atoms if not a.ghost], settings.basis, settings.ecp,
                          [a.symbol for a in atoms if a.ghost])
    mol = chem.build_molecule(atoms, settings.basis, settings.charge, settings.spin,
                              pyscf_max_memory(settings.max_memory), ecp, settings.cartesian)
    return Molecule(reference, dh, ecp, mol, jk_fitting_set(settings, mol))


def occupied_orbitals(mol, settings, reference) -> list:
    """Occupied orbitals per spin channel (one: restricted)."""
    return [(mol.nelectron + sign * settings.spin) // 2 for sign in ((1,) if reference == "rhf" else (1, -1))]


def jk_fitting_set(settings, mol):
    """The SCF's JK-fit set (None for an exact SCF): settings.jk_auxbasis where given, else the
    JK-fit set PySCF pairs with the orbital basis."""
    if settings.scf != "df":
        if settings.jk_auxbasis is not None:
            raise InputError(f"{option('jk_auxbasis')} is the density-fitted SCF's fitting set: "
                             f"{option('scf', 'exact')} fits nothing")
        return None
    if settings.jk_auxbasis is not None:
        return chem.named_fitting_set(settings.jk_auxbasis, mol)
    return chem.fitting_basis(mol, mp2fit=False)


def with_frozen_core(settings, mol, spins) -> Settings:
    """settings with frozen = the chemical core's orbital count when frozen_core asks for it
    (InputError if that leaves a spin without an active occupied orbital); spins: the occupied
    orbital count of each spin channel (one restricted, alpha and beta otherwise)."""
    if not settings.frozen_core:
        return settings
    nfrozen = chem.frozen_core_count(mol)
    for n, name in zip(spins, ("alpha", "beta")):
        if n <= nfrozen:
            label = f"{name} " if len(spins) == 2 else ""
            raise InputError(f"{option('frozen_core')} freezes {nfrozen} orbitals, leaving no active {label}occupied orbital")
    return settings.replace(frozen=nfrozen or None)


def check_budget(backend, integrals, spins, settings, context, mol=None, jk_fitting=None, early=None):
    """MemoryBudgetError before the SCF where the MP2 step's smallest blocks do not fit, or (a gradient) the
    gradient's (memory.gradient_least_bytes) above them; spins: occupied orbitals per spin channel; jk_fitting:
    the SCF's JK-fit set (None: exact); early: its `chem.EarlyIntegrals` (the run's, not its footprint) or None."""
    nfrozen = (settings.frozen or 0) if settings.frozen_core else 0  # (a list of frozen orbitals: checked later)
    plan = plan_for(backend, integrals, [(n - nfrozen, integrals.nao - n) for n in spins], settings.max_memory,
                    ranks=context.ranks, growth=SCF_GROWTH, gamma=settings.with_gamma,
                    held=early.held_bytes() if early is not None else 0, stages=stages_to_come(scf=True))
    if not settings.gradient or mol is None:
        return
    jk = chem.MNPIntegrals(mol, jk_fitting.basis) if jk_fitting is not None else None
    if jk is None:
        response_jk = RESPONSE_JK_GROWTH  # PySCF's exact J/K
    elif settings.scf_backend == "pyscf" or not isinstance(backend, FittedBuildsBackend):
        # PySCF's DF J/K (response.response_mean_field): out of core in RESPONSE_JK_GROWTH, or in core where less
        response_jk = min(RESPONSE_JK_GROWTH, 3 * fitted_bytes(jk) + 2 * jk.naux * jk.naux * 8)
    else:  # dfmp2's builds: the SCF's own builds, which need as much, check it at their set-up
        response_jk = 0
    least = plan.minimum + gradient_least_bytes(integrals.nao, integrals.naux, jk.naux if jk else 0, spins, response_jk)
    if least > plan.budget:
        raise MemoryBudgetError(
            f"the gradient needs at least {least / MB:.4g} MB even in the smallest blocks (the MP2 steps' {plan.minimum / MB:.4g} "
            f"MB, {plan.baseline / MB:.4g} MB of it resident after the SCF, then the metrics, the reference term's blocks "
            f"and the response's J/K); the memory budget is {plan.budget / MB:.4g} MB ({plan.budget_source})"
            + limit_needed(plan.budget_binding, plan.budget, least))
