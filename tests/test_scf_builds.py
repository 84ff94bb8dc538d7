"""dfmp2's SCF Coulomb/exchange builds (dfmp2.chem.jk) against PySCF's own DF-SCF on the same JK-fit set:
converged energies to 1e-9 Eh (E_SCF) and 1e-8 Eh (E_total), J and K matrices of arbitrary densities,
the precision policy, the memory fallbacks and the refusals."""

import json
import os

import numpy as np
import pytest
from pyscf import dft, gto, scf

import dfmp2
from conftest import TORCH_DEVICES
from dfmp2 import chem
from dfmp2.api.driver import run_xyz
from dfmp2.util.errors import InputError
from dfmp2.kernels import get_backend
from dfmp2.chem.jk import FittedCoulombExchange

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
WATER = os.path.join(EXAMPLES, "water.xyz")
METHYL = os.path.join(EXAMPLES, "methyl.xyz")

GLYCINE = """N 0.000 0.000 0.000; C 1.450 0.000 0.000; C 2.000 1.420 0.000; O 1.300 2.400 0.000
O 3.330 1.500 0.000; H 3.600 2.430 0.000; H -0.340 -0.940 0.000; H -0.340 0.470 0.810
H 1.800 -0.520 0.890; H 1.800 -0.520 -0.890"""


def _mean_field(mol, kind, xc=None):
    cls = {"rhf": scf.RHF, "uhf": scf.UHF, "rohf": scf.ROHF} if xc is None else \
        {"rhf": dft.RKS, "uhf": dft.UKS, "rohf": dft.ROKS}
    mf = cls[kind](mol) if xc is None else cls[kind](mol, xc=xc)
    if xc is not None:
        mf.grids.level = 1  # the same (coarse) grid on both sides
    mf = mf.density_fit(auxbasis=chem.fitting_basis(mol, False).basis)
    mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
    return mf


@pytest.mark.parametrize("kind,xc,charge,spin", [
    ("rhf", None, 0, 0), ("uhf", None, 1, 1), ("rohf", None, 1, 1),
    ("rhf", "b3lyp", 0, 0), ("uhf", "pbe0", 1, 1), ("rohf", "b3lyp", 1, 1)])
@pytest.mark.parametrize("precision", ["mixed", "fp64"])
def test_converged_energy_matches_pyscf(kind, xc, charge, spin, precision):
    """The SCF with dfmp2's builds converges to PySCF's fp64 DF-SCF energy to 1e-9 Eh."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", charge=charge, spin=spin, verbose=0)
    reference = _mean_field(mol, kind, xc).run()
    mf = _mean_field(mol, kind, xc)
    builds = FittedCoulombExchange(get_backend("cpu"), chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf)),
                                   precision)
    chem.use_fitted_builds(mf, builds).run()
    assert mf.converged
    assert abs(mf.e_tot - reference.e_tot) < 1e-9
    kinds = set(builds.record.builds)
    if precision == "fp64":
        assert kinds == {"fp64"}
    else:  # fp32 builds early, fp64 anchors, fp32 increments on an anchor
        assert {"fp32", "fp64", "incremental"} <= kinds


@pytest.mark.parametrize("hermi", [1, 0])
def test_j_and_k_of_arbitrary_densities(hermi):
    """J and K of untagged densities (an indefinite symmetric one; a non-symmetric one) equal PySCF's."""
    mol = gto.M(atom=GLYCINE, basis="cc-pvdz", verbose=0)
    mf = _mean_field(mol, "rhf")
    rng = np.random.default_rng(7)
    dm = rng.standard_normal((2, mol.nao, mol.nao)) * 0.1
    if hermi == 1:
        dm = dm + dm.transpose(0, 2, 1)
    vj_ref, vk_ref = mf.get_jk(mol, dm, hermi=hermi)
    builds = FittedCoulombExchange(get_backend("cpu"), chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf)), "fp64")
    dms, factors, shape = chem.density_factors(dm)
    vj, vk = builds.get_jk(dms, factors, hermi=hermi)
    assert np.abs(vj - vj_ref).max() < 1e-10
    assert builds.record.coulomb == "rho from K's half transforms, one fp64 pass"  # (cpu, in memory)
    if hermi == 1:
        assert np.abs(vk - vk_ref).max() < 1e-10
    else:  # PySCF's DF exchange of a non-symmetric density: sum_P B^P D B^P, not symmetric
        assert np.abs(vk - vk_ref).max() < 1e-10 and np.abs(vk - vk.transpose(0, 2, 1)).max() > 1e-3


