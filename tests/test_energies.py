"""DF-MP2 energies against PySCF's DFMP2 (same auxiliary basis, run here) and published values."""

import json
import os

import numpy as np
import pytest

from conftest import (MOLECULES, REFERENCE_FILE, SHARED_REFERENCE_FILE, converged_rhf,
                      load_reference_cases, mp2fit_auxbasis, pyscf_reference)
from dfmp2 import DFMP2, InputError
from pyscf.mp import dfmp2 as pyscf_dfmp2

FP64_TOL = 1e-8  # Eh, versus PySCF with the same auxiliary basis
FP32_TOL = 1e-6  # Eh, fp32 GEMMs versus fp64


@pytest.mark.parametrize("scf_mode", ["exact", "df"])
@pytest.mark.parametrize("name", ["water", "ammonia", "methane", "ethylene", "hf"])
def test_matches_pyscf_dfmp2(name, scf_mode):
    mf = converged_rhf(name, scf_mode=scf_mode)
    aux = mp2fit_auxbasis(mf.mol)
    for frozen in (None, 1):
        e_ref, os_ref, ss_ref = pyscf_reference(mf, aux, frozen)
        pt = DFMP2(mf, frozen=frozen, auxbasis=aux).run()
        assert pt.result.auxbasis == "cc-pvdz-ri"
        assert abs(pt.e_corr - e_ref) < FP64_TOL
        assert abs(pt.e_corr_os - os_ref) < FP64_TOL
        assert abs(pt.e_corr_ss - ss_ref) < FP64_TOL
        assert pt.e_corr < -0.05
        default, theirs = DFMP2(mf, frozen=frozen).run(), pyscf_dfmp2.DFMP2(mf, frozen=frozen).run()
        assert abs(default.e_corr - theirs.e_corr) < FP64_TOL  # PySCF's with_df choice (JK-fit for DF-SCF)


@pytest.mark.parametrize("name", ["water", "ethylene"])
def test_fp32_within_envelope(name):
    mf = converged_rhf(name, scf_mode="df")
    e64 = DFMP2(mf, frozen=1).run()
    e32 = DFMP2(mf, frozen=1, precision="fp32").run()
    assert e32.result.precision == "fp32"
    assert abs(e32.e_corr - e64.e_corr) < FP32_TOL
    assert abs(e32.e_corr_os - e64.e_corr_os) < FP32_TOL
    assert abs(e32.e_corr_ss - e64.e_corr_ss) < FP32_TOL
    assert e32.e_corr != e64.e_corr  # the fp32 path really ran in fp32


def test_reference_copy_is_current():
    if not os.path.exists(SHARED_REFERENCE_FILE):
        pytest.skip("no shared/ checkout beside the repository")
    with open(SHARED_REFERENCE_FILE, encoding="utf-8") as a, open(REFERENCE_FILE, encoding="utf-8") as b:
        assert json.load(a) == json.load(b)


@pytest.mark.parametrize("case", load_reference_cases(), ids=lambda c: c["name"])
def test_published_reference(case):
    scf_mode = "df" if case["scf"].startswith("df") else "exact"
    mf = converged_rhf(case["name"], basis=case["basis"], scf_mode=scf_mode, atom=case["atom"],
                       unit=case["unit"], conv_tol=case["scf_conv_tol"])
    pt = DFMP2(mf, frozen=case["frozen"] or None, auxbasis=case["auxbasis"]).run()
    assert abs(pt.e_corr - case["e_corr"]) < FP64_TOL
    for key in ("e_tot", "e_scs", "e_corr_os", "e_corr_ss"):
        if key in case:
            assert abs(getattr(pt, key) - case[key]) < FP64_TOL, key


def test_default_auxbasis_after_a_jkfit_scf_is_the_scfs_as_in_pyscf():
    mf = converged_rhf("water", basis="def2-svp", scf_mode="df")
    pt = DFMP2(mf).run()
    assert pt.result.scf == "df"
    assert pt.result.scf_auxbasis.endswith("jkfit")
    assert pt.result.auxbasis == pt.result.scf_auxbasis + " (the integrals with_df holds)"  # read, not redone
    assert abs(pt.e_corr - pyscf_dfmp2.DFMP2(mf).run().e_corr) < FP64_TOL
    mp2fit = DFMP2(mf, auxbasis="def2-svp-ri").run()
    assert abs(mp2fit.e_corr - pyscf_reference(mf, "def2-svp-ri")[0]) < FP64_TOL


