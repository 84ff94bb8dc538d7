"""dfmp2.DFMP2 as a drop-in for pyscf.mp.dfmp2.DFMP2: a PySCF script run unchanged except its
import gives PySCF's numbers; PySCF's conventions (kernel() -> (e_corr, t2), with_df, mo_coeff,
frozen, logger) hold."""

import io
import subprocess
import sys

import numpy as np
import pytest

from conftest import converged_rhf
from dfmp2 import DFMP2, InputError
from pyscf import df, gto, lib, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

SCRIPT = '''
import numpy as np
from pyscf import gto, scf, df
{import_line}

mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
mf = scf.RHF(mol).run(conv_tol=1e-12)
pt = DFMP2(mf, frozen=1)
e_corr, t2 = pt.kernel()
print("A", float(e_corr), t2 is None)
pt = DFMP2(mf).run()
print("B", float(pt.e_corr), float(pt.e_tot), float(pt.e_corr_os), float(pt.e_corr_ss))
mfd = scf.RHF(mol).density_fit().run(conv_tol=1e-12)
pt = DFMP2(mfd)
pt.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
e, t2 = pt.kernel(with_t2=True)
print("C", float(e), t2.shape, float(np.abs(t2).sum()))
'''


def _run(import_line):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(import_line=import_line)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()}


def test_pyscf_script_unchanged_except_the_import():
    ours = _run("from dfmp2 import DFMP2")
    theirs = _run("from pyscf.mp.dfmp2 import DFMP2")
    for key in ("A", "B", "C"):
        a = [float(x) for x in ours[key].replace("(", " ").replace(")", " ").replace(",", " ").split()
             if x not in ("True", "False")]
        b = [float(x) for x in theirs[key].replace("(", " ").replace(")", " ").replace(",", " ").split()
             if x not in ("True", "False")]
        assert np.allclose(a, b, rtol=0, atol=1e-8), (key, ours[key], theirs[key])
    assert ours["A"].endswith("False") and theirs["A"].endswith("False")  # t2 kept by default, as PySCF


def test_a_density_fitted_scf_gives_pyscf_numbers_by_default_and_a_note_names_the_mp2_fit_set():
    mf = converged_rhf("water", scf_mode="df")  # JK-fit SCF
    ref = pyscf_dfmp2.DFMP2(mf)  # PySCF reuses the SCF's DF object (JK-fit)
    ref.kernel()
    out = io.StringIO()
    pt = DFMP2(mf)
    pt.stdout, pt.verbose = out, lib.logger.NOTE
    assert pt.with_df is mf.with_df
    pt.kernel()
    pt.kernel()
    assert abs(pt.e_corr - ref.e_corr) < 1e-8
    assert pt.result.auxbasis == "cc-pvdz-jkfit (the integrals with_df holds)"  # the SCF's, read, not redone
    assert out.getvalue().count("the MP2-fit set cc-pvdz-ri is made for MP2") == 1  # said once
    mp2fit = DFMP2(mf, auxbasis="cc-pvdz-ri").run()
    assert abs(mp2fit.e_corr - ref.e_corr) > 1e-6  # the choice matters (1.3e-5 Eh here)


def test_with_df_is_pyscfs_and_can_be_changed_as_in_pyscf():
    mf = converged_rhf("water")  # no DF in the SCF: a DF object in the MP2-fit set, as PySCF makes
    pt, ref = DFMP2(mf), pyscf_dfmp2.DFMP2(mf)
    assert pt.with_df.auxbasis == ref.with_df.auxbasis
    pt.with_df.auxbasis = ref.with_df.auxbasis = "cc-pvdz-jkfit"
    assert abs(pt.kernel()[0] - ref.kernel()[0]) < 1e-8
    changed = DFMP2(mf).density_fit(auxbasis="cc-pvtz-ri")
    theirs = pyscf_dfmp2.DFMP2(mf).density_fit(auxbasis="cc-pvtz-ri")
    assert abs(changed.kernel()[0] - theirs.kernel()[0]) < 1e-8