def test_increment_from_rotated_orbitals():
    """An incremental build from orbitals that moved by 1e-3 and were rotated among themselves
    (the same density as unrotated ones): J and K of D - D_anchor against PySCF's fp64 difference
    to 1e-6 of the change (K(D) - K(D_anchor) from two fp32 builds: 3e-5 of it), with the
    anchor's half transforms kept and not."""
    from dfmp2.chem.jk import orbital_steps, whiten_fitted_integrals

    mol = gto.M(atom=GLYCINE, basis="cc-pvdz", verbose=0)
    mf = _mean_field(mol, "rhf")
    rng = np.random.default_rng(3)
    nocc = mol.nelectron // 2
    anchor = np.linalg.qr(rng.standard_normal((mol.nao, nocc)))[0] * 0.5
    rotation = np.linalg.qr(rng.standard_normal((nocc, nocc)))[0]
    moved = (anchor + 1e-3 * rng.standard_normal(anchor.shape)) @ rotation
    d_anchor, d = anchor @ anchor.T, moved @ moved.T
    vj_ref, vk_ref = (np.asarray(a) - np.asarray(b) for a, b in zip(mf.get_jk(mol, d), mf.get_jk(mol, d_anchor)))
    backend = get_backend("cpu")
    rows, _ = whiten_fitted_integrals(backend, chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf)))
    for free in (10**10, 0):
        store = backend.fitted_store(rows, mol.nao, ["fp32", "fp64"], lambda: free)
        anchor_factors = [(anchor, None, None)]
        store.build(d_anchor[None], anchor_factors, "fp64", True, True, anchor=True)
        steps = orbital_steps([(moved, None, None)], anchor_factors)
        assert np.abs(steps[0]).max() < 0.01  # aligned: the rotation is undone
        vj, vk = store.build_increment((d - d_anchor)[None], anchor_factors, steps, True, True)
        assert np.abs(vk[0] - vk_ref).max() < 1e-6 * np.abs(vk_ref).max()
        assert np.abs(vj[0] - vj_ref).max() < 1e-6 * np.abs(vj_ref).max()
        assert store.increment_form == ("orbitals, kept anchor halves" if free else "orbitals, anchor halves made")


