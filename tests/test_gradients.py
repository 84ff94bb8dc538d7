"""Analytic DF-MP2 gradients (RHF and UHF) against central finite differences of dfmp2's own energies,
and against PySCF's conventional (non-DF) MP2 gradient (the DF error)."""

import os

import numpy as np
import pytest
from pyscf import gto, scf

from dfmp2 import DFMP2
from dfmp2 import native

BOHR = 0.52917721092  # Angstrom
WATER = [("O", (0.0, 0.0, 0.1173)), ("H", (0.0, 0.7572, -0.4692)), ("H", (0.0, -0.7572, -0.4692))]
HYDROXYL = [("O", (0.0, 0.0, 0.1)), ("H", (0.0, 0.1, 1.05))]  # a doublet radical, off the axes


def _mean_field(coords, scf_mode, basis="cc-pvdz", atoms=WATER, spin=0):
    mol = gto.M(atom=[(s, c) for (s, _), c in zip(atoms, coords)], basis=basis, spin=spin, verbose=0)
    mf = scf.RHF(mol) if spin == 0 else scf.UHF(mol)
    mf = mf.density_fit() if scf_mode == "df" else mf
    mf.conv_tol, mf.conv_tol_grad = 1e-13, 1e-9
    return mf.run()


def _finite_difference(energy, x0, step=1e-4):
    """Central differences (step in Angstrom) -> Eh/bohr, [natm, 3]."""
    grad = np.zeros_like(x0)
    for a in range(x0.shape[0]):
        for k in range(3):
            plus, minus = x0.copy(), x0.copy()
            plus[a, k] += step
            minus[a, k] -= step
            grad[a, k] = (energy(plus) - energy(minus)) / (2 * step / BOHR)
    return grad


@pytest.mark.parametrize("spin, scf_mode, frozen, method", [
    (0, "exact", None, "mp2"), (0, "df", 1, "mp2"), (0, "df", None, "scs"),
    (1, "exact", None, "mp2"), (1, "df", 1, "mp2"), (1, "df", None, "scs")])
def test_gradient_matches_finite_differences(spin, scf_mode, frozen, method):
    """Against central differences of E_SCF + E_DF-MP2 (or SCS-MP2) from dfmp2 itself, 1e-6 Eh/bohr
    (measured: 4e-8 RHF water, 2e-8 UHF hydroxyl radical: the differences' own error), exact or
    density-fitted SCF, frozen core or not."""
    cls = native.SCSMP2 if method == "scs" else native.DFMP2
    atoms = WATER if spin == 0 else HYDROXYL

    def energy(coords):
        mf = _mean_field(coords, scf_mode, atoms=atoms, spin=spin)
        pt = cls(mf, frozen=frozen, auxbasis="cc-pvdz-ri")
        pt.kernel()
        return mf.e_tot + pt.e_corr

    x0 = np.array([c for _, c in atoms], dtype=float)
    pt = cls(_mean_field(x0, scf_mode, atoms=atoms, spin=spin), frozen=frozen, auxbasis="cc-pvdz-ri")
    analytic = pt.nuc_grad_method().kernel()
    assert analytic.shape == x0.shape and np.abs(analytic.sum(axis=0)).max() < 1e-8  # translations
    assert np.abs(analytic - _finite_difference(energy, x0)).max() < 1e-6


def test_gradient_interfaces_follow_pyscf():
    """pt.nuc_grad_method().kernel() and pt.Gradients().kernel() (the drop-in, PySCF's names),
    .de kept; ROHF and Kohn-Sham references are refused clearly."""
    mf = _mean_field(np.array([c for _, c in WATER]), "df")
    pt = DFMP2(mf, auxbasis="cc-pvdz-ri")
    g = pt.nuc_grad_method()
    de = g.kernel()
    assert g.de is de and np.allclose(pt.Gradients().kernel(), de, atol=1e-12)
    radical = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    with pytest.raises(NotImplementedError, match="ROHF and Kohn-Sham"):
        DFMP2(scf.ROHF(radical).run()).nuc_grad_method()
    with pytest.raises(NotImplementedError, match="ROHF and Kohn-Sham"):
        DFMP2(scf.RKS(mf.mol, xc="b3lyp").run()).nuc_grad_method()


@pytest.mark.parametrize("spin", [0, 1])
def test_gradient_against_pyscf_conventional_mp2(spin):
    """Against PySCF's conventional MP2 / UMP2 gradient (no density fitting): with cc-pVTZ-RI
    fitting the DF error in the gradient is below 1e-4 Eh/bohr (measured on water/cc-pVDZ:
    4.7e-6, 2.1e-5 with cc-pVDZ-RI; hydroxyl radical/cc-pVDZ: 6.5e-6, 1.1e-5)."""
    from pyscf import mp

    atoms = WATER if spin == 0 else HYDROXYL
    mf = _mean_field(np.array([c for _, c in atoms], dtype=float), "exact", atoms=atoms, spin=spin)
    conventional = mp.MP2(mf).run().nuc_grad_method().kernel()
    ours = native.DFMP2(mf, auxbasis="cc-pvtz-ri").nuc_grad_method().kernel()
    assert np.abs(ours - conventional).max() < 1e-4


