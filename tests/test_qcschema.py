"""QCSchema and QCEngine (dfmp2/api/qcschema.py, dfmp2/api/qcengine_harness.py): energies against
dfmp2's own run_atoms and PySCF's DF-MP2 on the same set-up, gradients against central
differences, ghost atoms against PySCF's, bad input as QCEngine reports it."""

import itertools
import json

import numpy as np
import pytest
import qcengine  # the `workflows` extra, which `test` installs (not skipped: CI runs these)
from pyscf import df, gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

import dfmp2
from dfmp2 import chem
from dfmp2.api.qcschema import qcschema_request, run_qcschema

WATER_BOHR = [0.0, 0.0, 0.2216655, 0.0, 1.4309, -0.8866, 0.0, -1.4309, -0.8866]
WATER = {"symbols": ["O", "H", "H"], "geometry": WATER_BOHR, "molecular_charge": 0, "molecular_multiplicity": 1}
FITTING = {"auxbasis": "cc-pvdz-ri", "jk_auxbasis": "cc-pvdz-jkfit"}


def _input(driver="energy", method="mp2", keywords=None, molecule=WATER, basis="cc-pvdz"):
    return {"schema_name": "qcschema_input", "schema_version": 1, "molecule": molecule, "driver": driver,
            "model": {"method": method, "basis": basis}, "keywords": dict(keywords or {})}


def _atoms(molecule):
    xyz = np.reshape(molecule["geometry"], (-1, 3)) * chem.angstrom_per_bohr()
    real = molecule.get("real", [True] * len(xyz))
    return [chem.Atom(s, tuple(x), ghost=not r) for s, x, r in zip(molecule["symbols"], xyz, real)]


def _pyscf_dfmp2(molecule, basis="cc-pvdz"):
    """PySCF's DF-RHF (cc-pVDZ-JKFIT, converged to 1e-12) and DFMP2 (cc-pVDZ-RI) on the same
    molecule (bohr; ghosts as PySCF's ghost atoms)."""
    labels = [s if r else f"ghost-{s}" for s, r in zip(molecule["symbols"], molecule.get("real", [True] * 99))]
    mol = gto.M(atom=[(label, x) for label, x in zip(labels, np.reshape(molecule["geometry"], (-1, 3)))],
                unit="Bohr", basis=basis, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=FITTING["jk_auxbasis"])
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-8
    mf.kernel()
    pt = pyscf_dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=FITTING["auxbasis"])
    pt.kernel()
    return mf, pt


@pytest.fixture(scope="module")
def harness():
    return dfmp2.register_qcengine()


def test_register_is_idempotent(harness):
    assert dfmp2.register_qcengine() is harness and "dfmp2" in qcengine.list_all_programs()
    assert harness.found() and harness.get_version() == dfmp2.__version__