def test_tags_that_do_not_describe_the_density_are_not_used():
    """A density PySCF tags with orbitals, then changed (damping arithmetic keeps no tags, but a caller's
    may): the builds use the density itself."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    mf = _mean_field(mol, "rhf").run()
    dm = mf.make_rdm1()
    from pyscf import lib

    changed = lib.tag_array(np.asarray(dm) * 0.9, mo_coeff=dm.mo_coeff, mo_occ=dm.mo_occ)
    builds = FittedCoulombExchange(get_backend("cpu"), chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf)), "fp64")
    dms, factors, _ = chem.density_factors(changed)
    vj, vk = builds.get_jk(dms, factors)
    vj_ref, vk_ref = mf.get_jk(mol, np.asarray(changed))
    assert np.abs(vk[0] - vk_ref).max() < 1e-10 and np.abs(vj[0] - vj_ref).max() < 1e-10


@pytest.mark.parametrize("room,precision,square64,storage,increments", [
    (0, "mixed", "1", "fp64 triangle", "orbitals, anchor halves made"),
    (4, "mixed", "1", "square 32 + fp64 triangle", "orbitals, anchor halves made"),
    (5, "mixed", "1", "square 32 + fp64 triangle", "orbitals, kept anchor halves"),
    (20, "mixed", "1", "square 64 + square 32 + fp64 triangle", "orbitals, kept anchor halves"),
    (20, "mixed", "0", "square 32 + fp64 triangle", "orbitals, kept anchor halves"),
    (4, "fp64", "0", "fp64 triangle", None), (8, "fp64", "0", "square 64 + fp64 triangle", None)])
def test_budget_decides_the_copies_of_b(monkeypatch, room, precision, square64, storage, increments):
    """The budget beyond the triangle (room: bytes per square element) decides the square copies kept
    (the kind most builds use; then the anchors' fp64 where it takes at most half of the rest and the
    CPU's configuration keeps one: DFMP2_SCF_FP64_SQUARE, util.cpu_config) and whether the anchor's
    half transforms are kept for the increments; K from whatever is kept (the triangle unpacked block
    by block at the least) gives the same energy."""
    import dfmp2.chem.jk as jk

    monkeypatch.setenv("DFMP2_SCF_FP64_SQUARE", square64)
    mol = gto.M(atom=WATER, basis="cc-pvtz", verbose=0)
    reference = _mean_field(mol, "rhf").run()
    mf = _mean_field(mol, "rhf")
    integrals = chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf))
    triangle = integrals.naux * mol.nao * (mol.nao + 1) // 2 * 8
    builds = FittedCoulombExchange(get_backend("cpu"), integrals, precision)
    asked = []  # the budget is read before the whitening (nothing resident), then with the triangle in place

    def resident():  # and the square copy, once made
        squares = builds._store._square.values() if builds._store is not None else ()
        return (triangle + sum(t.numel() * t.element_size() for t in squares)) if asked.append(1) or len(asked) > 1 else 0
    monkeypatch.setattr(jk, "resident_bytes", resident)
    monkeypatch.setattr(jk, "budget_bytes", lambda _: triangle + 4 * jk.BLOCK_BYTES + room * integrals.naux * mol.nao ** 2)
    chem.use_fitted_builds(mf, builds).run()
    assert builds.record.storage == storage
    # a CPU keeps its squares m-major (the half transforms and K one product over every P)
    assert builds.record.square_layout == ("m-major [nao, naux, nao]" if "square" in storage else "")
    if precision == "mixed" and room:  # (a choice only where an fp32 square is kept)
        wanted = "wanted (kept where the budget holds it)" if square64 == "1" else "not kept"
        assert builds.record.square_choice.startswith(f"fp64 square {wanted}: "
                                                      f"DFMP2_SCF_FP64_SQUARE={square64} (set by the user)")
    forms = set(builds.record.increment_forms)
    assert forms == ({increments} if increments else set())
    assert abs(mf.e_tot - reference.e_tot) < 1e-9


@pytest.mark.parametrize("device", TORCH_DEVICES)
@pytest.mark.parametrize("precision", ["mixed", "fp64"])
def test_out_of_core_builds_match_the_in_memory_ones(monkeypatch, tmp_path, precision, device):
    """Where the budget does not hold the whitened JK-fit integrals they stream from a scratch
    file, in several blocks (the whitening in place by blocks of pair columns, each build by blocks of
    auxiliary functions, J's sums on K's pass): the converged energy is the in-memory one to
    1e-10 Eh, the record says where B was and what was read (once per build), and the scratch
    directory goes with the builds. On a GPU the blocks are read on the host and uploaded."""
    import dfmp2.kernels.torch.fitted as fitted
    import dfmp2.chem.jk as jk

    mol = gto.M(atom=WATER, basis="cc-pvtz", verbose=0)
    in_memory = _mean_field(mol, "rhf")
    integrals = chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(in_memory))
    chem.use_fitted_builds(in_memory, FittedCoulombExchange(get_backend("cpu"), integrals, precision)).run()
    npair = mol.nao * (mol.nao + 1) // 2
    monkeypatch.setattr(jk, "BLOCK_BYTES", 16 * npair * 8)  # raw rows 16 at a time; whitening ~100 columns
    monkeypatch.setattr(fitted, "BLOCK_BYTES", 10 * 8 * mol.nao ** 2)  # builds: 10 auxiliary functions a block
    monkeypatch.setattr(FittedCoulombExchange, "_free_bytes", lambda self: 4 * jk.BLOCK_BYTES)
    mf = _mean_field(mol, "rhf")
    builds = FittedCoulombExchange(get_backend(device), integrals, precision, scratch=str(tmp_path))
    chem.use_fitted_builds(mf, builds).run()
    assert builds.record.storage.startswith("fp64 triangle on disk")
    assert abs(mf.e_tot - in_memory.e_tot) < 1e-10
    assert len(os.listdir(tmp_path)) == 1  # one scratch directory: the integrals, whitened in place
    builds.close()
    assert os.listdir(tmp_path) == []
    triangle = builds.naux * npair * 8
    io = builds.record.as_dict()["io"]
    assert io["bytes_read"] == triangle * (1 + len(builds.record.builds))  # by the whitening, then once per build
    assert io["bytes_written"] == 2 * triangle  # the integrals, then B over them


@pytest.mark.parametrize("options", [
    dict(reference="rohf", spin=1), dict(xc="b2plyp"), dict(frozen_core=True)])
def test_whole_run_matches_pyscf_builds(options):
    """run_xyz with dfmp2's builds (the default) and with PySCF's: E_total to 1e-8 Eh; the record says which ran."""
    path = METHYL if options.get("spin") else WATER
    ours = run_xyz(path, **options)
    theirs = run_xyz(path, scf_backend="pyscf", **options)
    assert abs(ours.e_tot - theirs.e_tot) < 1e-8
    assert abs(ours.e_ref - theirs.e_ref) < 1e-9
    record, other = ours.as_dict(), theirs.as_dict()
    assert record["scf_backend"] == "torch" and record["scf_precision"] == "mixed"
    assert record["scf_iterations"] >= 1 and record["scf_builds"]["builds"] >= record["scf_iterations"]
    assert record["kernels"]["exchange_product"] >= 1
    assert other["scf_backend"] == "pyscf" and "exchange_product" not in other["kernels"]


def test_cli_records_the_scf_builds(tmp_path):
    from dfmp2.app.cli import main

    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as stop:
        main(["run", WATER, "--scf-precision", "fp64", "--quiet", "--json", str(out)])
    assert stop.value.code == 0
    record = json.loads(out.read_text())
    assert record["scf_backend"] == "torch" and record["scf_precision"] == "fp64"
    assert record["scf_builds"]["fp64_builds"] == record["scf_builds"]["builds"] > 0
    assert len(record["scf_builds"]["build_seconds"]) == record["scf_builds"]["builds"]
    assert record["scf_builds"]["build_kinds"] == ["fp64"] * record["scf_builds"]["builds"]


@pytest.mark.parametrize("args,message", [
    (["--scf", "exact", "--scf-backend", "device"], "four-center"),
    (["--scf-backend", "gpu"], "unknown SCF backend"),
    (["--scf-precision", "fp16"], "unknown SCF precision"),
    (["--scf-backend", "pyscf", "--scf-precision", "fp64"], "--scf-precision applies"),
    (["--device", "trn1", "--simulate", "--scf-precision", "fp64"], "no fp64 arithmetic"),
])
def test_refusals(args, message, capsys):
    from dfmp2.app.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["run", WATER, "--quiet", *args])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_range_separated_double_hybrid_keeps_pyscf_builds(capsys):
    """A custom range-separated KS part: PySCF's builds by default (recorded), refused before the SCF if
    dfmp2's are asked for."""
    from dfmp2.app.cli import main

    assert run_xyz(WATER, xc="wb97x", c_os=0.5, c_ss=0.2).as_dict()["scf_backend"] == "pyscf"
    with pytest.raises(SystemExit) as stop:
        main(["run", WATER, "--quiet", "--xc", "wb97x", "--c-os", "0.5", "--c-ss", "0.2", "--scf-backend", "device"])
    assert stop.value.code == 2 and "range-separated" in capsys.readouterr().err


@pytest.mark.parametrize("kind,xc,charge,spin", [
    ("rhf", None, 0, 0), ("uhf", None, 1, 1), ("rohf", None, 1, 1),
    ("rhf", "b3lyp", 0, 0), ("uhf", "pbe0", 1, 1), ("rhf", "pbe", 0, 0)])
def test_trainium_builds_converge_to_the_fp64_energy(kind, xc, charge, spin):
    """NKI builds, every kernel emulated in full: fp32 builds while the density moves, exact-product
    anchors and fp32 increments converge to PySCF's fp64 DF-SCF energy within 1e-8 Eh (measured
    <= 2e-9), in as many cycles as PySCF's own (+1)."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", charge=charge, spin=spin, verbose=0)
    reference = _mean_field(mol, kind, xc).run()
    mf = _mean_field(mol, kind, xc)
    backend = get_backend("trn1", simulate=True)
    builds = FittedCoulombExchange(backend, chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf)))
    chem.use_fitted_builds(mf, builds).run()
    assert mf.converged and mf.cycles <= reference.cycles + 1
    assert abs(mf.e_tot - reference.e_tot) < 1e-8
    assert {"fp32", "exact", "incremental"} <= set(builds.record.builds)
    assert backend.calls["fitted_jk_kernel"] > 0 and backend.calls["exact_matmul_kernel"] > 0
    assert builds.record.whitening == "cpu, fp64"


def test_trainium_fp32_builds_alone_do_not_reach_the_fp64_energy():
    """Why the anchors: the same SCF with every NKI build in fp32 (J and K) stops short of PySCF's
    fp64 energy by more than the 1e-8 Eh the mixed builds reach."""
    import dfmp2.chem.jk as jk

    mol = gto.M(atom=WATER, basis="cc-pvtz", verbose=0)
    reference = _mean_field(mol, "rhf").run()
    mf = _mean_field(mol, "rhf")
    mf.max_cycle = 30
    builds = FittedCoulombExchange(get_backend("trn1", simulate=True, model_only=True),
                                   chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf)))
    builds._build_plan = lambda dms, with_j, with_k: ("fp32", None)
    chem.use_fitted_builds(mf, builds).run()
    assert abs(mf.e_tot - reference.e_tot) > 1e-8
    assert jk.SCF_PRECISIONS == ("mixed", "fp64")  # and no user can ask for it


def test_trainium_whole_job_envelope_at_triple_zeta():
    """E_total on trn1 (SCF builds and MP2 kernels, model-only emulation) within 1 uEh of the fp64
    run on the host; benzene/cc-pVTZ (264 functions; measured 1.1e-7 Eh, E_HF 2e-9 Eh)."""
    benzene = os.path.join(EXAMPLES, "benzene.xyz")
    host = run_xyz(benzene, basis="cc-pvtz").as_dict()
    trn = run_xyz(benzene, basis="cc-pvtz", device="trn1", simulate=True, model_only=True).as_dict()
    assert abs(trn["e_hf"] - host["e_hf"]) < 1e-8
    assert abs(trn["e_tot"] - host["e_tot"]) < 1e-6
    assert trn["scf_backend"] == "nki" and trn["scf_builds"]["exact_builds"] >= 1
    steps = trn["modelled"]["trn1"]["seconds_by_step"]
    assert steps["fitted_jk_kernel"]["launches"] >= trn["scf_builds"]["fp32_builds"]
    assert len(trn["scf_builds"]["modelled_build_seconds"]["trn1"]) == trn["scf_builds"]["builds"]


def test_trainium_double_hybrid_matches_the_host():
    """B2PLYP on trn1 (emulated in full): the KS part's J and scaled K from the NKI builds, the MP2
    part from the NKI kernels; E_total within 1 uEh of the fp64 host run."""
    host = run_xyz(WATER, xc="b2plyp").as_dict()
    trn = run_xyz(WATER, xc="b2plyp", device="trn1", simulate=True).as_dict()
    assert trn["scf_backend"] == "nki"
    assert abs(trn["e_tot"] - host["e_tot"]) < 1e-6


def test_range_separated_exchange_is_refused():
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    mf = dfmp2.use_dfmp2_jk(_mean_field(mol, "rhf", xc="wb97x"))
    mf.max_cycle = 1
    with pytest.raises(InputError, match="range-separated"):
        mf.kernel()


def test_plugin_mean_field_uses_the_builds_and_the_record_says_so():
    """dfmp2.use_dfmp2_jk on a user's mean field, then dfmp2's DFMP2: same energies as PySCF's SCF."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    reference = _mean_field(mol, "rhf").run()
    mf = dfmp2.use_dfmp2_jk(_mean_field(mol, "rhf")).run()
    assert abs(mf.e_tot - reference.e_tot) < 1e-9
    pt = dfmp2.DFMP2(mf).run()
    assert pt.result.as_dict()["scf_backend"] == "torch"
    assert dfmp2.DFMP2(reference).run().result.as_dict()["scf_backend"] == "pyscf"
    with pytest.raises(InputError, match="density_fit"):
        dfmp2.use_dfmp2_jk(scf.RHF(mol))


def test_a_new_geometry_gets_new_integrals():
    """mf.reset(new_mol) (a geometry scan) after use_dfmp2_jk: the builds follow the new molecule."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    mf = dfmp2.use_dfmp2_jk(_mean_field(mol, "rhf")).run()
    stretched = gto.M(atom="O 0 0 0; H 0 -0.80 0.60; H 0 0.80 0.60", basis="cc-pvdz", verbose=0)
    mf.reset(stretched)
    mf.run()
    reference = _mean_field(stretched, "rhf").run()
    assert abs(mf.e_tot - reference.e_tot) < 1e-9


def test_trainium_store_refuses_what_does_not_fit_on_the_device():
    """B on a NeuronCore: B in fp32 plus its 5 digit slices (9 bytes an element) within 80% of the
    HBM one launch's cores have; the kernels stream B^P and K, so nao 1,100 (refused before they
    did) is taken, and only an nao that leaves no room for 32 factor columns' half transforms
    (5,000) is refused."""
    from dfmp2.kernels.nki.fitted import NkiFittedStore

    backend = get_backend("trn1", simulate=True)
    NkiFittedStore(backend, np.zeros((1, 1100 * 1101 // 2)), 1100, ["fp32", "exact"], lambda: 1 << 40).close()
    with pytest.raises(dfmp2.MemoryBudgetError, match="nao 5000 leaves no room"):
        NkiFittedStore(backend, np.zeros((1, 1)), 5000, ["fp32", "exact"], lambda: 1 << 40)
    with pytest.raises(dfmp2.MemoryBudgetError, match="HBM"):  # 9 x 5000 x 600^2 bytes = 16.2 GB > 0.8 x 16 GiB
        NkiFittedStore(backend, np.zeros((5000, 1)), 600, ["fp32", "exact"], lambda: 1 << 40)


def test_early_integrals_are_the_set_ups_integrals():
    """chem.EarlyIntegrals (computed on a thread from construction on) hands over exactly the
    integrals the set-up computes itself, once; asked again it computes them anew."""
    mol = gto.M(atom=GLYCINE, basis="cc-pvdz", verbose=0)
    basis = chem.fitting_basis(mol, False).basis
    plain = chem.jk_fitting_integrals(mol, basis).packed()
    early = chem.jk_fitting_integrals(mol, basis, early=True).start()
    assert early.held_bytes() == plain.nbytes and early.seconds > 0
    assert np.array_equal(early.packed(), plain)
    assert early.held_bytes() == 0
    assert np.array_equal(early.packed(), plain)


def test_a_failure_on_the_early_thread_is_raised_by_packed(monkeypatch):
    def fails(self):
        raise MemoryError("no room for the integrals")

    monkeypatch.setattr(chem.MNPIntegrals, "packed", fails)
    mol = gto.M(atom="He 0 0 0", basis="cc-pvdz", verbose=0)
    early = chem.jk_fitting_integrals(mol, chem.fitting_basis(mol, False).basis, early=True).start()
    with pytest.raises(MemoryError, match="no room"):
        early.packed()


def test_the_set_ups_wait_for_the_early_integrals_is_its_own(monkeypatch):
    """The budget's check before the SCF waits for the early integrals (their bytes are the run's):
    that wait was counted as the set-up's (integral_wait_seconds above setup_seconds: a flaky CI
    failure); a thread slowed by 0.3 s shows it. The set-up's parts are within its time."""
    import time

    compute = chem.EarlyIntegrals._compute
    monkeypatch.setattr(chem.EarlyIntegrals, "_compute", lambda self: time.sleep(0.3) or compute(self))
    builds = run_xyz(WATER).as_dict()["scf_builds"]
    assert builds["integrals"].startswith("early")
    parts = builds["integral_wait_seconds"] + builds["whitening_seconds"] + builds["store_seconds"]
    assert parts <= builds["setup_seconds"] + 1e-3 and builds["setup_seconds"] < 0.3, builds


