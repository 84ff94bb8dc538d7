"""Chemistry, with PySCF: the only layer (with `dfmp2.api.pyscf_plugin`) that talks to PySCF.

It reads molecules, chooses basis and fitting sets, runs the RHF, UHF or ROHF reference (and
Kohn-Sham ones for double hybrids), checks it, and hands the MP2 layer plain arrays:

    three-center integrals (mn|P)   [naux block, nao, nao]   Hartree, fp64
    Coulomb metric         (P|Q)    [naux, naux]              Hartree, fp64
    orbitals C [nao, nmo], orbital energies e [nmo] (Hartree), occupations [nmo] (RHF); the
    same per spin ([2, nao, nmo], ...) for UHF and for ROHF's semicanonical orbitals, with the
    ROHF Fock matrices in that basis (for the singles)

    molecule      XYZ files, atoms, geometry checks           basis        basis/fitting sets, ECPs
    scf           running, restoring, hooking PySCF's SCF      reference    mean-field checks, frozen core
    integrals     (mn|P) and (P|Q) providers, Cholesky vectors cphf         the orbital response
    derivatives   derivative integrals, SCF gradient terms    jk           dfmp2's own J/K builds
    functionals   double hybrids                              charges      a molecule's and its fragments' charge, 2S

PySCF is imported inside functions, so that `dfmp2 --help` and `dfmp2 info` stay fast.
This package's namespace holds the public names of its modules (`chem.run_scf`, ...).
"""

from .basis import atomic_number, basis_name  # noqa: F401
from .basis import (BASIS_LOOKUP_ERRORS, BSE, ECP_FROM_BSE_MIN_Z, GENERATED, EffectiveCorePotentials, FittingSet,
                    basis_by_element, build_molecule, choose_ecp, ecp_record, fitting_basis, named_fitting_set,
                    pyscf_basis, pyscf_fitting_choice)
from .charges import ChargeSpin, charge_and_spin  # noqa: F401
from .cphf import fock_response_vo, response_potentials, solve_cphf  # noqa: F401
from .derivatives import DERIVATIVE_BLOCK_BYTES, SCFGradientTerms, mnP_derivative_contraction  # noqa: F401
from .integrals import CholeskyVectors, EarlyIntegrals, MNPIntegrals, pair_bounds  # noqa: F401
from .molecule import (GHOST_FORMS, MAX_ATOMS, MAX_COORDINATE, MAX_LINE, MAX_TRAILER, MIN_DISTANCE, Atom,  # noqa: F401
                       Fragment, Frame, angstrom_per_bohr, atom_symbols, check_geometry, element_symbol, format_xyz,
                       FrameError, formula, is_ghost, quoted, read_frames, read_xyz)
from .reference import (NOBLE_GAS_CORES, MeanField, check_gamma_point, dipole_moment, frozen_core_count,  # noqa: F401
                        is_kohn_sham, is_periodic, mean_field_orbitals, overlap_matrix, per_spin_orbitals,
                        reference_kind, semicanonical_orbitals, with_orbitals, write_molden)
from .scf import (KS_CONV_TOL, KS_CONV_TOL_GRAD, REFERENCES, SCF_CONV_TOL, SCF_CONV_TOL_GRAD, check_xc,  # noqa: F401
                  choose_reference, copy_with_builds, density_factors, fitted_builds_of, is_range_separated,
                  jk_auxbasis_of, jk_fitting_integrals, pyscf_scratch, pyscf_threads, reference_fitting_integrals,
                  release_integrals, restored_scf, restored_scf_from, run_scf, run_scratch, scf_arrays, scf_auxbasis_name, scf_mode,
                  use_fitted_builds)


from ..util.deprecated import MISSING as _MISSING, renamed as _renamed  # noqa: E402

OLD_NAMES = {"ThreeCenterIntegrals": "MNPIntegrals"}  # deprecated names (CHANGELOG.md) -> their new ones


def __getattr__(name):
    found = _renamed(__name__, OLD_NAMES, name, globals())
    if found is _MISSING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found
