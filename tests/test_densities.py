"""Unrelaxed DF-MP2 densities and natural orbitals against PySCF's dfmp2_native and the
published ethylene/def2-SVP natural occupations."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REFERENCE_FILE, ROOT, converged_rhf
from dfmp2 import DFMP2, InputError
from pyscf import gto, scf
from pyscf.mp import dfmp2_native


def _natocc_cases():
    with open(REFERENCE_FILE, encoding="utf-8") as handle:
        cases = json.load(handle)["natural_occupations"]["cases"]
    return [pytest.param(case, fc, id=f"{case['name']}-frozen{fc['frozen']}")
            for case in cases for fc in case["frozen_cases"]]


@pytest.mark.parametrize("case, frozen_case", _natocc_cases())
def test_density_and_natural_occupations(case, frozen_case):
    mol = gto.M(atom=case["atom"], unit=case["unit"], basis=case["basis"], verbose=0)
    mf = scf.RHF(mol)
    mf.conv_tol = case["scf_conv_tol"]
    mf.kernel()
    frozen = frozen_case["frozen"] or None
    pt = DFMP2(mf, frozen=frozen, auxbasis=case["auxbasis"])
    dm = pt.make_rdm1()
    ref = dfmp2_native.DFMP2(mf, frozen=frozen, auxbasis=case["auxbasis"])
    assert np.abs(dm - ref.make_rdm1()).max() < 1e-8
    assert np.abs(pt.make_rdm1(ao_repr=True) - ref.make_rdm1(ao_repr=True)).max() < 1e-8
    assert abs(np.trace(dm) - mol.nelectron) < 1e-10
    natocc, natorb = pt.make_natorbs()
    assert np.all(np.diff(natocc) <= 1e-12)  # descending
    for index, value in frozen_case["natocc"].items():
        assert abs(natocc[int(index)] - value) < 1e-8, index
    # natural orbitals: orthonormal in the AO metric and diagonalise the AO density
    s = mol.intor("int1e_ovlp")
    assert np.abs(natorb.T @ s @ natorb - np.eye(natorb.shape[1])).max() < 1e-8
    ref.kernel()
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=1e-8)


def test_density_refusals():
    radical = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    with pytest.raises(NotImplementedError, match="ROHF"):
        DFMP2(scf.ROHF(radical).run()).make_rdm1()


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_open_shell_and_scs_densities_on_simulated_trainium(target):
    """density_kernel's spin cases on the emulator (the amplitudes on chip, fp32): the UHF MP2
    density of the hydroxyl radical (same-spin and opposite-spin pairs), relaxed too, and the
    SCS-MP2 density of water, within 1e-6 of the fp64 CPU ones in every element."""
    from dfmp2 import native

    radical = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    uhf = scf.UHF(radical).run(conv_tol=1e-12)
    cpu, trn = (native.DFMP2(uhf, **kw) for kw in ({}, {"device": target, "simulate": True}))
    assert np.abs(trn.make_rdm1() - cpu.make_rdm1()).max() < 1e-6
    assert np.abs(trn.make_rdm1(relaxed=True) - cpu.make_rdm1(relaxed=True)).max() < 1e-6
    assert trn.result.kernels["density_kernel"] >= 1 and "density_block" not in trn.result.kernels
    mf = converged_rhf("water")
    cpu, trn = (native.SCSMP2(mf, frozen=1, **kw) for kw in ({}, {"device": target, "simulate": True}))
    dm_cpu, dm_trn = cpu.make_rdm1(), trn.make_rdm1()
    assert np.abs(dm_trn - dm_cpu).max() < 1e-6
    assert np.abs(dm_cpu - DFMP2(mf, frozen=1).make_rdm1()).max() > 1e-4  # the scaling is there


@pytest.mark.parametrize("frozen", [None, 1])
@pytest.mark.parametrize("scs", [False, True])
def test_uhf_density_matches_pyscf_dfump2_native(frozen, scs):
    """The UHF unrelaxed density [2, nmo, nmo] and the natural occupations of the spin-summed
    density against PySCF's dfump2_native (DFUMP2, SCSDFUMP2) on the same auxiliary set, 1e-10."""
    from pyscf.mp import dfump2_native

    from dfmp2 import native

    mol = gto.M(atom="O 0 0 0; O 0 0 1.21", basis="cc-pvdz", spin=2, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-12)
    ref = (dfump2_native.SCSDFUMP2 if scs else dfump2_native.DFUMP2)(mf, frozen=frozen, auxbasis="cc-pvdz-ri")
    pt = (native.SCSMP2 if scs else native.DFMP2)(mf, frozen=frozen, auxbasis="cc-pvdz-ri")
    dm, dm_ref = pt.make_rdm1(), ref.make_rdm1()
    assert dm.shape == (2, mol.nao, mol.nao) and np.abs(dm - dm_ref).max() < 1e-10
    assert abs(np.trace(dm[0]) - 9) < 1e-10 and abs(np.trace(dm[1]) - 7) < 1e-10
    assert np.abs(pt.make_natorbs()[0] - ref.make_natorbs()[0]).max() < 1e-10
    assert np.abs(pt.make_rdm1(ao_repr=True) - ref.make_rdm1(ao_repr=True)).max() < 1e-10


