"""The sparse layer (dfmp2.sparse): Schwarz-screened block-sparse (mn|P) against PySCF's dense
integrals, the screened MP2 transform and SCF builds against the dense ones and against PySCF,
energies within 1e-8 Eh of the dense run, the --screening setting, its record and refusals."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from pyscf import df, gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

from conftest import TORCH_DEVICES, converged_rhf, load_reference_cases
from dfmp2 import chem
from dfmp2.api.driver import run_mean_field, run_xyz
from dfmp2.util.errors import InputError
from dfmp2.kernels import device_screens, get_backend
from dfmp2.kernels.nki.sparse import TileMap
from dfmp2.chem.jk import FittedCoulombExchange, whiten_fitted_integrals
from dfmp2.sparse import LowerPanels, ScreenedMNP, parse_screening, screen_integrals

TORCH_SCREENS = frozenset({"mp2", "scf"})  # the steps the torch backend (cpu, cuda) screens


def water_chain(n, spacing=4.5, radical=False):
    """n waters along x, `spacing` A apart (the last an OH radical with radical=True): a molecule
    whose far pair blocks the default threshold drops."""
    atoms = []
    for k in range(n):
        x = spacing * k
        atoms += [("O", (x, 0.0, 0.0)), ("H", (x + 0.757, 0.586, 0.0))]
        if not (radical and k == n - 1):
            atoms.append(("H", (x - 0.757, 0.586, 0.0)))
    return atoms


def write_xyz(path, atoms):
    path.write_text(f"{len(atoms)}\n\n" + "".join(f"{s} {x} {y} {z}\n" for s, (x, y, z) in atoms))
    return str(path)


@pytest.fixture(scope="module")
def chain():
    mol = gto.M(atom=water_chain(5), basis="cc-pvdz", verbose=0)
    integrals = chem.MNPIntegrals(mol)
    integrals.screening = integrals.screened_pattern(1e-10, 32)
    return mol, integrals


def pyscf_dense(mol, auxmol):
    """(mn|P) [naux, nao, nao] from PySCF (the independent reference)."""
    return np.asarray(df.incore.aux_e2(mol, auxmol, "int3c2e", aosym="s1")).transpose(2, 0, 1)


def test_pattern_blocks_are_whole_atoms_and_cover_the_basis(chain):
    mol, integrals = chain
    pattern = integrals.screening
    starts = {int(a[2]) for a in mol.aoslice_by_atom()}
    assert pattern.blocks[0][0] == 0 and pattern.blocks[-1][1] == mol.nao
    assert all(b[1] == c[0] for b, c in zip(pattern.blocks, pattern.blocks[1:]))
    assert all(b[0] in starts for b in pattern.blocks)
    assert all((m, m) in pattern.pairs for m in range(len(pattern.blocks)))
    assert len(pattern.pairs) < len(pattern.blocks) * (len(pattern.blocks) + 1) // 2  # something is dropped


def test_dropped_blocks_hold_only_integrals_below_the_threshold(chain):
    """The Schwarz estimate bounds every integral of a dropped block (PySCF's dense integrals)."""
    mol, integrals = chain
    pattern = integrals.screening
    dense = pyscf_dense(mol, integrals.auxmol)
    kept = np.zeros((mol.nao, mol.nao), dtype=bool)
    for m, n in pattern.pairs:
        (a0, a1), (b0, b1) = pattern.blocks[m][:2], pattern.blocks[n][:2]
        kept[a0:a1, b0:b1] = kept[b0:b1, a0:a1] = True
    assert np.abs(dense[:, ~kept]).max() <= pattern.threshold
    assert np.abs(dense[:, ~kept]).max() > 0  # (the test would not see a wrong mask otherwise)


def test_screened_blocks_are_pyscfs_integrals_on_the_kept_blocks(chain):
    mol, integrals = chain
    dense = pyscf_dense(mol, integrals.auxmol)
    p0, p1 = integrals.aux_blocks(100)[1]
    block = integrals.block(p0, p1)
    assert isinstance(block, ScreenedMNP)
    got = block.dense()
    mask = got != 0
    assert np.abs(got[mask] - dense[p0:p1][mask]).max() < 1e-13
    assert np.abs(got - dense[p0:p1]).max() <= integrals.screening.threshold
    lower = integrals.screened_lower(p0, p1)
    assert lower.nbytes < block.nbytes  # each kept pair once
    assert np.array_equal(lower.expand().dense(), got)


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_screened_transform_equals_the_dense_transform_of_the_kept_blocks(chain, precision):
    mol, integrals = chain
    backend = get_backend("cpu", precision)
    p0, p1 = integrals.aux_blocks(100)[0]
    block = integrals.block(p0, p1)
    c = np.linalg.qr(np.random.default_rng(5).standard_normal((mol.nao, mol.nao)))[0]
    c_occ, c_vir = backend.to_device(c[:, :25], fp64=True), backend.to_device(c[:, 25:], fp64=True)
    got = backend.to_host(backend.screened_ao2mo(block.on_device(backend), c_occ, c_vir))
    masked = np.einsum("Pmn,mi,na->iaP", block.dense(), c[:, :25], c[:, 25:])
    full = np.einsum("Pmn,mi,na->iaP", pyscf_dense(mol, integrals.auxmol)[p0:p1], c[:, :25], c[:, 25:])
    assert np.abs(got - masked).max() < 1e-12
    assert np.abs(got - full).max() < 1e-9
    assert backend.calls["screened_ao2mo"] == 1 and backend.calls["ao2mo"] == 0


def test_screened_j_and_k_match_pyscf():
    """J and K of the screened store (fp64 builds) against PySCF's DF J and K."""
    mol = gto.M(atom=water_chain(4), basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=chem.fitting_basis(mol, False).basis)
    rng = np.random.default_rng(2)
    orbitals = np.linalg.qr(rng.standard_normal((mol.nao, 20)))[0]
    dm = orbitals @ orbitals.T
    vj_ref, vk_ref = mf.get_jk(mol, dm)
    jk = chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf))
    record = screen_integrals("1e-10", jk, TORCH_SCREENS, "torch", "scf")
    assert record["used"] and record["kept_fraction"]["pair_blocks"] < 1
    builds = FittedCoulombExchange(get_backend("cpu"), jk, "fp64")
    vj, vk = builds.get_jk(dm[None], [(orbitals, None, None)])
    assert "screened" in builds.record.storage
    assert np.abs(vj[0] - vj_ref).max() < 1e-9 and np.abs(vk[0] - vk_ref).max() < 1e-9


