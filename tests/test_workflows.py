"""The workflows MP2 users run (issue 49): fragments and ghost atoms in XYZ files, counterpoise
interaction energies, per-element basis sets, the SCF's fitting set, Cartesian functions, and many
molecules per process. References: PySCF on the same set-up (fp64, 1e-8 Eh) and Psi4's published
counterpoise DF-MP2 values (tests/data/psi4_ecp_references.json: Psi4's tests/dfmp2-ecp, 1 uEh)."""

import json
import os

import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

from dfmp2 import chem
from dfmp2.api.driver import run_atoms
from dfmp2.util.errors import InputError

from conftest import HERE
from test_cli import describe, dfmp2_cli

MICROHARTREE = 1e-6
KCAL = 627.5094737775374  # Eh -> kcal/mol (Psi4's psi_hartree2kcalmol)
WATER_DIMER = """6
water dimer
0 1
O  -1.551007  -0.114520   0.000000
H  -1.934259   0.762503   0.000000
H  -0.599677   0.040712   0.000000
--
0 1
O   1.350625   0.111469   0.000000
H   1.680398  -0.373741  -0.758561
H   1.680398  -0.373741   0.758561
"""
WATER = "3\nwater\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def pyscf_energies(atom, basis, auxbasis, jk_auxbasis=None, cart=False, frozen=None, charge=0, spin=0):
    """PySCF's DF-RHF (jk_auxbasis, or its own JK-fit choice) and DFMP2 (auxbasis): (E_HF, E_corr)."""
    mol = gto.M(atom=atom, basis=basis, cart=cart, charge=charge, spin=spin, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=jk_auxbasis)
    mf.conv_tol = 1e-12
    mf.kernel()
    assert mf.converged
    pt = pyscf_dfmp2.DFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mol, auxbasis=auxbasis)
    pt.kernel()
    return mf.e_tot, pt.e_corr


# ----------------------------------------------------------------------------- the XYZ reader