def test_frozen_list_including_a_virtual():
    mf = converged_rhf("water")
    frozen = [0, 23]  # the core orbital and the highest virtual
    e_ref = pyscf_reference(mf, "cc-pvdz-ri", frozen)[0]
    pt = DFMP2(mf, frozen=frozen).run()
    assert pt.result.correlation.nfrozen == 2
    assert pt.result.correlation.nvir == 18
    assert abs(pt.e_corr - e_ref) < FP64_TOL


def test_plugin_conventions():
    """kernel() returns PySCF's (e_corr, t2); e_tot and e_scs are PySCF's: its DFMP2 with the
    same auxiliary basis, run here, gives the reference total (e_tot) and SCS correlation
    energy (emp2_scs, Grimme's 6/5 and 1/3 scaling)."""
    from pyscf import df
    from pyscf.mp import dfmp2 as pyscf_dfmp2

    mf = converged_rhf("water")
    pt = DFMP2(mf)
    e, t2 = pt.kernel()  # PySCF's (e_corr, t2)
    assert e == pt.e_corr and t2.shape == (5, 5, 19, 19)
    ref = pyscf_dfmp2.DFMP2(mf)
    ref.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")  # the MP2-fit set dfmp2 picks for cc-pVDZ
    ref.kernel()
    assert abs(pt.e_tot - ref.e_tot) < FP64_TOL
    assert abs(pt.e_scs - ref.emp2_scs) < FP64_TOL
    assert pt.run(frozen=1) is pt and pt.result.correlation.nfrozen == 1
    assert pt.result.kernels["pair_energy"] >= 1 and pt.result.backend == "torch"


def test_rejects_unconverged_mean_fields_and_bad_frozen():
    """(Open shells are accepted since UHF/ROHF support: tests/test_open_shell.py.)"""
    from pyscf import gto, scf

    water = gto.M(atom=MOLECULES["water"], basis="cc-pvdz", verbose=0)
    unconverged = scf.RHF(water)
    unconverged.max_cycle = 1
    unconverged.kernel()
    assert not unconverged.converged
    with pytest.raises(InputError, match="not converged"):
        DFMP2(unconverged).kernel()
    with pytest.raises(InputError, match="frozen"):
        DFMP2(converged_rhf("water"), frozen=6).kernel()


def test_unknown_device_rejected():
    mf = converged_rhf("water")
    with pytest.raises(InputError, match="unknown device"):
        DFMP2(mf, device="tpu").kernel()


def test_singular_metric_uses_eigen_fallback_without_nan():
    from pyscf import gto

    mf = converged_rhf("water")
    ri_o = gto.basis.load("cc-pvdz-ri", "O")
    ri_h = gto.basis.load("cc-pvdz-ri", "H")
    duplicated = {"O": ri_o + ri_o[:3], "H": ri_h + ri_h[:1]}  # exactly linearly dependent
    pt = DFMP2(mf, auxbasis=duplicated).run()
    assert "eigen" in pt.result.correlation.metric
    assert np.isfinite(pt.e_corr)
    e_plain, _ = DFMP2(mf, auxbasis="cc-pvdz-ri").kernel()
    assert abs(pt.e_corr - e_plain) < FP64_TOL  # same fitting space, same energy


def test_run_xyz_takes_a_list_of_frozen_orbitals(tmp_path):
    """run_xyz with frozen as a list (the core orbital and the highest virtual): PySCF's DFMP2
    on the same SCF and auxiliary basis, run here, with the same list."""
    from dfmp2.api.driver import run_xyz

    xyz = tmp_path / "water.xyz"
    xyz.write_text("3\n\n" + "\n".join(MOLECULES["water"].split(";")) + "\n")
    frozen = [0, 23]
    result = run_xyz(str(xyz), basis="cc-pvdz", auxbasis="cc-pvdz-ri", scf="exact", frozen=frozen)
    assert result.correlation.nfrozen == 2 and result.correlation.nvir == 18
    e_ref = pyscf_reference(result.mean_field, "cc-pvdz-ri", frozen)[0]
    assert abs(result.e_corr - e_ref) < FP64_TOL
