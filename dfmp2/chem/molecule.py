"""Molecules: XYZ files read and checked (frames, fragments, ghost atoms), atoms, formulae.

An XYZ frame may be split into fragments by lines `--` (Psi4's convention), each optionally
opened by a line `charge multiplicity`; a ghost atom (basis functions, no nucleus, no electrons)
is written `@O` or `Gh(O)` (Psi4) or `X-O` / `ghost-O` (PySCF). Several frames one after another
make a multi-frame XYZ (a trajectory, or a batch of molecules).
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ..util.errors import InputError


@dataclass(frozen=True)
class Atom:
    symbol: str  # canonical element symbol, e.g. "C", "Cl"
    xyz: tuple  # Angstrom
    ghost: bool = False  # basis (and fitting) functions only: no nuclear charge, no electrons

    @property
    def label(self) -> str:
        """The atom as PySCF's molecule takes it: "O", or "ghost-O"."""
        return f"ghost-{self.symbol}" if self.ghost else self.symbol


@dataclass(frozen=True)
class Fragment:
    """Atoms [start, stop) of a frame, with the charge and multiplicity (2S+1) its input gives
    (None where it gives none) and the file line that gives them."""
    start: int
    stop: int
    charge: int | None = None
    multiplicity: int | None = None
    line: int | None = None


@dataclass(frozen=True)
class Frame:
    """One geometry of an XYZ file: its atoms, comment, fragments (one covering every atom when
    the file has no `--`), and where it came from ("water.xyz", or "traj.xyz#3" for the third
    of several frames)."""
    atoms: tuple
    comment: str
    fragments: tuple
    name: str
    first_line: int = 1  # the line of its atom count

    @classmethod
    def whole(cls, atoms, name: str) -> Frame:
        """A frame of `atoms` ([Atom]) as one fragment that gives no charge or multiplicity."""
        return cls(tuple(atoms), "", (Fragment(0, len(atoms)),), name)

    @property
    def charge(self) -> int | None:
        """The charge the file gives (the sum of its fragments'), or None where it gives none."""
        charges = [f.charge for f in self.fragments]
        return None if None in charges else sum(charges)


@functools.lru_cache(maxsize=1)
def element_symbols() -> dict:
    """{upper-case symbol: canonical symbol} of every element ("CL": "Cl")."""
    from pyscf.data.elements import ELEMENTS

    return {s.upper(): s for s in ELEMENTS[1:]}


MAX_ATOMS = 100_000  # more is not a molecule a DF-MP2 run can treat


MAX_LINE = 4096  # characters in one line of an XYZ file


MAX_TRAILER = 65536  # bytes read past the last atom line: blank lines only


MIN_DISTANCE = 0.3  # Angstrom; the shortest bond there is (H2) is 0.74


MAX_COORDINATE = 1e6  # Angstrom (0.1 mm): far beyond any molecule, and safely inside fp64 distances


MAX_FRAMES = 1_000_000  # frames of one multi-frame XYZ file


BYTE_ORDER_MARK = b"\xef\xbb\xbf"  # UTF-8's encoding mark, which some editors write first: not content
# The numbers an XYZ file holds, as programs write them (printf's %d, %f, %e, %g): ASCII digits, an
# optional sign, point and exponent. Python's int() and float() take more (1_0, nan, inf, full-width
# and other Unicode digits), none of which a program writes for a coordinate or a count.
WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
DECIMAL_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def read_xyz(path: str) -> list:
    """Read an XYZ file of one geometry -> [Atom] (its fragments, if any, in order); a file of
    several frames is refused (`read_frames` reads those)."""
    frames = read_frames(path, max_frames=1)
    return list(frames[0].atoms)