def test_uhf_density_dropin_matches_pyscf_dfump2():
    """The drop-in's UHF make_rdm1 returns PySCF DFUMP2's (alpha, beta) tuple, from (ia|kb)
    blocks instead of t2, active orbitals too."""
    from pyscf import df
    from pyscf.mp.dfump2 import DFUMP2 as PySCFDFUMP2

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-12)
    ref = PySCFDFUMP2(mf, frozen=1)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    pt = DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri")
    for with_frozen in (True, False):
        ours, theirs = pt.make_rdm1(with_frozen=with_frozen), ref.make_rdm1(with_frozen=with_frozen)
        assert isinstance(ours, tuple) and len(ours) == 2
        assert max(np.abs(a - b).max() for a, b in zip(ours, theirs)) < 1e-8


def test_cli_writes_uhf_natural_orbitals(tmp_path):
    """`dfmp2 run --spin 1 --natorbs`: the spin-summed natural occupations sum to the electrons."""
    xyz = Path(ROOT) / "examples" / "methyl.xyz"
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--spin", "1", "--natorbs", "no.molden",
                           "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    occupations = np.array(json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["natorbs"]["occupations"])
    assert abs(occupations.sum() - 9) < 1e-10 and 0.9 < occupations[4] < 1.1 and occupations[0] <= 2.0


def test_cli_writes_natural_orbitals(tmp_path):
    """`--natorbs FILE.molden`: PySCF reads it back with the occupations in the JSON."""
    from pyscf.tools import molden

    xyz = Path(ROOT) / "examples" / "water.xyz"
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--natorbs", "no.molden",
                           "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    occupations = np.array(record["natorbs"]["occupations"])
    assert abs(occupations.sum() - 10) < 1e-10 and occupations[0] <= 2.0 and occupations[5] < 0.05
    mol, _, _, mo_occ, _, _ = molden.load(str(tmp_path / "no.molden"))
    assert np.allclose(mo_occ, occupations, atol=6e-6)  # Molden keeps 5 decimals
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dfmp2-")] == []
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--natorbs", "nodir/x.molden"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "--natorbs" in proc.stderr


