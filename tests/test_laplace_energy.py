"""E_os through the Laplace transform (SOS-MP2; dfmp2.mp2.laplace_energy) against the canonical pair
loop on the same set-up: RHF, UHF and ROHF, frozen core, B on disk, passes of points, the
checkpoint, fp32, every backend (trn1/trn2/trn3 emulated), the energy within the recorded bound;
the method's settings and the refusals where the path does not apply."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from pyscf import gto, scf

from conftest import ROOT, converged_rhf
from dfmp2 import InputError
from dfmp2.api.driver import run_mean_field
from dfmp2.mp2 import laplace_energy
from dfmp2.run.settings import SOS_C_OS

EXAMPLES = os.path.join(ROOT, "examples")
PER_ATOM = laplace_energy.AUTO_PER_ATOM  # --laplace auto's target: 0.1 uEh per atom


@pytest.fixture(scope="module")
def radical():
    """OH (doublet), cc-pVDZ: the UHF and ROHF references, tightly converged."""
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", spin=1, basis="cc-pvdz", verbose=0)
    refs = {}
    for kind, make in (("uhf", scf.UHF), ("rohf", scf.ROHF)):
        mf = make(mol)
        mf.conv_tol = 1e-12
        mf.kernel()
        assert mf.converged
        refs[kind] = mf
    return refs


def assert_within_bound(laplace_run, canonical, natom, tolerance=None):
    """|E_os(L) - E_os| within the run's recorded bound and --laplace auto's target (natom atoms)."""
    corr = laplace_run.correlation
    error = abs(corr.e_corr_os - canonical.correlation.e_corr_os)
    assert corr.laplace["e_os_error_bound"] <= PER_ATOM * natom
    assert error <= corr.laplace["e_os_error_bound"] + (tolerance or 1e-11), (error, corr.laplace)
    assert error <= (tolerance or 0.0) + PER_ATOM * natom


@pytest.mark.parametrize("name", ["water", "ethylene"])
def test_rhf_sos_mp2_is_its_canonical_e_os_within_the_bound(name):
    mf = converged_rhf(name)
    canonical = run_mean_field(mf)
    sos = run_mean_field(mf, method="sos-mp2")
    corr = sos.correlation
    assert corr.laplace["request"] == "auto" and corr.e_corr_ss is None and corr.e_scs is None
    assert_within_bound(sos, canonical, mf.mol.natm)
    assert sos.e_corr == pytest.approx(SOS_C_OS * corr.e_corr_os, abs=1e-14)
    assert sos.e_tot == pytest.approx(mf.e_tot + SOS_C_OS * corr.e_corr_os, abs=1e-12)
    assert "laplace_z" in sos.kernels and "pair_energy" not in sos.kernels  # no pair loop ran


def test_fixed_points_converge_and_each_stays_within_its_bound():
    mf = converged_rhf("ethylene")
    canonical = run_mean_field(mf).correlation.e_corr_os
    errors = []
    for points in (2, 4, 6, 10):
        corr = run_mean_field(mf, method="sos-mp2", laplace=points).correlation
        assert corr.laplace["points"] == points
        error = abs(corr.e_corr_os - canonical)
        assert error <= corr.laplace["e_os_error_bound"] + 1e-11
        errors.append(error)
    assert errors[0] > errors[1] > errors[2] > errors[3]  # more points, closer to 1/Delta


def test_laplace_off_is_the_canonical_e_os_exactly_scaled():
    mf = converged_rhf("water")
    canonical = run_mean_field(mf)
    sos = run_mean_field(mf, method="sos-mp2", laplace="off", c_os=1.2)
    assert sos.correlation.laplace is None and "pair_energy" in sos.kernels
    assert sos.e_corr == pytest.approx(1.2 * canonical.e_corr_os, abs=1e-12)


@pytest.mark.parametrize("kind", ["uhf", "rohf"])
def test_open_shells_alpha_beta_and_the_rohf_singles(radical, kind):
    mf = radical[kind]
    canonical = run_mean_field(mf)
    sos = run_mean_field(mf, method="sos-mp2")
    assert_within_bound(sos, canonical, 2)
    corr = sos.correlation
    assert corr.e_corr_singles == pytest.approx(canonical.correlation.e_corr_singles, abs=1e-12)
    assert (corr.e_corr_singles != 0.0) == (kind == "rohf")
    assert sos.e_corr == pytest.approx(SOS_C_OS * corr.e_corr_os + corr.e_corr_singles, abs=1e-14)


def test_frozen_core_and_b_on_disk(radical, tmp_path):
    mf = radical["uhf"]
    canonical = run_mean_field(mf, frozen=1)
    on_disk = run_mean_field(mf, method="sos-mp2", frozen=1, force_outcore=True, scratch=str(tmp_path))
    in_memory = run_mean_field(mf, method="sos-mp2", frozen=1)
    assert on_disk.correlation.plan.storage == "disk" and in_memory.correlation.plan.storage == "memory"
    assert on_disk.correlation.e_corr_os == pytest.approx(in_memory.correlation.e_corr_os, abs=1e-12)
    assert_within_bound(on_disk, canonical, 2)
    assert list(tmp_path.iterdir()) == []


def test_points_in_several_passes_give_the_same_energy(monkeypatch):
    mf = converged_rhf("ethylene")
    at_once = run_mean_field(mf, method="sos-mp2", laplace=8)
    whole = at_once.correlation.e_corr_os
    passes = []

    def two_at_a_time(run, naux, points):
        passes.append(points)
        return 2

    monkeypatch.setattr(laplace_energy, "points_per_pass", two_at_a_time)
    split = run_mean_field(mf, method="sos-mp2", laplace=8)
    assert passes == [8]
    assert split.kernels["laplace_z"] == 4 * at_once.kernels["laplace_z"]  # every block once in each of 4 passes
    assert split.correlation.e_corr_os == pytest.approx(whole, abs=1e-13)


def test_a_budget_that_holds_no_point_is_refused(monkeypatch):
    from dfmp2.run.memory import MemoryPlan
    from dfmp2.util.errors import MemoryBudgetError

    class Run:
        plan = MemoryPlan(budget=10**6, aux_block=1, occ_block=1, storage="disk", minimum=9 * 10**5)
        channels = [type("Channel", (), {"nocc": 5, "nvir": 19})()]
        backend = type("Backend", (), {"itemsize": 8})()

    assert laplace_energy.points_per_pass(Run, 10, 8) == 8  # 10 functions: 800 B a point, 100 kB left
    with pytest.raises(MemoryBudgetError, match="Z\\(t\\)"):
        laplace_energy.points_per_pass(Run, 200, 8)  # 320 kB a point, 100 kB left


def test_fp32_products_with_fp64_sums():
    mf = converged_rhf("ethylene")
    canonical = run_mean_field(mf)
    fp32 = run_mean_field(mf, method="sos-mp2", precision="fp32")
    assert fp32.precision == "fp32"
    assert_within_bound(fp32, canonical, mf.mol.natm, tolerance=1e-7)  # fp32's envelope on top of the bound


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_trainium_kernels_emulated(target):
    mf = converged_rhf("water")
    canonical = run_mean_field(mf, device=target, simulate=True)
    sos = run_mean_field(mf, method="sos-mp2", device=target, simulate=True)
    assert {"laplace_z_kernel", "laplace_energy_kernel"} <= set(sos.kernels)
    assert "pair_energy_kernel" not in sos.kernels
    # the same device's B: the Laplace error alone (fp32 on the device: 1 uEh)
    assert abs(sos.correlation.e_corr_os - canonical.correlation.e_corr_os) <= \
        sos.correlation.laplace["e_os_error_bound"] + 1e-6
    fp64 = run_mean_field(mf)
    assert abs(sos.correlation.e_corr_os - fp64.correlation.e_corr_os) <= 1e-6


def test_the_nki_kernels_alone_match_their_host_math():
    """laplace_z_kernel over several row groups and ragged sizes, and the energy's triangle weights."""
    import torch

    from dfmp2.kernels import get_backend

    rng = np.random.default_rng(7)
    backend = get_backend("trn2", simulate=True)
    n, nvir, naux = 3, 150, 700  # 450 rows (4 row tiles), 700 functions (two 512-column chunks)
    b = rng.standard_normal((n, nvir, naux)) * 0.1
    e_occ, e_vir = -1.0 - rng.random(n), 0.2 + rng.random(nvir)
    t = (0.3, 1.7)
    z = backend.laplace_accumulator(len(t), naux)
    z = backend.laplace_z(z, backend.to_device(b), e_occ, e_vir, t)
    z = backend.laplace_z(z, backend.to_device(b[:1]), e_occ[:1], e_vir, t)  # a second block adds
    rows = b.reshape(-1, naux)
    gaps = (e_vir[None, :] - e_occ[:, None]).reshape(-1)
    expected = [rows.T @ (rows * np.exp(-gaps * tk)[:, None]) + b[0].T @ (b[0] * np.exp(-gaps[:nvir] * tk)[:, None])
                for tk in t]
    got = backend.to_host(z).astype(np.float64)
    for k in range(len(t)):
        lower = np.tril(got[k, :naux, :naux])
        assert np.allclose(lower, np.tril(expected[k]), rtol=1e-5, atol=1e-5 * np.abs(expected[k]).max())
    sums = backend.laplace_energy(z, z)
    for k in range(len(t)):
        assert sums[k] == pytest.approx(float(np.sum(expected[k] ** 2)), rel=1e-5)
    assert torch.is_tensor(z)


