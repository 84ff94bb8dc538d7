"""Unrelaxed DF-MP2 densities and natural orbitals against PySCF's dfmp2_native and the
published ethylene/def2-SVP natural occupations."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REFERENCE_FILE, ROOT, converged_rhf
from dfmp2 import DFMP2, ComputationError, InputError
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
    mf = converged_rhf("water")
    with pytest.raises(InputError, match="relaxed MP2 density"):
        DFMP2(mf).make_rdm1(relaxed=True)
    with pytest.raises(ComputationError, match="no NKI kernel yet"):
        DFMP2(mf, device="trn1", simulate=True).make_rdm1()
    radical = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    with pytest.raises(InputError, match="unrestricted"):
        DFMP2(scf.UHF(radical).run()).make_rdm1()


def test_cli_writes_natural_orbitals(tmp_path):
    """`--natorbs FILE.molden`: PySCF reads it back with the occupations in the JSON."""
    from pyscf.tools import molden

    xyz = Path(ROOT) / "examples" / "water.xyz"
    proc = subprocess.run([sys.executable, "-m", "dfmp2.cli", "run", str(xyz), "--natorbs", "no.molden",
                           "--json", "out.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    occupations = np.array(record["natorbs"]["occupations"])
    assert abs(occupations.sum() - 10) < 1e-10 and occupations[0] <= 2.0 and occupations[5] < 0.05
    mol, _, _, mo_occ, _, _ = molden.load(str(tmp_path / "no.molden"))
    assert np.allclose(mo_occ, occupations, atol=6e-6)  # Molden keeps 5 decimals
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dfmp2-")] == []
    proc = subprocess.run([sys.executable, "-m", "dfmp2.cli", "run", str(xyz), "--natorbs", "nodir/x.molden"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "--natorbs" in proc.stderr