@pytest.mark.parametrize("spin", [0, 1])
def test_cli_grad_in_the_input_frame_matches_finite_differences(tmp_path, spin):
    """`dfmp2 grad MOLECULE.xyz --json` (the command's fp32 pair stage by default): the gradient
    [[gx, gy, gz] per atom] in Eh/bohr, in the input's frame and atom order (a tilted water off the
    origin, hydrogens first; the hydroxyl radical, UHF, with --spin 1), against central
    differences of fp64 `run_xyz` energies (dfmp2's own DF-SCF), 1e-6 Eh/bohr."""
    import json
    import subprocess
    import sys

    from dfmp2.api.driver import run_xyz

    atoms = [("H", (1.10, 0.35, -0.20)), ("O", (0.45, 0.95, 0.25)), ("H", (0.70, 1.75, 0.85))][spin:]

    def write(coords, name):
        path = tmp_path / name
        path.write_text(f"{len(atoms)}\n\n" + "".join(f"{s} {x:.10f} {y:.10f} {z:.10f}\n" for (s, _), (x, y, z) in
                                          zip(atoms, coords)), encoding="utf-8")
        return path

    x0 = np.array([c for _, c in atoms])
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", str(write(x0, "m.xyz")),
                           "--spin", str(spin), "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "gradient dE/dR (Eh/bohr)" in proc.stdout
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["atoms"] == ["H", "O", "H"][spin:] and record["precision"] == "fp32"  # grad's default, as run's
    jk = record["gradient_jk"]  # the CPHF's J/K: dfmp2's builds in the reference's fitting set, exact kind
    assert jk["backend"] == "torch" and jk["precision"] == "exact" and jk["builds"] >= 5
    fd = _finite_difference(lambda c: run_xyz(write(c, "d.xyz"), precision="fp64", spin=spin).e_tot, x0)
    assert np.abs(np.array(record["gradient"]) - fd).max() < 1e-6


