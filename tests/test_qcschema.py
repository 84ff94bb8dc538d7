"""QCSchema and QCEngine (dfmp2/api/qcschema.py, dfmp2/api/qcengine_harness.py): energies against
dfmp2's own run_atoms and PySCF's DF-MP2 on the same set-up, gradients against central
differences, ghost atoms against PySCF's, bad input as QCEngine reports it."""

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
    + 1/3 E_ss of PySCF's parts; a double hybrid's energy is run_atoms'; QCEngine's memory is the
    budget. Measured: 0 against run_atoms, 8.8e-11 Eh against PySCF (SCS 9.9e-11)."""
    out = qcengine.compute(_input(keywords=FITTING), "dfmp2", return_dict=True, task_config={"memory": 4})
    assert out["success"], out.get("error")
    assert out["extras"]["dfmp2"]["memory"]["budget_mb"] == 4 * 1024 ** 3 / 1e6  # QCEngine's memory (GiB) -> MB
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
    ({"molecule": {**WATER, "molecular_multiplicity": 2}}, "spin 1 (2S) is impossible"),
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
