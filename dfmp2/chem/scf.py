"""The SCF with PySCF's driver: run, restored from arrays, dfmp2's builds plugged in."""

from __future__ import annotations

import contextlib

import numpy as np

from ..run.checkpoint import checkpoint_scratch
from ..run.settings import SCF_MAX_CYCLE
from ..util.errors import ComputationError, ConvergenceError, InputError, option
from ..util.scratch import holding, scratch_directory
from .basis import describe_basis, fitting_basis
from .integrals import EarlyIntegrals, MNPIntegrals

SCF_CONV_TOL = 1e-11  # Hartree; with SCF_CONV_TOL_GRAD keeps e_corr stable to well below 1e-8 Eh


SCF_CONV_TOL_GRAD = 1e-7


# Kohn-Sham: the DFT grid's noise keeps the orbital gradient above ~1e-7; 1e-10 Eh / 1e-6 still
# leaves the energy stable to ~1e-10 Eh
KS_CONV_TOL, KS_CONV_TOL_GRAD = 1e-10, 1e-6


REFERENCES = ("rhf", "uhf", "rohf")


def release_integrals(mf) -> None:
    """Free the SCF's own integrals (DF tensor or four-center ERIs) of a mean field this run
    made, once its orbitals are taken: MP2 uses its own, and they would count against the
    memory budget."""
    with_df = getattr(mf, "with_df", None)
    if with_df is not None:
        with_df.reset()
    if getattr(mf, "_eri", None) is not None:
        mf._eri = None


@contextlib.contextmanager
def pyscf_scratch(scratch=None):
    """Within: PySCF's temporary files (pyscf.lib.param.TMPDIR: out-of-core DF tensors, any
    chkfile) go to a new scratch directory of kind "pyscf" under `util.scratch.scratch_root(scratch)`,
    named and locked by the run (`util.scratch.scratch_directory`: a checkpoint's resume removes a
    killed run's), removed on the way out however the run ends; nested uses share the outer one.
    InputError before anything runs when the directory cannot be made (a read-only PYSCF_TMPDIR or
    TMPDIR, a missing --scratch)."""
    from pyscf.lib import param

    if param.TMPDIR in holding():
        yield param.TMPDIR
        return
    with scratch_directory("pyscf", scratch) as directory:
        previous, param.TMPDIR = param.TMPDIR, directory
        try:
            yield directory
        finally:
            param.TMPDIR = previous


@contextlib.contextmanager
def run_scratch(settings, team=None):
    """Within: a run's scratch (`run.checkpoint.checkpoint_scratch`: settings.checkpoint locked
    first, every scratch directory made within named by it) and PySCF's temporary files in a
    directory of it (`pyscf_scratch`). Gives that directory."""
    with checkpoint_scratch(settings, team), pyscf_scratch(settings.scratch) as directory:
        yield directory


@contextlib.contextmanager
def pyscf_threads(count: int):
    """Within: PySCF's OpenMP thread count (`pyscf.lib.num_threads`) is `count`; restored on the
    way out."""
    from pyscf import lib

    previous = lib.num_threads()
    lib.num_threads(count)
    try:
        yield
    finally:
        lib.num_threads(previous)


def choose_reference(spin: int, reference: str | None) -> str:
    """The SCF reference: `reference` if given (rhf, uhf, rohf), else RHF for a closed shell
    (spin 0) and UHF for an open one. RHF with spin > 0 is bad input."""
    if reference is None:
        return "rhf" if spin == 0 else "uhf"
    if reference not in REFERENCES:
        raise InputError(f"unknown reference {reference!r} (use one of: {', '.join(REFERENCES)})")
    if reference == "rhf" and spin != 0:
        raise InputError(f"RHF needs a closed shell, but 2S = {spin}: use {option('reference', 'uhf')} or rohf")
    return reference