def test_qcengine_energy_matches_run_atoms_and_pyscf(harness):
    """qcengine.compute(..., "dfmp2"): E_total equals run_atoms' on the same geometry to 1e-10 Eh
    and PySCF's DF-RHF + DFMP2 (same JK-fit and MP2-fit sets) to 1e-8 Eh; the SCF, the parts, the
    sizes, the nuclear repulsion and the SCF dipole as PySCF has them; SCS-MP2 is E_HF + 6/5 E_os
    + 1/3 E_ss of PySCF's parts; a double hybrid's energy is run_atoms'; QCEngine's memory is one
    limit of the budget (the smallest sets it: tests/test_budget_rule.py). Measured: 0 against
    run_atoms, 8.8e-11 Eh against PySCF (SCS 9.9e-11)."""
    out = qcengine.compute(_input(keywords=FITTING), "dfmp2", return_dict=True, task_config={"memory": 4})
    assert out["success"], out.get("error")
    memory = out["extras"]["dfmp2"]["memory"]  # QCEngine's memory (GiB) is one limit, in MB
    assert memory["budget_mb"] <= 4 * 1024 ** 3 / 1e6 and "QCEngine's task_config memory 4 GiB: 4295 MB" in memory["limits"]
    ours = dfmp2.run_atoms(_atoms(WATER), basis="cc-pvdz", **FITTING)
    mf, pt = _pyscf_dfmp2(WATER)
    props = out["properties"]
    assert abs(out["return_result"] - ours.e_tot) < 1e-10
    assert abs(out["return_result"] - pt.e_tot) < 1e-8 and abs(props["return_energy"] - out["return_result"]) == 0
    assert abs(props["scf_total_energy"] - mf.e_tot) < 1e-9 and abs(props["mp2_correlation_energy"] - pt.e_corr) < 1e-8
    assert abs(props["mp2_opposite_spin_correlation_energy"] - pt.e_corr_os) < 1e-8
    assert abs(props["mp2_same_spin_correlation_energy"] - pt.e_corr_ss) < 1e-8
    assert abs(props["nuclear_repulsion_energy"] - mf.energy_nuc()) < 1e-12
    assert np.abs(np.array(props["scf_dipole_moment"]) - mf.dip_moment(unit="AU", verbose=0)).max() < 1e-6
    assert (props["calcinfo_nbasis"], props["calcinfo_nmo"], props["calcinfo_nalpha"], props["calcinfo_nbeta"],
            props["calcinfo_natom"]) == (24, 24, 5, 5, 3)
    assert out["provenance"]["creator"] == "dfmp2" and out["extras"]["dfmp2"]["auxbasis"] == "cc-pvdz-ri"
    scs = qcengine.compute(_input(method="scs-mp2", keywords=FITTING), "dfmp2", return_dict=True)
    assert abs(scs["return_result"] - (mf.e_tot + 1.2 * pt.e_corr_os + pt.e_corr_ss / 3)) < 1e-8
    b2plyp = qcengine.compute(_input(method="b2plyp"), "dfmp2", return_dict=True)
    assert abs(b2plyp["return_result"] - dfmp2.run_atoms(_atoms(WATER), basis="cc-pvdz", xc="B2PLYP").e_tot) < 1e-10
    assert "mp2_correlation_energy" not in b2plyp["properties"] and b2plyp["extras"]["dfmp2"]["xc"] == "B2PLYP"


def _energy(geometry, method, keywords):
    out = run_qcschema(_input(method=method, keywords=keywords, molecule={**WATER, "geometry": list(geometry)}))
    assert out["success"], out.get("error")
    return out["return_result"]


@pytest.mark.parametrize("method, keywords", [("mp2", {"frozen_core": True}), ("scs-mp2", {})])
def test_qcengine_gradient_matches_finite_differences(harness, method, keywords):
    """driver gradient: return_result [natm*3] Eh/bohr equals run_atoms' gradient (1e-10) and
    central differences (1e-3 bohr) of the QCSchema energies to 1e-6 Eh/bohr (MP2 with frozen
    core; SCS-MP2, whose gradient is the SCS density's)."""
    out = qcengine.compute(_input("gradient", method, keywords), "dfmp2", return_dict=True)
    assert out["success"], out.get("error")
    grad = np.asarray(out["return_result"], dtype=float).ravel()
    assert grad.shape == (9,) and np.array_equal(grad, np.asarray(out["properties"]["return_gradient"]).ravel())
    if method == "mp2":
        ours = dfmp2.run_atoms(_atoms(WATER), basis="cc-pvdz", gradient=True, **keywords)
        assert np.abs(grad - np.asarray(ours.gradient).ravel()).max() < 1e-10
    x0, step, numeric = np.array(WATER_BOHR), 1e-3, np.zeros(9)
    for k in range(9):
        plus, minus = x0.copy(), x0.copy()
        plus[k] += step
        minus[k] -= step
        numeric[k] = (_energy(plus, method, keywords) - _energy(minus, method, keywords)) / (2 * step)
    assert np.abs(grad - numeric).max() < 1e-6


def test_ghost_atom_matches_pyscf(harness):
    """A ghost hydrogen (real False) beside water: its functions lower E_total (counterpoise-style)
    as PySCF's ghost atom does, to 1e-8 Eh; four atoms, a gradient of 12 components."""
    molecule = {"symbols": ["O", "H", "H", "H"], "geometry": WATER_BOHR + [0.0, 0.0, 4.0],
                "real": [True, True, True, False]}
    keywords = {**FITTING}
    out = qcengine.compute(_input(molecule=molecule, keywords=keywords), "dfmp2", return_dict=True)
    assert out["success"], out.get("error")
    _, pt = _pyscf_dfmp2(molecule)
    assert abs(out["return_result"] - pt.e_tot) < 1e-8
    plain = run_qcschema(_input(keywords=keywords))["return_result"]
    assert out["return_result"] < plain - 1e-6  # the ghost's functions do something
    assert out["properties"]["calcinfo_natom"] == 4 and out["properties"]["calcinfo_nbasis"] == 29
    grad = qcengine.compute(_input("gradient", molecule=molecule, keywords=keywords), "dfmp2", return_dict=True)
    assert grad["success"] and np.asarray(grad["return_result"]).size == 12