def test_checkpoint_keeps_b_and_a_second_run_reuses_it(tmp_path):
    mf = converged_rhf("water")
    first = run_mean_field(mf, method="sos-mp2", checkpoint=str(tmp_path / "ck"))
    second = run_mean_field(mf, method="sos-mp2", checkpoint=str(tmp_path / "ck"))
    assert not first.correlation.checkpoint["reused_B"] and second.correlation.checkpoint["reused_B"]
    assert second.correlation.e_corr_os == pytest.approx(first.correlation.e_corr_os, abs=1e-12)


def test_refusals_one_line_each():
    mf = converged_rhf("water")
    with pytest.raises(InputError, match="same-spin term"):
        run_mean_field(mf, laplace="auto")  # full MP2 through the Laplace path: not yet
    with pytest.raises(InputError, match="forms no amplitudes"):
        run_mean_field(mf, method="sos-mp2", laplace="auto", with_rdm1=True)
    with pytest.raises(InputError, match="c_ss"):
        run_mean_field(mf, method="sos-mp2", c_ss=0.3)
    with pytest.raises(InputError, match="c_os"):
        run_mean_field(mf, c_os=1.2)
    with pytest.raises(InputError, match="laplace"):
        run_mean_field(mf, method="sos-mp2", laplace=0)
    with pytest.raises(InputError, match="method"):
        run_mean_field(mf, method="ccsd")