def check_xc(xc: str) -> None:
    """InputError unless PySCF's libxc can parse the xc string (checked before any SCF)."""
    from pyscf.dft import libxc

    try:
        libxc.parse_xc(xc)
    except (KeyError, ValueError) as exc:
        raise InputError(f"xc {xc!r} is not a functional PySCF knows ({exc})") from None


def is_range_separated(xc: str | None) -> bool:
    """Whether the PySCF xc string has range-separated exchange (omega != 0)."""
    if xc is None:
        return False
    from pyscf.dft import libxc

    return libxc.rsh_coeff(xc)[0] != 0


def run_scf(mol, scf: str = "df", max_cycle: int = SCF_MAX_CYCLE, reference: str = "rhf",
            jk_auxbasis=None, xc: str | None = None, progress=None, builds=None):
    """Converged RHF, UHF or ROHF (`reference`). scf='df': density-fitted with `jk_auxbasis`
    (default: `fitting_basis(mol, mp2fit=False)`, PySCF's JK-fit set, generated per element where
    it has none); scf='exact': conventional four-center integrals. Raises ConvergenceError (a
    ComputationError) if not converged. xc: Kohn-Sham instead of Hartree-Fock (RKS, UKS, ROKS) with that PySCF xc
    string (PySCF's default grid). builds: dfmp2's Coulomb/exchange builds
    (`dfmp2.chem.jk.FittedCoulombExchange`, scf='df' only) instead of PySCF's (the caller closes them)."""
    mf = _scf_object(mol, scf, max_cycle, reference, jk_auxbasis, xc)
    if builds is not None:
        use_fitted_builds(mf, builds)
    last = {}  # the last cycle's F(D) = h + G(D) (no DIIS) and overlap

    def each_cycle(envs):
        last.update(fock=envs["fock"], s1e=envs["s1e"])
        if progress is not None:
            progress("SCF cycle", int(envs.get("cycle", 0)) + 1, None)

    mf.callback = each_cycle
    mf.conv_check = False  # PySCF's extra cycle: its diagonalisation is kept (canonical_orbitals), its build is not
    mf.kernel()
    if not mf.converged:
        raise ConvergenceError(
            f"{reference.upper() if xc is None else reference.upper().replace('HF', 'KS')} SCF did not converge in {max_cycle} cycles (last energy {mf.e_tot:.10f} Eh)")
    return canonical_orbitals(mf, last["fock"], last["s1e"])


def canonical_orbitals(mf, fock, s1e):
    """`mf` holding the orbitals of F(D) = h + G(D) of its converged density (the last cycle's, no
    DIIS) and their occupations: the diagonalisation of PySCF's conv_check cycle, without that
    cycle's build of G. The cycle's own orbitals diagonalise the DIIS-extrapolated Fock matrix; these
    are what PySCF's conv_check gives. e_tot stays E(D) of the last cycle (PySCF's extra cycle moves
    it by less than 10 conv_tol, 1e-10 Eh here).
        F C = S C e,  mo_occ from e (aufbau)"""
    mo_energy, mo_coeff = mf.eig(fock, s1e)
    mf.mo_energy, mf.mo_coeff, mf.mo_occ = mo_energy, mo_coeff, mf.get_occ(mo_energy, mo_coeff)
    return mf


def jk_fitting_integrals(mol, jk_auxbasis, early=False):
    """The SCF's JK-fit three-center integrals (an IntegralProvider with packed()); early: an
    `EarlyIntegrals`, which computes them on a thread once started."""
    return EarlyIntegrals(mol, jk_auxbasis) if early else MNPIntegrals(mol, jk_auxbasis)


def jk_auxbasis_of(mf):
    """The JK-fit basis of a density-fitted mean field: with_df.auxbasis, or PySCF's default for it."""
    from pyscf import df

    return mf.with_df.auxbasis if mf.with_df.auxbasis is not None else df.make_auxbasis(mf.mol)


