"""QCSchema in, QCSchema out: `run_qcschema(AtomicInput dict) -> AtomicResult dict`, plain JSON.

    out = run_qcschema({"schema_name": "qcschema_input", "driver": "energy",
                        "molecule": {"symbols": ["O", "H", "H"], "geometry": [...]},   # bohr, flat
                        "model": {"method": "mp2", "basis": "cc-pvdz"}, "keywords": {"frozen_core": True}})
    out["success"], out["return_result"], out["properties"]["mp2_correlation_energy"]

No qcelemental here (the CLI reads JSON with it absent); `qcengine_harness` wraps this for
QCEngine. The input is QCSchema v1's layout (driver, model, keywords at the top level) or v2's
(them under "specification"); the output is v1's AtomicResult, or on failure a FailedOperation
(success False, error {error_type "input_error" or "unknown_error", error_message}).

Methods: "mp2" ("df-mp2", "ri-mp2": DF-MP2; return_energy E_HF + E_corr); "scs-mp2" (E_HF + e_scs:
DFMP2Result.e_scs is the correlation part only, 6/5 E_os + 1/3 E_ss, plus the ROHF singles; the
gradient and dipole are SCS-MP2's); the double hybrids of `chem.functionals` by name ("b2plyp",
...; return_energy E_KS + c_os E_os + c_ss E_ss; no mp2_* properties, whose orbitals would be
KS ones: extras["dfmp2"] has the parts). Drivers: energy, gradient (return_result [natm*3]
Eh/bohr, the input's frame and atom order, ghosts included), properties (return_result the energy;
the relaxed dipole, a.u., as mp2_dipole_moment for "mp2", in extras otherwise). Molecule: symbols,
geometry (bohr), real (False: a ghost atom), molecular_charge (default 0), molecular_multiplicity
(default 1 for an even electron count, else 2, QCElemental's); fragments are not needed and not
read. Keywords: KEYWORDS (Settings fields, and Psi4's mp2_type "df"); anything else is bad input.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass

import numpy as np

from .. import __version__, chem
from ..chem.basis import atomic_number
from ..chem.functionals import ALIASES, DOUBLE_HYBRIDS
from ..run.settings import Settings
from ..util.errors import ComputationError, InputError
from .driver import run_atoms

DRIVERS = ("energy", "gradient", "properties")
MP2_METHODS = ("mp2", "df-mp2", "ri-mp2")
SCS_METHODS = ("scs-mp2", "scs-df-mp2", "scs-ri-mp2")
SCS = (1.2, 1.0 / 3.0)  # Grimme's (c_os, c_ss): DFMP2Result.e_scs
# keyword -> the kinds its value may have (then Settings and run_atoms check the value itself)
KEYWORDS = {
    "frozen_core": (bool,), "frozen": (int, list, type(None)), "auxbasis": (str,), "jk_auxbasis": (str,),
    "scf": (str,), "reference": (str,), "device": (str,), "precision": (str,), "cartesian": (bool,),
    "ecp": (str,), "screening": (str, float), "scf_backend": (str,), "scf_precision": (str,),
    "scf_max_cycle": (int,), "max_memory": (int, float), "scratch": (str,), "include_singles": (bool,),
    "simulate": (bool,), "nki_api": (str,), "transform": (str,),
}
PSI4_KEYWORDS = {"mp2_type": "df"}  # accepted with this value only (what dfmp2 computes)


@dataclass(frozen=True)
class Request:
    """A checked QCSchema input: atoms (Angstrom), settings, driver, method kind (mp2, scs, dh)."""

    atoms: list
    settings: Settings
    driver: str
    method: str


def run_qcschema(input: dict) -> dict:  # noqa: A002 (QCSchema's name)
    """A QCSchema AtomicInput (plain dict; geometry in bohr) -> AtomicResult dict (energies Eh,
    gradient Eh/bohr, dipoles a.u.), or a FailedOperation dict (success False) for bad input or a
    failed run."""
    try:
        request = qcschema_request(input)
        result = run_atoms(request.atoms, request.settings)
        return atomic_result(input, request, result)
    except InputError as error:
        return failed_operation(input, "input_error", str(error))
    except ComputationError as error:
        return failed_operation(input, "unknown_error", str(error))
    except Exception as error:  # noqa: BLE001 (reported, as QCEngine does: type, message, traceback)
        return failed_operation(input, "unknown_error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")


def qcschema_request(data) -> Request:
    """The one check of a QCSchema input (module docstring): InputError naming the first problem."""
    if not isinstance(data, dict):
        raise InputError(f"a QCSchema AtomicInput is a JSON object, not {type(data).__name__}")
    if data.get("schema_name", "qcschema_input") not in ("qcschema_input", "qcschema_atomic_input"):
        raise InputError(f"schema_name {data['schema_name']!r}: expected 'qcschema_input' (an AtomicInput)")
    spec = _object(data, "specification") if "specification" in data else data
    driver = _text(spec.get("driver"), "driver")
    if driver not in DRIVERS:
        hint = ": dfmp2 has no Hessians" if driver == "hessian" else ""
        raise InputError(f"driver {driver!r} is not offered (use one of: {', '.join(DRIVERS)}){hint}")
    model = _object(spec, "model")
    method = _method(_text(model.get("method"), "model.method"))
    basis = model.get("basis")
    if not isinstance(basis, str) or not basis.strip():
        raise InputError(f"model.basis {basis!r}: DF-MP2 needs an orbital basis set name")
    wavefunction = _object(spec, "protocols").get("wavefunction", "none") if spec.get("protocols") else "none"
    if wavefunction not in ("none", None):
        raise InputError(f"protocols.wavefunction {wavefunction!r}: dfmp2 returns no wavefunction (use 'none')")
    atoms, charge, spin = _molecule(_object(data, "molecule"))
    changes = dict(basis=basis.strip(), charge=charge, spin=spin, **_keywords(spec.get("keywords") or {}))
    if method not in ("mp2", "scs"):
        changes["xc"] = method
    if method == "scs":
        changes["rdm1_scaling"] = SCS  # the gradient's and the dipole's density: SCS-MP2's
    changes.update(gradient=driver == "gradient", properties=("dipole",) if driver == "properties" else ())
    return Request(atoms, Settings(**changes), driver, method if method in ("mp2", "scs") else "dh")


def _object(data: dict, name: str) -> dict:
    value = data.get(name)
    if not isinstance(value, dict):
        raise InputError(f"{name}: expected a JSON object, got {type(value).__name__}")
    return value


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{name}: expected a string, got {value!r}")
    return value.strip().lower()


def _method(method: str) -> str:
    """"mp2", "scs", or the double hybrid's name (chem.functionals)."""
    if method in MP2_METHODS:
        return "mp2"
    if method in SCS_METHODS:
        return "scs"
    key = ALIASES.get(method.upper(), method.upper())
    if key in DOUBLE_HYBRIDS:
        return key
    raise InputError(f"model.method {method!r} is not offered (use mp2, scs-mp2, or a double hybrid: "
                     f"{', '.join(name.lower() for name in DOUBLE_HYBRIDS)})")