@pytest.mark.parametrize("target, api", [("trn1", "0.2"), ("trn2", "0.7"), ("trn3", "0.6")])
def test_density_on_simulated_trainium(target, api):
    """density_kernel on the emulator (t and T on chip) against the fp64 CPU density: 1e-6 in
    every element, the same natural occupations to 1e-6, trace exact to fp32 sums."""
    mf = converged_rhf("ethylene")
    cpu = DFMP2(mf, frozen=2)
    trn = DFMP2(mf, frozen=2, device=target, simulate=True, nki_api=api)
    dm_cpu, dm_trn = cpu.make_rdm1(), trn.make_rdm1()
    assert np.abs(dm_trn - dm_cpu).max() < 1e-6
    assert abs(np.trace(dm_trn) - mf.mol.nelectron) < 1e-7
    assert np.abs(trn.make_natorbs()[0] - cpu.make_natorbs()[0]).max() < 1e-6
    assert trn.result.kernels["density_kernel"] >= 1 and "density_block" not in trn.result.kernels


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("case, scaling, nocc, nk, nvir, nvir_k, naux, rows", [
    ("closed", (1.0, 1.0), 5, 2, 7, 7, 9, 2), ("closed", (1.2, 1 / 3), 7, 3, 129, 129, 130, 3),
    ("closed", (1.0, 1.0), 4, 4, 300, 300, 200, 4), ("same", (1.0, 1.0), 7, 3, 129, 129, 130, 3),
    ("same", (0.0, 0.5), 5, 2, 20, 20, 33, 2), ("opposite", (1.2, 0.5), 4, 3, 140, 131, 200, 2),
    ("opposite", (1.0, 1.0), 3, 2, 20, 300, 40, 2)])