def test_mo_coeff_and_logger_follow_pyscf():
    mf = converged_rhf("water")
    rotated = mf.mo_coeff.copy()
    rotated[:, [1, 2]] = rotated[:, [2, 1]]  # swap two occupied orbitals: same energy
    energies = mf.mo_energy.copy()
    energies[[1, 2]] = energies[[2, 1]]
    ref = pyscf_dfmp2.DFMP2(mf)
    ref.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    pt = DFMP2(mf, mo_coeff=rotated)
    e, _ = pt.kernel(mo_energy=energies)
    assert abs(e - ref.e_corr) < 1e-8
    out = io.StringIO()
    pt = DFMP2(mf)
    pt.stdout, pt.verbose = out, lib.logger.INFO
    pt.kernel()
    assert "E(DFMP2) =" in out.getvalue() and "frozen orbitals" in out.getvalue()
    assert isinstance(pt, lib.StreamObject) and pt.run() is pt


def test_t2_is_kept_by_default_where_it_fits_and_said_so_where_not(arrays_only_budget):
    mf = converged_rhf("ethylene")
    e, t2 = DFMP2(mf).kernel()
    ref = pyscf_dfmp2.DFMP2(mf).set(with_df=df.DF(mf.mol, auxbasis="cc-pvdz-ri"))
    ref.kernel()
    assert abs(e - ref.e_corr) < 1e-8 and np.abs(t2 - ref.t2).max() < 1e-10
    assert DFMP2(mf).kernel(with_t2=False)[1] is None
    pt = DFMP2(mf)
    pt.max_memory = 2.0  # MB: enough for the energy (needs 1.63 MB), not for t2 (0.82 MB) as well
    with pytest.raises(MemoryError, match="with_t2: t2 needs 0.8192 MB"):
        pt.kernel(with_t2=True)
    e_tight, t2 = pt.kernel()  # the default keeps t2 only if it fits: here a note, not an error
    assert t2 is None and abs(e_tight - e) < 1e-10
    assert any(note.startswith("t2 not kept: t2 needs 0.8192 MB") for note in pt.result.notes)


def test_gpu4pyscf_mean_field_is_moved_to_the_cpu():
    """gpu4pyscf is not installed here: a stand-in class from a module named gpu4pyscf with
    to_cpu() (what mf.to_gpu() objects provide); the move is recorded in the result."""
    mf = converged_rhf("water")
    gpu_cls = type("RHF", (), {"__module__": "gpu4pyscf.scf.hf", "to_cpu": lambda self: mf})
    pt = DFMP2(gpu_cls()).run()
    assert abs(pt.e_corr - DFMP2(mf).run().e_corr) < 1e-12
    assert any("gpu4pyscf" in note for note in pt.result.notes)
    bare = type("RHF", (), {"__module__": "gpu4pyscf.scf.hf"})
    with pytest.raises(InputError, match="to_cpu"):
        DFMP2(bare())


def test_unrestricted_alias():
    from dfmp2 import DFUMP2

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-11)
    assert DFUMP2(mf).run().reference == "uhf"


@pytest.fixture(scope="module")
def cation():
    """H2O+ doublet (UHF) and PySCF's DFUMP2 on it (MP2-fit set, t2 kept)."""
    from pyscf.mp import dfump2

    mol = gto.M(atom="O 0 0 0; H 0 -0.757 0.587; H 0 0.757 0.587", basis="cc-pvdz", charge=1, spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-12)
    ref = dfump2.DFUMP2(mf, frozen=[[0, 1, 5], [1]])
    ref.kernel()
    return mf, ref


def test_open_shell_t2_and_frozen_lists_follow_dfump2(cation):
    mf, ref = cation
    pt = DFMP2(mf, frozen=[[0, 1, 5], [1]])
    e, t2 = pt.kernel()
    assert abs(e - ref.e_corr) < 1e-8 and len(t2) == 3
    for ours, theirs in zip(t2, ref.t2):  # aa, ab, bb: PySCF's layout and antisymmetrised same-spin
        assert ours.shape == theirs.shape and np.abs(ours - theirs).max() < 1e-10
    assert pt.nocc == tuple(ref.nocc) and pt.nmo == tuple(ref.nmo)
    for ours, theirs in zip(pt.get_frozen_mask(), ref.get_frozen_mask()):
        assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("kind", ["rhf", "uhf"])
