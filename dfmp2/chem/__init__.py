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
    functionals   double hybrids

PySCF is imported inside functions, so that `dfmp2 --help` and `dfmp2 info` stay fast.
This package's namespace holds the public names of its modules (`chem.run_scf`, ...).
"""

from .molecule import (Atom, MAX_ATOMS, MAX_LINE, MAX_TRAILER, MIN_DISTANCE, MAX_COORDINATE, read_xyz, format_xyz,
                       angstrom_per_bohr, check_geometry, formula, atom_symbols)  # noqa: F401
from .basis import (BASIS_LOOKUP_ERRORS, ECP_FROM_BSE_MIN_Z, EffectiveCorePotentials, choose_ecp, build_molecule,
                    GENERATED, BSE, FittingSet, fitting_basis, pyscf_fitting_choice, named_fitting_set, ecp_record,
                    basis_name)  # noqa: F401
from .scf import (SCF_CONV_TOL, SCF_CONV_TOL_GRAD, KS_CONV_TOL, KS_CONV_TOL_GRAD, REFERENCES, release_integrals,
                  pyscf_scratch, choose_reference, check_xc, is_range_separated, run_scf, jk_fitting_integrals,
                  jk_auxbasis_of, use_fitted_builds, reference_fitting_integrals, copy_with_builds, fitted_builds_of,
                  density_factors, scf_arrays, restored_scf, restored_scf_from, scf_mode, scf_auxbasis_name)  # noqa: F401
from .reference import (MeanField, mean_field_orbitals, with_orbitals, overlap_matrix, reference_kind, is_kohn_sham,
                        semicanonical_orbitals, NOBLE_GAS_CORES, frozen_core_count, check_gamma_point, is_periodic,
                        write_molden, per_spin_orbitals, dipole_moment)  # noqa: F401
from .integrals import (ThreeCenterIntegrals, pair_bounds, EarlyIntegrals, CholeskyVectors)  # noqa: F401
from .cphf import (fock_response_vo, response_potentials, solve_cphf)  # noqa: F401
from .derivatives import (SCFGradientTerms, DERIVATIVE_BLOCK_BYTES, three_center_derivative_contraction)  # noqa: F401
