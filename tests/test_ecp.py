"""Heavy elements with def2 effective core potentials, against Psi4's published DF-MP2 values
(tests/data/psi4_ecp_references.json: Psi4's tests/dfmp2-ecp), to 1 uEh.

dfmp2 uses the ECPs a named basis carries (def2: Rb-Rn) unless told otherwise, takes the def2
RI fitting sets PySCF lacks (Rb-Rn) from the Basis Set Exchange's data, and freezes Psi4's core
count on ECP atoms; the plugin honours whatever ECP the user's molecule has.
"""

import json
import os

import pytest

from dfmp2 import chem
from dfmp2.api.driver import run_xyz
from dfmp2.util.errors import InputError

from conftest import HERE

with open(os.path.join(HERE, "data", "psi4_ecp_references.json"), encoding="utf-8") as _handle:
    PSI4 = json.load(_handle)
CASES = {case["name"]: case for case in PSI4["cases"]}
MICROHARTREE = 1e-6


def write_xyz(path, atoms):
    path.write_text(f"{len(atoms)}\npsi4 dfmp2-ecp\n" + "".join(f"{s} {x} {y} {z}\n" for s, x, y, z in atoms))
    return path


@pytest.fixture(scope="module")
def psi4_runs(tmp_path_factory):
    """`run_xyz` on each Psi4 case, def2-SVP, everything else dfmp2's defaults."""
    directory = tmp_path_factory.mktemp("ecp")
    runs = {}
    for name, case in CASES.items():
        path = write_xyz(directory / f"{name}.xyz", case["atoms"])
        runs[name] = run_xyz(str(path), basis="def2-svp", frozen_core=case["frozen_core"])
    return runs


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "e_corr" in c])
def test_dfmp2_with_ecp_matches_psi4(psi4_runs, name):
    case, result = CASES[name], psi4_runs[name]
    assert result.correlation.nfrozen == case["nfrozen"]  # Psi4's frozen-core count on ECP atoms
    assert abs(result.e_hf - case["e_scf"]) < MICROHARTREE
    for key in ("e_corr", "e_corr_os", "e_corr_ss"):
        assert abs(getattr(result, key) - case[key]) < MICROHARTREE, (key, getattr(result, key), case[key])


def test_hydrogen_iodide_uses_the_def2_ecp(psi4_runs):
    """The defect: HI/def2-SVP ran iodine all-electron (E(RHF) about -1994 Eh, no warning)."""
    result = psi4_runs["HI_scf"]
    assert abs(result.e_hf - CASES["HI_scf"]["e_scf"]) < MICROHARTREE
    assert result.ecp == {"I": {"name": "def2-svp", "core_electrons": 28}}
    record = result.as_dict()
    assert record["ecp"] == {"I": {"name": "def2-svp", "core_electrons": 28}}
    # PySCF's def2-svp-ri stops at Kr: iodine's set is the Basis Set Exchange's, and says so
    assert record["auxbasis_sources"]["mp2"] == {"H": "def2-svp-ri", "I": "def2-svp-rifit (Basis Set Exchange)"}
    assert record["auxbasis_generated"] == {}


def test_ecp_none_runs_all_electron_and_says_so(tmp_path):
    path = write_xyz(tmp_path / "hi.xyz", CASES["HI_scf"]["atoms"])
    result = run_xyz(str(path), basis="def2-svp", ecp="none")
    assert result.ecp == {}
    assert result.e_hf < -1990  # 53 electrons more than with the ECP
    assert any("ECPs off (ecp='none')" in note and "28-electron def2-svp" in note for note in result.notes)


def test_ecp_by_name_and_refused_where_it_covers_nothing():
    """--ecp NAME: that library for the elements it covers; a name covering none is bad input."""
    assert chem.choose_ecp(["I", "H"], "cc-pvdz", "def2-svp").record == {
        "I": {"name": "def2-svp", "core_electrons": 28}}
    assert chem.choose_ecp(["I", "H"], "cc-pvdz").record == {}  # cc-pVDZ carries no ECP
    with pytest.raises(InputError, match="no ECP of that name"):
        chem.choose_ecp(["C", "H"], "cc-pvdz", "def2-svp")


def test_lanthanide_ecp_comes_from_the_basis_set_exchange():
    """PySCF's library has the def2 orbital sets of Ce-Lu but not their ECPs: an auto run would
    otherwise put Gd all-electron (64 electrons) in a basis made for a 28-electron ECP."""
    from pyscf import gto

    assert not gto.basis.load_ecp("def2-svp", "Gd")  # the gap this fills
    ecp = chem.choose_ecp(["Gd", "Cl"], "def2-svp")
    assert ecp.record == {"Gd": {"name": "def2-svp (Basis Set Exchange)", "core_electrons": 28}}
    mol = chem.build_molecule([chem.Atom("Gd", (0.0, 0.0, 0.0)), chem.Atom("Cl", (0.0, 0.0, 2.6)),
                               chem.Atom("Cl", (0.0, 2.6, 0.0)), chem.Atom("Cl", (2.6, 0.0, 0.0))],
                              "def2-svp", spin=7, ecp=ecp)  # Gd(III): seven unpaired 4f electrons
    assert mol.nelectron == 64 - 28 + 3 * 17


@pytest.mark.parametrize("name", ["Xe_ghost_Ne", "Ne_ghost_Xe"])
def test_plugin_honours_the_molecules_ecp(name):
    """A PySCF script's own molecule with ECPs and ghost atoms (Psi4's counterpoise monomers)."""
    from pyscf import gto, scf

    from dfmp2 import DFMP2

    case = next(c for c in PSI4["counterpoise"]["cases"] if c["name"] == name)
    mol = gto.M(atom=case["atom"], basis="def2-svp", ecp="def2-svp", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    mf.conv_tol = 1e-11
    mf.kernel()
    assert abs(mf.e_tot - case["e_scf"]) < MICROHARTREE
    pt = DFMP2(mf, frozen=case["nfrozen"], auxbasis="def2-svp-ri").run()  # Psi4's DF_BASIS_MP2
    assert abs(pt.e_corr - case["e_corr"]) < MICROHARTREE
    assert pt.result.ecp == ({"Xe": {"name": "def2-svp", "core_electrons": 28}} if name == "Xe_ghost_Ne" else {})
    assert chem.frozen_core_count(mol) == case["nfrozen"]  # Psi4's count, ghosts freezing nothing
