"""Double-hybrid DFT: E = E_KS + c_os E_os + c_ss E_ss with DF-MP2 on the KS orbitals, against
the published Psi4/ORCA neon values (same DFT grid) and PySCF's own KS + scaled DFMP2."""

import json
from pathlib import Path
import subprocess
import sys

import pytest

from conftest import REFERENCE_FILE, ROOT
from dfmp2 import DFMP2, InputError
from dfmp2.chem.functionals import DOUBLE_HYBRIDS
from pyscf import df, dft, gto
from pyscf.data.elements import chemcore
from pyscf.mp import dfmp2, dfump2

WATER = "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"


def _published():
    with open(REFERENCE_FILE, encoding="utf-8") as handle:
        return json.load(handle)["double_hybrid"]["cases"]


@pytest.mark.parametrize("case", _published(), ids=lambda c: c["name"])
def test_published_neon_double_hybrids(case):
    """Psi4's dft-custom-dhdf values (ORCA RI-MP2 references): conventional SCF on a 99 x 770
    grid, cc-pVTZ-RI. 2 uEh: what remains is the two programs' DFT grids and SCF convergence."""
    name = "B2PLYP" if "b2plyp" in case["name"] else "DSD-BLYP"
    functional = DOUBLE_HYBRIDS[name]
    mol = gto.M(atom=case["atom"], basis=case["basis"], verbose=0)
    mf = dft.RKS(mol, xc=functional.xc)
    mf.grids.atom_grid = (99, 770)
    mf.conv_tol = 1e-11
    mf.kernel()
    frozen = chemcore(mol) if case["frozen"] == "core" else case["frozen"]
    pt = DFMP2(mf, frozen=frozen or None, auxbasis=case["auxbasis"]).run()
    assert pt.result.reference == "rks"
    assert abs(mf.e_tot - case["e_ks"]) < 2e-6
    e_pt2 = functional.c_os * pt.e_corr_os + functional.c_ss * pt.e_corr_ss
    assert abs(e_pt2 - case["e_pt2_scaled"]) < 2e-6
    assert abs(pt.double_hybrid_energy(name) - case["e_tot"]) < 2e-6


def test_plugin_double_hybrid_matches_pyscf_ks_plus_scaled_dfmp2():
    """PySCF's RKS with B2PLYP's hybrid part + 0.27 x PySCF's DFMP2 on the same orbitals and aux
    basis, to 1e-8 Eh."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    mf = dft.RKS(mol, xc=DOUBLE_HYBRIDS["B2PLYP"].xc).density_fit().run(conv_tol=1e-11)
    ref = dfmp2.DFMP2(mf)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    pt = DFMP2(mf, auxbasis="cc-pvdz-ri").run()
    assert abs(pt.e_corr - ref.e_corr) < 1e-8  # DFMP2(mf_ks).run(): the PT2 energy of a KS reference
    assert abs(pt.double_hybrid_energy("b2plyp") - (mf.e_tot + 0.27 * ref.e_corr)) < 1e-8
    # custom coefficients: PySCF's opposite- and same-spin parts (not dfmp2's own), scaled
    assert abs(pt.double_hybrid_energy(c_os=0.5, c_ss=0.1)
               - (mf.e_tot + 0.5 * ref.e_corr_os + 0.1 * ref.e_corr_ss)) < 1e-8
    with pytest.raises(InputError, match="DSD-BLYP's KS part"):
        pt.double_hybrid_energy("DSD-BLYP")  # the reference is not DSD-BLYP's KS part


def _pyscf_reference(mol, functional, ks, mp2):
    """PySCF's DF-KS with `functional`'s hybrid part (the JK-fit set dfmp2 picks, its SCF
    convergence) and PySCF's DF-MP2 class `mp2` on those orbitals with cc-pVDZ-RI."""
    mf = ks(mol, xc=DOUBLE_HYBRIDS[functional].xc).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad = 1e-10, 1e-6
    mf.kernel()
    ref = mp2(mf)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    return mf, ref


def test_cli_double_hybrid_closed_and_open_shell(tmp_path):
    """`dfmp2 run --xc B2PLYP`: JSON xc/c_os/c_ss/e_ks/e_pt2/e_tot against PySCF's DF-RKS (same
    JK-fit set, default grid) + 0.27 DFMP2; the OH radical (--spin 1) runs UKS + DFUMP2."""
    xyz = Path(ROOT) / "examples" / "water.xyz"
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), "--xc", "B2PLYP", "--json",
                           "w.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "w.json").read_text(encoding="utf-8"))
    assert (r["xc"], r["c_os"], r["c_ss"], r["reference"]) == ("B2PLYP", 0.27, 0.27, "rks")
    assert r["e_hf"] is None and "E(PT2)" in proc.stdout
    mf, ref = _pyscf_reference(gto.M(atom=WATER, basis="cc-pvdz", verbose=0), "B2PLYP", dft.RKS, dfmp2.DFMP2)
    assert abs(r["e_ks"] - mf.e_tot) < 1e-8
    assert abs(r["e_pt2"] - 0.27 * ref.e_corr) < 1e-8
    assert abs(r["e_tot"] - (mf.e_tot + 0.27 * ref.e_corr)) < 1e-8

    oh = tmp_path / "oh.xyz"
    oh.write_text("2\nOH\nO 0 0 0\nH 0 0 0.9697\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(oh), "--spin", "1", "--xc", "DSD-PBEP86",
                           "--json", "oh.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "oh.json").read_text(encoding="utf-8"))
    assert r["reference"] == "uks" and (r["c_os"], r["c_ss"]) == (0.51, 0.36)
    _, ref = _pyscf_reference(gto.M(atom="O 0 0 0; H 0 0 0.9697", basis="cc-pvdz", spin=1, verbose=0),
                              "DSD-PBEP86", dft.UKS, dfump2.DFUMP2)
    assert abs(r["e_pt2"] - (0.51 * ref.e_corr_os + 0.36 * ref.e_corr_ss)) < 1e-8


@pytest.mark.parametrize("args, needle", [
    (["--xc", "NOSUCH"], "not a double hybrid dfmp2 knows"),
    (["--xc", "PWPB95"], "tweaked"),
    (["--xc", "B2PLYP", "--c-os", "0.3"], "fixes c_os and c_ss"),
    (["--c-os", "0.3", "--c-ss", "0.1"], "give --xc too"),
    (["--xc", "0.5*HF + 0.5*NOSUCHX, LYP", "--c-os", "0.3", "--c-ss", "0.1"], "not a functional PySCF knows"),
])
def test_double_hybrid_bad_input(args, needle, tmp_path):
    xyz = Path(ROOT) / "examples" / "water.xyz"
    proc = subprocess.run([sys.executable, "-m", "dfmp2.app.cli", "run", str(xyz), *args, "--json", "out.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out.json").exists()