@pytest.mark.parametrize("change, message", [
    ({"driver": "hessian"}, "driver 'hessian'"),
    ({"model": {"method": "ccsd", "basis": "cc-pvdz"}}, "model.method 'ccsd'"),
    ({"model": {"method": "mp2"}}, "model.basis"),
    ({"keywords": {"mp2_type": "conv"}}, "mp2_type"),
    ({"keywords": {"basis_guess": True}}, "unknown keyword 'basis_guess'"),
    ({"keywords": {"frozen_core": "yes"}}, "frozen_core='yes'"),
    ({"molecule": {**WATER, "geometry": WATER_BOHR[:8]}}, "molecule.geometry"),
    ({"molecule": {**WATER, "symbols": ["O", "H", "Qq"]}}, "'Qq' is not an element"),
    ({"molecule": {**WATER, "molecular_charge": 0.5}}, "molecular_charge 0.5"),
    ({"molecule": {**WATER, "real": [True, True]}}, "molecule.real"),
    ({"molecule": {**WATER, "molecular_multiplicity": 2}}, "2S 1 (molecule.molecular_multiplicity) is impossible"),
    ({"protocols": {"wavefunction": "all"}}, "protocols.wavefunction"),
    ({"keywords": {"device": "tpu"}}, "tpu"),
])
def test_bad_input_is_an_input_error(change, message):
    """Each bad input: success False, error_type input_error, one line naming it, before any SCF."""
    out = run_qcschema({**_input(), **change})
    assert out["success"] is False and out["error"]["error_type"] == "input_error", out["error"]
    assert message in out["error"]["error_message"] and "\n" not in out["error"]["error_message"]


def test_bad_input_through_qcengine(harness):
    out = qcengine.compute(_input(method="ccsd"), "dfmp2", return_dict=True)
    assert out["success"] is False and out["error"]["error_type"] == "input_error"
    assert "model.method 'ccsd'" in out["error"]["error_message"]


def test_plain_json_in_and_out():
    """run_qcschema on JSON text's dict: the v1 AtomicResult layout, strict JSON (no NaN), the
    input echoed; QCSchema v2's layout (specification) reads the same; defaults: charge 0,
    multiplicity from the electron count."""
    out = run_qcschema(json.loads(json.dumps(_input())))
    text = json.dumps(out, allow_nan=False)
    assert out["schema_name"] == "qcschema_output" and out["success"] and out["driver"] == "energy"
    assert json.loads(text)["extras"]["dfmp2"]["e_tot"] == out["return_result"]
    v2 = {"schema_name": "qcschema_atomic_input", "molecule": {"symbols": ["o", "h", "h"], "geometry": WATER_BOHR},
          "specification": {"driver": "energy", "model": {"method": "MP2", "basis": "cc-pvdz"}, "keywords": {}}}
    assert run_qcschema(v2)["return_result"] == out["return_result"]
    request = qcschema_request({**_input(), "molecule": {"symbols": ["O", "H"], "geometry": [0, 0, 0, 0, 0, 1.8]}})
    assert (request.settings.charge, request.settings.spin) == (0, 1)