@pytest.mark.parametrize("changes,early", [
    ({}, True), (dict(scf_backend="pyscf"), False), (dict(max_memory=1), False)])
def test_run_computes_the_jk_integrals_early_where_it_will_use_them(changes, early, monkeypatch, tmp_path):
    """run_xyz starts the JK-fit integrals on a thread before loading the backend (the record
    says so) where its SCF will use dfmp2's builds and the budget holds them; the energy is the
    one with integrals computed in the set-up (a checkpointed run) to 1e-10 Eh."""
    started = []
    original = chem.EarlyIntegrals.start
    monkeypatch.setattr(chem.EarlyIntegrals, "start", lambda self: started.append(self) or original(self))
    if changes.get("max_memory"):  # no room: not started early (the run is refused before the SCF)
        with pytest.raises(dfmp2.util.errors.MemoryBudgetError):
            run_xyz(WATER, **changes)
        assert not started
        return
    result = run_xyz(WATER, **changes).as_dict()
    assert bool(started) == early
    if not early:
        assert result["scf_backend"] == "pyscf"
        return
    builds = result["scf_builds"]
    assert builds["integrals"].startswith("early")
    assert builds["integral_seconds"] > 0
    # the set-up's parts (the wait for the thread, metric and whitening, the store's copies) are disjoint
    parts = builds["integral_wait_seconds"] + builds["whitening_seconds"] + builds["store_seconds"]
    assert 0 < builds["whitening_seconds"] and parts <= builds["setup_seconds"] + 1e-3
    kept = run_xyz(WATER, checkpoint=str(tmp_path / "ck")).as_dict()
    assert kept["scf_builds"]["integrals"] == "set-up"
    assert abs(kept["e_tot"] - result["e_tot"]) < 1e-10


