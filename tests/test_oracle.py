"""The small readable DF-MP2 (`dfmp2.mp2.oracle`): checked against PySCF's own DF-MP2 (energies of
RHF water and the UHF hydroxyl radical, the RHF unrelaxed density of dfmp2_native), then taken as
the reference the pipeline must match in fp64 (1e-10 Eh; densities 1e-10 per element)."""

import numpy as np
import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfmp2, dfmp2_native, dfump2

from conftest import converged_rhf
from dfmp2 import DFMP2
from dfmp2.mp2.oracle import dfmp2_oracle

AUX = "cc-pvdz-ri"


def _oracle(mf):
    """The oracle on a PySCF mean field: (mn|P), (P|Q) and its spin channels."""
    mol = mf.mol
    auxmol = df.addons.make_auxmol(mol, AUX)
    mnP = df.incore.aux_e2(mol, auxmol, "int3c2e", aosym="s1").reshape(mol.nao, mol.nao, -1).transpose(2, 0, 1)
    coeffs, energies, occs = (([mf.mo_coeff], [mf.mo_energy], [mf.mo_occ]) if np.ndim(mf.mo_occ) == 1
                              else (mf.mo_coeff, mf.mo_energy, mf.mo_occ))
    channels = [(c[:, o > 0], c[:, o == 0], e[o > 0], e[o == 0]) for c, e, o in zip(coeffs, energies, occs)]
    return dfmp2_oracle(mnP, auxmol.intor("int2c2e"), channels)


@pytest.fixture(scope="module")
def water():
    return converged_rhf("water", "cc-pvdz")


@pytest.fixture(scope="module")
def hydroxyl():
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    return scf.UHF(mol).run(conv_tol=1e-11, conv_tol_grad=1e-7)


def test_the_oracle_is_pyscfs_dfmp2(water, hydroxyl):
    rhf, uhf = _oracle(water), _oracle(hydroxyl)
    ref = dfmp2.DFMP2(water)
    ref.with_df.auxbasis = AUX
    ref.kernel()
    assert rhf["e_corr"] == pytest.approx(ref.e_corr, abs=1e-10)
    native = dfmp2_native.DFMP2(water, auxbasis=AUX)
    nocc = int(np.count_nonzero(water.mo_occ))
    correction = native.make_rdm1() - np.diag(water.mo_occ)
    p_oo, p_vv = rhf["densities"][0]
    assert np.abs(2 * p_oo - correction[:nocc, :nocc]).max() < 1e-10  # RHF: both spins
    assert np.abs(2 * p_vv - correction[nocc:, nocc:]).max() < 1e-10
    ref_u = dfump2.DFUMP2(hydroxyl)
    ref_u.with_df.auxbasis = AUX
    ref_u.kernel()
    assert uhf["e_corr"] == pytest.approx(ref_u.e_corr, abs=1e-10)


@pytest.mark.parametrize("system", ["water", "hydroxyl"])
def test_the_pipeline_equals_the_oracle(system, request):
    """dfmp2's pipeline (the drop-in, fp64) against the oracle: E_os, E_ss and, per spin, the
    unrelaxed density's occupied and virtual blocks."""
    mf = request.getfixturevalue(system)
    want = _oracle(mf)
    pt = DFMP2(mf, auxbasis=AUX, precision="fp64")
    pt.kernel()
    assert (pt.e_corr_os, pt.e_corr_ss) == (pytest.approx(want["e_os"], abs=1e-10),
                                           pytest.approx(want["e_ss"], abs=1e-10))
    dms = np.asarray(pt.make_rdm1())  # RHF [nmo, nmo] (both spins); UHF (alpha, beta)
    dms, occs = (dms[None], [mf.mo_occ]) if dms.ndim == 2 else (dms, mf.mo_occ)
    for dm, occ, (p_oo, p_vv) in zip(dms, occs, want["densities"]):
        nocc, scale = int(np.count_nonzero(occ)), 2 if dms.shape[0] == 1 else 1
        correction = dm - np.diag(occ)
        assert np.abs(scale * p_oo - correction[:nocc, :nocc]).max() < 1e-10
        assert np.abs(scale * p_vv - correction[nocc:, nocc:]).max() < 1e-10