def test_qcschema_needs_neither_qcelemental_nor_qcengine():
    """run_qcschema's module (the CLI's JSON path) and `import dfmp2` import neither package."""
    import subprocess
    import sys

    code = ("import sys, dfmp2, dfmp2.api.qcschema; "
            "print(sorted(m for m in ('qcelemental', 'qcengine', 'ase') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


# ----------------------------------------------------------------------------- charge and multiplicity (issue 60)

WATER_DIMER = {"symbols": ["O", "H", "H", "O", "H", "H"],
               "geometry": [-2.9309, -0.2164, 0.0, -3.6552, 1.4409, 0.0, -1.1331, 0.0769, 0.0,
                            2.5523, 0.2106, 0.0, 3.1755, -0.7063, -1.4335, 3.1755, -0.7063, 1.4335],
               "fragments": [[0, 1, 2], [3, 4, 5]]}
HYDROXYL_PAIR = {"symbols": ["O", "H", "O", "H"], "geometry": [0, 0, 0, 0, 0, 1.83, 0, 6.0, 0, 0, 6.0, 1.83],
                 "fragments": [[0, 1], [2, 3]]}
Z = {"H": 1, "He": 2, "Li": 3, "C": 6, "N": 7, "O": 8}
# name: (symbols, real, fragment sizes or None: no fragments)
CHGMULT_SYSTEMS = {
    "H/H": (["H", "H"], None, [1, 1]), "H/He": (["H", "He"], None, [1, 1]), "He/He": (["He", "He"], None, [1, 1]),
    "OH/OH": (["O", "H", "O", "H"], None, [2, 2]), "H2O/H2O": (["O", "H", "H"] * 2, None, [3, 3]),
    "He/ghost": (["He", "He"], [True, False], [1, 1]), "ghost/He": (["He", "He"], [False, True], [1, 1]),
    "N/N/N": (["N"] * 3, None, [1, 1, 1]), "H/He/Li": (["H", "He", "Li"], None, [1, 1, 1]),
    "ghost/He/ghost": (["He"] * 3, [False, True, False], [1, 1, 1]), "Li": (["Li"], None, [1]),
    "H2O": (["O", "H", "H"], None, [3]), "CH3": (["C", "H", "H", "H"], None, None),
}


def _chgmult_molecule(symbols, real, sizes, charge, multiplicity, charges, multiplicities):
    """A QCSchema molecule (atoms 3 bohr apart on a line) with the fields that are not None."""
    molecule = {"symbols": symbols, "geometry": [c for k in range(len(symbols)) for c in (0.0, 0.0, 3.0 * k)],
                "real": real or [True] * len(symbols)}
    if sizes is not None:
        molecule["fragments"] = [list(range(a, b)) for a, b in itertools.pairwise(np.cumsum([0, *sizes]))]
    for name, value in (("molecular_charge", charge), ("molecular_multiplicity", multiplicity),
                        ("fragment_charges", charges), ("fragment_multiplicities", multiplicities)):
        if value is not None:
            molecule[name] = list(value) if isinstance(value, tuple) else value
    return molecule


def _qcelemental_chgmult(symbols, real, sizes, charge, multiplicity, charges, multiplicities):
    """QCElemental's (charge, multiplicity, a real fragment left without electrons?), or None
    where it refuses (validate_and_fill_chgmult, as its Molecule model calls it)."""
    from qcelemental.exceptions import ValidationError
    from qcelemental.molparse.chgmult import validate_and_fill_chgmult

    sizes = sizes or [len(symbols)]
    real = real or [True] * len(symbols)
    zeff = np.array([Z[s] * r for s, r in zip(symbols, real)], dtype=float)
    count = len(sizes)
    try:
        found = validate_and_fill_chgmult(zeff, np.cumsum(sizes)[:-1], charge, list(charges or [None] * count),
                                          multiplicity, list(multiplicities or [None] * count), verbose=0)
    except ValidationError:
        return None
    bounds = np.cumsum([0, *sizes])
    bare = any(zeff[a:b].sum() == q and any(real[a:b])
               for a, b, q in zip(bounds, bounds[1:], found["fragment_charges"]))
    return int(found["molecular_charge"]), int(found["molecular_multiplicity"]), bare


def _dfmp2_chgmult(molecule):
    request = qcschema_request(_input(molecule=molecule, basis="sto-3g"))
    return request.settings.charge, request.settings.spin + 1


# dfmp2's refusals where QCElemental goes on: a multiplicity without its charge while charge is left
# to place and the whole's multiplicity is not given (the whole's spin would hang on QCElemental's
# guess); one fragment whose fields contradict the whole's (chem.charges: one fragment is the whole); a
# whole without electrons (nothing to compute)
ALLOWED_REFUSALS = ("where the charge lands sets the spin", "(one fragment: the whole)", "leaves 0 electrons")


def test_charge_and_multiplicity_are_qcelementals():
    """The charge and multiplicity run equal QCElemental's validate_and_fill_chgmult wherever it
    succeeds, over every combination (three-fragment systems: a fixed sample) of molecular and
    fragment charges (null, -1, 0, 1, 2) and multiplicities (null, 1, 2, 3), the lists absent or
    with null entries, on 13 systems (fragments or none, ghost fragments); dfmp2 refuses only
    ALLOWED_REFUSALS. A fragment left without electrons (a bare nucleus, H+) is taken as QCElemental
    takes it. Measured: 3184 equal, 451 allowed refusals; where dfmp2 runs and QCElemental refuses,
    the input gave the molecular multiplicity itself."""
    import random

    from dfmp2 import InputError

    rng = random.Random(7)
    equal = refused = 0
    for symbols, real, sizes in CHGMULT_SYSTEMS.values():
        count = len(sizes) if sizes else 1
        charges = [None, *itertools.product([None, -1, 0, 1], repeat=count)]
        multiplicities = [None, *itertools.product([None, 1, 2, 3], repeat=count)]
        cases = list(itertools.product([None, -1, 0, 1, 2], [None, 1, 2, 3], charges, multiplicities))
        for case in rng.sample(cases, 3000) if len(cases) > 3000 else cases:
            theirs = _qcelemental_chgmult(symbols, real, sizes, *case)
            try:
                ours = _dfmp2_chgmult(_chgmult_molecule(symbols, real, sizes, *case))
            except InputError as error:
                ours, message = None, str(error)
            if theirs is None:
                assert ours is None or case[1] is not None, (symbols, case, ours)  # runs only a multiplicity given
            else:
                if ours is None:
                    assert any(reason in message for reason in ALLOWED_REFUSALS), (symbols, case, message)
                    refused += 1
                else:
                    assert ours == theirs[:2], (symbols, case, ours, theirs)
                    equal += 1
    assert equal > 3000 and refused < 500


def test_bare_nucleus_fragment_as_qcelemental():
    """H...He with molecular_charge 1, fragments without charges: QCElemental puts the charge on
    the first fragment that can hold it, H (a bare proton, 0 electrons): singlet, as dfmp2 does
    (chem.charges skipped fragments it would leave without electrons: He+, and a triplet)."""
    case = (["H", "He"], None, [1, 1], 1, None, None, None)
    assert _qcelemental_chgmult(*case) == (1, 1, True)
    atoms = (chem.Atom("H", (0.0, 0.0, 0.0)), chem.Atom("He", (0.0, 0.0, 1.6)))
    frame = chem.Frame(atoms, "", (chem.Fragment(0, 1), chem.Fragment(1, 2)), "HHe+")
    assert chem.charge_and_spin(frame, 1, None).spin == 0  # (was 2: He+ and H, high-spin)
    assert _dfmp2_chgmult(_chgmult_molecule(*case)) == (1, 1)


def test_issue_examples_as_qcelementals_molecule():
    """The battery's cases through QCElemental's Molecule model and its dict (numpy arrays): a
    water dimer with fragment charges [1, 0] and multiplicities [2, 1] is +1, doublet (it ran
    neutral and singlet); two hydroxyl radicals without multiplicities a triplet (it ran a singlet),
    as Molecule fills them; fragment charges without multiplicities [1, 0] the same cation."""
    from qcelemental.models import Molecule

    for molecule in ({**WATER_DIMER, "fragment_charges": [1, 0], "fragment_multiplicities": [2, 1]},
                     {**WATER_DIMER, "fragment_charges": [1, 0]}, HYDROXYL_PAIR,
                     {**HYDROXYL_PAIR, "molecular_charge": 0}, {**HYDROXYL_PAIR, "fragment_multiplicities": [2, 2]}):
        model = Molecule(**molecule)
        expected = (int(model.molecular_charge), int(model.molecular_multiplicity))
        assert _dfmp2_chgmult(molecule) == expected and _dfmp2_chgmult(model.dict()) == expected
    assert _dfmp2_chgmult({**WATER_DIMER, "fragment_charges": [1, 0]}) == (1, 2)
    assert _dfmp2_chgmult(HYDROXYL_PAIR) == (0, 3)


def test_hydroxyl_pair_runs_as_a_triplet_with_a_note():
    """Two hydroxyl radicals as fragments: the triplet runs (nalpha - nbeta = 2), its
    energy run_atoms' with spin 2 (1e-10 Eh); the echoed molecule carries the multiplicity run and
    extras["dfmp2"]["notes"] says the fragments' spins were added high-spin."""
    out = run_qcschema(_input(molecule=HYDROXYL_PAIR, basis="sto-3g"))
    assert out["success"], out.get("error")
    props = out["properties"]
    assert props["calcinfo_nalpha"] - props["calcinfo_nbeta"] == 2
    assert out["molecule"]["molecular_multiplicity"] == 3 and out["molecule"]["molecular_charge"] == 0
    assert any("added high-spin" in note for note in out["extras"]["dfmp2"]["notes"])
    ours = dfmp2.run_atoms(_atoms(HYDROXYL_PAIR), basis="sto-3g", spin=2)
    assert abs(out["return_result"] - ours.e_tot) < 1e-10


@pytest.mark.parametrize("change, message", [
    ({"fragments": [[0, 2, 1], [3, 4, 5]]}, "molecule.fragments[0]: atom 2 comes where atom 1 belongs"),
    ({"fragments": [[3, 4, 5], [0, 1, 2]]}, "molecule.fragments[0]: atom 3 comes where atom 0 belongs"),
    ({"fragments": [[0, 1, 2], [3, 4]]}, "atoms 5 to 5 are in no fragment"),
    ({"fragments": [[0, 1, 2], [2, 3, 4, 5]]}, "molecule.fragments[1]: atom 2 comes where atom 3 belongs"),
    ({"fragments": [[0, 1, 2], [3, 4, 9]]}, "atom 9 is not an atom (0 to 5)"),
    ({"fragments": [[0, 1, 2], []]}, "molecule.fragments[1]: expected a non-empty list"),
    ({"fragments": []}, "molecule.fragments: expected a non-empty list"),
    ({"fragments": [[0, 1, 2], [3, 4, 5.0]]}, "5.0 is not an atom index"),
    ({"fragment_charges": [1]}, "molecule.fragment_charges: 1 entries for 2 fragment(s)"),
    ({"fragment_multiplicities": [2, 0]}, "molecule.fragment_multiplicities[1] 0: must be at least 1"),
    ({"fragment_charges": [0.5, -0.5]}, "molecule.fragment_charges[0] 0.5: expected a whole number"),
    ({"fragment_charges": "1 0"}, "molecule.fragment_charges: str entries"),
    ({"molecular_multiplicity": 2.5}, "molecule.molecular_multiplicity 2.5: expected a whole number"),
    ({"fragment_charges": [2, 0], "fragment_multiplicities": [2, 1]}, "multiplicity 2 (2S 1) is impossible"),
    ({"molecular_charge": 1, "fragment_multiplicities": [2, 1]}, "where the charge lands sets the spin"),
    ({"molecular_charge": 1, "fragment_charges": [0, 0], "fragment_multiplicities": [1, 1]}, "disagrees with the fragments"),
    ({"fragments": None, "fragment_charges": [1, 0]}, "2 entries for 1 fragment(s)"),
])
def test_bad_fragments_are_input_errors(change, message):
    """Fragments that are not consecutive, ordered and covering every atom (dfmp2 keeps the
    input's atom order), fragment lists of the wrong length or kind, charges and multiplicities
    that are not whole or not possible: input_error, one line naming the field."""
    molecule = {key: value for key, value in {**WATER_DIMER, **change}.items() if value is not None}
    out = run_qcschema(_input(molecule=molecule))
    assert out["success"] is False and out["error"]["error_type"] == "input_error", out
    assert message in out["error"]["error_message"] and "\n" not in out["error"]["error_message"]


# ----------------------------------------------------------------------------- versions, strict JSON (issue 60)

def _v2_input(driver="energy", molecule=WATER, basis="cc-pvdz", method="mp2", keywords=None):
    return {"schema_name": "qcschema_atomic_input", "schema_version": 2, "id": "w1",
            "molecule": {**molecule, "schema_name": "qcschema_molecule", "schema_version": 3},
            "specification": {"driver": driver, "model": {"method": method, "basis": basis},
                              "keywords": dict(keywords or {}), "program": "dfmp2"}}


@pytest.mark.parametrize("driver", ["energy", "gradient"])
def test_outputs_are_valid_in_the_inputs_version(driver):
    """v1 in, v1 AtomicResult out; v2 in, v2 AtomicResult out (input_data the input): each
    validates as QCElemental's model of its version and not the other's; both give the same
    numbers (1e-10), strict JSON."""
    import pydantic
    import pydantic.v1
    from qcelemental.models import v1, v2

    out1 = run_qcschema(_input(driver, keywords={"frozen_core": True}))
    out2 = run_qcschema(_v2_input(driver, keywords={"frozen_core": True}))
    json.dumps(out1, allow_nan=False), json.dumps(out2, allow_nan=False)
    first, second = v1.AtomicResult(**out1), v2.AtomicResult.model_validate(out2)
    assert out1["schema_name"] == "qcschema_output" and out2["schema_name"] == "qcschema_atomic_result"
    assert second.schema_version == 2 and second.input_data.specification.driver == driver and second.id == "w1"
    assert np.abs(np.asarray(first.return_result) - np.asarray(second.return_result)).max() < 1e-10
    with pytest.raises(pydantic.ValidationError):
        v2.AtomicResult.model_validate(out1)
    with pytest.raises((pydantic.v1.ValidationError, KeyError)):  # (v1's return_result validator: KeyError)
        v1.AtomicResult(**out2)


@pytest.mark.parametrize("data, message", [
    ({**_input(), "schema_version": 99}, "schema_version 99: dfmp2 reads QCSchema AtomicInput versions 1 and 2"),
    ({**_v2_input(), "schema_version": 3}, "schema_version 3"),
    ({**_input(), "molecule": {**WATER, "schema_version": 99}}, "molecule.schema_version 99"),
    ({**_input(), "molecule": {**WATER, "schema_version": 3}}, "v1 AtomicInput holds a molecule of schema_version 2"),
    ({**_v2_input(), "molecule": {**WATER, "schema_version": 2}},
     "v2 AtomicInput holds a molecule of schema_version 3"),
    ({**_input(), "schema_version": 2}, "schema_name 'qcschema_input' is QCSchema v1's"),
    ({**_input(), "schema_name": "qcschema_atomic_input", "schema_version": None}, "under 'specification'"),
    ({**_input(), "schema_name": "qcschema_output"}, "schema_name 'qcschema_output'"),
    ({**_input(), "molecule": {**WATER, "schema_name": "xyz"}}, "molecule.schema_name 'xyz'"),
])
def test_unknown_versions_are_input_errors(data, message):
    """An unknown or mixed schema_version (of the input or its molecule) is a FailedOperation
    (input_error naming it) in the input's version (v2's where its layout, schema_version or
    schema_name says v2), valid as QCElemental's model."""
    from qcelemental.models import v1, v2

    data = {key: value for key, value in data.items() if value is not None}
    out = run_qcschema(data)
    assert out["success"] is False and out["error"]["error_type"] == "input_error", out
    assert message in out["error"]["error_message"]
    v2_named = "specification" in data or data.get("schema_version") == 2 or "atomic" in data["schema_name"]
    assert ("schema_name" in out) == v2_named
    failed = v2.FailedOperation.model_validate(out) if "schema_name" in out else v1.FailedOperation(**out)
    assert failed.error.error_type == "input_error"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_geometry_is_a_strict_json_input_error(bad):
    """NaN or infinity in the geometry: input_error naming molecule.geometry, before any SCF; the
    FailedOperation echoes the input with null where it had the non-finite number (as
    QCElemental's models write JSON), so it is strict JSON (v1 and v2)."""
    from qcelemental.models import v1, v2

    geometry = [bad, *WATER_BOHR[1:]]
    for data in (_input(molecule={**WATER, "geometry": geometry}), _v2_input(molecule={**WATER, "geometry": geometry})):
        out = run_qcschema(data)
        assert out["success"] is False and out["error"]["error_type"] == "input_error"
        assert out["error"]["error_message"].startswith("molecule.geometry: atom 1 (O)")
        text = json.dumps(out, allow_nan=False)
        assert json.loads(text)["input_data"]["molecule"]["geometry"] == [None, *WATER_BOHR[1:]]
        v2.FailedOperation.model_validate(out) if "specification" in data else v1.FailedOperation(**out)


def test_numpy_input_gives_plain_json():
    """An input holding numpy arrays (QCElemental's Molecule.dict(): symbols, geometry,
    fragments) and numpy scalars: the result echoes them as lists and numbers (strict JSON), and
    computes the same energy as the plain input (0 difference)."""
    from qcelemental.models import Molecule

    molecule = Molecule(symbols=WATER["symbols"], geometry=WATER_BOHR).dict()
    assert isinstance(molecule["geometry"], np.ndarray)
    data = _input(molecule=molecule, basis="sto-3g", keywords={"max_memory": np.float64(2000.0)})
    data["id"] = np.str_("w")
    out = run_qcschema(data)
    assert out["success"], out.get("error")
    again = json.loads(json.dumps(out, allow_nan=False))
    assert again["molecule"]["geometry"] == np.asarray(molecule["geometry"]).tolist()
    assert again["molecule"]["symbols"] == ["O", "H", "H"] and again["keywords"]["max_memory"] == 2000.0
    assert out["return_result"] == run_qcschema(_input(basis="sto-3g"))["return_result"]


# ----------------------------------------------------------------------------- QCEngine's ncores (issue 60)

def test_qcengine_ncores_sets_the_runs_threads(harness, monkeypatch):
    """task_config ncores: inside the run torch, PySCF (OpenMP) and every BLAS and OpenMP pool
    threadpoolctl sees hold ncores threads (observed from within run_atoms; the record's device
    description says it too); afterwards they are as before."""
    import torch
    from pyscf import lib
    from threadpoolctl import threadpool_info

    from dfmp2.api import qcschema

    before = (torch.get_num_threads(), lib.num_threads())
    ncores = 1 if before[0] != 1 else 2
    seen = {}
    real = qcschema.run_atoms

    def observed(atoms, settings):
        seen.update(torch=torch.get_num_threads(), pyscf=lib.num_threads(),
                    pools={pool["num_threads"] for pool in threadpool_info()})
        return real(atoms, settings)

    monkeypatch.setattr(qcschema, "run_atoms", observed)
    out = qcengine.compute(_input(basis="sto-3g"), "dfmp2", return_dict=True, task_config={"ncores": ncores})
    assert out["success"], out.get("error")
    assert seen == {"torch": ncores, "pyscf": ncores, "pools": {ncores}}
    assert f", {ncores} threads" in out["extras"]["dfmp2"]["device_description"]
    assert (torch.get_num_threads(), lib.num_threads()) == before


# ----------------------------------------------------------------------------- an extrapolated basis (issue 60)

def test_extrapolated_basis_gives_the_limit_energy():
    """model.basis cc-pv[dt]z, driver energy: return_result E_HF(TZ) + (27 E_c(TZ) - 8 E_c(DZ)) / 19
    of two run_atoms runs (Helgaker's X^-3; HF from the largest basis) to 1e-10 Eh (mp2; SCS-MP2
    by its parts); the v2 result validates; keyword scf_extrapolation exponential as Psi4's
    scf_xtpl_helgaker_2; gradients, double hybrids and scf_extrapolation with one basis refused."""
    from qcelemental.models import v2

    from dfmp2.chem.extrapolation import scf_xtpl_helgaker_2

    dz, tz = (dfmp2.run_atoms(_atoms(WATER), basis=b, frozen_core=True) for b in ("cc-pvdz", "cc-pvtz"))
    out = run_qcschema(_v2_input(basis="cc-pv[dt]z", keywords={"frozen_core": True}))
    assert out["success"], out.get("error")
    v2.AtomicResult.model_validate(out)

    def limit(name):
        return (27 * getattr(tz, name) - 8 * getattr(dz, name)) / 19

    assert abs(out["return_result"] - (tz.e_ref + limit("e_corr"))) < 1e-10
    props = out["properties"]
    assert abs(props["scf_total_energy"] - tz.e_ref) < 1e-12
    assert abs(props["mp2_correlation_energy"] - limit("e_corr")) < 1e-10
    assert out["extras"]["dfmp2"]["bases"] == ["cc-pvdz", "cc-pvtz"]
    scs = run_qcschema(_input(method="scs-mp2", basis="cc-pv[dt]z", keywords={"frozen_core": True,
                                                                           "scf_extrapolation": "exponential"}))
    hf = scf_xtpl_helgaker_2(2, dz.e_ref, 3, tz.e_ref)
    assert abs(scs["return_result"] - (hf + 1.2 * limit("e_corr_os") + limit("e_corr_ss") / 3)) < 1e-10
    for data, message in ((_input("gradient", basis="cc-pv[dt]z"), "an extrapolated basis gives the energy only"),
                          (_input(method="b2plyp", basis="cc-pv[dt]z"), "not a double hybrid's"),
                          (_input(keywords={"scf_extrapolation": "exponential"}), "applies to an extrapolated basis"),
                          (_input(basis="cc-pv[dt]z", keywords={"scf_extrapolation": "x"}), "scf_extrapolation='x'"),
                          (_input(basis="cc-pv[tz"), "unclosed bracket")):
        failed = run_qcschema(data)
        assert failed["error"]["error_type"] == "input_error" and message in failed["error"]["error_message"], failed