TORCH_AFTER_EARLY_INTEGRALS = """
import sys, threading
import dfmp2
from dfmp2 import chem
from dfmp2.api.driver import run_xyz
assert "torch" not in sys.modules, "importing dfmp2's driver loaded torch"
seen = []
original = chem.EarlyIntegrals.start
chem.EarlyIntegrals.start = lambda self: seen.append("torch" in sys.modules) or original(self)
result = run_xyz(sys.argv[1]).as_dict()
print(seen, result["device_description"])
"""


def test_the_early_integrals_start_before_torch_loads(tmp_path):
    """In a fresh process a CLI run (`dfmp2 run`) starts the JK-fit integrals' thread before torch
    is imported (the driver's modules load without it), so that the import (~1 s) overlaps them;
    the subnormals are still flushed in the pool torch's GEMMs use."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", TORCH_AFTER_EARLY_INTEGRALS, WATER], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("[False]"), done.stdout
    assert "subnormals flushed to zero" in done.stdout


@pytest.mark.parametrize("target, nao, r, same", [("trn1", 1300, 384, False), ("trn2", 1300, 512, True),
                                                  ("trn1", 200, 40, True), ("trn2", 150, 96, False)])
def test_fitted_jk_kernel_streams_b_and_k_at_any_nao(target, nao, r, same):
    """fitted_jk_kernel streams B^P in 512-column chunks and, where K [nao, nao] no longer fits
    beside the factors (nao 1,300: 59 KiB per partition), adds K into HBM per auxiliary function:
    J and K of D = L diag(w) R^T with weights of both signs (an increment's eigenvalues) equal the
    fp64 contractions of the same fp32 B, and the launch stays inside usable SBUF."""
    import torch

    from nki_emulator import TARGETS
    from dfmp2.kernels.nki.tiles import jk_columns, jk_k_resident

    assert r <= jk_columns(nao, same)
    assert jk_k_resident(nao, r, same) == (nao < 1024)
    rng = np.random.default_rng(nao + r)
    naux = 3
    b = rng.standard_normal((naux, nao, nao)) * 0.1
    b = (b + b.transpose(0, 2, 1)).astype(np.float32)
    left = rng.standard_normal((nao, r)) * 0.1
    right = left if same else rng.standard_normal((nao, r)) * 0.1
    weights = rng.uniform(-1.0, 2.0, r)
    backend = get_backend(target, simulate=True)
    out = backend.fitted_jk(torch.from_numpy(b), left, right, weights, same, True)
    d = (left * weights) @ right.T
    b64 = b.astype(np.float64)
    ref_j = np.einsum("pmn,mn,pab->ab", b64, d, b64, optimize=True)
    ref_k = np.einsum("pma,ab,pnb->mn", b64, d, b64, optimize=True)  # K_mn = sum_P (B^P D B^P)_mn
    assert np.abs(out[0] - ref_j).max() < 1e-4 * np.abs(ref_j).max()
    assert np.abs(out[1] - ref_k).max() < 1e-4 * np.abs(ref_k).max()
    assert backend.trace.peak_sbuf_bytes <= TARGETS[target].sbuf_usable_bytes_per_partition


@pytest.mark.parametrize("weights, right", [(None, False), (2.0, False), (0.75, False), (None, True)])
def test_exact_builds_match_fp64_contractions_whichever_slicing_serves_k(weights, right):
    """The NKI store's exact build (exact_matmul_kernel, emulated in full): J and K of D = L diag(w) R^T
    against numpy's fp64 contractions of the same B to 1e-9 of their largest element. Where R is L and
    every w_i is one power of two (None: ones; 2.0), K's second operand is the first's digits times
    their powers of two; else (0.75, or R apart) both are sliced."""
    from dfmp2.kernels.nki.fitted import NkiFittedStore

    rng = np.random.default_rng(17)
    nao, naux, r = 40, 6, 7
    rows = rng.standard_normal((naux, nao * (nao + 1) // 2)) * 0.1
    square = np.zeros((naux, nao, nao))
    lower_r, lower_c = np.tril_indices(nao)
    square[:, lower_r, lower_c] = square[:, lower_c, lower_r] = rows
    left = rng.standard_normal((nao, r))
    other = rng.standard_normal((nao, r)) if right else None
    w = None if weights is None else np.full(r, weights)
    backend = get_backend("trn2", simulate=True)
    store = NkiFittedStore(backend, rows, nao, ["fp32", "exact"], lambda: 1 << 40)
    vj, vk = store.build(None, [(left, other, w)], "exact", True, True)
    d = (left * (1.0 if w is None else w)) @ (left if other is None else other).T
    ref_j = np.einsum("pmn,mn,pab->ab", square, d, square)
    ref_k = np.einsum("pma,ab,pnb->mn", square, d, square)
    assert np.abs(vj[0] - ref_j).max() < 1e-9 * np.abs(ref_j).max()
    assert np.abs(vk[0] - ref_k).max() < 1e-9 * np.abs(ref_k).max()


def test_gradient_with_the_integrals_out_of_core(monkeypatch):
    """A gradient whose SCF and orbital response stream the JK-fit integrals from disk (every
    FittedCoulombExchange told that the budget does not hold them): the in-memory gradient to
    1e-9 Eh/bohr."""
    from dfmp2.api.driver import run_xyz

    in_memory = run_xyz(WATER, basis="cc-pvdz", precision="fp64", gradient=True)
    monkeypatch.setattr(FittedCoulombExchange, "_free_bytes", lambda self: 0)
    out_of_core = run_xyz(WATER, basis="cc-pvdz", precision="fp64", gradient=True)
    assert out_of_core.scf_record["scf_builds"]["storage"].startswith("fp64 triangle on disk")
    assert abs(out_of_core.e_tot - in_memory.e_tot) < 1e-10
    assert np.abs(out_of_core.gradient - in_memory.gradient).max() < 1e-9


@pytest.mark.parametrize("n, block_rows", [(129, 2), (300, 2), (301, 3), (5, 2)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_symmetric_product_is_the_full_product(n, block_rows, dtype):
    """K = A^T diag(w) A from its lower block rows and their mirror (kernels.torch.products) equals numpy's fp64
    product, for contiguous and transposed (strided) operands, signs in w, any size and block count."""
    import torch

    from dfmp2.kernels.torch.products import symmetric_product

    rng = np.random.default_rng(n)
    a = rng.standard_normal((203, n))
    w = rng.choice([-1.0, 2.0], size=203)
    reference = a.T @ (a * w[:, None])
    tolerance = 1e-12 if dtype == "float64" else 1e-4
    for left in (torch.tensor(a, dtype=getattr(torch, dtype)),
                 torch.tensor(a.T.copy(), dtype=getattr(torch, dtype)).transpose(0, 1)):
        k = symmetric_product(left, left * torch.tensor(w, dtype=left.dtype)[:, None], block_rows)
        assert np.abs(k.double().numpy() - reference).max() < tolerance * np.abs(reference).max()


def test_exchange_of_one_density_takes_its_symmetric_product(monkeypatch):
    """The dense and the screened stores build K of one density (orbitals; an indefinite symmetric
    density, signed weights) from the symmetric product (its size floor lowered to these small
    molecules): K and J equal PySCF's DF J and K to 1e-10."""
    from dfmp2.kernels.torch import products as torch_products, backend as torch_backend, sparse as torch_sparse
    from dfmp2.sparse import screen_integrals
    from test_sparse import TORCH_SCREENS, water_chain

    calls = []

    def counted(left, right, block_rows=2):
        calls.append(left.shape[1])
        return torch_products.symmetric_product(left, right, block_rows)

    monkeypatch.setattr(torch_products, "SYMMETRIC_MIN_SIZE", 16)
    monkeypatch.setattr(torch_backend, "symmetric_product", counted)
    monkeypatch.setattr(torch_sparse, "symmetric_product", counted)
    rng = np.random.default_rng(11)
    for atoms, screened in ((GLYCINE, False), (water_chain(4), True)):
        mol = gto.M(atom=atoms, basis="cc-pvdz", verbose=0)
        mf = _mean_field(mol, "rhf")
        jk = chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(mf))
        if screened:
            assert screen_integrals("1e-10", jk, TORCH_SCREENS, "torch", "scf")["used"]
        builds = FittedCoulombExchange(get_backend("cpu"), jk, "fp64")
        orbitals = np.linalg.qr(rng.standard_normal((mol.nao, 20)))[0]
        indefinite = rng.standard_normal((mol.nao, mol.nao)) * 0.1
        for dm, factors in ((orbitals @ orbitals.T, (orbitals, None, None)), (indefinite + indefinite.T, None)):
            before = len(calls)
            vj, vk = builds.get_jk(dm[None], [factors])
            vj_ref, vk_ref = mf.get_jk(mol, dm)
            assert len(calls) > before and set(calls[before:]) == {mol.nao}
            assert np.abs(vk[0] - vk_ref).max() < 1e-10 and np.abs(vj[0] - vj_ref).max() < 1e-10
        assert ("screened" in builds.record.storage) == screened