def test_ao2mo_eris_round_trip_in_memory_and_through_files_pyscf_reads(kind, cation, tmp_path):
    """ao2mo() -> kernel(eris=...) as in PySCF; the file written with ovL_to_save is in PySCF's
    layout (PySCF's own DFMP2 reads it back), and PySCF's eris feed dfmp2."""
    from pyscf.mp import dfump2

    mf = converged_rhf("water") if kind == "rhf" else cation[0]
    theirs = pyscf_dfmp2.DFMP2 if kind == "rhf" else dfump2.DFUMP2
    pt = DFMP2(mf, frozen=1)
    e_direct = pt.kernel()[0]
    eris = pt.ao2mo()
    assert abs(DFMP2(mf, frozen=1).kernel(eris=eris)[0] - e_direct) < 1e-12
    path = str(tmp_path / "ovL.h5")
    saved = DFMP2(mf, frozen=1).ao2mo(ovL_to_save=path)
    assert abs(DFMP2(mf, frozen=1).kernel(eris=saved)[0] - e_direct) < 1e-12
    saved.close()
    reader = theirs(mf, frozen=1)
    assert abs(reader.kernel(eris=reader.ao2mo(ovL=path))[0] - e_direct) < 1e-8  # PySCF reads dfmp2's file
    assert abs(DFMP2(mf, frozen=1).kernel(eris=theirs(mf, frozen=1).ao2mo())[0] - e_direct) < 1e-8
    with pytest.raises(InputError, match="made for another run \\(active"):
        DFMP2(mf, frozen=2).kernel(eris=eris)  # made for other active orbitals (its identity says so)
    with pytest.raises(InputError, match="not \\[nocc \\* nvir, naux"):  # PySCF's: its shapes say so
        DFMP2(mf, frozen=2).kernel(eris=theirs(mf, frozen=1).ao2mo())
    assert list(tmp_path.iterdir()) == [tmp_path / "ovL.h5"]  # nothing else left beside it


def test_context_manager_pyscf_attributes_and_what_is_not_there_yet():
    mf = converged_rhf("water")
    ref = pyscf_dfmp2.DFMP2(mf, frozen=[0, 5])
    ref.kernel()
    with DFMP2(mf, frozen=[0, 5]) as pt:
        assert pt.converged is False and pt.e_hf == mf.e_tot
        pt.kernel()
        assert pt.converged is True and pt.emp2 == pt.e_corr
        assert abs(pt.emp2_scs - ref.emp2_scs) < 1e-8 and abs(pt.e_tot_scs - ref.e_tot_scs) < 1e-8
        assert (pt.nocc, pt.nmo) == (ref.nocc, ref.nmo)
        assert np.array_equal(pt.get_frozen_mask(), ref.get_frozen_mask())
        rdm2 = pt.make_rdm2()
        assert np.abs(rdm2 - ref.make_rdm2()).max() < 1e-10
        for kwargs in ({}, {"ao_repr": True}, {"with_frozen": False}):  # (PySCF 2.14 fails on both)
            theirs = ref.make_rdm1(**kwargs)
            assert np.abs(pt.make_rdm1(**kwargs) - theirs).max() < 1e-10  # blockwise, no t2
            assert np.abs(pt.make_rdm1(t2=pt.t2, **kwargs) - theirs).max() < 1e-10  # from t2
    assert pt.t2 is None  # the with-block let go of t2
    with pytest.raises(NotImplementedError, match="frozen virtual"):  # gradients: RHF, frozen occupied only
        pt.nuc_grad_method().kernel()
    with pytest.raises(NotImplementedError, match="frozen virtual"):  # frozen=[0, 5]: orbital 5 is virtual
        pt.make_rdm1(relaxed=True)  # (test_densities.py checks relaxed densities against PySCF)