@pytest.mark.parametrize("ghost", ["@O", "Gh(O)", "gh(o)", "X-O", "ghost-O", "GHOST-o"])
def test_ghost_atom_notations(tmp_path, ghost):
    path = write(tmp_path / "g.xyz", f"3\nghost\n{ghost} 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    atoms = chem.read_xyz(str(path))
    assert [a.ghost for a in atoms] == [True, False, False]
    assert atoms[0].symbol == "O" and atoms[0].label == "ghost-O"


def test_fragments_with_charge_and_multiplicity_lines(tmp_path):
    text = "4\nion pair\n1 1\nN 0 0 0\nH 0 0 1.0\n--\n-1 1\nCl 0 0 3.5\n--\nHe 0 0 7\n"
    (frame,) = chem.read_frames(str(write(tmp_path / "f.xyz", text)))
    assert [(f.start, f.stop, f.charge, f.multiplicity) for f in frame.fragments] == [
        (0, 2, 1, 1), (2, 3, -1, 1), (3, 4, None, None)]
    assert frame.charge is None  # the third fragment gives no line


@pytest.mark.parametrize("text, needle", [
    ("2\nx\n--\nHe 0 0 0\nHe 0 0 3\n", "no atoms before it"),
    ("2\nx\nHe 0 0 0\n--\n--\nHe 0 0 3\n", "no atoms before it"),
    ("2\nx\nHe 0 0 0\nHe 0 0 3\n--\n", "line 1 announces"),
    ("2\nx\n@He 0 0 0\nX-He 0 0 3\n", "every atom is a ghost"),
    ("2\nx\nHe 0 0 0\n--\n0 0\nHe 0 0 3\n", "multiplicity 0"),
    ("2\nx\nHe 0 0 0\n--\na b\nHe 0 0 3\n", "charge multiplicity"),
    ("2\nx\nBq 0 0 0\nHe 0 0 3\n", "a ghost atom is written @O, Gh(O), X-O or ghost-O"),
])
def test_bad_fragment_files_are_refused_naming_the_line(tmp_path, text, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        chem.read_frames(str(write(tmp_path / "bad.xyz", text)))


def test_multi_frame_file(tmp_path):
    frames = chem.read_frames(str(write(tmp_path / "t.xyz", WATER + "\n" + WATER.replace("0.1173", "0.1200"))))
    assert [f.name for f in frames] == [f"{tmp_path / 't.xyz'}#1", f"{tmp_path / 't.xyz'}#2"]
    assert frames[1].atoms[0].xyz == (0.0, 0.0, 0.12)
    with pytest.raises(InputError, match="one geometry per file here"):
        chem.read_xyz(str(tmp_path / "t.xyz"))


# ----------------------------------------------------------------------------- against PySCF

def test_ghost_atoms_match_pyscf_and_freeze_only_real_cores():
    """Water A in the dimer's basis (B's atoms ghosts), frozen core: PySCF's ghost atoms, 1e-8 Eh."""
    atoms = [chem.Atom("O", (-1.551007, -0.114520, 0.0)), chem.Atom("H", (-1.934259, 0.762503, 0.0)),
             chem.Atom("H", (-0.599677, 0.040712, 0.0)), chem.Atom("O", (1.350625, 0.111469, 0.0), True),
             chem.Atom("H", (1.680398, -0.373741, -0.758561), True), chem.Atom("H", (1.680398, -0.373741, 0.758561), True)]
    result = run_atoms(atoms, basis="cc-pvdz", frozen_core=True, precision="fp64")
    e_hf, e_corr = pyscf_energies([(a.label, a.xyz) for a in atoms], "cc-pvdz", "cc-pvdz-ri", frozen=1)
    assert result.correlation.nfrozen == 1  # the ghost oxygen has no core
    assert result.correlation.nao == 48
    assert result.formula == "H2O"
    assert abs(result.e_hf - e_hf) < 1e-8 and abs(result.e_corr - e_corr) < 1e-8


def test_per_element_basis_fitting_sets_and_cartesian_match_pyscf():
    """--basis 'O:aug-cc-pvdz,H:cc-pvdz' with per-element --auxbasis and --jk-auxbasis, Cartesian."""
    atoms = [chem.Atom("O", (0, 0, 0.1173)), chem.Atom("H", (0, 0.7572, -0.4692)), chem.Atom("H", (0, -0.7572, -0.4692))]
    result = run_atoms(atoms, basis="O:aug-cc-pvdz,H:cc-pvdz", auxbasis="cc-pvdz-ri,O:aug-cc-pvdz-ri",
                       jk_auxbasis="def2-universal-jkfit", cartesian=True, precision="fp64")
    e_hf, e_corr = pyscf_energies([(a.symbol, a.xyz) for a in atoms], {"O": "aug-cc-pvdz", "H": "cc-pvdz"},
                                  {"O": "aug-cc-pvdz-ri", "H": "cc-pvdz-ri"}, "def2-universal-jkfit", cart=True)
    assert result.correlation.nao == 25 + 2 * 5  # aug-cc-pVDZ O, 4s3p2d with 6 Cartesian d (23 spherical); cc-pVDZ H
    assert result.scf_auxbasis == "def2-universal-jkfit"
    assert abs(result.e_hf - e_hf) < 1e-8 and abs(result.e_corr - e_corr) < 1e-8
    record = result.as_dict()
    assert record["auxbasis_sources"]["mp2"] == {"H": "cc-pvdz-ri", "O": "aug-cc-pvdz-ri"}


@pytest.mark.parametrize("spec, needle", [
    ("O:cc-pvdz", "gives no basis for H"), ("cc-pvdz,sto-3g", "at most one bare name"),
    ("Q:cc-pvdz,cc-pvdz", "is not 'Element:name'"), ("O:cc-pvdz,O:sto-3g,H:sto-3g", "O is given twice"),
    ("O:nosuchbasis,H:cc-pvdz", "unknown or has no functions for O")])
def test_bad_basis_specs_are_refused(spec, needle):
    atoms = [chem.Atom("O", (0, 0, 0.1173)), chem.Atom("H", (0, 0.7572, -0.4692)), chem.Atom("H", (0, -0.7572, -0.4692))]
    with pytest.raises(InputError, match=needle):
        run_atoms(atoms, basis=spec)


def test_jk_auxbasis_with_an_exact_scf_is_refused():
    atoms = [chem.Atom("He", (0, 0, 0))]
    with pytest.raises(InputError, match="fits nothing"):
        run_atoms(atoms, scf="exact", jk_auxbasis="def2-universal-jkfit")


# ----------------------------------------------------------------------------- counterpoise, the command line

@pytest.fixture(scope="module")
def nexe_counterpoise(tmp_path_factory):
    """`dfmp2 run nexe.xyz --bsse cp,nocp --basis def2-svp --frozen-core` (Psi4's dfmp2-ecp set-up)."""
    directory = tmp_path_factory.mktemp("cp")
    write(directory / "nexe.xyz", "2\nNeXe\nNe 0 0 0\n--\nXe 0 0 3.0\n")
    proc = dfmp2_cli("run", "nexe.xyz", "--bsse", "cp,nocp", "--basis", "def2-svp", "--frozen-core",
                     "--json", "out.json", cwd=directory)
    assert proc.returncode == 0, describe(proc)
    return proc, json.loads((directory / "out.json").read_text(encoding="utf-8"))


def test_counterpoise_matches_psi4_published_values(nexe_counterpoise):
    """Each total to 1 uEh of Psi4's, E_int(CP) to 0.001 kcal/mol of the one Psi4's totals give."""
    with open(os.path.join(HERE, "data", "psi4_ecp_references.json"), encoding="utf-8") as handle:
        psi4 = json.load(handle)
    dimer = next(c for c in psi4["cases"] if c["name"] == "NeXe_frozen_core")
    monomers = {c["name"]: c for c in psi4["counterpoise"]["cases"]}
    proc, record = nexe_counterpoise
    energies = record["per_basis"]["def2-svp"]["energies"]
    expected = {"whole": dimer, "fragment 1 (whole basis)": monomers["Ne_ghost_Xe"],
                "fragment 2 (whole basis)": monomers["Xe_ghost_Ne"]}
    for name, case in expected.items():
        assert abs(energies[name]["e_ref"] - case["e_scf"]) < MICROHARTREE, name
        assert abs(energies[name]["e_corr"] - case["e_corr"]) < MICROHARTREE, name
    psi4_int = sum(sign * (c["e_scf"] + c["e_corr"]) for sign, c in (
        (1, dimer), (-1, monomers["Ne_ghost_Xe"]), (-1, monomers["Xe_ghost_Ne"])))
    assert abs(record["interaction_kcal_mol"]["cp"]["e_tot"] - psi4_int * KCAL) < 1e-3
    runs = record["per_basis"]["def2-svp"]["runs"]
    assert [runs[n]["nfrozen"] for n in expected] == [5, 1, 4]  # ghosts freeze nothing
    assert runs["fragment 2 (whole basis)"]["ecp"] == {"Xe": {"name": "def2-svp", "core_electrons": 28}}
    assert runs["fragment 1 (whole basis)"]["ecp"] == {}  # a ghost Xe carries no ECP (Psi4)
    assert "interaction energy, CP" in proc.stdout and "kcal/mol" in proc.stdout


def test_counterpoise_parts_add_up(nexe_counterpoise):
    """E_int of every component is the whole's less the fragments' (CP: in the whole's basis;
    noCP: own basis), and the own-basis fragments are the plain runs of the fragments."""
    _, record = nexe_counterpoise
    energies = record["per_basis"]["def2-svp"]["energies"]
    for kind, label in (("cp", "whole basis"), ("nocp", "own basis")):
        for part in ("e_ref", "e_corr_os", "e_corr_ss", "e_scs", "e_tot"):
            parts = energies[f"fragment 1 ({label})"][part] + energies[f"fragment 2 ({label})"][part]
            assert record["interaction"][kind][part] == pytest.approx(energies["whole"][part] - parts, abs=1e-12)
            assert record["interaction_kcal_mol"][kind][part] == pytest.approx(
                record["interaction"][kind][part] * KCAL, rel=1e-12)
    alone = run_atoms([chem.Atom("Ne", (0.0, 0.0, 0.0))], basis="def2-svp", frozen_core=True, precision="fp32")
    assert abs(energies["fragment 1 (own basis)"]["e_tot"] - alone.e_tot) < 1e-9


@pytest.mark.parametrize("text, args, needle", [
    (WATER, ["--counterpoise"], "counterpoise needs fragments"),
    (WATER_DIMER, ["--bsse", "cpp"], "expected cp, nocp or cp,nocp"),
    (WATER_DIMER, ["--counterpoise", "--charge", "1"], "disagrees with the fragments' 'charge multiplicity' lines"),
    (WATER_DIMER.replace("0 1\n", ""), ["--counterpoise", "--charge", "1"], "write each fragment's line"),
    (WATER_DIMER, ["--counterpoise", "--checkpoint", "ck"], "keeps one run"),
    ("2\nx\nHe 0 0 0\n--\n@He 0 0 3\n", ["--counterpoise"], "fragment 2 holds ghost atoms only"),
])
def test_counterpoise_refusals_exit_2(tmp_path, text, args, needle):
    write(tmp_path / "d.xyz", text)
    proc = dfmp2_cli("run", "d.xyz", *args, cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert needle in proc.stderr and proc.stderr.count("\n") == 1


# ----------------------------------------------------------------------------- many molecules per process

def test_many_molecules_in_one_process(tmp_path):
    """Two files, a two-frame file and a directory; one bad molecule is recorded and the rest go
    on; exit 1; each record equals the single run of that molecule."""
    write(tmp_path / "a.xyz", WATER)
    write(tmp_path / "two.xyz", WATER + WATER.replace("0.1173", "0.1300"))
    (tmp_path / "dir").mkdir()
    write(tmp_path / "dir" / "b.xyz", "2\nHF\nF 0 0 0\nH 0 0 0.9168\n")
    write(tmp_path / "dir" / "c.xyz", "1\nbad\nXx 0 0 0\n")
    proc = dfmp2_cli("run", "a.xyz", "two.xyz", "dir", "--json", "out.jsonl", cwd=tmp_path)
    assert proc.returncode == 1, describe(proc)
    assert "1 of 5 molecules failed" in proc.stderr and proc.stderr.count("\n") == 1
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["molecule"] for r in records] == ["a.xyz", "two.xyz#1", "two.xyz#2", "dir/b.xyz", "dir/c.xyz"]
    assert [r["status"] for r in records] == ["ok"] * 4 + ["failed"]
    assert records[4]["exit_code"] == 2 and "unknown element 'Xx'" in records[4]["error"]
    assert records[0]["e_tot"] == records[1]["e_tot"] != records[2]["e_tot"]
    single = dfmp2_cli("run", "dir/b.xyz", "--json", "b.json", cwd=tmp_path)
    assert single.returncode == 0, describe(single)
    assert abs(json.loads((tmp_path / "b.json").read_text())["e_tot"] - records[3]["e_tot"]) < 1e-10
    assert "dir/c.xyz: failed (exit 2)" in proc.stdout


def test_a_batch_that_all_succeeds_exits_0(tmp_path):
    write(tmp_path / "two.xyz", WATER + WATER)
    proc = dfmp2_cli("run", "two.xyz", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout == "" and proc.stderr == ""


# ----------------------------------------------------------------------------- Psi4's published workflows

with open(os.path.join(HERE, "data", "psi4_workflow_references.json"), encoding="utf-8") as _handle:
    PSI4 = json.load(_handle)


def fragments_xyz(fragments, comment):
    """An XYZ file of neutral singlet fragments separated by '--'."""
    blocks = ["0 1\n" + "".join(f"{s} {x} {y} {z}\n" for s, x, y, z in atoms) for atoms in fragments]
    return f"{sum(map(len, fragments))}\n{comment}\n" + "--\n".join(blocks)


@pytest.mark.parametrize("case", PSI4["counterpoise"], ids=lambda c: c["name"])
def test_counterpoise_reproduces_psi4(tmp_path, case):
    """`dfmp2 run dimer.xyz --counterpoise` as a user types it: every total to 1 uEh of Psi4's
    printed ones, E_int(CP) to 0.001 kcal/mol of the one Psi4's totals give."""
    write(tmp_path / "dimer.xyz", fragments_xyz(case["fragments"], case["source"]))
    proc = dfmp2_cli("run", "dimer.xyz", "--counterpoise", "--basis", case["basis"], "--json", "out.json",
                     cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    energies = record["per_basis"][case["basis"]]["energies"]
    expected = {"whole": case["whole"], **{f"fragment {k} (whole basis)": e
                                           for k, e in enumerate(case["fragments_in_whole_basis"], start=1)}}
    assert sorted(energies) == sorted(expected)
    for name, psi4 in expected.items():
        for ours, theirs in (("e_ref", "e_scf"), ("e_corr", "e_corr"), ("e_corr_os", "e_corr_os"),
                             ("e_corr_ss", "e_corr_ss"), ("e_tot", "e_tot")):
            if theirs in psi4:
                assert abs(energies[name][ours] - psi4[theirs]) < MICROHARTREE, (name, ours)
    psi4_int = case["whole"]["e_tot"] - sum(e["e_tot"] for e in case["fragments_in_whole_basis"])
    assert abs(record["interaction_kcal_mol"]["cp"]["e_tot"] - psi4_int * KCAL) < 1e-3
    assert record["interaction"]["cp"]["e_tot"] == pytest.approx(record["interaction_kcal_mol"]["cp"]["e_tot"] / KCAL)
    if "e_int_cp_input_dat" in case:  # the value Psi4's test compares (to 1e-5 Eh there)
        assert abs(record["interaction"]["cp"]["e_tot"] - case["e_int_cp_input_dat"]) < 1e-7
    if "e_int_cp_kj_mol_input_dat" in case:  # the literature value Psi4 compares, to its 0.1 kJ/mol
        assert abs(record["interaction_kcal_mol"]["cp"]["e_tot"] * 4.184 - case["e_int_cp_kj_mol_input_dat"]) < 0.1


@pytest.fixture(scope="module")
def extrapolations(tmp_path_factory):
    """`dfmp2 run water.xyz --basis aug-cc-pv[..]z` for each of Psi4's extrapolation cases."""
    from test_cli import run_all

    data = PSI4["extrapolation"]
    directory = tmp_path_factory.mktemp("cbs")
    write(directory / "water.xyz", f"3\n{data['molecule']}\n" + "".join(f"{s} {x} {y} {z}\n" for s, x, y, z in data["atoms"]))
    jobs = {k: (["run", "water.xyz", "--basis", c["basis"], "--scf-extrapolation", c["scf_extrapolation"],
                 "--json", f"out{k}.json"], directory) for k, c in enumerate(data["cases"])}
    procs = run_all(jobs)
    for proc in procs.values():
        assert proc.returncode == 0, describe(proc)
        assert ", 1 system, basis" in proc.stdout, describe(proc)  # (it printed "1 systems")
    return [json.loads((directory / f"out{k}.json").read_text(encoding="utf-8")) for k in jobs]


@pytest.mark.parametrize("k", range(len(PSI4["extrapolation"]["cases"])),
                         ids=lambda k: PSI4["extrapolation"]["cases"][k]["psi4"])
def test_extrapolation_reproduces_psi4_cbs(extrapolations, k):
    """Psi4's cbs() values (MP2 totals; SCF limits by its exponential formulas) to 1 uEh, and each
    basis's own energies to 1 uEh of Psi4's printed ones."""
    case, record = PSI4["extrapolation"]["cases"][k], extrapolations[k]
    limit = record["extrapolation"]["energies"]["whole"]
    assert abs(limit[case["quantity"]] - case["value"]) < MICROHARTREE
    assert limit["e_tot"] == pytest.approx(limit["e_ref"] + limit["e_corr"], abs=1e-12)
    for basis, block in record["per_basis"].items():
        psi4 = PSI4["extrapolation"]["per_basis"][basis]
        assert abs(block["energies"]["whole"]["e_ref"] - psi4["e_scf"]) < MICROHARTREE, basis
        assert abs(block["energies"]["whole"]["e_corr"] - psi4["e_corr"]) < MICROHARTREE, basis
    expected_scheme = "xtpl_highest_1" if case["scf_extrapolation"] == "highest" else \
        f"scf_xtpl_helgaker_{len(record['bases'])}"
    assert record["extrapolation"]["scheme"]["scf"] == expected_scheme


def test_extrapolated_counterpoise_combines_both(tmp_path):
    """--counterpoise with cc-pv[dt]z: E_int at the limit is the limit of the systems' energies,
    and each basis's E_int is that basis's counterpoise computation."""
    write(tmp_path / "d.xyz", "2\nHe2\nHe 0 0 0\n--\nHe 0 0 3.0\n")
    proc = dfmp2_cli("run", "d.xyz", "--counterpoise", "--basis", "cc-pv[dt]z", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert record["workflow"] == ["counterpoise", "extrapolation"]
    dz, tz = (record["per_basis"][b]["energies"] for b in ("cc-pvdz", "cc-pvtz"))
    for name in dz:
        corr = (27 * tz[name]["e_corr"] - 8 * dz[name]["e_corr"]) / 19  # Helgaker, X = 2, 3
        assert record["extrapolation"]["energies"][name]["e_corr"] == pytest.approx(corr, abs=1e-12)
        assert record["extrapolation"]["energies"][name]["e_ref"] == tz[name]["e_ref"]
    limit = record["extrapolation"]["energies"]
    assert record["interaction"]["cp"]["e_tot"] == pytest.approx(
        limit["whole"]["e_tot"] - limit["fragment 1 (whole basis)"]["e_tot"] - limit["fragment 2 (whole basis)"]["e_tot"],
        abs=1e-12)


@pytest.mark.parametrize("basis, needle", [
    ("cc-pv[tx]z", "not a list of cardinal numbers"), ("cc-pv[qt]z", "smallest first"),
    ("cc-pv[t]z", "gives one basis"), ("cc-pv[dq]z", "consecutive"), ("cc-pv[dt]z,O:aug-cc-pv[tq]z", "the same"),
    ("cc-pv[dtz", "unclosed bracket"), ("O:aug-cc-pv[dt]z,H:cc-pvdz", "'H:cc-pvdz' has no bracket")])
def test_bad_extrapolation_bases_exit_2(tmp_path, basis, needle):
    write(tmp_path / "w.xyz", WATER)
    proc = dfmp2_cli("run", "w.xyz", "--basis", basis, cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert needle in proc.stderr


def test_three_fragments_give_the_total_interaction_energy(tmp_path):
    """He3 as three fragments: E_int(CP) = E_ABC - E_A - E_B - E_C, each in the trimer's basis,
    each fragment's run with the other two as ghosts (its basis size the trimer's)."""
    write(tmp_path / "he3.xyz", "3\nHe3\nHe 0 0 0\n--\nHe 0 0 3.0\n--\nHe 0 2.6 1.5\n")
    proc = dfmp2_cli("run", "he3.xyz", "--counterpoise", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    runs = record["per_basis"]["cc-pvdz"]["runs"]
    assert sorted(runs) == ["fragment 1 (whole basis)", "fragment 2 (whole basis)", "fragment 3 (whole basis)", "whole"]
    assert {r["nbasis"] for r in runs.values()} == {15} and {r["formula"] for r in runs.values()} == {"He3", "He"}
    energies = record["energies"]
    assert record["interaction"]["cp"]["e_tot"] == pytest.approx(
        energies["whole"]["e_tot"] - sum(energies[f"fragment {k} (whole basis)"]["e_tot"] for k in (1, 2, 3)), abs=1e-12)


# ----------------------------------------------------------------------------- QCSchema on the command line

QCSCHEMA_WATER = {"schema_name": "qcschema_input",
                  "molecule": {"symbols": ["O", "H", "H"],
                               "geometry": [0, 0, 0.2217, 0, 1.4309, -0.8866, 0, -1.4309, -0.8866]},
                  "driver": "gradient", "model": {"method": "mp2", "basis": "cc-pvdz"},
                  "keywords": {"frozen_core": True}}


def test_dfmp2_run_reads_a_qcschema_input(tmp_path):
    """`dfmp2 run input.json` writes the AtomicResult run_qcschema gives in process (PySCF-checked
    in tests/test_qcschema.py), to --json or standard output."""
    from dfmp2.api.qcschema import run_qcschema

    write(tmp_path / "in.json", json.dumps(QCSCHEMA_WATER))
    proc = dfmp2_cli("run", "in.json", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout == ""
    written = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    expected = run_qcschema(QCSCHEMA_WATER)
    assert written["success"] is True and written["schema_name"] == "qcschema_output"
    assert written["return_result"] == pytest.approx(expected["return_result"], abs=1e-10)
    assert written["properties"]["return_energy"] == pytest.approx(expected["properties"]["return_energy"], abs=1e-10)
    to_stdout = dfmp2_cli("run", "in.json", cwd=tmp_path)
    assert to_stdout.returncode == 0 and json.loads(to_stdout.stdout)["success"] is True


@pytest.mark.parametrize("content, args, needle, written", [
    (dict(QCSCHEMA_WATER, driver="hessian"), [], "dfmp2 has no Hessians", True),
    (dict(QCSCHEMA_WATER, schema_version=99), [], "schema_version 99", True),
    (dict(QCSCHEMA_WATER, molecule=dict(QCSCHEMA_WATER["molecule"], geometry=[float("nan")] * 9)), [],
     "molecule.geometry: atom 1 (O)", True),
    (dict(QCSCHEMA_WATER, molecule=dict(QCSCHEMA_WATER["molecule"], geometry=[0, 0, float("inf")] + [0] * 6)), [],
     "molecule.geometry: atom 1 (O)", True),
    (QCSCHEMA_WATER, ["--basis", "sto-3g"], "--basis is not taken with it", False),
    ("{not json", [], "not a readable JSON file", False),
    (QCSCHEMA_WATER, ["other.xyz"], "a QCSchema input runs alone", False),
])
def test_bad_qcschema_inputs_exit_2(tmp_path, content, args, needle, written):
    """An input_error is written as QCEngine's FailedOperation (strict JSON: a NaN or infinity
    the input held is null in its echo) and exits 2; options the input carries itself and
    unreadable JSON are refused before anything runs (nothing written)."""
    write(tmp_path / "in.json", content if isinstance(content, str) else json.dumps(content))  # NaN, Infinity
    proc = dfmp2_cli("run", "in.json", *args, "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert needle in proc.stderr and proc.stderr.count("\n") == 1
    assert (tmp_path / "out.json").exists() == written
    if written:
        failed = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"), parse_constant=_no_constant)
        assert failed["success"] is False and failed["error"]["error_type"] == "input_error"


def _no_constant(name):
    raise AssertionError(f"{name} in a written JSON file: not strict JSON")


def test_qcschema_fragments_and_ghosts_match_an_xyz_file(tmp_path):
    """A water dimer's second molecule as ghosts, as QCSchema v2 (fragments, real false) through
    `dfmp2 run in.json` and as an XYZ file with '--' and '@' ghosts through `dfmp2 run --precision
    fp64` (a QCSchema input runs at the library's fp64 unless its keywords say otherwise): the same
    E_total (1e-10 Eh; measured 1.4e-14) and basis; the v2 AtomicResult validates as QCElemental's model."""
    from qcelemental.models import v2

    lines = ["O  -1.551007  -0.114520   0.000000", "H  -1.934259   0.762503   0.000000",
             "H  -0.599677   0.040712   0.000000", "O   1.350625   0.111469   0.000000",
             "H   1.680398  -0.373741  -0.758561", "H   1.680398  -0.373741   0.758561"]
    write(tmp_path / "dimer.xyz", "6\nghosted dimer\n" + "\n".join(lines[:3]) + "\n--\n"
          + "\n".join("@" + line for line in lines[3:]) + "\n")
    bohr = 1 / chem.angstrom_per_bohr()
    molecule = {"symbols": [line.split()[0] for line in lines], "real": [True] * 3 + [False] * 3,
                "geometry": [float(x) * bohr for line in lines for x in line.split()[1:]],
                "fragments": [[0, 1, 2], [3, 4, 5]]}
    write(tmp_path / "in.json", json.dumps({"schema_name": "qcschema_atomic_input", "schema_version": 2,
                                            "molecule": molecule, "specification": {
                                                "driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"},
                                                "keywords": {"frozen_core": True}}}))
    from_json = dfmp2_cli("run", "in.json", "--json", "out.json", cwd=tmp_path)
    from_xyz = dfmp2_cli("run", "dimer.xyz", "--frozen-core", "--precision", "fp64", "--json", "xyz.json", cwd=tmp_path)
    assert from_json.returncode == 0 and from_xyz.returncode == 0, describe(from_json) + describe(from_xyz)
    result = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    v2.AtomicResult.model_validate(result)
    record = json.loads((tmp_path / "xyz.json").read_text(encoding="utf-8"))
    assert abs(result["return_result"] - record["e_tot"]) < 1e-10
    assert result["properties"]["calcinfo_nbasis"] == record["nbasis"] == 48
