"""Which references are accepted: occupations, aufbau order, Kohn-Sham labelling, auxiliary
basis coverage per element, and the memory budget's own bad input."""

import json
import subprocess
import sys

import pytest

from conftest import converged_rhf
from dfmp2 import DFMP2, InputError
from pyscf import dft, gto, scf

LIH = "Li 0 0 0; H 0 0 1.595"


def test_occupations_must_be_zero_or_two_and_sum_to_the_electrons():
    mf = converged_rhf("water")
    open_shell = mf.mo_occ.copy()
    open_shell[3:6] = [2, 1, 1]  # 2,2,2,2,1,1: 12 electrons, not a closed shell
    mf_bad = scf.RHF(mf.mol)
    mf_bad.__dict__.update(mf.__dict__)
    mf_bad.mo_occ = open_shell
    with pytest.raises(InputError, match=r"orbital 4 has occupation 1: a RHF reference needs occupations 0 or 2"):
        DFMP2(mf_bad).kernel()
    mf_bad.mo_occ = mf.mo_occ.copy()
    mf_bad.mo_occ[5] = 2.0  # 12 electrons on a 10-electron molecule
    with pytest.raises(InputError, match="occupations sum to 12, but the molecule has 10 electrons"):
        DFMP2(mf_bad).kernel()


def test_swapped_homo_lumo_is_refused_unless_asked_for():
    mf = converged_rhf("water")
    swapped = scf.RHF(mf.mol)
    swapped.__dict__.update(mf.__dict__)
    swapped.mo_occ = mf.mo_occ.copy()
    swapped.mo_occ[[4, 5]] = swapped.mo_occ[[5, 4]]
    with pytest.raises(InputError, match=r"not an aufbau reference: occupied orbital 5 .* virtual orbital 4 .*"
                                         r"allow_non_aufbau=True"):
        DFMP2(swapped).kernel()
    pt = DFMP2(swapped, allow_non_aufbau=True).run()
    normal = DFMP2(mf).run()
    assert pt.e_corr != pytest.approx(normal.e_corr, abs=1e-4)  # really the other determinant
    assert any("non-aufbau" in note for note in pt.result.notes)


def test_uhf_occupations_per_spin():
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-10)
    bad = scf.UHF(mol)
    bad.__dict__.update(mf.__dict__)
    bad.mo_occ = mf.mo_occ.copy()
    bad.mo_occ[1][4] = 1.0  # 5 beta electrons on a 4-beta-electron radical
    with pytest.raises(InputError, match="the beta occupations sum to 5, but the molecule has 4 beta electrons"):
        DFMP2(bad).kernel()


def test_kohn_sham_reference_is_labelled_never_as_hartree_fock():
    """An RKS reference: accepted (the PT2 part of a double hybrid), recorded as rks with its
    functional and e_ref, never as E(HF); the MP2 sums are PySCF's DFMP2 on the same orbitals."""
    from pyscf import df
    from pyscf.mp import dfmp2

    mol = gto.M(atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", basis="cc-pvdz", verbose=0)
    ks = dft.RKS(mol, xc="b3lyp").run(conv_tol=1e-11)
    pt = DFMP2(ks).run()
    assert pt.result.reference == "rks" and pt.result.xc == "b3lyp"
    assert pt.e_hf is None and pt.e_ref == pytest.approx(ks.e_tot)
    record = pt.result.as_dict()
    assert record["e_hf"] is None and record["e_ref"] == ks.e_tot and record["reference"] == "rks"
    ref = dfmp2.DFMP2(ks)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    assert abs(pt.e_corr - ref.e_corr) < 1e-8


def test_unrestricted_kohn_sham_is_labelled():
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    uks = dft.UKS(mol, xc="pbe0").run(conv_tol=1e-10)
    assert DFMP2(uks).run().result.reference == "uks"


def test_lithium_gets_a_generated_jk_fit_set_announced_before_the_scf(tmp_path):
    """cc-pVDZ-JKFIT has no Li in PySCF: `dfmp2 run` uses PySCF's generated even-tempered set for
    Li (announced in the summary and per element in the JSON), the MP2-fit set is the named one,
    and the energy is PySCF's own DF-RHF + DFMP2 with those sets."""
    from pyscf import df
    from pyscf.mp import dfmp2

    xyz = tmp_path / "lih.xyz"
    xyz.write_text("2\nLiH\nLi 0 0 0\nH 0 0 1.595\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--json", "out.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["auxbasis_generated"] == {"scf": ["Li"]}
    assert "generated even-tempered" in proc.stdout and "Li" in proc.stdout
    mol = gto.M(atom=LIH, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol = 1e-11
    mf.kernel()
    assert abs(record["e_ref"] - mf.e_tot) < 1e-8
    ref = dfmp2.DFMP2(mf)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    assert abs(record["e_corr"] - ref.e_corr) < 1e-8


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_max_memory_is_bad_input(value, tmp_path):
    xyz = tmp_path / "lih.xyz"
    xyz.write_text("2\nLiH\nLi 0 0 0\nH 0 0 1.595\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--max-memory", value,
                           "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--max-memory" in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_frozen_core_follows_pyscf_chemcore():
    """--frozen-core freezes PySCF's chemcore count: 0 for Li and Be, 1 for B-Ne and Na-Mg."""
    from pyscf.data.elements import charge

    from dfmp2.chem import frozen_core_count

    counts = {atom: frozen_core_count(gto.M(atom=f"{atom} 0 0 0", basis="sto-3g", spin=charge(atom) % 2, verbose=0))
              for atom in ("Li", "Be", "C", "Ne", "Na", "Mg", "Ar")}
    assert counts == {"Li": 0, "Be": 0, "C": 1, "Ne": 1, "Na": 1, "Mg": 1, "Ar": 5}