def test_a_zero_gap_is_refused_before_the_sums():
    mf = converged_rhf("water")
    energies = mf.mo_energy.copy()
    nocc = mf.mol.nelectron // 2
    energies[nocc] = energies[nocc - 1]  # LUMO = HOMO
    from dfmp2.kernels import get_backend
    from dfmp2.mp2.pipeline import dfmp2_energy
    from dfmp2.chem import MNPIntegrals

    with pytest.raises(InputError, match="positive orbital-energy gap"):
        dfmp2_energy(get_backend("cpu"), MNPIntegrals(mf.mol), mf.mo_coeff, energies, mf.mo_occ, method="sos-mp2")


def test_synthetic_integrals_need_their_points():
    from dfmp2.kernels import get_backend
    from dfmp2.mp2.pipeline import dfmp2_energy
    from dfmp2.rng.synthetic import SyntheticIntegrals

    nao, nocc = 30, 6
    integrals = SyntheticIntegrals(nao, nocc, 60, seed=3)
    rng = np.random.default_rng(0)
    c = np.linalg.qr(rng.standard_normal((nao, nao)))[0]
    energies = np.concatenate([-1.0 - rng.random(nocc), 0.3 + rng.random(nao - nocc)])
    energies.sort()
    occ = np.array([2.0] * nocc + [0.0] * (nao - nocc))
    with pytest.raises(InputError, match="name no atoms"):
        dfmp2_energy(get_backend("cpu"), integrals, c, energies, occ, method="sos-mp2")
    canonical = dfmp2_energy(get_backend("cpu"), integrals, c, energies, occ)
    sos = dfmp2_energy(get_backend("cpu"), integrals, c, energies, occ, method="sos-mp2", laplace=12)
    assert abs(sos.e_corr_os - canonical.e_corr_os) <= sos.laplace["e_os_error_bound"] + 1e-12