def use_fitted_builds(mf, builds):
    """Make the density-fitted mean field `mf` take its Coulomb and exchange matrices from
    `builds` (a `dfmp2.chem.jk.FittedCoulombExchange`) instead of PySCF's own: its with_df's get_jk
    is replaced (PySCF's SCF, Kohn-Sham and response code all call it). Range-separated
    exchange (omega) is refused. Returns mf."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        raise InputError("dfmp2's SCF builds need a density-fitted mean field (mf.density_fit())")

    def get_jk(dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega:
            raise InputError(f"range-separated exchange (omega) is not built by dfmp2: use {option('scf_backend', 'pyscf')}")
        if with_df.mol is not builds.integrals.mol:  # mf.reset(new_mol), e.g. a geometry scan: new integrals
            builds.reset(jk_fitting_integrals(with_df.mol, builds.integrals.fitting.basis))
        dms, factors, shape = density_factors(dm)
        vj, vk = builds.get_jk(dms, factors, with_j, with_k, hermi)
        return (None if vj is None else vj.reshape(shape)), (None if vk is None else vk.reshape(shape))

    with_df.get_jk = get_jk
    with_df.dfmp2_builds = builds
    return mf


def reference_fitting_integrals(mf):
    """The fitting set of a density-fitted mean field's J/K as MNPIntegrals (its
    with_df's auxiliary basis), or None for one with exact integrals."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        return None
    auxmol = getattr(with_df, "auxmol", None)
    return MNPIntegrals(mf.mol, auxmol._basis if auxmol is not None else jk_auxbasis_of(mf))


def copy_with_builds(mf, builds):
    """A shallow copy of the density-fitted mean field `mf` (and of its with_df) whose J and K
    come from `builds` (use_fitted_builds); mf itself is left as it was."""
    import copy

    twin = copy.copy(mf)
    twin.with_df = copy.copy(mf.with_df)
    return use_fitted_builds(twin, builds)


def fitted_builds_of(mf):
    """The dfmp2 builds `use_fitted_builds` gave mf, or None (PySCF's own)."""
    return getattr(getattr(mf, "with_df", None), "dfmp2_builds", None)


def density_factors(dm) -> tuple:
    """PySCF density matrices and, where PySCF tags them with mo_coeff and mo_occ (RHF, UHF, ROHF,
    Kohn-Sham), their occupied orbitals as factors: (dms [nset, nao, nao], [(L = C_occ n^1/2,
    None, None) or None per density], the shape to give the results). Tags that do not describe
    the densities (L L^T != D) are not used; the builds factor such densities themselves
    (`jk.density_factor`)."""
    shape = np.shape(dm)
    dms = np.asarray(dm, dtype=np.float64).reshape(-1, shape[-2], shape[-1])
    mo_coeff, mo_occ = getattr(dm, "mo_coeff", None), getattr(dm, "mo_occ", None)
    if mo_coeff is not None and mo_occ is not None:
        coeffs, occs = _spin_orbitals(np.asarray(mo_coeff), np.asarray(mo_occ), len(dms))
        if coeffs is not None:
            factors = [(c[:, n > 0] * np.sqrt(n[n > 0]), None, None) for c, n in zip(coeffs, occs)]
            if all(np.abs(l @ l.T - d).max() <= 1e-10 * max(1.0, np.abs(d).max()) for (l, _, _), d in zip(factors, dms)):
                return dms, factors, shape
    return dms, [None] * len(dms), shape


def _spin_orbitals(mo_coeff, mo_occ, nset) -> tuple:
    """(orbitals, occupations) per density of a tagged PySCF density (None, None where the tags
    do not describe the densities one to one)."""
    if nset == 1 and mo_coeff.ndim == 2 and mo_occ.ndim == 1:  # restricted
        return [mo_coeff], [mo_occ]
    if nset == 2 and mo_coeff.ndim == 3 and mo_occ.ndim == 2:  # unrestricted
        return list(mo_coeff), list(mo_occ)
    if nset == 2 and mo_coeff.ndim == 2 and mo_occ.ndim == 1:  # restricted open shell
        return [mo_coeff, mo_coeff], [(mo_occ > 0).astype(float), (mo_occ > 1).astype(float)]
    return None, None