def read_frames(path: str, max_frames: int = MAX_FRAMES, keep_going: bool = False) -> list:
    """Read a standard XYZ file (count, comment, `Symbol x y z` in Angstrom, ASCII element
    symbols in any case; UTF-8, a leading byte-order mark skipped), one frame or several one
    after another -> [Frame]. Numbers are read as XYZ files write them (`xyz_decimal`,
    `xyz_whole_number`). Reads no more than valid frames of their atom counts can hold (lines of
    at most MAX_LINE characters, blank runs of at most MAX_TRAILER bytes); atoms closer than
    MIN_DISTANCE are refused, naming their lines. keep_going (a batch): a frame whose lines can
    be told apart from the next frame's but not read (an unknown element, a coordinate that is
    no number, atoms too close, an impossible fragment line), or a last frame the file cuts short
    (fewer atom lines than its count, a count with nothing after it), is its `FrameError` in the
    list, and the next frame is read; a file that cannot be split into frames is bad input as a whole.
    A path that is not one (None, a number: os.stat would take an integer as a file descriptor) is bad input."""
    if isinstance(path, bool) or not isinstance(path, (str, bytes, os.PathLike)):
        raise InputError(f"an XYZ file's path is a str or os.PathLike, got {type(path).__name__} {path!r:.60}")
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not an XYZ file")
    try:
        with open(path, "rb") as handle:
            return _parse_frames(path, handle, max_frames, keep_going)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read it ({error.strerror})") from None


class FrameError(InputError):
    """A frame that cannot be read, whose lines were read to its end: the next frame can be."""


def format_xyz(frames) -> str:
    """The XYZ text of frames [(comment, [Atom]) or (comment, [Atom], fragments)] (Angstrom, 10
    decimals; ghosts written @O): one frame is a molecule file, several a trajectory. Fragments
    (chem.Fragment) are written as the reader takes them: '--' between them, each one's
    'charge multiplicity' line where its input gave one."""
    lines = []
    for frame in frames:
        comment, atoms, fragments = (*frame, ())[:3]
        lines += [str(len(atoms)), comment.replace("\n", " ")]
        opening = {f.start: f for f in fragments}
        for k, a in enumerate(atoms):
            if k in opening:
                lines += ["--"] * (k > 0) + ([f"{opening[k].charge} {opening[k].multiplicity}"]
                                             if opening[k].charge is not None else [])
            lines.append(f"{'@' * a.ghost}{a.symbol:2s} {a.xyz[0]:17.10f} {a.xyz[1]:17.10f} {a.xyz[2]:17.10f}")
    return "\n".join(lines) + "\n"


def element_symbol(name: str) -> str:
    """The canonical symbol of the element `name` names (any case: "CL" -> "Cl"); InputError if none."""
    symbol = element_symbols().get(name.strip().upper()) if isinstance(name, str) and name.isascii() else None
    if symbol is None:
        raise InputError(f"{quoted(str(name))} is not an element symbol")
    return symbol


def angstrom_per_bohr() -> float:
    """PySCF's Bohr radius in Angstrom (the unit it builds molecules with)."""
    from pyscf.lib import param

    return float(param.BOHR)


class _Lines:
    """An XYZ file's lines, one at a time, counted, none longer than MAX_LINE."""

    def __init__(self, path, handle):
        self.path, self.handle, self.lineno = path, handle, 0

    def next(self):
        raw = self.handle.readline(MAX_LINE + 1)
        self.lineno += 1
        if self.lineno == 1 and raw.startswith(BYTE_ORDER_MARK):
            raw = raw[len(BYTE_ORDER_MARK):]
        if len(raw) > MAX_LINE:
            raise InputError(f"{self.path}, line {self.lineno}: longer than {MAX_LINE} characters: not an XYZ file")
        return None if raw == b"" else raw.decode("utf-8")

    def next_filled(self):
        """The next line that is not blank (None at the end), after at most MAX_TRAILER blank bytes."""
        blank = 0
        while True:
            text = self.next()
            if text is None or text.strip():
                return text
            blank += len(text)
            if blank > MAX_TRAILER:
                raise InputError(f"{self.path}, line {self.lineno}: more than {MAX_TRAILER} bytes of blank lines: "
                                 "not an XYZ file")


def _parse_frames(path, handle, max_frames, keep_going=False) -> list:
    lines, frames = _Lines(path, handle), []
    first = lines.next()
    if first is None or not first.strip():
        raise InputError(f"{path}, line 1: expected the number of atoms, found an empty line")
    elements = element_symbols()
    while first is not None:
        if len(frames) == max_frames:
            raise InputError(f"{path}: the file goes on after the atoms line 1 announces (line {lines.lineno}; "
                             "one geometry per file here)" if max_frames == 1 else f"{path}: more than {max_frames} frames")
        try:
            frames.append(_parse_frame(lines, first, elements))
        except FrameError as error:
            if not keep_going:
                raise InputError(str(error)) from None
            frames.append(error)
        first = lines.next_filled()
        if first is not None and xyz_whole_number(first.split()[0]) is None:
            count, start = _frame_extent(frames[-1])
            raise InputError(f"{path}, line {lines.lineno}: the file goes on after the {count} atoms "
                             f"line {start} announces: expected another frame's atom count, found {quoted(first)}")
    if len(frames) > 1:
        frames = [Frame(f.atoms, f.comment, f.fragments, f"{path}#{k + 1}", f.first_line) if isinstance(f, Frame)
                  else f for k, f in enumerate(frames)]
    return frames