def test_cli_grad_refusals():
    """ROHF (grad) and ROKS double hybrids' relaxed densities (run --properties): exit 2 with the
    reason, before any SCF."""
    import os
    import subprocess
    import sys

    methyl = os.path.join(os.path.dirname(__file__), "..", "examples", "methyl.xyz")
    for args, message in ((["grad", "--spin", "1", "--reference", "rohf"], "ROHF"),
                          (["run", "--spin", "1", "--reference", "rohf", "--xc", "B2PLYP", "--properties", "dipole"],
                           "ROKS double hybrids")):
        proc = subprocess.run([sys.executable, "-m", "dfmp2", args[0], methyl, *args[1:]],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_dropin_on_a_density_fitted_scf_uses_its_fitting_set():
    """DFMP2(df_mf) fits with the SCF's own JK-fit set (PySCF's convention), whose Cholesky vectors
    the energy reads; the relaxed density and the gradient use that set's (mn|P) themselves:
    the relaxed density equals dfmp2_native's in the same set (1e-10), and the gradient matches
    central differences of the drop-in's energies (1e-6 Eh/bohr)."""
    from pyscf.mp import dfmp2_native

    x0 = np.array([c for _, c in WATER])
    mf = _mean_field(x0, "df")
    ref = dfmp2_native.DFMP2(mf, auxbasis=mf.with_df.auxmol.basis).make_rdm1(relaxed=True)
    assert np.abs(DFMP2(mf).make_rdm1(relaxed=True) - ref).max() < 1e-10

    def energy(coords):
        mf = _mean_field(coords, "df")
        return mf.e_tot + DFMP2(mf).kernel()[0]

    assert np.abs(DFMP2(mf).nuc_grad_method().kernel() - _finite_difference(energy, x0)).max() < 1e-6


def test_pyscf_geomopt_drives_dfmp2_to_the_conventional_mp2_minimum():
    """PySCF's geomopt (geomeTRIC) with dfmp2's gradient scanner converges water with PySCF's
    default criteria; the bond lengths and angle agree with the conventional (non-DF) MP2
    optimum that PySCF's own MP2 gradients give, within the DF error (1e-4 A, 0.01 degree with
    cc-pVTZ-RI)."""
    import contextlib
    import io

    pytest.importorskip("geometric")
    from pyscf import mp
    from pyscf.geomopt.geometric_solver import optimize

    start = gto.M(atom="O 0 0 0.1; H 0 0.8 -0.45; H 0 -0.75 -0.5", basis="cc-pvdz", verbose=0)

    def shape(mol):
        x = mol.atom_coords(unit="Angstrom")
        r1, r2 = np.linalg.norm(x[1] - x[0]), np.linalg.norm(x[2] - x[0])
        angle = np.degrees(np.arccos(np.dot(x[1] - x[0], x[2] - x[0]) / (r1 * r2)))
        return np.array([r1, r2, angle])

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        ours = optimize(native.DFMP2(scf.RHF(start).run(conv_tol=1e-11), auxbasis="cc-pvtz-ri"), maxsteps=30)
        theirs = optimize(mp.MP2(scf.RHF(start).run(conv_tol=1e-11)), maxsteps=30)
    final = native.DFMP2(scf.RHF(ours).run(conv_tol=1e-11), auxbasis="cc-pvtz-ri").nuc_grad_method().kernel()
    assert np.abs(final).max() < 4.5e-4  # PySCF's (geomeTRIC's) default max-gradient criterion
    difference = np.abs(shape(ours) - shape(theirs))
    assert difference[:2].max() < 1e-4 and difference[2] < 1e-2


def _psi4_cases():
    import json
    import os

    with open(os.path.join(os.path.dirname(__file__), "data", "psi4_gradient_references.json"), encoding="utf-8") as f:
        data = json.load(f)
    return [(case, fc) for case in data["cases"] for fc in case["frozen_cases"]]


@pytest.mark.parametrize("case, frozen_case", _psi4_cases(), ids=lambda c: c.get("name", str(c.get("frozen"))))
def test_gradient_matches_psi4_published_df_mp2_gradients(case, frozen_case):
    """Against Psi4's DF-MP2 gradients (QCEngine's standard suite; tests/data/psi4_gradient_references.json):
    water (RHF) and the NH2 radical (UHF), aug-cc-pVDZ, DF-SCF in aug-cc-pVDZ-JKFIT and DF-MP2 in
    aug-cc-pVDZ-RI, all-electron and frozen core, in Psi4's frame: 1e-6 Eh/bohr (measured: 3e-8 to
    5.4e-8); the SCF energy 1e-8 Eh and the correlation energy to the 1e-8 Eh the suite prints."""
    mol = gto.M(atom=case["atom"], unit=case["unit"], basis=case["basis"], charge=case["charge"], spin=case["spin"],
                verbose=0)
    mf = (scf.RHF(mol) if case["reference"] == "rhf" else scf.UHF(mol)).density_fit(auxbasis=case["jkfit"])
    mf.conv_tol = 1e-12
    mf.run()
    assert abs(mf.e_tot - case["e_hf"]) < 1e-8
    pt = native.DFMP2(mf, auxbasis=case["auxbasis"], frozen=frozen_case["frozen"])
    pt.kernel()
    assert abs(pt.e_corr - frozen_case["e_corr"]) < 1e-8
    assert np.abs(pt.nuc_grad_method().kernel() - np.array(frozen_case["gradient"])).max() < 1e-6


@pytest.mark.parametrize("target, api", [("trn1", "0.2"), ("trn2", "0.7"), ("trn3", "0.7")])
def test_gradients_on_simulated_trainium(tmp_path, target, api):
    """Analytic gradients on emulated trn1/trn2 (fp32 on chip: the NKI SCF builds, the exact
    transform, density_kernel and gamma_kernel, the response's J/K on the NKI builds) against the
    CPU's fp64 ones. The envelope is 1e-5 Eh/bohr; measured 3e-8 (water) to 8.5e-8 (benzene),
    so 1e-6 is asserted here. `dfmp2 grad --device trn* --simulate` (RHF water, the command's own
    DF-SCF) and the drop-in's nuc_grad_method() (the UHF hydroxyl radical, exact SCF, frozen
    core, SCS: same-spin and opposite-spin pairs through both kernels)."""
    import json
    import subprocess
    import sys

    from dfmp2.api.driver import run_xyz

    root = os.path.join(os.path.dirname(__file__), "..")
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", os.path.join(root, "examples", "water.xyz"),
                           "--device", target, "--simulate", "--nki-api", api, "--json", "out.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["device"] == target and record["precision"] == "fp32"
    assert record["kernels"]["gamma_kernel"] >= 1 and record["kernels"]["density_kernel"] >= 1
    cpu = run_xyz(os.path.join(root, "examples", "water.xyz"), precision="fp64", gradient=True)
    assert np.abs(np.array(record["gradient"]) - cpu.gradient).max() < 1e-6
    mf = _mean_field(np.array([c for _, c in HYDROXYL]), "exact", atoms=HYDROXYL, spin=1)
    grads = [native.SCSMP2(mf, frozen=1, **kw).nuc_grad_method().kernel()
             for kw in ({}, {"device": target, "simulate": True, "nki_api": api})]
    assert np.abs(grads[1] - grads[0]).max() < 1e-6


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("case, ni, nall, nvir, nvir_all, naux, rows", [
    ("closed", 3, 5, 7, 7, 9, 2), ("same", 2, 4, 129, 129, 130, 3), ("opposite", 3, 4, 140, 131, 200, 3),
    ("closed", 2, 3, 300, 300, 140, 32)])
def test_gamma_kernel_blocks_and_ragged_sizes(target, case, ni, nall, nvir, nvir_all, naux, rows):
    """NkiBackend.gamma_block (gamma_kernel over launches of `rows` j) equals the torch
    backend's fp64 G (density_block with_gamma: the i of b_i against the block of j, G of that block)
    at ragged sizes, every spin case (SCS weights), to 1e-5 relative."""
    import torch

    from dfmp2.kernels.nki.backend import NkiBackend
    from dfmp2.kernels.torch.backend import TorchBackend

    rng = np.random.default_rng(ni + nvir)
    b_i = torch.from_numpy(rng.standard_normal((ni, nvir, naux)) * 0.1)
    b_all = torch.from_numpy(rng.standard_normal((nall, nvir_all, naux)) * 0.1)
    if case != "opposite":
        b_i = b_all[:ni]
    e_i, e_all = torch.from_numpy(rng.uniform(-2, -0.5, ni)), torch.from_numpy(rng.uniform(-2, -0.5, nall))
    e_vir, e_vir_all = torch.from_numpy(rng.uniform(0.2, 3, nvir)), torch.from_numpy(rng.uniform(0.2, 3, nvir_all))
    other = e_vir_all if case == "opposite" else None
    scaling = (1.2, 1.0 / 3.0)
    ref = TorchBackend("cpu", "fp64").density_block(b_i, b_all, e_i, e_all, e_vir, scaling, case, other,
                                                    with_gamma=True)[2]
    nki = NkiBackend(target, simulate=True)
    nki.gamma_rows = lambda nv, nvj, na: rows
    out = nki.gamma_block(b_i.float(), b_all.float(), e_i.float(), e_all.float(), e_vir.float(), scaling, case,
                          None if other is None else other.float())
    assert float((out - ref).abs().max()) < 1e-5 * float(ref.abs().max())
    assert nki.calls["gamma_kernel"] == -(-nall // rows)


@pytest.mark.parametrize("case, nvir_all", [("closed", 1500), ("opposite", 1100)])
def test_gamma_kernel_streams_at_large_sizes(case, nvir_all):
    """nvir 1500 with naux 3000 on trn1: one B_j row (141 KiB per partition) and one G_j
    (141 KiB) each overflow SBUF, so gamma_kernel streams B, forms X in blocks of j's virtuals
    (two blocks at 1500) and adds G_j into HBM; the result equals the fp64 formulas (closed
    shell with (ib|ja), opposite spin with j's virtual count different) inside usable SBUF."""
    import torch

    from nki_emulator import TARGETS
    from dfmp2.kernels.nki.backend import NkiBackend
    from dfmp2.kernels.torch.backend import TorchBackend

    ni, nall, nvir, naux = 1, 2, 1500, 3000
    rng = np.random.default_rng(nvir_all)
    b_all = torch.from_numpy(rng.standard_normal((nall, nvir_all, naux)) * 0.02)
    b_i = b_all[:ni] if case == "closed" else torch.from_numpy(rng.standard_normal((ni, nvir, naux)) * 0.02)
    e_i, e_all = torch.from_numpy(rng.uniform(-2, -0.5, ni)), torch.from_numpy(rng.uniform(-2, -0.5, nall))
    e_vir, e_vir_all = torch.from_numpy(rng.uniform(0.2, 3, nvir)), torch.from_numpy(rng.uniform(0.2, 3, nvir_all))
    other = e_vir_all if case == "opposite" else None
    ref = TorchBackend("cpu", "fp64").density_block(b_i, b_all, e_i, e_all, e_vir, (1.2, 1.0 / 3.0), case, other,
                                                    with_gamma=True)[2]
    nki = NkiBackend("trn1", simulate=True)
    out = nki.gamma_block(b_i.float(), b_all.float(), e_i.float(), e_all.float(), e_vir.float(), (1.2, 1.0 / 3.0),
                          case, None if other is None else other.float())
    assert float((out - ref).abs().max()) < 1e-5 * float(ref.abs().max())
    assert nki.calls["gamma_kernel"] == 1
    assert nki.trace.peak_sbuf_bytes <= TARGETS["trn1"].sbuf_usable_bytes_per_partition


def _b2plyp_gradient_and_differences(atoms, scf_mode, spin=0):
    """(the analytic B2PLYP gradient (response.nuclear_gradient), central differences of
    E_KS + c_os E_os + c_ss E_ss, the reference at the start) for `atoms` on a level-6 grid,
    RKS (spin 0) or UKS, DF or exact SCF, cc-pVDZ with cc-pVDZ-RI."""
    from pyscf import dft

    from dfmp2.api.driver import run_mean_field
    from dfmp2.chem.functionals import double_hybrid
    from dfmp2.mp2.gradient import nuclear_gradient_of_run as nuclear_gradient
    from dfmp2.run.settings import Settings

    dh = double_hybrid("B2PLYP")

    def mean_field(coords):
        mol = gto.M(atom=[(s, c) for (s, _), c in zip(atoms, coords)], basis="cc-pvdz", spin=spin, verbose=0)
        mf = (dft.RKS if spin == 0 else dft.UKS)(mol, xc=dh.xc)
        mf.grids.level = 6
        mf = mf.density_fit() if scf_mode == "df" else mf
        mf.conv_tol, mf.conv_tol_grad, mf.max_cycle = (1e-12, 1e-8, 50) if spin == 0 else (1e-11, 1e-7, 300)
        return mf.run()

    def energy(coords):
        mf = mean_field(coords)
        r = run_mean_field(mf, Settings(precision="fp64", auxbasis="cc-pvdz-ri"))
        return mf.e_tot + dh.c_os * r.e_corr_os + dh.c_ss * r.e_corr_ss

    x0 = np.array([c for _, c in atoms])
    mf = mean_field(x0)
    settings = Settings(precision="fp64", auxbasis="cc-pvdz-ri", rdm1_scaling=(dh.c_os, dh.c_ss), with_rdm1=True,
                        with_gamma=True)
    analytic = nuclear_gradient(mf, run_mean_field(mf, settings).correlation, settings)[0]
    return analytic, _finite_difference(energy, x0), mf


@pytest.mark.parametrize("scf_mode", ["df", "exact"])
def test_double_hybrid_gradient_matches_finite_differences(scf_mode):
    """B2PLYP (RKS, DF-MP2 scaled by c_os = c_ss = 0.27): the analytic gradient (PySCF's KS
    gradient, the J/a_x K and XC-kernel terms of the relaxed density, the CPKS with the XC
    kernel) against central differences of E_KS + c_os E_os + c_ss E_ss on a fine grid
    (level 6, where the grid's own motion, which neither side's analytic terms include, is
    small): 1e-6 Eh/bohr (measured 5.4e-8, DF and exact SCF)."""
    atoms = [("O", (0.0, 0.0, 0.1173)), ("H", (0.0, 0.7572, -0.4692)), ("H", (0.05, -0.7572, -0.4692))]
    analytic, differences, _ = _b2plyp_gradient_and_differences(atoms, scf_mode)
    assert np.abs(analytic - differences).max() < 1e-6


@pytest.mark.parametrize("scf_mode", ["df", "exact"])
def test_unrestricted_double_hybrid_gradient_matches_finite_differences(scf_mode):
    """B2PLYP on UKS orbitals, the hydroxyl radical (the same code path as RKS, per spin: J - a_x
    sum_s K_s of the relaxed densities, PySCF's TDUKS XC-kernel contraction, the UCPKS with the
    XC kernel) against central differences on a level-6 grid, 1e-6 Eh/bohr (measured 4.8e-8, DF
    and exact SCF). On that grid PySCF's own UKS gradient misses 1.2e-6 of the grid's motion (its
    translational sum), which neither side's analytic terms include. PySCF's grid response of the
    KS part is added to both sides, so that the test sees dfmp2's terms alone."""
    analytic, differences, mf = _b2plyp_gradient_and_differences(HYDROXYL, scf_mode, spin=1)
    with_grid = mf.nuc_grad_method()
    with_grid.grid_response = True
    grid_motion = with_grid.kernel() - mf.nuc_grad_method().kernel()
    assert np.abs(grid_motion).max() > 1e-7  # the correction is of the size stated
    assert np.abs(analytic + grid_motion - differences).max() < 1e-6


def test_cli_unrestricted_double_hybrid_gradient(tmp_path):
    """`dfmp2 grad --spin 1 --xc B2PLYP` runs on UKS orbitals (no longer refused): the JSON's
    gradient [[gx, gy, gz] per atom], whose translational sum is only the grid's motion (below
    1e-4 Eh/bohr on the default grid). Its accuracy: the finite-difference test above."""
    import json
    import subprocess
    import sys

    (tmp_path / "oh.xyz").write_text("2\n\nO 0 0 0.1\nH 0 0.1 1.05\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", "oh.xyz", "--spin", "1", "--xc", "B2PLYP",
                           "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["reference"] == "uks" and record["xc"] == "B2PLYP"
    gradient = np.array(record["gradient"])
    assert gradient.shape == (2, 3) and np.abs(gradient).max() > 1e-3 and np.abs(gradient.sum(axis=0)).max() < 1e-4


def test_cli_double_hybrid_gradient(tmp_path):
    """`dfmp2 grad --xc B2PLYP --precision fp64`: the JSON gradient against central differences
    of run_xyz's B2PLYP energies on dfmp2's default grid, 1e-5 Eh/bohr (measured 3.7e-6: the
    grid's own motion, as in PySCF's KS gradients without grid response)."""
    import subprocess
    import sys

    from dfmp2.api.driver import run_xyz

    atoms = [("O", (0.0, 0.0, 0.1173)), ("H", (0.0, 0.7572, -0.4692)), ("H", (0.05, -0.7572, -0.4692))]

    def write(coords, name):
        path = tmp_path / name
        path.write_text("3\n\n" + "".join(f"{s} {x:.10f} {y:.10f} {z:.10f}\n" for (s, _), (x, y, z) in
                                           zip(atoms, coords)), encoding="utf-8")
        return path

    x0 = np.array([c for _, c in atoms])
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", str(write(x0, "m.xyz")), "--xc", "B2PLYP",
                           "--precision", "fp64", "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    import json

    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["xc"] == "B2PLYP"
    fd = _finite_difference(lambda c: run_xyz(write(c, "d.xyz"), precision="fp64", xc="B2PLYP").e_tot, x0)
    assert np.abs(np.array(record["gradient"]) - fd).max() < 1e-5


def test_gradient_and_dipole_share_one_relaxed_density(monkeypatch):
    """A run asking for the gradient and the dipole forms the relaxed density once (the gradient's
    serves the dipole; relaxed_properties runs no CPHF of its own): its dipole equals a
    dipole-only run's (its own CPHF) to 1e-9 a.u., its gradient a gradient-only run's."""
    import os

    from dfmp2.mp2 import gradient, response
    from dfmp2.api.driver import run_xyz

    calls = []
    own = response.relaxed_density
    for module in (response, gradient):  # every name the density is formed through
        monkeypatch.setattr(module, "relaxed_density", lambda *a, **k: calls.append(1) or own(*a, **k))
    water = os.path.join(os.path.dirname(__file__), "..", "examples", "water.xyz")
    both = run_xyz(water, precision="fp64", gradient=True, properties=("dipole",))
    assert len(calls) == 1
    alone = run_xyz(water, precision="fp64", properties=("dipole",))
    assert len(calls) == 2
    grad_only = run_xyz(water, precision="fp64", gradient=True)
    assert np.abs(np.array(both.properties["dipole"]) - alone.properties["dipole"]).max() < 1e-9
    assert np.abs(both.gradient - grad_only.gradient).max() < 1e-10


ETHYLENE = [("C", (0.0, 0.0, 0.6695)), ("C", (0.0, 0.0, -0.6695)), ("H", (0.0, 0.9289, 1.2321)),
            ("H", (0.0, -0.9289, 1.2321)), ("H", (0.0, 0.9289, -1.2321)), ("H", (0.0, -0.9289, -1.2321))]


@pytest.mark.parametrize("spin, scf_mode, frozen, scaling", [(0, "df", 2, (1.0, 1.0)), (1, "exact", 2, (1.2, 1 / 3))])
def test_out_of_core_gradient_equals_in_memory(tmp_path, arrays_only_budget, monkeypatch, spin, scf_mode, frozen,
                                               scaling):
    """B on disk at the smallest budget: the densities read it a slab at a time (several slabs
    and blocks of k), G goes to HDF5 scratch and is read back by auxiliary slices; gradient and
    relaxed density equal the in-memory run's to 1e-10 (RHF ethylene, DF-SCF, frozen core; UHF
    vinyl radical, exact SCF, SCS weights), and close() leaves no scratch behind. The DF
    reference's [naux, nao, nocc] arrays go to scratch too, three occupied orbitals at a time."""
    from dfmp2.mp2 import gradient as gradient_module
    from dfmp2.run import storage
    from dfmp2.api.driver import run_mean_field
    from dfmp2.util.system_memory import MB
    from dfmp2.mp2.gradient import nuclear_gradient_of_run as nuclear_gradient
    from dfmp2.run.settings import Settings

    atoms = ETHYLENE if spin == 0 else ETHYLENE[:5]
    mol = gto.M(atom=atoms, basis="cc-pvdz", spin=spin, verbose=0)
    mf = (scf.RHF(mol) if spin == 0 else scf.UHF(mol))
    mf = mf.density_fit() if scf_mode == "df" else mf
    mf.conv_tol, mf.max_cycle = 1e-10, 300
    mf.run()
    settings = Settings(precision="fp64", auxbasis="cc-pvdz-ri", frozen=frozen, rdm1_scaling=scaling, with_rdm1=True,
                        with_gamma=True)
    roomy = run_mean_field(mf, settings)
    tight_settings = settings.replace(max_memory=roomy.correlation.plan.minimum * 1.02 / MB, scratch=str(tmp_path))
    tight = run_mean_field(mf, tight_settings)
    plan = tight.correlation.plan
    assert plan.storage == "disk" and plan.slab_rows < max(np.atleast_1d(tight.correlation.nocc))
    assert tight.correlation.gamma.kind == "disk" and roomy.correlation.gamma.kind == "memory"
    expected, _, expected_density = nuclear_gradient(mf, roomy.correlation, settings)
    made = []  # the gradient's own scratch arrays (the DF reference's L and Y d), a few occupied orbitals at a time
    real_new = storage.ScratchArrays.new
    monkeypatch.setattr(storage.ScratchArrays, "new", lambda self, *a, **k: made.append(self.kind) or real_new(self, *a, **k))
    monkeypatch.setattr(gradient_module, "REFERENCE_BLOCK_BYTES", 8 * 3 * mf.mol.nao * 400)
    gradient, _, density = nuclear_gradient(mf, tight.correlation, settings.replace(scratch=str(tmp_path)))
    assert made == ["disk"] * (scf_mode == "df")  # the DF reference's L (then Y d) of its one spin channel
    assert np.abs(gradient - expected).max() < 1e-10
    assert np.abs(density - expected_density).max() < 1e-10
    assert any(tmp_path.iterdir())
    for result in (tight, roomy):
        result.correlation.gamma.close()
    assert not any(tmp_path.iterdir())


def test_cli_grad_with_a_checkpoint_runs_out_of_core_and_leaves_no_scratch(tmp_path):
    """`dfmp2 grad --checkpoint` keeps B on disk (it was refused while densities needed B in
    memory): the gradient equals a plain run's to 1e-10, a second run reuses the checkpoint's B
    and SCF, and neither leaves anything in --scratch (the three-index density's HDF5 included)."""
    import json
    import subprocess
    import sys

    water = os.path.join(os.path.dirname(__file__), "..", "examples", "water.xyz")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def grad(name, *args):
        proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", water, "--json", name, *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert not any(scratch.iterdir())
        return json.loads((tmp_path / name).read_text(encoding="utf-8"))

    plain = grad("plain.json")
    first, again = (grad(name, "--checkpoint", "ck", "--scratch", str(scratch)) for name in ("first.json", "again.json"))
    assert plain["memory"]["storage"] == "memory" and first["memory"]["storage"] == "disk"
    assert again["checkpoint"]["reused_B"] and again["checkpoint"]["reused_scf"]
    for record in (first, again):
        assert np.abs(np.array(record["gradient"]) - np.array(plain["gradient"])).max() < 1e-10


def test_cli_grad_with_pyscf_builds_takes_the_response_from_pyscf_too(tmp_path):
    """`--scf-backend pyscf`: the orbital response's J/K are PySCF's as the SCF's were (the budget
    error of dfmp2's builds advises it), the record says so, and the gradient agrees with the
    default run's (dfmp2's builds) to 1e-7 Eh/bohr (two DF SCFs converged to 1e-9)."""
    import json
    import subprocess
    import sys

    water = os.path.join(os.path.dirname(__file__), "..", "examples", "water.xyz")
    records = {}
    for name, args in (("device", []), ("pyscf", ["--scf-backend", "pyscf"])):
        proc = subprocess.run([sys.executable, "-m", "dfmp2", "grad", water, "--json", f"{name}.json", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        records[name] = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
    assert records["device"]["gradient_jk"]["backend"] == "torch"
    assert records["pyscf"]["gradient_jk"] == {"scf_backend": "pyscf", "why": "--scf-backend pyscf"}
    difference = np.array(records["pyscf"]["gradient"]) - np.array(records["device"]["gradient"])
    assert np.abs(difference).max() < 1e-7


class _FittingSet:
    """A density-fitting set as reference_fitting_densities reads it: (mn|P) as T [naux, nao, nao], (P|Q) V."""

    def __init__(self, mnP, metric):
        self.t, self.v = mnP, metric
        self.naux, self.nao = mnP.shape[0], mnP.shape[1]

    def aux_blocks(self, limit):
        return [(p0, min(p0 + limit, self.naux)) for p0 in range(0, self.naux, limit)]

    def block(self, p0, p1):
        return self.t[p0:p1]

    def metric(self):
        return self.v.copy()


def test_the_reference_term_factorises_its_metric_with_the_pivot_check_and_the_eigen_fallback():
    """The gradient's reference term fits through linalg.factor_metric (issue 64: it had its own scipy
    Cholesky, without the pivot check): on a metric with an exact null direction u it takes the pseudo-inverse,
    and since (mn|P) has no component along u, the result is that of the same term in an orthonormal basis Q of
    the range (V' = Q^T V Q, full rank, Cholesky), carried back by Q."""
    from dfmp2.linalg import factor_metric, metric_solve
    from dfmp2.kernels import get_backend
    from dfmp2.mp2.gradient import reference_fitting_densities

    rng = np.random.default_rng(7)
    naux, nao, nocc = 7, 5, 2
    range_basis, _ = np.linalg.qr(rng.standard_normal((naux, naux - 1)))  # Q [naux, naux - 1]; u is orthogonal
    reduced_metric = rng.standard_normal((naux - 1, naux - 1))
    reduced_metric = reduced_metric @ reduced_metric.T + (naux - 1) * np.eye(naux - 1)
    reduced_t = rng.standard_normal((naux - 1, nao, nao))
    reduced_t = reduced_t + reduced_t.transpose(0, 2, 1)
    metric = range_basis @ reduced_metric @ range_basis.T  # singular: V u = 0
    mnP = np.einsum("pk,kmn->pmn", range_basis, reduced_t)
    occupied = [(rng.standard_normal((nao, nocc)), np.array([2.0, 2.0]))]
    y = rng.standard_normal((nao, nao))
    y_dms = [y + y.T]
    block, g_aux = reference_fitting_densities(_FittingSet(mnP, metric), occupied, y_dms, aux_block=3)
    reduced_block, reduced_g = reference_fitting_densities(_FittingSet(reduced_t, reduced_metric), occupied, y_dms,
                                                           aux_block=3)
    assert np.allclose(g_aux, range_basis @ reduced_g @ range_basis.T, rtol=0, atol=1e-10)
    assert np.allclose(block(0, naux), np.einsum("pk,kmn->pmn", range_basis, reduced_block(0, naux - 1)),
                       rtol=0, atol=1e-10)
    # metric_solve itself: V^-1 R against numpy's solve (Cholesky) and pseudo-inverse (eigen)
    rhs = rng.standard_normal((naux - 1, 3, 2))
    factor = factor_metric(get_backend("cpu", "fp64"), reduced_metric)
    assert factor.kind == "cholesky"
    assert np.allclose(metric_solve(factor, rhs), np.linalg.solve(reduced_metric, rhs.reshape(naux - 1, -1))
                       .reshape(rhs.shape), rtol=0, atol=1e-12)
    singular = factor_metric(get_backend("cpu", "fp64"), metric)
    assert singular.kind == "eigen" and singular.nkept == naux - 1
    rhs = rng.standard_normal((naux, 4))
    assert np.allclose(metric_solve(singular, rhs), np.linalg.pinv(metric, rcond=1e-10) @ rhs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scf_backend", ["device", "pyscf"])
def test_a_gradient_run_factorises_each_metric_once(tmp_path, monkeypatch, scf_backend):
    """Issue 64: one factorisation per metric per run. The MP2 fitting set's (P|Q) serves the energy, the
    densities and the gradient's three-index terms; the JK-fit set's serves the SCF's builds, the orbital
    response's and the gradient's reference term (before: the SCF, the response and the reference term each
    factorised it, the last with its own scipy Cholesky). With PySCF's J/K only the reference term needs it."""
    import sys

    import dfmp2.chem.jk  # noqa: F401  (every module that factorises a metric, loaded before it is counted)
    import dfmp2.linalg.metric as metric
    import dfmp2.mp2.gradient  # noqa: F401
    import dfmp2.mp2.b.provider  # noqa: F401
    from dfmp2.api.driver import run_xyz

    counts = {}
    original = metric.factor_metric

    def counting(backend, matrix, *args, **kwargs):
        counts[matrix.shape[0]] = counts.get(matrix.shape[0], 0) + 1
        return original(backend, matrix, *args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("dfmp2")]:
        if getattr(module, "factor_metric", None) is original:
            monkeypatch.setattr(module, "factor_metric", counting)
    xyz = tmp_path / "water.xyz"
    xyz.write_text("3\n\n" + "\n".join(f"{s} {x} {y} {z}" for s, (x, y, z) in WATER) + "\n")
    result = run_xyz(str(xyz), basis="cc-pvdz", gradient=True, scf_backend=scf_backend)
    assert result.gradient is not None
    assert len(counts) == 2 and sorted(counts.values()) == [1, 1], counts  # the MP2 fit's metric and the JK fit's


def test_the_gradient_is_timed_on_the_backends_clock_and_the_callers_timer_is_left_alone(tmp_path, monkeypatch):
    """Issue 64: the pipeline set the caller's timer.synchronize and left it set (the gradient's steps were
    synchronised by that side effect). The driver now times the run with a timer of its own that drains the
    backend's queue (Timer.synchronized_with): the gradient gets it, the caller's timer is unchanged."""
    import dfmp2.api.driver as driver
    from dfmp2.run.context import RunContext

    seen = []
    real = driver.nuclear_gradient_of_run

    def spy(mf, corr, settings, timer=None):
        seen.append(timer)
        return real(mf, corr, settings, timer)

    monkeypatch.setattr(driver, "nuclear_gradient_of_run", spy)
    context = RunContext()
    default = context.timer.synchronize
    xyz = tmp_path / "water.xyz"
    xyz.write_text("3\n\n" + "\n".join(f"{s} {x} {y} {z}" for s, (x, y, z) in WATER) + "\n")
    result = driver.run_xyz(str(xyz), basis="cc-pvdz", gradient=True, context=context)
    assert context.timer.synchronize is default  # the caller's timer as it was handed
    (timer,) = seen
    assert getattr(timer.synchronize, "__func__", None) is not None  # a backend's bound synchronize
    assert type(timer.synchronize.__self__).__name__ == "TorchBackend"
    assert timer.timings is context.timer.timings and "gradient_cphf" in result.timings
