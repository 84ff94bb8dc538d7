"""Molecules: XYZ files read and checked, atoms, formulae."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from ..util.errors import InputError


@dataclass(frozen=True)
class Atom:
    symbol: str  # canonical element symbol, e.g. "C", "Cl"
    xyz: tuple  # Angstrom


def _element_symbols() -> dict:
    from pyscf.data.elements import ELEMENTS

    return {s.upper(): s for s in ELEMENTS[1:]}


MAX_ATOMS = 100_000  # more is not a molecule a DF-MP2 run can treat


MAX_LINE = 4096  # characters in one line of an XYZ file


MAX_TRAILER = 65536  # bytes read past the last atom line: blank lines only


MIN_DISTANCE = 0.3  # Angstrom; the shortest bond there is (H2) is 0.74


MAX_COORDINATE = 1e6  # Angstrom (0.1 mm): far beyond any molecule, and safely inside fp64 distances


def read_xyz(path: str) -> list:
    """Read a standard XYZ file (count, comment, `Symbol x y z` in Angstrom, ASCII element
    symbols in any case) -> [Atom]. Reads no more than a valid XYZ of its atom count can hold
    (lines of at most MAX_LINE characters, then MAX_TRAILER bytes of blank lines); atoms closer
    than MIN_DISTANCE are refused, naming their lines."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not an XYZ file")
    try:
        with open(path, "rb") as handle:
            return _parse_xyz(path, handle)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read it ({error.strerror})") from None


def format_xyz(frames) -> str:
    """The XYZ text of frames [(comment, [Atom])] (Angstrom, 10 decimals): one frame is a
    molecule file, several a trajectory."""
    lines = []
    for comment, atoms in frames:
        lines += [str(len(atoms)), comment.replace("\n", " ")]
        lines += [f"{a.symbol:2s} {x:17.10f} {y:17.10f} {z:17.10f}" for a in atoms for x, y, z in [a.xyz]]
    return "\n".join(lines) + "\n"


def angstrom_per_bohr() -> float:
    """PySCF's Bohr radius in Angstrom (the unit it builds molecules with)."""
    from pyscf.lib import param

    return float(param.BOHR)


def _parse_xyz(path, handle) -> list:
    lineno = 0

    def next_line():
        nonlocal lineno
        raw = handle.readline(MAX_LINE + 1)
        lineno += 1
        if len(raw) > MAX_LINE:
            raise InputError(f"{path}, line {lineno}: longer than {MAX_LINE} characters: not an XYZ file")
        return None if raw == b"" else raw.decode("utf-8")

    first = next_line()
    if first is None or not first.strip():
        raise InputError(f"{path}, line 1: expected the number of atoms, found an empty line")
    try:
        natom = int(first.split()[0])
    except ValueError:
        raise InputError(f"{path}, line 1: expected the number of atoms, found {first.strip()!r}") from None
    if natom < 1:
        raise InputError(f"{path}, line 1: the number of atoms must be positive, found {natom}")
    if natom > MAX_ATOMS:
        raise InputError(f"{path}, line 1: {natom} atoms, more than dfmp2 can treat (at most {MAX_ATOMS})")
    if next_line() is None:
        raise InputError(f"{path}: missing the comment line (line 2)")

    elements = _element_symbols()
    atoms, lines = [], []
    blank = 0
    while len(atoms) < natom:
        text = next_line()
        if text is None:
            raise InputError(f"{path}: line 1 says {natom} atoms but the file has {len(atoms)} atom lines")
        if not text.strip():
            blank += len(text)
            if blank > MAX_TRAILER:
                raise InputError(f"{path}, line {lineno}: more than {MAX_TRAILER} bytes of blank lines among "
                                 "the atoms: not an XYZ file")
            continue
        atoms.append(_parse_atom(path, lineno, text, elements))
        lines.append(lineno)
    trailer = handle.read(MAX_TRAILER + 1)
    if trailer.strip() or len(trailer) > MAX_TRAILER:
        raise InputError(f"{path}: the file goes on after the {natom} atoms line 1 announces (past line {lineno}; "
                         "one geometry per file)")
    check_geometry(atoms, path, lines)
    return atoms