@pytest.mark.parametrize("device", TORCH_DEVICES)
@pytest.mark.parametrize("precision", ["mixed", "fp64"])
def test_screened_builds_out_of_core_match_the_in_memory_ones(monkeypatch, tmp_path, precision, device):
    """Screened JK-fit integrals the budget does not hold stream from a scratch file (each kept
    pair block once, LowerPanels.flat rows), in several blocks: J and K of a density match PySCF's
    DF J and K, the converged energy is the in-memory screened one to 1e-10 Eh, B is read once per
    build and the scratch goes with the builds."""
    import dfmp2.kernels.torch.fitted as fitted
    import dfmp2.sparse.scf_store as screened_store
    import dfmp2.chem.jk as jk_module
    from dfmp2.sparse.formats import LowerPanels as Panels

    mol = gto.M(atom=water_chain(4), basis="cc-pvdz", verbose=0)
    reference = scf.RHF(mol).density_fit(auxbasis=chem.fitting_basis(mol, False).basis)
    reference.conv_tol, reference.conv_tol_grad = 1e-11, 1e-7

    def screened():
        integrals = chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(reference))
        assert screen_integrals("1e-10", integrals, TORCH_SCREENS, "torch", "scf")["used"]
        return integrals

    first = screened()
    lower = first.screened_lower(*first.aux_blocks(12)[0])
    assert all(np.array_equal(a, b) for a, b in zip(Panels.from_flat(lower.pattern, lower.flat()).panels,
                                                      lower.panels))
    in_memory = chem.use_fitted_builds(scf.RHF(mol).density_fit(auxbasis=reference.with_df.auxbasis),
                                       FittedCoulombExchange(get_backend("cpu"), screened(), precision))
    in_memory.conv_tol, in_memory.conv_tol_grad = 1e-11, 1e-7
    in_memory.run()
    integrals = screened()
    columns = integrals.screening.lower_elements
    monkeypatch.setattr(jk_module, "BLOCK_BYTES", 16 * columns * 8)  # raw rows 16 at a time; whitening in blocks
    monkeypatch.setattr(fitted, "BLOCK_BYTES", 10 * 8 * columns)  # J-only passes: 10 auxiliary functions a block
    monkeypatch.setattr(screened_store, "SCREENED_BLOCK_BYTES", 12 * 4 * integrals.screening.stored_elements)  # K: 12 or 6
    monkeypatch.setattr(FittedCoulombExchange, "_free_bytes", lambda self: 4 * jk_module.BLOCK_BYTES)
    if precision == "fp64":
        rng = np.random.default_rng(5)
        orbitals = np.linalg.qr(rng.standard_normal((mol.nao, 20)))[0]
        dm = orbitals @ orbitals.T
        vj_ref, vk_ref = reference.get_jk(mol, dm)
        builds = FittedCoulombExchange(get_backend(device), integrals, precision, scratch=str(tmp_path))
        vj, vk = builds.get_jk(dm[None], [(orbitals, None, None)])
        assert np.abs(vj[0] - vj_ref).max() < 1e-9 and np.abs(vk[0] - vk_ref).max() < 1e-9
        builds.close()
        assert os.listdir(tmp_path) == []
    builds = FittedCoulombExchange(get_backend(device), integrals, precision, scratch=str(tmp_path))
    mf = chem.use_fitted_builds(scf.RHF(mol).density_fit(auxbasis=reference.with_df.auxbasis), builds)
    mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
    mf.run()
    assert builds.record.storage.startswith("screened: each kept pair block once fp64 on disk")
    assert abs(mf.e_tot - in_memory.e_tot) < 1e-10
    assert len(os.listdir(tmp_path)) == 1
    builds.close()
    assert os.listdir(tmp_path) == []
    stored = builds.naux * columns * 8
    io = builds.record.as_dict()["io"]
    assert io["bytes_read"] == stored * (1 + len(builds.record.builds)) and io["bytes_written"] == 2 * stored


