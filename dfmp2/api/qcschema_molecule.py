"""A QCSchema molecule read and checked: its atoms (`chem.Atom`, Angstrom; ghosts from `real`,
the geometry through `chem.check_geometry`) and the charge and 2S it asks for
(`chem.charge_and_spin` on a `chem.Frame` of its fragments). The fields and rules:
`dfmp2.api.qcschema`'s docstring; every problem is an InputError naming the field.
"""

from __future__ import annotations

import math

import numpy as np

from .. import chem
from ..chem.basis import atomic_number
from ..util.errors import InputError

CHARGE_NAME, SPIN_NAME = "molecule.molecular_charge", "molecule.molecular_multiplicity"
# A QCSchema molecule's keys (QCElemental's Molecule, schema_version 2 in v1 inputs and 3 in v2's, the
# same keys): those read here, and those that change nothing dfmp2 computes (names, labels, masses and
# isotopes, connectivity, which dfmp2's coordinates never use, and the orientation and symmetry
# flags: dfmp2 never moves or symmetrises a molecule); any other key is refused by name.
READ_KEYS = ("schema_name", "schema_version", "symbols", "geometry", "real", "fragments", "fragment_charges",
             "fragment_multiplicities", "molecular_charge", "molecular_multiplicity", "atomic_numbers")
DESCRIPTIVE_KEYS = ("id", "name", "comment", "identifiers", "provenance", "extras", "validated", "atom_labels",
                    "masses", "mass_numbers", "connectivity", "fix_com", "fix_orientation", "fix_symmetry")


def read_molecule(molecule: dict, version: int, expected: int) -> tuple:
    """([chem.Atom] in Angstrom, chem.ChargeSpin) of a QCSchema molecule (geometry in bohr) in a
    QCSchema `version` AtomicInput, whose molecules are of schema_version `expected`; checked."""
    unknown = [key for key in molecule if key not in READ_KEYS + DESCRIPTIVE_KEYS]
    if unknown:
        raise InputError(f"molecule.{unknown[0]}: not a field of a QCSchema molecule (QCElemental's Molecule)")
    given = molecule.get("schema_version")
    if given is not None and (isinstance(given, bool) or given != expected):
        known = given in (2, 3) and not isinstance(given, bool)
        raise InputError(f"molecule.schema_version {given!r}: " + (
            f"a QCSchema v{version} AtomicInput holds a molecule of schema_version {expected}" if known else
            "QCSchema molecules are versions 2 (in v1 inputs) and 3 (in v2 inputs)"))
    if molecule.get("schema_name") not in (None, "qcschema_molecule"):
        raise InputError(f"molecule.schema_name {molecule['schema_name']!r}: expected 'qcschema_molecule'")
    symbols = molecule.get("symbols")
    symbols = symbols.tolist() if isinstance(symbols, np.ndarray) else symbols
    if not isinstance(symbols, (list, tuple)) or not symbols:
        raise InputError("molecule.symbols: expected a non-empty list of element symbols")
    symbols = [chem.element_symbol(s) for s in symbols]
    numbers = molecule.get("atomic_numbers")
    if numbers is not None:  # (QCElemental's are the symbols'; a ghost's too)
        numbers = list(np.ravel(np.asarray(numbers, dtype=object)))
        wrong = next((k for k, s in enumerate(symbols) if k >= len(numbers) or numbers[k] != atomic_number(s)),
                     len(symbols) if len(numbers) != len(symbols) else None)
        if wrong is not None:
            raise InputError(f"molecule.atomic_numbers: {len(numbers)} numbers for {len(symbols)} symbols" if wrong
                             == len(symbols) else f"molecule.atomic_numbers[{wrong}] {numbers[wrong]!r} is not "
                             f"molecule.symbols[{wrong}] {symbols[wrong]!r}'s atomic number")
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
    chem.check_geometry(atoms, "molecule.geometry")  # finite, within range, no two atoms on each other
    return atoms, molecule_charge_spin(molecule, atoms)


def molecule_charge_spin(molecule: dict, atoms: list) -> chem.ChargeSpin:
    """The charge and 2S of a QCSchema molecule (`dfmp2.api.qcschema`'s docstring): its fields
    checked, its fragments as a chem.Frame, the rules `chem.charge_and_spin`'s."""
    bounds = _fragments(molecule.get("fragments"), len(atoms))
    charges = _per_fragment(molecule, "fragment_charges", len(bounds), minimum=None)
    multiplicities = _per_fragment(molecule, "fragment_multiplicities", len(bounds), minimum=1)
    charge = _optional_whole(molecule.get("molecular_charge"), CHARGE_NAME)
    multiplicity = _optional_whole(molecule.get("molecular_multiplicity"), SPIN_NAME, minimum=1)
    if len(bounds) == 1:  # one fragment is the whole: its values are the whole's
        charge = _same(charge, charges[0], CHARGE_NAME, "molecule.fragment_charges[0]")
        multiplicity = _same(multiplicity, multiplicities[0], SPIN_NAME, "molecule.fragment_multiplicities[0]")
        fragments = (chem.Fragment(0, len(atoms)),)
    else:
        left = 0 if charge is None else charge - sum(q for q in charges if q is not None)
        fragments = tuple(_fragment(atoms, k, start, stop, charges[k], multiplicities[k], left, multiplicity)
                          for k, (start, stop) in enumerate(bounds))
    frame = chem.Frame(tuple(atoms), "", fragments, "molecule")
    return chem.charge_and_spin(frame, charge, None if multiplicity is None else multiplicity - 1,
                                charge_name=CHARGE_NAME, spin_name=SPIN_NAME)