@pytest.mark.parametrize("kind,xc,charge,spin", [
    ("rhf", None, 0, 0), ("uhf", None, 1, 1), ("rohf", None, 1, 1), ("rhf", "b3lyp", 0, 0)])
def test_scf_without_the_conv_check_build_gives_pyscfs_orbitals(kind, xc, charge, spin):
    """dfmp2's SCF leaves out PySCF's conv_check build but keeps its diagonalisation: against PySCF's
    driver with conv_check on the same (fp64) builds, one build fewer, the same orbital energies (1e-10
    Eh) and occupations, and e_tot within PySCF's extra-cycle tolerance (10 conv_tol); and e_tot of
    PySCF's own DF-SCF to 1e-9 Eh (Hartree-Fock)."""
    from dfmp2.chem.scf import SCF_MAX_CYCLE, _scf_object

    mol = gto.M(atom=WATER, basis="cc-pvdz", charge=charge, spin=spin, verbose=0)
    reference = _scf_object(mol, "df", SCF_MAX_CYCLE, kind, None, xc)  # run_scf's settings, conv_check on
    reference.conv_check = True
    integrals = lambda: chem.jk_fitting_integrals(mol, chem.jk_auxbasis_of(reference))  # noqa: E731
    theirs = FittedCoulombExchange(get_backend("cpu"), integrals(), "fp64")
    chem.use_fitted_builds(reference, theirs).run()
    builds = FittedCoulombExchange(get_backend("cpu"), integrals(), "fp64")
    ours = chem.run_scf(mol, reference=kind, xc=xc, builds=builds)
    assert ours.cycles == reference.cycles
    assert len(builds.record.builds) == len(theirs.record.builds) - 1 == ours.cycles + 1  # the guess's, one a cycle
    assert abs(ours.e_tot - reference.e_tot) < 10 * reference.conv_tol
    assert np.abs(np.asarray(ours.mo_energy) - np.asarray(reference.mo_energy)).max() < 1e-10
    assert np.array_equal(np.asarray(ours.mo_occ), np.asarray(reference.mo_occ))
    if xc is None:
        assert abs(ours.e_tot - _mean_field(mol, kind).run().e_tot) < 1e-9