def _frame_extent(frame) -> tuple:
    """(atom count, line of the count) of a frame read, or of a FrameError's frame."""
    return (len(frame.atoms), frame.first_line) if isinstance(frame, Frame) else (frame.count, frame.first_line)


def _parse_frame(lines, first, elements) -> Frame:
    """One frame: the count line `first` (already read), the comment, the atom lines (with
    fragment separators `--` and `charge multiplicity` lines among them). An error in a line
    the frame's count covers is raised as a FrameError once its lines are read."""
    path, start = lines.path, lines.lineno
    natom = xyz_whole_number(first.split()[0])
    if natom is None:
        raise InputError(f"{path}, line {start}: expected the number of atoms, found {quoted(first)}")
    if natom < 1:
        raise InputError(f"{path}, line {start}: the number of atoms must be positive, found {natom}")
    if natom > MAX_ATOMS:
        raise InputError(f"{path}, line {start}: {natom} atoms, more than dfmp2 can treat (at most {MAX_ATOMS})")
    comment = lines.next()
    if comment is None:  # the file ends after the count: a cut frame (the frames before it stand)
        raise _frame_error(InputError(f"{path}, line {start}: the file ends after the atom count ({natom}): the "
                                      f"frame is cut (no comment line, no atoms)"), natom, start)
    atoms, numbers, fragments = [], [], [[0, None, None, None]]  # [start, charge, multiplicity, line]
    problem = None  # the first error in the frame's lines (raised once they are read)
    while len(atoms) < natom:
        text = lines.next_filled()
        if text is None:  # the file ends inside the frame: a cut frame (the frames before it stand)
            raise _frame_error(InputError(f"{path}: line {start} says {natom} atoms but the frame has {len(atoms)} "
                                          "atom lines: the file ends there (the frame is cut)"), natom, start)
        fields = text.split()
        try:
            if fields == ["--"]:
                if not atoms or fragments[-1][0] == len(atoms):
                    raise InputError(f"{path}, line {lines.lineno}: a fragment separator '--' with no atoms before it")
                fragments.append([len(atoms), None, None, None])
            elif len(fields) == 2 and fragments[-1][0] == len(atoms) and fragments[-1][1] is None:
                fragments[-1][1:] = (*_charge_multiplicity(path, lines.lineno, fields), lines.lineno)
            else:
                numbers.append(lines.lineno)
                atoms.append(None)  # (an atom line, counted whether or not it can be read)
                atoms[-1] = _parse_atom(path, lines.lineno, text, elements)
        except InputError as error:
            problem = problem or error
    try:
        if problem is not None:
            raise problem
        if fragments[-1][0] == len(atoms):
            raise InputError(f"{path}, line {lines.lineno}: the last fragment has no atoms")
        check_geometry(atoms, path, numbers)
    except InputError as error:
        raise _frame_error(error, natom, start) from None
    stops = [f[0] for f in fragments[1:]] + [len(atoms)]
    return Frame(tuple(atoms), comment.strip(), tuple(Fragment(b, e, c, m, n) for (b, c, m, n), e in zip(fragments, stops)),
                 path, start)


def _frame_error(error, count, first_line) -> FrameError:
    found = FrameError(str(error))
    found.count, found.first_line = count, first_line
    return found


def _charge_multiplicity(path, lineno, fields) -> tuple:
    """A fragment's `charge multiplicity` line -> (charge, multiplicity) (whole numbers: xyz_whole_number)."""
    charge, multiplicity = xyz_whole_number(fields[0]), xyz_whole_number(fields[1])
    if charge is None or multiplicity is None:
        raise InputError(f"{path}, line {lineno}: expected 'Symbol x y z' or a fragment's 'charge multiplicity', "
                         f"found {quoted(' '.join(fields))}")
    if multiplicity < 1:
        raise InputError(f"{path}, line {lineno}: multiplicity {multiplicity} (2S+1) must be at least 1")
    return charge, multiplicity