def test_a_memory_shortfall_is_a_memory_error_pyscf_code_catches():
    mf = converged_rhf("water")
    pt = DFMP2(mf)
    pt.max_memory = 1.0  # MB: below the process's own footprint
    with pytest.raises(MemoryError) as caught:
        pt.kernel()
    assert isinstance(caught.value, InputError)  # and bad input for the CLI (exit 2)


def test_native_classes_follow_dfmp2_native_scs_included():
    from pyscf.mp import dfmp2_native
    from dfmp2 import native

    mf = converged_rhf("ethylene", basis="def2-svp")
    for ours, theirs in ((native.DFMP2, dfmp2_native.DFMP2), (native.SCSMP2, dfmp2_native.SCSMP2)):
        with ours(mf, frozen=2) as pt, theirs(mf, frozen=2) as ref:
            e = pt.kernel()
            assert isinstance(e, float) and abs(e - ref.kernel()) < 1e-8 and abs(pt.e_tot - ref.e_tot) < 1e-8
            assert np.abs(pt.make_natorbs()[0] - ref.make_natorbs()[0]).max() < 1e-8
            assert np.abs(pt.make_rdm1(ao_repr=True) - ref.make_rdm1(ao_repr=True)).max() < 1e-8


def test_rohf_singles_can_be_left_out_and_a_closed_shell_rohf_is_rhf():
    from pyscf import mp

    mol = gto.M(atom="O 0 0 0; O 0 0 1.2222", basis="def2-svp", spin=2, verbose=0)
    rohf = scf.ROHF(mol).density_fit(auxbasis="def2-universal-jkfit").run(conv_tol=1e-11)
    pt = DFMP2(rohf).run()
    assert pt.e_corr_singles < -1e-3
    assert abs(pt.e_corr - (pt.e_corr_os + pt.e_corr_ss + pt.e_corr_singles)) < 1e-12
    singles = pt.e_corr_singles
    pt.include_singles = False
    pt.kernel()
    assert abs(pt.e_corr - (pt.e_corr_os + pt.e_corr_ss)) < 1e-12 and pt.e_corr_singles == 0.0  # as PySCF
    assert abs(pt.e_corr - (DFMP2(rohf).run().e_corr - singles)) < 1e-12
    assert pt.result.as_dict()["singles_included"] is False
    # the doubles are DF-UMP2's on the semicanonical orbitals (PySCF's DFUMP2 run on them)
    semi = chem_semicanonical(rohf)
    uhf_like = scf.UHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    uhf_like.mo_coeff, uhf_like.mo_energy, uhf_like.mo_occ = semi["mo_coeff"], semi["mo_energy"], semi["mo_occ"]
    uhf_like.converged, uhf_like.e_tot = True, rohf.e_tot
    doubles = mp.dfump2.DFUMP2(uhf_like, mo_coeff=semi["mo_coeff"], mo_occ=semi["mo_occ"])
    doubles.with_df = rohf.with_df
    assert abs(doubles.kernel(mo_energy=semi["mo_energy"])[0] - pt.e_corr) < 1e-8

    closed = gto.M(atom="H 0 0 0; F 0 0 1.1", basis="cc-pvdz", verbose=0)
    rhf = scf.RHF(closed).run(conv_tol=1e-12)
    as_rohf = scf.ROHF(closed)
    as_rohf.mo_coeff, as_rohf.mo_energy, as_rohf.mo_occ = rhf.mo_coeff, rhf.mo_energy, rhf.mo_occ
    as_rohf.converged, as_rohf.e_tot = True, rhf.e_tot
    assert DFMP2(as_rohf).run().e_corr == DFMP2(rhf).run().e_corr  # the same arithmetic, bit for bit
    per_spin = DFMP2(as_rohf, frozen=[[0], [0, 1]])
    assert per_spin.kernel()[0] == DFMP2(rhf.to_uhf(), frozen=[[0], [0, 1]]).kernel()[0]
    assert len(per_spin.t2) == 3 and per_spin.nocc == (4, 3)


def chem_semicanonical(rohf):
    from dfmp2.chem import semicanonical_orbitals

    return semicanonical_orbitals(rohf)