def test_whitened_lower_panels_keep_the_pattern():
    mol = gto.M(atom=water_chain(3), basis="cc-pvdz", verbose=0)
    jk = chem.jk_fitting_integrals(mol, chem.fitting_basis(mol, False).basis)
    screen_integrals("1e-10", jk, TORCH_SCREENS, "torch", "scf")
    rows, factor = whiten_fitted_integrals(get_backend("cpu"), jk)
    assert isinstance(rows, LowerPanels) and rows.naux == factor.nkept
    assert [p.shape[1:] for p in rows.panels] == [p.shape[1:] for p in jk.screened_lower(0, 10).panels]


@pytest.mark.parametrize("spin,reference", [(0, "rhf"), (1, "uhf"), (1, "rohf")])
def test_screened_run_matches_dense_and_pyscf(tmp_path, spin, reference):
    """The whole job (SCF on dfmp2's builds, MP2) screened at the default threshold against the
    dense run (1e-8 Eh) and against PySCF's DF-SCF + DF-MP2 on the same fitting sets."""
    atoms = water_chain(4, radical=spin == 1)
    path = write_xyz(tmp_path / "chain.xyz", atoms)
    common = dict(spin=spin, reference=reference, precision="fp64")
    screened = run_xyz(path, screening="1e-10", **common)
    dense = run_xyz(path, screening="off", **common)
    record = screened.as_dict()["screening"]
    assert record["mp2"]["used"] and record["scf"]["used"]
    assert record["mp2"]["kept_fraction"]["pair_blocks"] < 1 and record["mp2"]["bytes"]["saved"] > 0
    assert screened.kernels.get("screened_ao2mo", 0) > 0 and dense.kernels.get("screened_ao2mo", 0) == 0
    assert abs(screened.e_tot - dense.e_tot) < 1e-8 and abs(screened.e_corr - dense.e_corr) < 1e-8
    if reference == "rhf":  # PySCF's own DF-RHF + DF-MP2 (independent)
        mol = gto.M(atom=atoms, basis="cc-pvdz", verbose=0)
        mf = scf.RHF(mol).density_fit(auxbasis=chem.fitting_basis(mol, False).basis)
        mf.conv_tol = 1e-11
        mf.kernel()
        pt = pyscf_dfmp2.DFMP2(mf)
        pt.with_df = df.DF(mol, auxbasis=chem.fitting_basis(mol, True).basis)
        pt.kernel(with_t2=False)
        assert abs(screened.e_tot - pt.e_tot) < 1e-8