GHOST_FORMS = "@O, Gh(O), X-O or ghost-O"
QUOTED_MAX = 60  # characters of a file's text a message quotes


def quoted(text: str) -> str:
    """`text` (a piece of an input file) quoted for a one-line message, cut to QUOTED_MAX characters."""
    text = text.strip()
    return repr(text) if len(text) <= QUOTED_MAX else repr(text[:QUOTED_MAX]) + f"... ({len(text)} characters)"


def _element_of(name: str, elements: dict) -> tuple:
    """(canonical symbol or None, ghost?) of an atom line's first field: `O`, or a ghost written
    as GHOST_FORMS (any case)."""
    upper = name.upper()
    ghost = True
    if upper.startswith("@"):
        name = name[1:]
    elif upper.startswith("GH(") and upper.endswith(")"):
        name = name[3:-1]
    elif upper.startswith("X-"):
        name = name[2:]
    elif upper.startswith("GHOST-"):
        name = name[6:]
    else:
        ghost = False
    symbol = elements.get(name.upper()) if name.isascii() and name.isalpha() else None
    return symbol, ghost


def _parse_atom(path, lineno, text, elements) -> Atom:
    """One `Symbol x y z` line (further columns ignored)."""
    fields = text.split()
    if len(fields) < 4:
        raise InputError(f"{path}, line {lineno}: expected 'Symbol x y z', found {quoted(text)}")
    name = fields[0]
    symbol, ghost = _element_of(name, elements)
    if symbol is None:
        raise InputError(f"{path}, line {lineno}: unknown element {quoted(name)} (a ghost atom is written {GHOST_FORMS})")
    coords = []
    for field in fields[1:4]:
        value = xyz_decimal(field)
        if value is None:
            raise InputError(f"{path}, line {lineno}: coordinate {quoted(field)} is not a number as an XYZ file "
                             "writes one ([sign] digits [. digits] [e [sign] digits])")
        if not math.isfinite(value):  # (digits beyond fp64's range: 1e999)
            raise InputError(f"{path}, line {lineno}: coordinate {quoted(field)} is not finite")
        if abs(value) > MAX_COORDINATE:
            raise InputError(f"{path}, line {lineno}: coordinate {quoted(field)} is beyond {MAX_COORDINATE:g} Angstrom "
                             "from the origin: not a molecule")
        coords.append(value)
    return Atom(symbol, tuple(coords), ghost)


def xyz_whole_number(text: str) -> int | None:
    """The whole number `text` (an XYZ file's field: an atom count, a charge, a multiplicity)
    writes, or None unless it is WHOLE_NUMBER's form (ASCII digits, an optional sign)."""
    return int(text) if WHOLE_NUMBER.fullmatch(text) else None


def xyz_decimal(text: str) -> float | None:
    """The number `text` (an XYZ file's coordinate) writes, or None unless it is DECIMAL_NUMBER's
    form: the one parser of an XYZ file's decimals (no 1_0, nan, inf or non-ASCII digits)."""
    return float(text) if DECIMAL_NUMBER.fullmatch(text) else None


def check_geometry(atoms, path="atoms", lines=None) -> None:
    """The one check of a geometry (an XYZ file's, or atoms given to `run_atoms`): at least one
    atom, every coordinate finite and within MAX_COORDINATE Angstrom, no two atoms closer than
    MIN_DISTANCE; InputError naming the first offence (with its file lines where `lines` gives them)."""
    from scipy.spatial import cKDTree

    if not atoms:
        raise InputError(f"{path}: no atoms")
    if isinstance(atoms, (str, bytes)) or any(not isinstance(a, Atom) for a in atoms):
        found = atoms if isinstance(atoms, (str, bytes)) else next(a for a in atoms if not isinstance(a, Atom))
        raise InputError(f"{path}: a list of dfmp2.chem.Atom(symbol, xyz in Angstrom), got {found!r:.60}")
    if all(getattr(a, "ghost", False) for a in atoms):
        raise InputError(f"{path}: every atom is a ghost ({GHOST_FORMS}): no molecule")
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
        if is_ghost(mol, i):
            continue
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


def is_ghost(mol, i: int) -> bool:
    """Whether atom i of the PySCF molecule is a ghost (basis functions, no nucleus)."""
    from pyscf.data.elements import is_ghost_atom

    return bool(is_ghost_atom(mol.atom_symbol(i)))