@pytest.mark.parametrize("kind", ["rhf", "uhf"])
def test_periodic_gamma_point_mean_field_uses_its_gdf(kind):
    from pyscf.mp import dfump2
    from pyscf.pbc import gto as pbc_gto, scf as pbc_scf

    cell = pbc_gto.Cell()
    cell.atom = "O 0 0 0; H 0 -0.757 0.587; H 0 0.757 0.587"
    cell.a, cell.basis, cell.verbose = np.eye(3) * 5, "cc-pvdz", 0
    cell.charge, cell.spin = (0, 0) if kind == "rhf" else (1, 1)
    cell.build()
    mf = (pbc_scf.RHF if kind == "rhf" else pbc_scf.UHF)(cell).density_fit().run(conv_tol=1e-10)
    ref = (pyscf_dfmp2.DFMP2 if kind == "rhf" else dfump2.DFUMP2)(mf)
    ref.kernel()
    pt = DFMP2(mf)
    pt.kernel()
    assert abs(pt.e_corr - ref.e_corr) < 1e-8 and "GDF" in pt.result.auxbasis
    t2 = [pt.t2] if kind == "rhf" else pt.t2
    assert max(np.abs(a - b).max() for a, b in zip(t2, [ref.t2] if kind == "rhf" else ref.t2)) < 1e-10
    if kind == "rhf":  # auxbasis= makes a GDF in that set, as PySCF's pbc df.GDF would
        other = DFMP2(mf, auxbasis="cc-pvdz-ri")
        theirs = pyscf_dfmp2.DFMP2(mf)
        theirs.with_df = pbc_gdf(cell, "cc-pvdz-ri")
        assert abs(other.kernel()[0] - theirs.kernel()[0]) < 1e-8 and "cc-pvdz-ri" in other.result.auxbasis
    with pytest.raises(InputError, match="k-points other than gamma"):
        DFMP2(pbc_scf.KRHF(cell, cell.make_kpts([2, 1, 1])).density_fit()).kernel()
    with pytest.raises(InputError, match="Gaussian density fitting"):
        DFMP2(mf.copy().set(with_df=__import__("pyscf.pbc.df", fromlist=["FFTDF"]).FFTDF(cell))).kernel()


def test_orbitals_given_without_energies_and_density_fit_follow_pyscf():
    """Orbitals other than the SCF's: energies from their Fock matrix and E(HF) of their density,
    as PySCF's DFMP2 does; density_fit() makes a new object with PySCF's rule."""
    from pyscf import dft

    mf = converged_rhf("water")
    pbe = dft.RKS(mf.mol, xc="pbe").run(conv_tol=1e-10)  # orbitals that are not the RHF's own
    ref = pyscf_dfmp2.DFMP2(mf, mo_coeff=pbe.mo_coeff)
    ref.kernel()
    pt = DFMP2(mf, mo_coeff=pbe.mo_coeff)
    pt.kernel()
    assert abs(pt.e_corr - ref.e_corr) < 1e-8 and abs(pt.e_hf - ref.e_hf) < 1e-8
    for auxbasis in (None, "cc-pvtz-ri"):
        ours = DFMP2(mf, frozen=1).density_fit(auxbasis=auxbasis)
        theirs = pyscf_dfmp2.DFMP2(mf, frozen=1).density_fit(auxbasis=auxbasis)
        assert abs(ours.kernel()[0] - theirs.kernel()[0]) < 1e-8
    original = DFMP2(mf).run()
    with original.density_fit() as copy:
        copy.kernel()
    assert original.t2 is not None and original.result.correlation.t2 is not None  # not shared