def _keywords(keywords) -> dict:
    """The Settings changes the keywords ask for (KEYWORDS, PSI4_KEYWORDS)."""
    if not isinstance(keywords, dict):
        raise InputError(f"keywords: expected a JSON object, got {type(keywords).__name__}")
    changes = {}
    for name, value in keywords.items():
        key = str(name).lower()
        if key in PSI4_KEYWORDS:
            if str(value).lower() != PSI4_KEYWORDS[key]:
                raise InputError(f"keyword {name}={value!r}: dfmp2 computes {key} {PSI4_KEYWORDS[key]!r} only")
            continue
        if key not in KEYWORDS:
            known = ", ".join(sorted([*KEYWORDS, *PSI4_KEYWORDS]))
            raise InputError(f"unknown keyword {name!r} (dfmp2 takes: {known})")
        kinds = KEYWORDS[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            if not (float in kinds and isinstance(value, int) and not isinstance(value, bool)):
                raise InputError(f"keyword {name}={value!r}: expected {' or '.join(k.__name__ for k in kinds)}")
        changes[key] = value
    return changes


def _molecule(molecule: dict) -> tuple:
    """([chem.Atom] in Angstrom, charge, 2S) of a QCSchema molecule (geometry in bohr)."""
    symbols = molecule.get("symbols")
    if not isinstance(symbols, (list, tuple)) or not symbols:
        raise InputError("molecule.symbols: expected a non-empty list of element symbols")
    symbols = [chem.element_symbol(s) for s in symbols]
    try:
        geometry = np.asarray(molecule.get("geometry"), dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("molecule.geometry: expected numbers (bohr)") from None
    if geometry.size != 3 * len(symbols) or geometry.ndim not in (1, 2):
        raise InputError(f"molecule.geometry: {geometry.size} numbers for {len(symbols)} atoms "
                         "(expected 3 each, bohr)")
    real = molecule.get("real")
    real = [True] * len(symbols) if real is None else list(real)
    if len(real) != len(symbols) or not all(isinstance(r, (bool, np.bool_)) for r in real):
        raise InputError(f"molecule.real: expected {len(symbols)} booleans (False: a ghost atom)")
    xyz = geometry.reshape(-1, 3) * chem.angstrom_per_bohr()
    atoms = [chem.Atom(s, tuple(float(c) for c in x), ghost=not r) for s, x, r in zip(symbols, xyz, real)]
    charge = _whole(molecule.get("molecular_charge", 0) or 0, "molecule.molecular_charge")
    electrons = sum(atomic_number(a.symbol) for a in atoms if not a.ghost) - charge
    multiplicity = molecule.get("molecular_multiplicity")
    multiplicity = 1 + electrons % 2 if multiplicity is None else _whole(multiplicity,
                                                                         "molecule.molecular_multiplicity")
    if multiplicity < 1:
        raise InputError(f"molecule.molecular_multiplicity {multiplicity}: must be at least 1")
    return atoms, charge, multiplicity - 1


def _whole(value, name: str) -> int:
    """value as an int if it is a whole number (QCSchema writes 0.0), else InputError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value != round(value):
        raise InputError(f"{name} {value!r}: expected a whole number")
    return int(round(value))


def atomic_result(data: dict, request: Request, result) -> dict:
    """The AtomicResult dict (QCSchema v1 layout) of a finished run: the input's fields, then the
    results (module docstring)."""
    energy = result.e_ref + result.e_scs if request.method == "scs" else result.e_tot
    properties = qcschema_properties(request, result, energy)
    return_result = properties["return_gradient"] if request.driver == "gradient" else energy
    spec = data.get("specification", data)
    return {
        "schema_name": "qcschema_output", "schema_version": 1, "id": data.get("id"),
        "molecule": data["molecule"], "driver": request.driver, "model": spec["model"],
        "keywords": spec.get("keywords") or {}, "protocols": spec.get("protocols") or {},
        "extras": {**(spec.get("extras") or {}), "dfmp2": json_safe(result.as_dict())},
        "provenance": {"creator": "dfmp2", "version": __version__, "routine": "dfmp2.api.qcschema.run_qcschema"},
        "properties": properties, "return_result": return_result, "success": True, "error": None,
        "stdout": None, "stderr": None, "native_files": {}, "wavefunction": None,
    }


def qcschema_properties(request: Request, result, energy: float) -> dict:
    """QCSchema's AtomicResultProperties of a run (Eh, Eh/bohr, a.u.)."""
    mf = result.mean_field
    nalpha, nbeta = (int(n) for n in mf.mol.nelec)
    dm = np.asarray(mf.make_rdm1())
    properties = {
        "calcinfo_nbasis": int(result.correlation.nao), "calcinfo_nmo": int(np.shape(mf.mo_coeff)[-1]),
        "calcinfo_nalpha": nalpha, "calcinfo_nbeta": nbeta, "calcinfo_natom": len(request.atoms),
        "nuclear_repulsion_energy": float(mf.energy_nuc()), "return_energy": float(energy),
        "scf_total_energy": float(result.e_ref), "scf_iterations": result.scf_record.get("scf_iterations"),
        "scf_dipole_moment": [float(x) for x in chem.dipole_moment(mf.mol, dm.sum(axis=0) if dm.ndim == 3 else dm)],
    }
    if request.method != "dh":
        properties.update(
            mp2_same_spin_correlation_energy=float(result.e_corr_ss),
            mp2_opposite_spin_correlation_energy=float(result.e_corr_os),
            mp2_singles_energy=float(result.e_corr_singles),
            mp2_doubles_energy=float(result.e_corr_os + result.e_corr_ss),
            mp2_correlation_energy=float(result.e_corr), mp2_total_energy=float(result.e_ref + result.e_corr))
    if request.method == "mp2" and "dipole" in result.properties:
        properties["mp2_dipole_moment"] = [float(x) for x in result.properties["dipole"]]
    if request.driver == "gradient":
        properties["return_gradient"] = [float(g) for g in np.asarray(result.gradient, dtype=np.float64).ravel()]
    return properties


def failed_operation(data, error_type: str, message: str) -> dict:
    """QCSchema's FailedOperation (v1 layout): success False, the input, the error."""
    return {"id": data.get("id") if isinstance(data, dict) else None, "input_data": data,
            "success": False, "error": {"error_type": error_type, "error_message": message}, "extras": {}}


def json_safe(value):
    """value with numpy scalars and arrays as Python numbers and lists, tuples as lists, keys as
    strings, non-finite floats as None (strict JSON has no NaN), anything else as its str."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [json_safe(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