def _fragment(atoms, k, start, stop, charge, multiplicity, left, whole_multiplicity) -> chem.Fragment:
    """Fragment k as chem.charge_and_spin takes it: a 'charge multiplicity' line where the
    molecule gives its charge (without a multiplicity: the lowest spin of its electrons) or its
    multiplicity (without a charge: neutral where the molecular_charge leaves no charge beyond
    the fragment charges given); none where it gives neither, or only a multiplicity while charge
    is left to place and the whole's multiplicity is given (the whole's state is then the input's
    own; the fragment's charge, and so its multiplicity's fit, are QCElemental's guess). A
    multiplicity alone with charge left to place and no whole multiplicity is refused: the
    whole's spin would hang on that guess."""
    if charge is None and multiplicity is not None and left:
        if whole_multiplicity is not None:
            multiplicity = None
        else:
            raise InputError(f"molecule.fragment_charges[{k}] is null with fragment_multiplicities[{k}] "
                             f"{multiplicity}, and {CHARGE_NAME} leaves charge {left:+d} beyond the fragment charges "
                             f"given: give fragment_charges[{k}] or {SPIN_NAME} (where the charge lands sets the spin)")
    if charge is None and multiplicity is None:
        return chem.Fragment(start, stop)
    charge = 0 if charge is None else charge
    if multiplicity is None:
        electrons = sum(atomic_number(a.symbol) for a in atoms[start:stop] if not a.ghost) - charge
        multiplicity = 1 + electrons % 2
    return chem.Fragment(start, stop, charge, multiplicity)


def _fragments(fragments, natom: int) -> list:
    """[(start, stop)] of molecule.fragments: every atom once, in order, each fragment's atoms
    consecutive (one fragment of every atom where none are given); InputError naming the first
    index out of place."""
    if fragments is None:
        return [(0, natom)]
    fragments = fragments.tolist() if isinstance(fragments, np.ndarray) else fragments
    if not isinstance(fragments, (list, tuple)) or not fragments:
        raise InputError("molecule.fragments: expected a non-empty list of lists of atom indices (omit it for one "
                         "fragment)")
    bounds, expected = [], 0
    for k, fragment in enumerate(fragments):
        fragment = fragment.tolist() if isinstance(fragment, np.ndarray) else fragment
        if not isinstance(fragment, (list, tuple)) or not fragment:
            raise InputError(f"molecule.fragments[{k}]: expected a non-empty list of atom indices")
        for index in fragment:
            if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
                raise InputError(f"molecule.fragments[{k}]: {index!r} is not an atom index")
            if index != expected:
                what = (f"atom {index} is not an atom (0 to {natom - 1})" if not 0 <= index < natom else
                        f"atom {index} comes where atom {expected} belongs")
                raise InputError(f"molecule.fragments[{k}]: {what}: fragments must list every atom once, in order, "
                                 "each fragment's atoms consecutive (dfmp2 does not reorder atoms)")
            expected += 1
        bounds.append((expected - len(fragment), expected))
    if expected != natom:
        raise InputError(f"molecule.fragments: atoms {expected} to {natom - 1} are in no fragment (every atom "
                         "belongs to one)")
    return bounds


def _per_fragment(molecule, name, nfragment, minimum) -> list:
    """molecule[name] (fragment_charges or fragment_multiplicities): one whole number or null
    per fragment; [None, ...] where absent."""
    values = molecule.get(name)
    if values is None:
        return [None] * nfragment
    values = values.tolist() if isinstance(values, np.ndarray) else values
    if not isinstance(values, (list, tuple)) or len(values) != nfragment:
        count = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise InputError(f"molecule.{name}: {count} entries for {nfragment} fragment(s) (one whole number or null "
                         "each)")
    return [_optional_whole(v, f"molecule.{name}[{k}]", minimum) for k, v in enumerate(values)]


def _optional_whole(value, name: str, minimum=None):
    """None, or value as an int (at least `minimum`)."""
    if value is None:
        return None
    found = _whole(value, name)
    if minimum is not None and found < minimum:
        raise InputError(f"{name} {found}: must be at least {minimum}")
    return found


def _same(whole, fragment, whole_name, fragment_name):
    """The one fragment's value is the whole's: either, or both if they agree."""
    if whole is not None and fragment is not None and whole != fragment:
        raise InputError(f"{whole_name} {whole} disagrees with {fragment_name} {fragment} (one fragment: the whole)")
    return fragment if whole is None else whole


def _whole(value, name: str) -> int:
    """value as an int if it is a whole number (QCSchema writes 0.0), else InputError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value != round(value):
        raise InputError(f"{name} {value!r}: expected a whole number")
    return int(round(value))