def test_the_command_line_and_its_json(tmp_path):
    out = tmp_path / "w.json"
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", os.path.join(EXAMPLES, "water.xyz"), "--method",
                           "sos-mp2", "--precision", "fp64", "--json", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["method"] == "sos-mp2" and record["c_os"] == SOS_C_OS and record["e_corr_ss"] is None
    laplace = record["laplace"]
    assert laplace["points"] == len(laplace["exponents"]) == len(laplace["weights"])
    assert record["e_corr"] == pytest.approx(SOS_C_OS * record["e_corr_os"], abs=1e-14)
    assert "SOS-MP2" in proc.stdout and "Laplace" in proc.stdout
    refused = subprocess.run([sys.executable, "-m", "dfmp2", "run", os.path.join(EXAMPLES, "water.xyz"), "--laplace",
                              "auto"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "Traceback" not in refused.stderr


def test_the_native_drop_in():
    from dfmp2.native import SOSMP2

    mf = converged_rhf("water")
    canonical = run_mean_field(mf)
    pt = SOSMP2(mf)
    e_corr = pt.kernel()
    assert pt.result.correlation.laplace is not None
    assert abs(pt.e_corr_os - canonical.e_corr_os) <= pt.result.correlation.laplace["e_os_error_bound"] + 1e-11
    assert e_corr == pytest.approx(SOS_C_OS * pt.e_corr_os, abs=1e-14) and pt.emp2_scs is None
    assert math.isfinite(pt.e_tot)


def test_the_plugin_drop_in_takes_method_and_laplace():
    from dfmp2 import DFMP2

    mf = converged_rhf("water")
    pt = DFMP2(mf)
    pt.method, pt.laplace = "sos-mp2", 6
    pt.kernel()
    assert pt.result.correlation.laplace["points"] == 6
    assert pt.e_corr == pytest.approx(SOS_C_OS * pt.e_corr_os, abs=1e-14)


def test_sos_mp2_gradient_matches_finite_differences_of_its_energy():
    """SOS-MP2's gradient through the existing machinery: the density of c_os E_os (the canonical pair
    loop, announced), against central differences of E_HF + c_os E_os (canonical E_os, the energy the
    gradient is of), 1e-6 Eh/bohr."""
    from pyscf.data.nist import BOHR

    from dfmp2.native import SOSMP2

    atoms = [("O", (0.0, 0.0, 0.1173)), ("H", (0.0, 0.7572, -0.4692)), ("H", (0.05, -0.7572, -0.4692))]

    def mean_field(coords):
        mol = gto.M(atom=[(s, c) for (s, _), c in zip(atoms, coords)], basis="cc-pvdz", verbose=0)
        mf = scf.RHF(mol)
        mf.conv_tol, mf.conv_tol_grad = 1e-13, 1e-9
        return mf.run()

    def energy(coords):
        pt = SOSMP2(mean_field(coords), auxbasis="cc-pvdz-ri")
        pt.laplace = "off"
        return pt.e_scf + pt.kernel()

    x0 = np.array([c for _, c in atoms])
    pt = SOSMP2(mean_field(x0), auxbasis="cc-pvdz-ri")
    analytic = pt.nuc_grad_method().kernel()
    assert any("canonical pair loop" in note for note in pt.result.notes)
    step = 1e-4
    differences = np.zeros_like(x0)
    for a in range(x0.shape[0]):
        for k in range(3):
            plus, minus = x0.copy(), x0.copy()
            plus[a, k] += step
            minus[a, k] -= step
            differences[a, k] = (energy(plus) - energy(minus)) / (2 * step / BOHR)
    assert np.abs(analytic - differences).max() < 1e-6


def test_an_opposite_spin_only_double_hybrid_goes_through_the_laplace_path():
    """A custom double hybrid with c_ss = 0 (E = E_KS + c_os E_os): --laplace auto unless told otherwise,
    its E_PT2 within c_os times the bound of the canonical one on the same KS orbitals."""
    from dfmp2.api.driver import run_xyz

    water = os.path.join(EXAMPLES, "water.xyz")
    options = dict(xc="0.5*HF + 0.5*PBE, 0.75*PBE", c_os=0.4, c_ss=0.0, precision="fp64")
    laplace = run_xyz(water, **options)
    canonical = run_xyz(water, laplace="off", **options)
    record = laplace.correlation.laplace
    assert record is not None and canonical.correlation.laplace is None
    assert laplace.e_ref == pytest.approx(canonical.e_ref, abs=1e-10)
    assert abs(laplace.e_pt2 - canonical.e_pt2) <= 0.4 * record["e_os_error_bound"] + 1e-10
    assert laplace.e_tot == pytest.approx(laplace.e_ref + 0.4 * laplace.e_corr_os, abs=1e-12)
