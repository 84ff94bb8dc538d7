"""QCSchema in, QCSchema out: `run_qcschema(AtomicInput dict) -> AtomicResult dict`, plain JSON.

    out = run_qcschema({"schema_name": "qcschema_input", "driver": "energy",
                        "molecule": {"symbols": ["O", "H", "H"], "geometry": [...]},   # bohr, flat
                        "model": {"method": "mp2", "basis": "cc-pvdz"}, "keywords": {"frozen_core": True}})
    out["success"], out["return_result"], out["properties"]["mp2_correlation_energy"]

No qcelemental here (the CLI reads JSON with it absent); `qcengine_harness` wraps this for
QCEngine. Versions: an input in QCSchema v1's layout (schema_version 1 or none; driver, model,
keywords at the top level; a molecule of schema_version 2 or none) gives v1's AtomicResult
(schema_name "qcschema_output"); one in v2's (schema_version 2, schema_name
"qcschema_atomic_input", or "specification" holding driver, model, keywords; a molecule of
schema_version 3 or none) gives v2's (schema_name "qcschema_atomic_result", schema_version 2,
input_data the input). Any other version, or a mix, is bad input naming it. Every key of the
input is one its version's layout has (LAYOUTS, QCElemental's models) and is read, or is refused
by name: a v1 field at a v2 input's top level (driver, model, keywords, protocols, extras belong
in its specification), v2's program in a v1 input, a program other than dfmp2. On failure a
FailedOperation of the input's version (success False, input_data the input, error
{error_type (ERROR_TYPES: input_error, resource_error, convergence_error, unknown_error),
error_message, extras {exit_code: the command line's}}). Everything out is strict JSON:
numpy arrays become lists, and a non-finite number in an echoed input becomes null (as
QCElemental's models write it).

Methods: "mp2" ("df-mp2", "ri-mp2": DF-MP2; return_energy E_HF + E_corr); "scs-mp2" (E_HF + e_scs:
DFMP2Result.e_scs is the correlation part only, 6/5 E_os + 1/3 E_ss, plus the ROHF singles; the
gradient and dipole are SCS-MP2's); the double hybrids of `chem.functionals` by name ("b2plyp",
...; return_energy E_KS + c_os E_os + c_ss E_ss; no mp2_* properties, whose orbitals would be
KS ones: extras["dfmp2"] has the parts). Drivers: energy, gradient (return_result [natm*3]
Eh/bohr, the input's frame and atom order, ghosts included), properties (return_result the energy;
the relaxed dipole, a.u., as mp2_dipole_moment for "mp2", in extras otherwise). model.basis in
Psi4's bracket notation ("cc-pv[dt]z"): the energy at the basis-set limit as `dfmp2 run --basis`
gives it (`composite.run_composite`; driver energy, mp2 or scs-mp2; keyword scf_extrapolation
"highest" or "exponential"); properties are the limit's, extras["dfmp2"] the composite's record.

Molecule: symbols, geometry (bohr; `chem.check_geometry`), real (False: a ghost atom), fragments
(lists of atom indices: consecutive, in order, every atom once; dfmp2 never reorders atoms),
molecular_charge, molecular_multiplicity, fragment_charges, fragment_multiplicities (whole
numbers or null): the charge and 2S run are `chem.charge_and_spin`'s (QCElemental's rules; a
fragment that gives its charge but not its multiplicity is at its lowest spin, one that gives its
multiplicity but not its charge is neutral unless a molecular_charge beyond the fragment charges
given is left to place: `qcschema_molecule`). The echoed molecule carries the molecular_charge and
molecular_multiplicity run; extras["dfmp2"]["notes"] says what was defaulted.
Keywords: KEYWORDS (Settings fields), Psi4's mp2_type "df", scf_extrapolation (an extrapolated
basis's); anything else is bad input.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass

import numpy as np

from .. import chem
from ..chem.extrapolation import SCF_SCHEMES, expand_basis
from ..chem.functionals import ALIASES, DOUBLE_HYBRIDS
from ..mp2.pipeline import SCS_OS, SCS_SS
from ..run.settings import Settings
from ..util.errors import (ComputationError, ConvergenceError, DFMP2Error, DeviceUnavailableError, InputError,
                           MemoryBudgetError)
from ..util.version import __version__
from .driver import run_atoms
from .qcschema_molecule import read_molecule

DRIVERS = ("energy", "gradient", "properties")
MP2_METHODS = ("mp2", "df-mp2", "ri-mp2")
SCS_METHODS = ("scs-mp2", "scs-df-mp2", "scs-ri-mp2")
SCS = (SCS_OS, SCS_SS)  # Grimme's (c_os, c_ss): DFMP2Result.e_scs
# keyword -> the kinds its value may have (then Settings and run_atoms check the value itself)
KEYWORDS = {
    "frozen_core": (bool,), "frozen": (int, list, type(None)), "auxbasis": (str,), "jk_auxbasis": (str,),
    "scf": (str,), "reference": (str,), "device": (str,), "precision": (str,), "cartesian": (bool,),
    "ecp": (str,), "screening": (str, float), "scf_backend": (str,), "scf_precision": (str,),
    "scf_max_cycle": (int,), "max_memory": (int, float), "scratch": (str,), "include_singles": (bool,),
    "simulate": (bool,), "nki_api": (str,), "transform": (str,),
}
PSI4_KEYWORDS = {"mp2_type": "df"}  # accepted with this value only (what dfmp2 computes)
WORKFLOW_KEYWORDS = ("scf_extrapolation",)  # an extrapolated basis's (not a Settings field)
# QCSchema version -> (the AtomicInput's schema_names, its molecule's schema_version)
VERSIONS = {1: (("qcschema_input", "qc_schema_input"), 2), 2: (("qcschema_atomic_input",), 3)}
PROVENANCE = {"creator": "dfmp2", "version": __version__, "routine": "dfmp2.api.qcschema.run_qcschema"}
PROGRAM = "dfmp2"  # a v2 specification's program: this one, or none ("")
# The AtomicInput layouts of QCSchema v1 and v2 as QCElemental's models, the schema's reference
# implementation, define them (qcelemental.models.v1.AtomicInput; v2.AtomicInput, AtomicSpecification,
# AtomicProtocols; each forbids other keys): version -> {object: its keys}. v1's driver, model,
# keywords, protocols and extras are v2's specification's, which adds program.
SPECIFIED = ("driver", "model", "keywords", "protocols", "extras")
LAYOUTS = {
    1: {"AtomicInput": ("id", "schema_name", "schema_version", "molecule", "provenance", *SPECIFIED),
        "protocols": ("wavefunction", "stdout", "error_correction", "native_files")},
    2: {"AtomicInput": ("id", "schema_name", "schema_version", "molecule", "provenance", "specification"),
        "specification": ("schema_name", "program", *SPECIFIED),
        "protocols": ("schema_name", "wavefunction", "stdout", "error_correction", "native_files")},
}
MODEL_KEYS = ("method", "basis")  # (QCElemental's Model lets a program take more: dfmp2 takes none)
SCHEMA_NAMES = {"specification": "qcschema_atomic_specification", "protocols": "qcschema_atomic_protocols"}
# dfmp2's failure kinds -> QCSchema's error types (ComputeError.error_type: the classifiers QCElemental
# points to, qcengine/exceptions.py): input_error "incorrect user parameters"; resource_error "not enough
# resources ... recoverable on different compute hardware" (a budget that cannot hold the run, memory
# that ran out, a device this machine cannot run); convergence_error "failed iteration convergence";
# unknown_error for the rest. An error's most derived class listed decides (`error_type`).
ERROR_TYPES = {
    MemoryBudgetError: "resource_error", InputError: "input_error", DeviceUnavailableError: "resource_error",
    ConvergenceError: "convergence_error", ComputationError: "unknown_error", MemoryError: "resource_error",
}


@dataclass(frozen=True)
class Request:
    """A checked QCSchema input: atoms (Angstrom), settings (the charge and 2S run), driver,
    method kind (mp2, scs, dh), the QCSchema version (1, 2: the output's), the molecule as the
    output echoes it (JSON; the charge and multiplicity run filled in), the charge rules' notes,
    and for an extrapolated basis the SCF's scheme (None: one basis)."""

    atoms: list
    settings: Settings
    driver: str
    method: str
    version: int = 1
    molecule: dict | None = None
    notes: tuple = ()
    scf_extrapolation: str | None = None


def run_qcschema(input: dict) -> dict:  # noqa: A002 (QCSchema's name)
    """A QCSchema AtomicInput (plain dict; geometry in bohr) -> AtomicResult dict of its version
    (energies Eh, gradient Eh/bohr, dipoles a.u.), or a FailedOperation dict (success False) for
    bad input or a failed run; strict JSON either way (module docstring)."""
    try:
        request = qcschema_request(input)
        if request.scf_extrapolation is not None:
            from .composite import run_composite

            frame = chem.Frame.whole(request.atoms, "molecule")
            result = run_composite(frame, request.settings, scf_extrapolation=request.scf_extrapolation)
        else:
            result = run_atoms(request.atoms, request.settings)
        return atomic_result(input, request, result)
    except Exception as error:  # noqa: BLE001 (reported, as QCEngine does: its type; else its class, traceback)
        message = str(error) if isinstance(error, DFMP2Error) else \
            f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
        return failed_operation(input, error_type(error), message, getattr(error, "exit_code", 1))


def error_type(error: BaseException) -> str:
    """QCSchema's error type of `error` (ERROR_TYPES: its most derived class listed; else unknown_error)."""
    return next((ERROR_TYPES[kind] for kind in type(error).__mro__ if kind in ERROR_TYPES), "unknown_error")


def qcschema_request(data) -> Request:
    """The one check of a QCSchema input (module docstring): InputError naming the first problem."""
    if not isinstance(data, dict):
        raise InputError(f"a QCSchema AtomicInput is a JSON object, not {type(data).__name__}")
    version = schema_version(data)
    spec = _object(data, "specification") if version == 2 else data
    check_layout(data, spec, version)
    driver = _text(spec.get("driver"), "driver")
    if driver not in DRIVERS:
        hint = ": dfmp2 has no Hessians" if driver == "hessian" else ""
        raise InputError(f"driver {driver!r} is not offered (use one of: {', '.join(DRIVERS)}){hint}")
    model = _object(spec, "model")
    method = _method(_text(model.get("method"), "model.method"))
    basis = model.get("basis")
    if not isinstance(basis, str) or not basis.strip():
        raise InputError(f"model.basis {basis!r}: DF-MP2 needs an orbital basis set name")
    basis = basis.strip()
    protocols = _object(spec, "protocols") if spec.get("protocols") else {}
    for name, why in (("wavefunction", "returns no wavefunction"), ("native_files", "runs in this process and keeps "
                                                                                    "no program files")):
        if protocols.get(name, "none") not in ("none", None):
            raise InputError(f"protocols.{name} {protocols[name]!r}: dfmp2 {why} (use 'none')")
    for part, name in ((spec, "extras"), (data, "provenance")):  # (kept, echoed: not read)
        if part.get(name) is not None:
            _object(part, name)
    keywords, workflow = _keywords(spec.get("keywords") or {})
    scf_extrapolation = _extrapolation(basis, workflow, driver, method)
    molecule = _object(data, "molecule")
    atoms, found = read_molecule(molecule, version, VERSIONS[version][1])
    changes = dict(basis=basis, charge=found.charge, spin=found.spin, **keywords)
    if method not in ("mp2", "scs"):
        changes["xc"] = method
    if method == "scs":
        changes["rdm1_scaling"] = SCS  # the gradient's and the dipole's density: SCS-MP2's
    changes.update(gradient=driver == "gradient", properties=("dipole",) if driver == "properties" else ())
    return Request(atoms, Settings(**changes), driver, method if method in ("mp2", "scs") else "dh", version,
                   echoed_molecule(molecule, found), tuple(found.notes), scf_extrapolation)


def schema_version(data: dict) -> int:
    """The QCSchema version of an AtomicInput (1 or 2): its schema_version, else what its
    schema_name or layout ("specification": v2) says; InputError for an unknown one or a mix."""
    given, name = data.get("schema_version"), data.get("schema_name")
    if given is not None and (isinstance(given, bool) or not isinstance(given, (int, np.integer))
                              or given not in VERSIONS):
        raise InputError(f"schema_version {given!r}: dfmp2 reads QCSchema AtomicInput versions 1 and 2")
    named = next((v for v, (names, _) in VERSIONS.items() if name in names), None)
    if name is not None and named is None:
        raise InputError(f"schema_name {name!r}: expected 'qcschema_input' (v1) or 'qcschema_atomic_input' (v2), "
                         "an AtomicInput")
    layout = 2 if "specification" in data else 1
    version = int(given) if given is not None else named or layout
    if named is not None and named != version:
        raise InputError(f"schema_name {name!r} is QCSchema v{named}'s, but schema_version is {given!r}")
    if layout != version:
        where = "under 'specification'" if version == 2 else "at the top level, without 'specification'"
        raise InputError(f"schema_version {version}: QCSchema v{version} puts driver, model and keywords {where}")
    return version


def check_layout(data: dict, spec: dict, version: int) -> None:
    """InputError naming the first key of the input that its QCSchema `version`'s layout (LAYOUTS)
    does not have, or puts elsewhere; a schema_name or program not the layout's (module docstring)."""
    layout = LAYOUTS[version]
    for key in data:
        if key not in layout["AtomicInput"]:
            raise InputError(f"{key}: " + (
                f"QCSchema v2 puts it under 'specification' (specification.{key}); at a v2 AtomicInput's top "
                "level it is not read" if version == 2 and key in LAYOUTS[2]["specification"] else
                "a QCSchema v2 field (specification.program); a v1 AtomicInput has none" if key == "program" else
                f"not a field of a QCSchema v{version} AtomicInput (its fields: {', '.join(layout['AtomicInput'])})"))
    if version == 2:
        for key in spec:
            if key not in layout["specification"]:
                raise InputError(f"specification.{key}: " + (
                    "QCSchema v2 puts it at the AtomicInput's top level" if key in layout["AtomicInput"] else
                    f"not a field of QCSchema v2's specification (its fields: {', '.join(layout['specification'])})"))
        program = spec.get("program")
        if program not in (None, "") and (not isinstance(program, str) or program.strip().lower() != PROGRAM):
            raise InputError(f"specification.program {program!r}: this is dfmp2 (give {PROGRAM!r} or none)")
    model, protocols = spec.get("model"), spec.get("protocols")
    for name, given, keys in (("model", model, MODEL_KEYS), ("protocols", protocols, layout["protocols"])):
        unknown = [key for key in given if key not in keys] if isinstance(given, dict) else []
        if unknown:
            raise InputError(f"{name}.{unknown[0]}: not a field dfmp2 reads (QCSchema v{version}'s {name}: "
                             f"{', '.join(keys)})")
    for name, part in (("specification", spec if version == 2 else {}), ("protocols", protocols)):
        if isinstance(part, dict) and part.get("schema_name") not in (None, SCHEMA_NAMES[name]):
            raise InputError(f"{name}.schema_name {part['schema_name']!r}: expected {SCHEMA_NAMES[name]!r}")


def output_version(data) -> int:
    """The QCSchema version an answer to `data` is written in, whatever is wrong with it: 2 for
    an input in v2's layout or naming, else 1."""
    if isinstance(data, dict) and ("specification" in data or data.get("schema_version") == 2
                                   or data.get("schema_name") == "qcschema_atomic_input"):
        return 2
    return 1


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


def _keywords(keywords) -> tuple:
    """(the Settings changes the keywords ask for (KEYWORDS, PSI4_KEYWORDS), the workflow's
    keywords (WORKFLOW_KEYWORDS))."""
    if not isinstance(keywords, dict):
        raise InputError(f"keywords: expected a JSON object, got {type(keywords).__name__}")
    changes, workflow = {}, {}
    for name, value in keywords.items():
        key = str(name).lower()
        if key in PSI4_KEYWORDS:
            if str(value).lower() != PSI4_KEYWORDS[key]:
                raise InputError(f"keyword {name}={value!r}: dfmp2 computes {key} {PSI4_KEYWORDS[key]!r} only")
            continue
        if key in WORKFLOW_KEYWORDS:
            workflow[key] = value
            continue
        if key not in KEYWORDS:
            known = ", ".join(sorted([*KEYWORDS, *PSI4_KEYWORDS, *WORKFLOW_KEYWORDS]))
            raise InputError(f"unknown keyword {name!r} (dfmp2 takes: {known})")
        kinds = KEYWORDS[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            if not (float in kinds and isinstance(value, int) and not isinstance(value, bool)):
                raise InputError(f"keyword {name}={value!r}: expected {' or '.join(k.__name__ for k in kinds)}")
        changes[key] = value
    return changes, workflow


def _extrapolation(basis: str, workflow: dict, driver: str, method: str) -> str | None:
    """The SCF's extrapolation scheme for a basis in bracket notation (None: one basis);
    InputError for what an extrapolated energy cannot give."""
    scheme = workflow.get("scf_extrapolation")
    if len(expand_basis(basis)) == 1:  # (expand_basis checks the notation)
        if scheme is not None:
            raise InputError(f"keyword scf_extrapolation={scheme!r}: applies to an extrapolated basis (e.g. "
                             f"cc-pv[dt]z), not model.basis {basis!r}")
        return None
    scheme = "highest" if scheme is None else scheme
    if scheme not in SCF_SCHEMES:
        raise InputError(f"keyword scf_extrapolation={scheme!r}: expected one of {', '.join(SCF_SCHEMES)}")
    if driver != "energy":
        raise InputError(f"driver {driver!r} with model.basis {basis!r}: an extrapolated basis gives the energy only "
                         "(dfmp2 has no gradient or density of a composite); use driver 'energy' or one basis")
    if method not in ("mp2", "scs"):
        raise InputError(f"model.method {method.lower()!r} with model.basis {basis!r}: basis-set extrapolation is of "
                         "MP2's correlation energy (mp2, scs-mp2), not a double hybrid's")
    return scheme


def echoed_molecule(molecule: dict, found) -> dict:
    """The molecule as the output echoes it: JSON, with the molecular_charge and
    molecular_multiplicity run filled in where the input has none."""
    echoed = json_safe(molecule)
    if echoed.get("molecular_charge") is None:
        echoed["molecular_charge"] = float(found.charge)
    if echoed.get("molecular_multiplicity") is None:
        echoed["molecular_multiplicity"] = found.spin + 1
    return echoed


def atomic_result(data: dict, request: Request, result) -> dict:
    """The AtomicResult dict of a finished run in the input's QCSchema version (module
    docstring): v1, the input's fields then the results; v2, input_data and the results."""
    record = result.as_dict()
    if request.scf_extrapolation is not None:
        energy, properties = composite_properties(request, record)
    else:
        energy = result.e_ref + result.e_scs if request.method == "scs" else result.e_tot
        properties = qcschema_properties(request, result, energy)
    return_result = properties["return_gradient"] if request.driver == "gradient" else energy
    dfmp2 = json_safe(record)
    dfmp2["notes"] = list(dfmp2.get("notes") or []) + list(request.notes)
    spec = data.get("specification", data)
    if request.version == 2:
        return {
            "schema_name": "qcschema_atomic_result", "schema_version": 2, "id": json_safe(data.get("id")),
            "input_data": json_safe(data), "molecule": request.molecule, "properties": properties,
            "wavefunction": None, "return_result": return_result, "stdout": None, "stderr": None,
            "native_files": {}, "success": True, "provenance": dict(PROVENANCE), "extras": {"dfmp2": dfmp2},
        }
    return {
        "schema_name": "qcschema_output", "schema_version": 1, "id": json_safe(data.get("id")),
        "molecule": request.molecule, "driver": request.driver, "model": json_safe(spec["model"]),
        "keywords": json_safe(spec.get("keywords") or {}), "protocols": json_safe(spec.get("protocols") or {}),
        "extras": {**json_safe(spec.get("extras") or {}), "dfmp2": dfmp2},
        "provenance": dict(PROVENANCE), "properties": properties, "return_result": return_result, "success": True,
        "error": None, "stdout": None, "stderr": None, "native_files": {}, "wavefunction": None,
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


def composite_properties(request: Request, record: dict) -> tuple:
    """(the energy, QCSchema's properties) of an extrapolated run: the basis-set limit's
    energies (`composite.run_composite`'s record; no sizes, SCF dipole or nuclear repulsion,
    which belong to one basis: its per_basis runs have them)."""
    limit = record["energies"]["whole"]
    energy = float(limit["e_tot_scs"] if request.method == "scs" else limit["e_tot"])
    return energy, {
        "calcinfo_natom": len(request.atoms), "return_energy": energy, "scf_total_energy": float(limit["e_ref"]),
        "mp2_same_spin_correlation_energy": float(limit["e_corr_ss"]),
        "mp2_opposite_spin_correlation_energy": float(limit["e_corr_os"]),
        "mp2_singles_energy": float(limit["e_corr_singles"]),
        "mp2_doubles_energy": float(limit["e_corr_os"] + limit["e_corr_ss"]),
        "mp2_correlation_energy": float(limit["e_corr"]), "mp2_total_energy": float(limit["e_tot"]),
    }


def failed_operation(data, kind: str, message: str, exit_code: int = 1) -> dict:
    """QCSchema's FailedOperation in the input's version (`output_version`): success False, the
    input (strict JSON: non-finite numbers null), the error (`kind`: its error_type; exit_code:
    the command line's for it, 2 bad input, 1 a failure, in the error's extras)."""
    error = {"error_type": kind, "error_message": message, "extras": {"exit_code": int(exit_code)}}
    failed = {"id": json_safe(data.get("id")) if isinstance(data, dict) else None, "input_data": json_safe(data),
              "success": False, "error": error, "extras": {}}
    if output_version(data) == 2:
        failed = {"schema_name": "qcschema_failed_operation", "schema_version": 2, **failed}
    return failed


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