def _parse_atom(path, lineno, text, elements) -> Atom:
    """One `Symbol x y z` line (further columns ignored)."""
    fields = text.split()
    if len(fields) < 4:
        raise InputError(f"{path}, line {lineno}: expected 'Symbol x y z', found {text.strip()!r}")
    name = fields[0]
    symbol = elements.get(name.upper()) if name.isascii() and name.isalpha() else None
    if symbol is None:
        raise InputError(f"{path}, line {lineno}: unknown element {name!r}")
    coords = []
    for field in fields[1:4]:
        try:
            value = float(field)
        except ValueError:
            raise InputError(f"{path}, line {lineno}: coordinate {field!r} is not a number") from None
        if not math.isfinite(value):
            raise InputError(f"{path}, line {lineno}: coordinate {field!r} is not finite")
        if abs(value) > MAX_COORDINATE:
            raise InputError(f"{path}, line {lineno}: coordinate {field!r} is beyond {MAX_COORDINATE:g} Angstrom "
                             "from the origin: not a molecule")
        coords.append(value)
    return Atom(symbol, tuple(coords))


def check_geometry(atoms, path="atoms", lines=None) -> None:
    """The one check of a geometry (an XYZ file's, or atoms given to `run_atoms`): at least one
    atom, every coordinate finite and within MAX_COORDINATE Angstrom, no two atoms closer than
    MIN_DISTANCE; InputError naming the first offence (with its file lines where `lines` gives them)."""
    from scipy.spatial import cKDTree

    if not atoms:
        raise InputError(f"{path}: no atoms")
    lines = lines or [None] * len(atoms)
    xyz = np.array([a.xyz for a in atoms], dtype=np.float64).reshape(len(atoms), 3)
    bad = np.flatnonzero(~(np.abs(xyz) <= MAX_COORDINATE).all(axis=1))  # (NaN compares False)
    if bad.size:
        k = int(bad[0])
        where = f", line {lines[k]}" if lines[k] else ""
        raise InputError(f"{path}{where}: atom {k + 1} ({atoms[k].symbol}) at {tuple(atoms[k].xyz)} is not finite or "
                         f"beyond {MAX_COORDINATE:g} Angstrom from the origin: not a molecule")
    pairs = sorted(cKDTree(xyz).query_pairs(MIN_DISTANCE))
    if pairs:
        i, j = pairs[0]
        distance = float(np.linalg.norm(xyz[i] - xyz[j]))
        where = "at the same position" if distance == 0 else f"{distance:.3g} Angstrom apart"
        place = f", lines {lines[i]} and {lines[j]}" if lines[i] else ""
        raise InputError(f"{path}{place}: atoms {i + 1} ({atoms[i].symbol}) and "
                         f"{j + 1} ({atoms[j].symbol}) are {where}; atoms closer than {MIN_DISTANCE} Angstrom are "
                         "not a molecule")


def formula(mol) -> str:
    """Hill formula, e.g. 'C6H6', 'H2O'."""
    counts = {}
    for i in range(mol.natm):
        symbol = mol.atom_pure_symbol(i)
        counts[symbol] = counts.get(symbol, 0) + 1
    # Hill order: C first and H second when there is carbon, then the rest alphabetically;
    # without carbon, every element alphabetically (H included)
    first = [k for k in ("C", "H") if k in counts] if "C" in counts else []
    order = first + sorted(k for k in counts if k not in first)
    return "".join(f"{k}{counts[k] if counts[k] > 1 else ''}" for k in order)


def atom_symbols(mol) -> list:
    """The element symbols of the molecule's atoms, in its order."""
    return [mol.atom_pure_symbol(k) for k in range(mol.natm)]