def scf_arrays(mf) -> dict:
    """What a converged SCF is, for a checkpoint: mo_coeff, mo_energy, mo_occ, e_tot (Eh)."""
    return {"mo_coeff": np.asarray(mf.mo_coeff), "mo_energy": np.asarray(mf.mo_energy),
            "mo_occ": np.asarray(mf.mo_occ), "e_tot": np.float64(mf.e_tot)}


def restored_scf(mol, arrays, scf: str = "df", reference: str = "rhf", jk_auxbasis=None, xc=None):
    """The SCF object `run_scf` would return, holding `arrays` (`scf_arrays` of an earlier run)
    instead of iterating again."""
    mf = _scf_object(mol, scf, SCF_MAX_CYCLE, reference, jk_auxbasis, xc)
    mf.converged = True
    return _hold_arrays(mf, arrays)


def restored_scf_from(mf, arrays):
    """A copy of the converged mean field `mf` holding `arrays` (`scf_arrays`, e.g. rank 0's)."""
    return _hold_arrays(mf.copy(), arrays)


def _hold_arrays(mf, arrays):
    """`mf` with the orbitals and energy of `arrays` (`scf_arrays`)."""
    mf.mo_coeff, mf.mo_energy, mf.mo_occ = arrays["mo_coeff"], arrays["mo_energy"], arrays["mo_occ"]
    mf.e_tot = float(arrays["e_tot"])
    return mf


def _scf_object(mol, scf, max_cycle, reference, jk_auxbasis, xc):
    """The configured (not yet run) PySCF mean-field object of `run_scf`."""
    from pyscf import dft
    from pyscf import scf as pyscf_scf

    if scf not in ("df", "exact"):
        raise InputError(f"unknown SCF mode {scf!r} (use 'df' or 'exact')")
    reference = choose_reference(mol.spin, reference)
    if xc is None:
        mf = {"rhf": pyscf_scf.RHF, "uhf": pyscf_scf.UHF, "rohf": pyscf_scf.ROHF}[reference](mol)
    else:
        check_xc(xc)
        mf = {"rhf": dft.RKS, "uhf": dft.UKS, "rohf": dft.ROKS}[reference](mol, xc=xc)
    if scf == "df":
        mf = mf.density_fit(auxbasis=jk_auxbasis if jk_auxbasis is not None else fitting_basis(mol, False).basis)
    mf.conv_tol = SCF_CONV_TOL if xc is None else KS_CONV_TOL
    mf.conv_tol_grad = SCF_CONV_TOL_GRAD if xc is None else KS_CONV_TOL_GRAD
    mf.max_cycle = max_cycle
    mf.verbose = 0
    _without_chkfile(mf)
    return mf


def _without_chkfile(mf) -> None:
    """dfmp2's SCF keeps no PySCF chkfile (a run's checkpoint is dfmp2's own): the temporary file
    PySCF opened for it when the object was made is closed (and so deleted) at once, and nothing
    is dumped, so that no run, however it ends, leaves one behind."""
    opened = getattr(mf, "_chkfile", None)
    mf.chkfile = None
    if opened is not None:
        opened.close()
        mf._chkfile = None


def scf_mode(mf) -> str:
    """'df' if the mean field used density fitting, else 'exact'."""
    return "df" if getattr(mf, "with_df", None) is not None else "exact"


def scf_auxbasis_name(mf):
    """Name of the JK-fit basis a density-fitted SCF used, or None."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        return None
    from pyscf import df

    aux = with_df.auxbasis or df.make_auxbasis(mf.mol)
    return describe_basis(aux)