def test_density_kernel_blocks_and_ragged_sizes(target, case, scaling, nocc, nk, nvir, nvir_k, naux, rows):
    """NkiBackend.density_block over several I >= J launches (rows per side forced small) equals
    the torch backend's fp64 formulas at ragged sizes, for every spin case (closed shell, same
    spin, opposite spin with k's own virtuals) and SCS scalings."""
    import torch

    from dfmp2.kernels.nki.backend import NkiBackend
    from dfmp2.kernels.torch.backend import TorchBackend

    rng = np.random.default_rng(nocc + nvir + nvir_k)
    b = torch.from_numpy(rng.standard_normal((nocc, nvir, naux)) * 0.1)
    e_occ, e_vir = torch.from_numpy(rng.uniform(-2, -0.5, nocc)), torch.from_numpy(rng.uniform(0.2, 3, nvir))
    if case == "opposite":  # k of the other spin: its own B rows and energies
        b_k = torch.from_numpy(rng.standard_normal((nk, nvir_k, naux)) * 0.1)
        e_k, e_vir_k = torch.from_numpy(rng.uniform(-2, -0.5, nk)), torch.from_numpy(rng.uniform(0.2, 3, nvir_k))
    else:
        b_k, e_k, e_vir_k = b[:nk], e_occ[:nk], None
    ref_oo, ref_vv, _ = TorchBackend("cpu", "fp64").density_block(b, b_k, e_occ, e_k, e_vir, scaling, case, e_vir_k)
    nki = NkiBackend(target, simulate=True)
    nki.density_rows = lambda *shape: rows
    oo, vv, _ = nki.density_block(b.float(), b_k.float(), e_occ.float(), e_k.float(), e_vir.float(), scaling, case,
                                  None if e_vir_k is None else e_vir_k.float())
    scale = max(float(ref_oo.abs().max()), float(ref_vv.abs().max()))
    assert float((oo - ref_oo).abs().max()) < 1e-5 * scale
    assert float((vv - ref_vv).abs().max()) < 1e-5 * scale
    blocks = -(-nocc // rows)
    assert nki.calls["density_kernel"] == blocks * (blocks + 1) // 2


@pytest.mark.parametrize("reference, frozen", [("rhf", None), ("rhf", 1), ("uhf", None), ("uhf", 1)])
@pytest.mark.parametrize("scs, scf_mode", [(False, "exact"), (True, "df")])
def test_relaxed_density_matches_pyscf_native(reference, frozen, scs, scf_mode):
    """The relaxed (Z-vector) DF-MP2 density against PySCF's dfmp2_native / dfump2_native
    (relaxed=True) on the same auxiliary set, 1e-8: MP2 and SCS, frozen core or not, an exact
    or a density-fitted SCF (the CPHF response through the SCF's own J/K)."""
    from pyscf.mp import dfmp2_native, dfump2_native

    from dfmp2 import native

    if reference == "rhf":
        mol = gto.M(atom="O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587", basis="cc-pvdz", verbose=0)
        mf, module = scf.RHF(mol), dfmp2_native
    else:
        mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
        mf, module = scf.UHF(mol), dfump2_native
    mf = (mf.density_fit() if scf_mode == "df" else mf).run(conv_tol=1e-12)
    ref_class = getattr(module, ("SCSDF" if scs else "DF") + ("MP2" if reference == "rhf" else "UMP2"))
    ref = ref_class(mf, frozen=frozen, auxbasis="cc-pvdz-ri").make_rdm1(relaxed=True)
    pt = (native.SCSMP2 if scs else native.DFMP2)(mf, frozen=frozen, auxbasis="cc-pvdz-ri")
    dm = pt.make_rdm1(relaxed=True)
    assert dm.shape == ref.shape and np.abs(dm - ref).max() < 1e-8
    assert abs(np.trace(dm.reshape(-1, *dm.shape[-2:]).sum(axis=0)) - mol.nelectron) < 1e-8
    unrelaxed = pt.make_rdm1()
    assert np.abs(dm - unrelaxed).max() > 1e-4  # the response is there


def test_relaxed_density_dropin_and_on_simulated_trainium():
    """The drop-in's make_rdm1(relaxed=True) (PySCF DFMP2's signature) equals the native one;
    on emulated trn1 (density_kernel and gamma_kernel, fp32 on chip) within 1e-6 of it."""
    from pyscf.mp import dfmp2_native

    from dfmp2 import native

    mf = converged_rhf("water")
    ref = dfmp2_native.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri").make_rdm1(relaxed=True)
    assert np.abs(DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri").make_rdm1(relaxed=True) - ref).max() < 1e-8
    trn = native.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri", device="trn1", simulate=True)
    assert np.abs(trn.make_rdm1(relaxed=True) - ref).max() < 1e-6
    assert trn.result.kernels["gamma_kernel"] >= 1 and "gamma_block" not in trn.result.kernels


@pytest.mark.parametrize("spin, atoms", [(0, "O 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692"),
                                         (1, "O 0.1 0 0\nH 0.1 0 0.97")])
def test_cli_relaxed_dipole_matches_pyscf(tmp_path, spin, atoms):
    """`dfmp2 run --properties dipole --precision fp64`: the relaxed MP2 dipole (JSON `dipole`, a.u.)
    against PySCF's dfmp2_native / dfump2_native relaxed density on PySCF's own DF-SCF (same
    JK-fit and MP2-fit sets), 1e-6 a.u. (the two SCFs agree to ~1e-9 Eh)."""
    from pyscf import df
    from pyscf.mp import dfmp2_native, dfump2_native

    xyz = tmp_path / "m.xyz"
    xyz.write_text(f"{len(atoms.splitlines())}\n\n{atoms}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--spin", str(spin), "--precision",
                           "fp64", "--properties", "dipole", "--json", "out.json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "dipole (relaxed)" in proc.stdout
    ours = np.array(json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["dipole"])
    mol = gto.M(atom=atoms.replace("\n", ";"), basis="cc-pvdz", spin=spin, verbose=0)
    mf = (scf.RHF(mol) if spin == 0 else scf.UHF(mol)).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.run(conv_tol=1e-12)
    dm = (dfmp2_native.DFMP2 if spin == 0 else dfump2_native.DFUMP2)(mf, auxbasis="cc-pvdz-ri").make_rdm1(
        relaxed=True, ao_repr=True)
    theirs = mf.dip_moment(mol, dm if spin == 0 else dm[0] + dm[1], unit="AU", verbose=0)
    scf_dipole = mf.dip_moment(mol, mf.make_rdm1() if spin == 0 else mf.make_rdm1().sum(axis=0), unit="AU", verbose=0)
    assert np.abs(ours - theirs).max() < 1e-6 and np.abs(ours - scf_dipole).max() > 1e-3


def test_trainium_densities_out_of_core_are_refused_before_the_pair_stage(monkeypatch):
    """The NKI density kernels take all of B at once: where the plan puts B on disk in several
    slabs (forced here: 2 rows a slab, pair blocks of 2), a density run on trn1 is refused with the reason
    (MemoryBudgetError) when it is planned, before the transform; the same plan on cpu runs out
    of core and equals the in-memory densities to 1e-10."""
    from dataclasses import replace

    from dfmp2 import MemoryBudgetError
    from dfmp2.mp2 import pipeline
    from dfmp2.api.driver import run_mean_field

    mf = converged_rhf("ethylene")
    in_memory = run_mean_field(mf, frozen=2, precision="fp64", with_rdm1=True)
    real_plan_for = pipeline.plan_for
    monkeypatch.setattr(pipeline, "plan_for", lambda *a, **k: replace(  # (a slab: whole pair blocks)
        real_plan_for(*a, **k), storage="disk", occ_block=2, slab_rows=2))
    with pytest.raises(MemoryBudgetError, match="trn1 density kernels take all of \\(ia\\|P\\) at once"):
        run_mean_field(mf, frozen=2, device="trn1", simulate=True, with_rdm1=True)
    out_of_core = run_mean_field(mf, frozen=2, precision="fp64", with_rdm1=True)
    assert out_of_core.correlation.io["bytes_read"] > 0
    for (_, _, oo, vv), (_, _, oo_ref, vv_ref) in zip(out_of_core.correlation.rdm1_active,
                                                      in_memory.correlation.rdm1_active):
        assert np.abs(oo - oo_ref).max() < 1e-10 and np.abs(vv - vv_ref).max() < 1e-10


@pytest.mark.parametrize("case, nvir_k", [("closed", 1500), ("opposite", 700)])
def test_density_kernel_streams_b_rows_and_vv_at_large_sizes(case, nvir_k):
    """nvir 1500 with naux 3000 on trn1: one B row (141 KiB per partition) and P_vv's partial sums
    (70 KiB) together overflow SBUF, so B is streamed in [128, 512] tiles and P_vv accumulates in
    HBM; the result equals the fp64 formulas and the kernel stays inside usable SBUF."""
    import torch

    from nki_emulator import TARGETS
    from dfmp2.kernels.nki.backend import NkiBackend
    from dfmp2.kernels.torch.backend import TorchBackend

    nocc, nk, nvir, naux = 2, 2, 1500, 3000
    rng = np.random.default_rng(nvir_k)
    b = torch.from_numpy(rng.standard_normal((nocc, nvir, naux)) * 0.02)
    e_occ, e_vir = torch.from_numpy(rng.uniform(-2, -0.5, nocc)), torch.from_numpy(rng.uniform(0.2, 3, nvir))
    if case == "opposite":
        b_k = torch.from_numpy(rng.standard_normal((nk, nvir_k, naux)) * 0.02)
        e_k, e_vir_k = torch.from_numpy(rng.uniform(-2, -0.5, nk)), torch.from_numpy(rng.uniform(0.2, 3, nvir_k))
    else:
        b_k, e_k, e_vir_k = b[:nk], e_occ[:nk], None
    ref_oo, ref_vv, _ = TorchBackend("cpu", "fp64").density_block(b, b_k, e_occ, e_k, e_vir, (1.0, 1.0), case, e_vir_k)
    nki = NkiBackend("trn1", simulate=True)
    oo, vv, _ = nki.density_block(b.float(), b_k.float(), e_occ.float(), e_k.float(), e_vir.float(), (1.0, 1.0),
                                  case, None if e_vir_k is None else e_vir_k.float())
    scale = max(float(ref_oo.abs().max()), float(ref_vv.abs().max()))
    assert float((oo - ref_oo).abs().max()) < 1e-5 * scale
    assert float((vv - ref_vv).abs().max()) < 1e-5 * scale
    assert nki.calls["density_kernel"] == 1
    assert nki.trace.peak_sbuf_bytes <= TARGETS["trn1"].sbuf_usable_bytes_per_partition