def test_scs_energy_survives_the_density_and_force_outcore_runs_out_of_core():
    from dfmp2 import native
    from pyscf.mp import dfmp2_native

    mf = converged_rhf("water")
    pt, ref = native.SCSMP2(mf), dfmp2_native.SCSMP2(mf)
    e = pt.kernel()
    pt.make_rdm1()
    assert pt.e_corr == e and abs(e - ref.kernel()) < 1e-8 and abs(pt.e_tot - ref.e_tot) < 1e-8
    disk = DFMP2(mf, frozen=1).set(force_outcore=True)
    in_memory = DFMP2(mf, frozen=1)
    assert abs(disk.kernel()[0] - in_memory.kernel()[0]) < 1e-10
    assert np.abs(disk.t2 - in_memory.t2).max() < 1e-12  # t2 from the out-of-core pair stage too
    assert disk.result.as_dict()["memory"]["storage"] == "disk" and disk.result.as_dict()["io"]["bytes_written"] > 0
    # densities out of core too: B read a slab at a time, G in scratch; PySCF's relaxed density
    assert np.abs(disk.make_rdm1() - in_memory.make_rdm1()).max() < 1e-10
    relaxed = disk.make_rdm1(relaxed=True)
    assert disk.result.correlation.gamma.kind == "disk"
    theirs = dfmp2_native.DFMP2(mf, frozen=1).make_rdm1(relaxed=True)
    assert np.abs(relaxed - theirs).max() < 1e-8
    given = DFMP2(mf, frozen=1).set(force_outcore=True)  # given integrals are read into memory
    assert abs(given.kernel(eris=DFMP2(mf, frozen=1).ao2mo())[0] - disk.e_corr) < 1e-10
    assert given.result.as_dict()["memory"]["storage"] == "memory"


def test_integrals_a_with_df_holds_are_read_as_pyscf_reads_them(tmp_path):
    """A DF object holding only a _cderi file (no auxiliary basis named): its integrals are used."""
    mf = converged_rhf("water")
    made = df.DF(mf.mol, auxbasis="cc-pvtz-ri")
    made._cderi_to_save = str(tmp_path / "cderi.h5")
    made.build()
    lone = df.DF(mf.mol)
    lone._cderi = str(tmp_path / "cderi.h5")
    ours, theirs = DFMP2(mf), pyscf_dfmp2.DFMP2(mf)
    ours.with_df = theirs.with_df = lone
    assert abs(ours.kernel()[0] - theirs.kernel()[0]) < 1e-8
    assert abs(ours.e_corr - DFMP2(mf, auxbasis="cc-pvtz-ri").kernel()[0]) < 1e-8  # the set it was made in
    assert ours.result.auxbasis == "an unnamed set (the integrals with_df holds)"


def test_what_dfmp2_refuses_or_does_differently_is_said():
    from pyscf import dft

    mf = converged_rhf("water")
    with pytest.raises(InputError, match="frozen="):
        DFMP2(mf).nocc = 3
    lone = df.DF(mf.mol)
    lone._cderi = "somewhere.h5"
    with pytest.raises(InputError, match="with_df's integrals 'somewhere.h5' cannot be read"):
        DFMP2(mf).set(with_df=lone).kernel()
    ks = dft.RKS(mf.mol, xc="b3lyp").density_fit().run()
    pt = DFMP2(ks)
    pt.kernel()
    assert pt.e_hf is None and pt.e_ref == ks.e_tot  # a KS energy is not called E(HF) (PySCF's e_hf is E_KS)
    assert abs(pt.e_corr - pyscf_dfmp2.DFMP2(ks).run().e_corr) < 1e-8


def pbc_gdf(cell, auxbasis):
    from pyscf.pbc import df as pbc_df

    fitting = pbc_df.GDF(cell)
    fitting.auxbasis = auxbasis
    return fitting


def test_with_a_checkpoint_the_default_keeps_no_t2_and_says_so(tmp_path):
    mf = converged_rhf("water")
    pt = DFMP2(mf)
    pt.checkpoint = str(tmp_path / "ck")
    e, t2 = pt.kernel()
    assert t2 is None and any(note.startswith("t2 not kept: a checkpoint") for note in pt.result.notes)
    again = DFMP2(mf)
    again.checkpoint = str(tmp_path / "ck")
    e_again, t2 = again.kernel(with_t2=True)  # every pair block formed again for t2
    assert e_again == e and np.abs(t2 - DFMP2(mf).kernel()[1]).max() < 1e-12
    assert again.result.correlation.checkpoint["reused_pair_tasks"] == 0