def test_plugin_mean_field_is_screened_as_asked():
    mol = gto.M(atom=water_chain(4), basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11)
    dense = run_mean_field(mf, screening="off")
    screened = run_mean_field(mf, screening="1e-10")
    assert screened.screening["mp2"]["used"] and not dense.screening["mp2"]["used"]
    assert abs(screened.e_corr - dense.e_corr) < 1e-8


def test_auto_leaves_a_compact_molecule_dense_and_says_why():
    mol = gto.M(atom="O 0 0 0; H 0.757 0.586 0; H -0.757 0.586 0", basis="cc-pvdz", verbose=0)
    integrals = chem.MNPIntegrals(mol)
    record = screen_integrals("auto", integrals, TORCH_SCREENS, "torch")
    assert not record["used"] and integrals.screening is None
    assert "compact" in record["reason"] and record["kept_fraction"]["elements"] == 1.0


def test_auto_screens_an_extended_molecule():
    mol = gto.M(atom=water_chain(10, spacing=5.0), basis="cc-pvdz", verbose=0)
    integrals = chem.MNPIntegrals(mol)
    record = screen_integrals("auto", integrals, TORCH_SCREENS, "torch")
    assert record["used"] and integrals.screening is not None and record["kept_fraction"]["stored"] <= 0.5


@pytest.mark.parametrize("value", ["sometimes", "0", "-1e-10", "1e-3", "nan"])
def test_bad_screening_values_are_refused(value):
    with pytest.raises(InputError, match="^screening="):
        parse_screening(value)


def test_screening_on_trainium_covers_the_transform_only():
    """trn1/trn2 have the block-sparse transform but not block-sparse SCF builds: a threshold screens
    the MP2 step and leaves the SCF dense, saying so; a backend with none refuses a threshold."""
    assert device_screens("trn1") == {"mp2"} and device_screens("cpu") == TORCH_SCREENS
    assert get_backend("trn1", simulate=True).screens == {"mp2"} and get_backend("cpu").screens == TORCH_SCREENS
    mol = gto.M(atom=water_chain(6, spacing=5.0), basis="sto-3g", verbose=0)
    assert screen_integrals("1e-10", chem.MNPIntegrals(mol), {"mp2"}, "nki")["used"]
    jk = chem.jk_fitting_integrals(mol, chem.fitting_basis(mol, False).basis)
    record = screen_integrals("1e-10", jk, {"mp2"}, "nki", "scf")
    assert not record["used"] and jk.screening is None and "no block-sparse SCF builds" in record["reason"]
    with pytest.raises(InputError, match="no block-sparse kernels"):
        screen_integrals("1e-10", chem.MNPIntegrals(mol), frozenset(), "other")
    record = screen_integrals("auto", chem.MNPIntegrals(mol), frozenset(), "other")
    assert not record["used"] and "no block-sparse AO->MO transform" in record["reason"]


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dfmp2.app.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)


def test_cli_screening_option_and_record(tmp_path):
    path = write_xyz(tmp_path / "chain.xyz", water_chain(3))
    out = tmp_path / "r.json"
    proc = _cli("run", path, "--screening", "1e-10", "--json", out, "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())["screening"]
    for kind in ("mp2", "scf"):
        assert record[kind]["threshold"] == 1e-10 and record[kind]["used"] is True
        assert set(record[kind]["kept_fraction"]) == {"pair_blocks", "elements", "stored"}
        assert record[kind]["bytes"]["saved"] == record[kind]["bytes"]["dense"] - record[kind]["bytes"]["kept"]
    for args, message in ((["--screening", "often"], "--screening often"),
                          (["--screening", "1e-3"], "a threshold must be in")):
        proc = _cli("run", path, *args, cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def _transforms(backend, screened, c_occ, c_vir):
    """(ia|P) of a ScreenedMNP on `backend` (host fp64 operands), as a host array."""
    return backend.to_host(backend.screened_ao2mo(screened.on_device(backend), backend.to_device(c_occ, fp64=True),
                                                  backend.to_device(c_vir, fp64=True)))


@pytest.mark.parametrize("transform", ["exact", "fp32"])
def test_nki_block_sparse_transform_skips_dropped_tiles(transform):
    """ao2mo_kernel's block-sparse layout on the emulator: the same (ia|P) as the fp64 torch
    screened transform (exact: to fp32 rounding of the output; fp32: 1e-6), and as the dense kernel
    on the densified kept blocks, bit for bit, with only the kept 128 x 128 tiles uploaded and
    multiplied."""
    mol = gto.M(atom=water_chain(16, spacing=5.0), basis="cc-pvdz", verbose=0)  # 384 AOs: 3 x 3 whole tiles
    integrals = chem.MNPIntegrals(mol)
    screen_integrals("1e-10", integrals, {"mp2"}, "nki")
    tiles = TileMap.from_pattern(integrals.screening)
    assert tiles.ntiles < tiles.nm ** 2  # the far-apart ends' tiles are dropped
    screened = integrals.block(0, 13)
    c = np.linalg.qr(np.random.default_rng(3).standard_normal((mol.nao, mol.nao)))[0]
    c_occ, c_vir = c[:, :40], c[:, 40:]
    reference = _transforms(get_backend("cpu", "fp64"), screened, c_occ, c_vir)
    sparse, dense = (get_backend("trn2", simulate=True, transform=transform) for _ in range(2))
    out = _transforms(sparse, screened, c_occ, c_vir)
    scale = np.abs(reference).max()
    assert np.abs(out - reference).max() < (2 ** -22 if transform == "exact" else 1e-6) * scale
    whole = dense.to_host(dense.ao2mo(torch.from_numpy(screened.dense()), dense.to_device(c_occ, fp64=True),
                                      dense.to_device(c_vir, fp64=True)))
    assert np.array_equal(out, whole)
    kept, every = sparse.trace.as_dict(), dense.trace.as_dict()
    assert kept["matmuls"] < every["matmuls"] and kept["host_mb_in"] < every["host_mb_in"]
    assert sparse.calls["host:pack_tiles"] == 1 and sparse.specializations["ao2mo_kernel"] != \
        dense.specializations["ao2mo_kernel"]


def test_trainium_screened_run_matches_dense():
    """A screened MP2 step on emulated trn2 (model-only repeats): within 1 uEh of the dense fp64
    run, only kept tiles streamed (the record says how many), the SCF's builds not screened."""
    mol = gto.M(atom=water_chain(12, spacing=5.0), basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit().run(conv_tol=1e-10)
    dense = run_mean_field(mf, screening="off")
    trn = run_mean_field(mf, device="trn2", simulate=True, model_only=True, screening="1e-10")
    record = trn.screening["mp2"]
    assert record["used"] and record["kernel_layout"]["unit"] == "128 x 128 tiles"
    assert record["kernel_layout"]["kept_tiles"] < record["kernel_layout"]["tiles"]
    assert abs(trn.e_corr - dense.e_corr) < 1e-6
    assert trn.kernels["host:pack_tiles"] >= 1 and "ao2mo_kernel" in trn.kernels


@pytest.mark.parametrize("case", load_reference_cases(), ids=lambda c: c["name"])
def test_published_reference_set_screened_at_the_default_threshold(case):
    """The reference set with screening forced at 1e-10 (auto would leave these compact molecules
    dense): the published energies to 1e-8 Eh, as the dense path has them."""
    mf = converged_rhf(case["name"], basis=case["basis"], scf_mode="df" if case["scf"].startswith("df") else "exact",
                       atom=case["atom"], unit=case["unit"], conv_tol=case["scf_conv_tol"])
    result = run_mean_field(mf, auxbasis=case["auxbasis"], frozen=case["frozen"] or None, screening="1e-10")
    assert result.screening["mp2"]["used"] and result.screening["mp2"]["threshold"] == 1e-10
    assert abs(result.e_corr - case["e_corr"]) < 1e-8


def test_the_block_sparse_product_is_the_dense_product_over_the_kept_blocks():
    """sparse.block_sparse_product (the SCF's half transforms) and sparse.ao2mo (the MP2 transform) on
    a banded pattern with ragged blocks: numpy's dense products of the same (mn|P), zero outside the
    kept blocks, to 1e-13 of the largest element; the synthetic (mn|P) is symmetric in m, n."""
    from dfmp2.sparse import ao2mo, banded_pattern, block_sparse_product, random_screened

    pattern = banded_pattern(300, 64, 1)  # 5 blocks, the last 44 wide
    assert len(pattern.pairs) == 9 and pattern.stored_elements < 300**2
    screened = random_screened(pattern, 7, seed=3)
    dense = screened.dense()
    assert np.array_equal(dense, dense.transpose(0, 2, 1))
    assert not dense[:, :64, 128:].any()  # blocks two apart are dropped
    rng = np.random.default_rng(4)
    factor, c_vir = rng.standard_normal((300, 9)), rng.standard_normal((300, 291))
    backend = get_backend("cpu", "fp64")
    on_device = screened.on_device(backend)
    x = block_sparse_product(backend, on_device, torch.from_numpy(factor)).numpy()
    mo = ao2mo(backend, on_device, torch.from_numpy(factor), torch.from_numpy(c_vir)).numpy()
    for value, reference in ((x, np.einsum("pmn,nr->mpr", dense, factor)),
                             (mo, np.einsum("pmn,mi,na->iap", dense, factor, c_vir))):
        assert np.abs(value - reference).max() < 1e-13 * np.abs(reference).max()


def test_a_backend_without_screened_scf_builds_refuses_them_in_one_line():
    """The NKI backend screens the MP2 transform only: the sparse layer's SCF store and half transform
    refuse it by name rather than running something else."""
    from dfmp2.sparse import banded_pattern, block_sparse_product, fitted_store, random_screened

    backend = get_backend("trn2", simulate=True)
    screened = random_screened(banded_pattern(256, 128, 0), 2)
    with pytest.raises(ValueError, match=r"^block_sparse_product: the nki backend has no block-sparse half"):
        block_sparse_product(backend, screened, torch.ones((256, 3)))
    lower = LowerPanels(screened.pattern, [p[:, :, -128:] for p in screened.panels])
    with pytest.raises(ValueError, match=r"^fitted_store: the nki backend has no screened SCF builds"):
        fitted_store(backend, lower, 256, ["fp32"], lambda: 10**9)
