"""Chemistry front end: the only module that talks to PySCF.

It reads molecules, runs the RHF, UHF or ROHF reference, chooses the MP2-fit auxiliary basis
and hands the pipeline plain arrays:

    three-center integrals (mn|P)   [naux block, nao, nao]   Hartree, fp64
    Coulomb metric         (P|Q)    [naux, naux]              Hartree, fp64
    orbitals C [nao, nmo], orbital energies e [nmo] (Hartree), occupations [nmo] (RHF); the
    same per spin ([2, nao, nmo], ...) for UHF and for ROHF's semicanonical orbitals, with the
    ROHF Fock matrices in that basis (for the singles)
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np

from . import files
from .errors import ComputationError, InputError, option
from .memory import release_freed_memory
from .settings import SCF_MAX_CYCLE

# PySCF is imported lazily inside functions so that `dfmp2 --help` and `dfmp2 info` stay fast.

SCF_CONV_TOL = 1e-11  # Hartree; with SCF_CONV_TOL_GRAD keeps e_corr stable to well below 1e-8 Eh
SCF_CONV_TOL_GRAD = 1e-7
# Kohn-Sham: the DFT grid's noise keeps the orbital gradient above ~1e-7; 1e-10 Eh / 1e-6 still
# leaves the energy stable to ~1e-10 Eh
KS_CONV_TOL, KS_CONV_TOL_GRAD = 1e-10, 1e-6
REFERENCES = ("rhf", "uhf", "rohf")
# what PySCF's basis and ECP loaders raise for a name or element they do not have
BASIS_LOOKUP_ERRORS = (KeyError, RuntimeError, OSError, ValueError, AttributeError, IndexError)


# ----------------------------------------------------------------------------- molecules

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


ECP_FROM_BSE_MIN_Z = 37  # ECPs are also looked up in the Basis Set Exchange's data from Rb on, where
# PySCF's library has gaps (the def2 ECPs of Ce-Lu); lighter elements never load it (start-up time)


@dataclass(frozen=True)
class EffectiveCorePotentials:
    """The ECPs of a run: `pyscf` {element: ECP as PySCF's mol.ecp takes it}, `record`
    {element: {"name": where it came from, "core_electrons": n}}, and `off`: {element: the
    ECP a named basis carries that --ecp none turned off, e.g. "28-electron def2-svp"}."""

    pyscf: dict
    record: dict
    off: dict

    def core_electrons(self, symbol: str) -> int:
        return self.record[symbol]["core_electrons"] if symbol in self.record else 0


def choose_ecp(symbols, basis: str, ecp: str | None = "auto") -> EffectiveCorePotentials:
    """ECPs for the elements `symbols`. ecp "auto" (or None): the ECP that ships with the orbital
    basis `basis` for each element that has one (def2: Rb-Rn), as Psi4, ORCA and Turbomole do;
    "none": all-electron (what auto would have used is kept in `off`, for a note); any other
    name: that ECP library for every element it covers (InputError if it covers none)."""
    choice = "auto" if ecp is None else str(ecp).strip()
    name = basis if choice.lower() in ("auto", "none") else choice
    found = {}
    for symbol in sorted(set(symbols)):
        potential = _ecp_of(name, symbol)
        if potential is not None:
            found[symbol] = potential
    if choice.lower() == "none":
        return EffectiveCorePotentials({}, {}, {el: f"{n}-electron {label}" for el, (_, label, n) in found.items()})
    if choice.lower() != "auto" and not found:
        raise InputError(f"{option('ecp', choice)}: no ECP of that name for any element here ({', '.join(sorted(set(symbols)))}); "
                         "use auto, none, or an ECP name PySCF or the Basis Set Exchange knows")
    return EffectiveCorePotentials({el: data for el, (data, _, _) in found.items()},
                                   {el: {"name": label, "core_electrons": n} for el, (_, label, n) in found.items()}, {})


def _ecp_of(name: str, symbol: str):
    """(ECP as PySCF takes it, label, core electrons) of ECP library `name` for `symbol`: PySCF's
    library first, then (from Rb on) the Basis Set Exchange's data; None where neither has one."""
    from pyscf.gto import basis as basis_lib

    data = _loaded(basis_lib.load_ecp, name, symbol)
    if data:
        return name, name, int(data[0])
    if _atomic_number(symbol) >= ECP_FROM_BSE_MIN_Z:
        potential = _bse_shells(name, symbol)[1]
        if potential:
            return potential, f"{_bse_name(name)} ({BSE})", int(potential[0])
    return None


def build_molecule(atoms: list, basis: str, charge: int = 0, spin: int = 0, max_memory=None,
                   ecp: EffectiveCorePotentials | None = None):
    """PySCF Mole from atoms (Angstrom) with the ECPs `ecp` (choose_ecp; None: all-electron).
    Checks the basis, and that charge and spin (2S) are possible for the electron count (the
    electrons an ECP replaces not counted). max_memory (MB, the whole process's, PySCF's
    meaning): what PySCF's SCF and integral code may use (they go out of core beyond it)."""
    from pyscf import gto

    ecp = ecp or EffectiveCorePotentials({}, {}, {})
    _check_basis_name(basis, sorted({a.symbol for a in atoms}))
    nuclear_charge = sum(_atomic_number(a.symbol) - ecp.core_electrons(a.symbol) for a in atoms)
    nelectron = nuclear_charge - charge
    if nelectron <= 0:
        raise InputError(f"charge {charge} leaves {nelectron} electrons")
    if spin < 0 or spin > nelectron:
        raise InputError(f"spin {spin} (2S) is impossible with {nelectron} electrons")
    if (nelectron - spin) % 2:
        if spin == 0:
            raise InputError(
                f"odd electron count ({nelectron}) with spin 0: a closed shell needs an even "
                f"number; check {option('charge')}, or give {option('spin')} (2S) for an open shell")
        raise InputError(f"spin {spin} (2S) is impossible with {nelectron} electrons")
    mol = gto.Mole()
    mol.atom = [(a.symbol, a.xyz) for a in atoms]
    mol.unit = "Angstrom"
    mol.basis = basis
    mol.ecp = dict(ecp.pyscf)
    mol.charge = charge
    mol.spin = spin
    mol.verbose = 0
    if max_memory is not None:
        mol.max_memory = max_memory
    mol.build()
    nalpha, nbeta = mol.nelec
    if nalpha >= mol.nao_nr():
        raise InputError(f"charge {charge} and 2S {spin} put {nalpha} alpha electrons in the {mol.nao_nr()} orbitals "
                         f"of {basis}: " + ("more than they hold" if nalpha > mol.nao_nr() else
                                            "none is left virtual, so there is nothing to correlate"))
    if nbeta == 0:
        raise InputError(f"2S = {spin} leaves no beta electron ({nelectron} electron{'s' if nelectron > 1 else ''} in "
                         "all): DF-MP2 here needs at least one occupied orbital of each spin")
    return mol


def release_integrals(mf) -> None:
    """Free the SCF's own integrals (DF tensor or four-center ERIs) of a mean field this run
    made, once its orbitals are taken: MP2 uses its own, and they would count against the
    memory budget."""
    with_df = getattr(mf, "with_df", None)
    if with_df is not None:
        with_df.reset()
    if getattr(mf, "_eri", None) is not None:
        mf._eri = None


def _atomic_number(symbol: str) -> int:
    from pyscf.data.elements import charge

    return charge(symbol)


def _check_basis_name(basis: str, symbols: list) -> None:
    """Raise InputError unless PySCF has `basis` for every element in `symbols` (its library, or
    the Basis Set Exchange's data it loads names it lacks from)."""
    from pyscf.gto import basis as basis_lib

    for symbol in symbols:
        if not _loaded(basis_lib.load, basis, symbol):
            raise InputError(f"basis {basis!r} is unknown or has no functions for {symbol}")


@contextlib.contextmanager
def pyscf_scratch(scratch=None, prefix="dfmp2-"):
    """Within: PySCF's temporary files (pyscf.lib.param.TMPDIR: out-of-core DF tensors, any
    chkfile) go to a new directory <prefix>pyscf-* under `files.scratch_root(scratch)` (prefix:
    `files.scratch_prefix`), removed on the way out however the run ends (after a SIGKILL, by the
    next run of the same checkpoint); nested uses share the outer one. InputError before anything
    runs when the directory cannot be made (a read-only PYSCF_TMPDIR, a missing --scratch)."""
    from pyscf.lib import param

    if param.TMPDIR in files.holding():
        yield param.TMPDIR
        return
    with files.held_directory(prefix + "pyscf-", scratch) as directory:
        previous, param.TMPDIR = param.TMPDIR, directory
        try:
            yield directory
        finally:
            param.TMPDIR = previous


# ----------------------------------------------------------------------------- SCF

def choose_reference(spin: int, reference: str | None) -> str:
    """The SCF reference: `reference` if given (rhf, uhf, rohf), else RHF for a closed shell
    (spin 0) and UHF for an open one. RHF with spin > 0 is bad input."""
    if reference is None:
        return "rhf" if spin == 0 else "uhf"
    if reference not in REFERENCES:
        raise InputError(f"unknown reference {reference!r} (use one of: {', '.join(REFERENCES)})")
    if reference == "rhf" and spin != 0:
        raise InputError(f"RHF needs a closed shell, but 2S = {spin}: use {option('reference', 'uhf')} or rohf")
    return reference


GENERATED = "generated (PySCF's even-tempered aug_etb)"
BSE = "Basis Set Exchange"


@dataclass
class FittingSet:
    """An auxiliary basis chosen element by element: `basis` as PySCF takes it (a name, or
    {atom label: name or shells}) and `sources` {element: where its set came from: a PySCF
    name, "NAME (Basis Set Exchange)", or GENERATED}."""

    basis: object
    sources: dict

    @property
    def generated(self) -> list:
        """Elements that got PySCF's generated set."""
        return sorted(el for el, source in self.sources.items() if source == GENERATED)

    def describe(self) -> str:
        """One name where every element's set has it, else 'H, O: name; I: name (source)'."""
        labels = {}
        for element, source in sorted(self.sources.items()):
            labels.setdefault(source, []).append(element)
        if len(labels) == 1:
            return next(iter(labels))
        return "; ".join(f"{', '.join(elements)}: {source}" for source, elements in labels.items())


def fitting_basis(mol, mp2fit: bool) -> FittingSet:
    """The auxiliary basis PySCF pairs with mol's orbital basis (mp2fit: the RI/MP2-fit set, else
    the JK-fit set), element by element: the named set where PySCF ships it for that element,
    else the same set from the Basis Set Exchange's data (e.g. def2-SVP-RIFIT for Rb-Rn, which
    PySCF's def2-svp-ri lacks), else PySCF's generated even-tempered set (`aug_etb`)."""
    from pyscf import df
    from pyscf.df.addons import predefined_auxbasis

    with warnings.catch_warnings():  # PySCF suggests basis-set-exchange on stderr
        warnings.simplefilter("ignore")
        try:
            aux = df.make_auxbasis(mol, mp2fit=mp2fit)
        except KeyError:  # PySCF 2.14 fails on some names it derives (6-311G**: '6311gststrifit'):
            aux = df.addons.aug_etb(mol)  # no named set then; its generated set, announced as such
    labels = _atom_labels(mol)
    if isinstance(aux, str):
        return FittingSet(aux, {symbol: aux for symbol in labels.values()})
    wanted = predefined_auxbasis(mol, mol.basis, mp2fit=mp2fit) if isinstance(mol.basis, str) else None
    sources = {}
    for label, value in list(aux.items()):
        symbol = labels.get(label, label)
        if isinstance(value, str):
            sources[symbol] = value
            continue
        shells = _bse_shells(wanted, symbol)[0] if wanted else None
        if shells:
            aux[label] = shells
            sources[symbol] = f"{_bse_name(wanted)} ({BSE})"
        else:
            sources[symbol] = GENERATED
    return FittingSet(aux, sources)


def pyscf_fitting_choice(mol, mp2fit: bool = True):
    """The auxiliary basis PySCF's make_auxbasis picks for mol (what its DFMP2 uses without
    density fitting in the SCF), or where it fails on a name it derives (PySCF 2.14, 6-311G**),
    `fitting_basis`'s."""
    from pyscf import df

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return df.make_auxbasis(mol, mp2fit=mp2fit)
    except KeyError:
        return fitting_basis(mol, mp2fit).basis


def named_fitting_set(name: str, mol) -> FittingSet:
    """The auxiliary basis `name` for every element of mol: PySCF's where its library has the
    element, else the Basis Set Exchange's set of that name (PySCF's "-ri" sets are BSE's
    "-rifit"); InputError naming an element neither has."""
    labels = _atom_labels(mol)
    basis, sources = {}, {}
    for label, symbol in labels.items():
        if _pyscf_library_has(name, symbol):
            basis[label], sources[symbol] = name, name
            continue
        shells = _bse_shells(name, symbol)[0]
        if not shells:
            raise InputError(f"auxiliary basis {name!r} is unknown or has no functions for {symbol}")
        basis[label], sources[symbol] = shells, f"{_bse_name(name)} ({BSE})"
    if all(source == name for source in sources.values()):
        return FittingSet(name, sources)
    return FittingSet(basis, sources)


def _atom_labels(mol) -> dict:
    """{atom label as mol writes it (e.g. 'GHOST-Xe'): its element symbol ('Xe')}."""
    from pyscf.data.elements import _std_symbol_without_ghost

    return {mol.atom_symbol(i): _std_symbol_without_ghost(mol.atom_symbol(i)) for i in range(mol.natm)}


def _pyscf_library_has(name: str, symbol: str) -> bool:
    """PySCF's own basis library (not its Basis Set Exchange fallback) has `name` for `symbol`."""
    from pyscf.gto import basis as basis_lib

    alias = basis_lib._format_basis_name(name)
    if alias not in basis_lib.ALIAS and not basis_lib._is_pople_basis(alias):
        return False
    return bool(_loaded(basis_lib.load, name, symbol))


def _loaded(loader, name: str, symbol: str):
    """loader(name, symbol) (PySCF's basis_lib.load or load_ecp), or None where PySCF has no such
    name or element; PySCF's suggestion to install basis-set-exchange kept off stderr."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return loader(name, symbol)
    except BASIS_LOOKUP_ERRORS:
        return None


def _bse_name(name: str) -> str:
    """The Basis Set Exchange's name of a PySCF basis name: PySCF's "-ri" fitting sets are the
    BSE's "-rifit" ones, its def2-XXX-jkfit aliases the def2-universal-jkfit set."""
    lower = name.lower()
    if lower.endswith("-ri"):
        return lower + "fit"
    if lower.startswith("def2-") and lower.endswith("-jkfit"):
        return "def2-universal-jkfit"
    return lower


def _bse_shells(name: str, symbol: str) -> tuple:
    """(shells, ECP) of basis `name` for `symbol` from the Basis Set Exchange package's data
    (shipped with it: no network), each as PySCF takes it or None where it has none."""
    import basis_set_exchange
    from pyscf.gto import basis as basis_lib

    try:
        text = basis_set_exchange.get_basis(_bse_name(name), elements=[symbol], fmt="nwchem", header=False)
    except (KeyError, ValueError, RuntimeError):
        return None, None
    orbital, _, ecp = text.partition("\nECP\n")
    try:
        shells = basis_lib.parse(orbital, symbol) if symbol in orbital else None
        potential = basis_lib.parse_ecp("ECP\n" + ecp, symbol) if ecp else None
    except (KeyError, ValueError, RuntimeError):
        return None, None
    return shells or None, potential or None


def check_xc(xc: str) -> None:
    """InputError unless PySCF's libxc can parse the xc string (checked before any SCF)."""
    from pyscf.dft import libxc

    try:
        libxc.parse_xc(xc)
    except (KeyError, ValueError) as exc:
        raise InputError(f"xc {xc!r} is not a functional PySCF knows ({exc})") from None


def is_range_separated(xc: str | None) -> bool:
    """Whether the PySCF xc string has range-separated exchange (omega != 0)."""
    if xc is None:
        return False
    from pyscf.dft import libxc

    return libxc.rsh_coeff(xc)[0] != 0


def run_scf(mol, scf: str = "df", max_cycle: int = SCF_MAX_CYCLE, reference: str = "rhf",
            jk_auxbasis=None, xc: str | None = None, progress=None, builds=None):
    """Converged RHF, UHF or ROHF (`reference`). scf='df': density-fitted with `jk_auxbasis`
    (default: `fitting_basis(mol, mp2fit=False)`, PySCF's JK-fit set, generated per element where
    it has none); scf='exact': conventional four-center integrals. Raises ComputationError if
    not converged. xc: Kohn-Sham instead of Hartree-Fock (RKS, UKS, ROKS) with that PySCF xc
    string (PySCF's default grid). builds: dfmp2's Coulomb/exchange builds
    (`dfmp2.scf.FittedCoulombExchange`, scf='df' only) instead of PySCF's (the caller closes them)."""
    mf = _scf_object(mol, scf, max_cycle, reference, jk_auxbasis, xc)
    if builds is not None:
        use_fitted_builds(mf, builds)
    if progress is not None:  # one call per SCF cycle
        mf.callback = lambda envs: progress("SCF cycle", int(envs.get("cycle", 0)) + 1, None)
    mf.kernel()
    if not mf.converged:
        raise ComputationError(
            f"{reference.upper() if xc is None else reference.upper().replace('HF', 'KS')} SCF did not converge in {max_cycle} cycles (last energy {mf.e_tot:.10f} Eh)")
    return mf


def jk_fitting_integrals(mol, jk_auxbasis, early=False):
    """The SCF's JK-fit three-center integrals (an IntegralProvider with packed()); early: an
    `EarlyIntegrals`, which computes them on a thread once started."""
    return EarlyIntegrals(mol, jk_auxbasis) if early else ThreeCenterIntegrals(mol, jk_auxbasis)


def jk_auxbasis_of(mf):
    """The JK-fit basis of a density-fitted mean field: with_df.auxbasis, or PySCF's default for it."""
    from pyscf import df

    return mf.with_df.auxbasis if mf.with_df.auxbasis is not None else df.make_auxbasis(mf.mol)


def use_fitted_builds(mf, builds):
    """Make the density-fitted mean field `mf` take its Coulomb and exchange matrices from
    `builds` (a `dfmp2.scf.FittedCoulombExchange`) instead of PySCF's own: its with_df's get_jk
    is replaced (PySCF's SCF, Kohn-Sham and response code all call it). Range-separated
    exchange (omega) is refused. Returns mf."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        raise InputError("dfmp2's SCF builds need a density-fitted mean field (mf.density_fit())")

    def get_jk(dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega:
            raise InputError(f"range-separated exchange (omega) is not built by dfmp2: use {option('scf_backend', 'pyscf')}")
        if with_df.mol is not builds.integrals.mol:  # mf.reset(new_mol), e.g. a geometry scan: new integrals
            builds.reset(jk_fitting_integrals(with_df.mol, builds.integrals.fitting.basis))
        dms, factors, shape = density_factors(dm)
        vj, vk = builds.get_jk(dms, factors, with_j, with_k, hermi)
        return (None if vj is None else vj.reshape(shape)), (None if vk is None else vk.reshape(shape))

    with_df.get_jk = get_jk
    with_df.dfmp2_builds = builds
    return mf


def reference_fitting_integrals(mf):
    """The fitting set of a density-fitted mean field's J/K as ThreeCenterIntegrals (its
    with_df's auxiliary basis), or None for one with exact integrals."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        return None
    auxmol = getattr(with_df, "auxmol", None)
    return ThreeCenterIntegrals(mf.mol, auxmol._basis if auxmol is not None else jk_auxbasis_of(mf))


def copy_with_builds(mf, builds):
    """A shallow copy of the density-fitted mean field `mf` (and of its with_df) whose J and K
    come from `builds` (use_fitted_builds); mf itself is left as it was."""
    import copy

    twin = copy.copy(mf)
    twin.with_df = copy.copy(mf.with_df)
    return use_fitted_builds(twin, builds)


def fitted_builds_of(mf):
    """The dfmp2 builds `use_fitted_builds` gave mf, or None (PySCF's own)."""
    return getattr(getattr(mf, "with_df", None), "dfmp2_builds", None)


def density_factors(dm) -> tuple:
    """PySCF density matrices and, where PySCF tags them with mo_coeff and mo_occ (RHF, UHF, ROHF,
    Kohn-Sham), their occupied orbitals as factors: (dms [nset, nao, nao], [(L = C_occ n^1/2,
    None, None) or None per density], the shape to give the results). Tags that do not describe
    the densities (L L^T != D) are not used; the builds factor such densities themselves
    (`scf.density_factor`)."""
    shape = np.shape(dm)
    dms = np.asarray(dm, dtype=np.float64).reshape(-1, shape[-2], shape[-1])
    mo_coeff, mo_occ = getattr(dm, "mo_coeff", None), getattr(dm, "mo_occ", None)
    if mo_coeff is not None and mo_occ is not None:
        coeffs, occs = _spin_orbitals(np.asarray(mo_coeff), np.asarray(mo_occ), len(dms))
        if coeffs is not None:
            factors = [(c[:, n > 0] * np.sqrt(n[n > 0]), None, None) for c, n in zip(coeffs, occs)]
            if all(np.abs(l @ l.T - d).max() <= 1e-10 * max(1.0, np.abs(d).max()) for (l, _, _), d in zip(factors, dms)):
                return dms, factors, shape
    return dms, [None] * len(dms), shape


def _spin_orbitals(mo_coeff, mo_occ, nset) -> tuple:
    """(orbitals, occupations) per density of a tagged PySCF density (None, None where the tags
    do not describe the densities one to one)."""
    if nset == 1 and mo_coeff.ndim == 2 and mo_occ.ndim == 1:  # restricted
        return [mo_coeff], [mo_occ]
    if nset == 2 and mo_coeff.ndim == 3 and mo_occ.ndim == 2:  # unrestricted
        return list(mo_coeff), list(mo_occ)
    if nset == 2 and mo_coeff.ndim == 2 and mo_occ.ndim == 1:  # restricted open shell
        return [mo_coeff, mo_coeff], [(mo_occ > 0).astype(float), (mo_occ > 1).astype(float)]
    return None, None


def scf_arrays(mf) -> dict:
    """What a converged SCF is, for a checkpoint: mo_coeff, mo_energy, mo_occ, e_tot (Eh)."""
    return {"mo_coeff": np.asarray(mf.mo_coeff), "mo_energy": np.asarray(mf.mo_energy),
            "mo_occ": np.asarray(mf.mo_occ), "e_tot": np.float64(mf.e_tot)}


def restored_scf(mol, arrays, scf: str = "df", reference: str = "rhf", jk_auxbasis=None, xc=None):
    """The SCF object `run_scf` would return, holding `arrays` (`scf_arrays` of an earlier run)
    instead of iterating again."""
    mf = _scf_object(mol, scf, SCF_MAX_CYCLE, reference, jk_auxbasis, xc)
    mf.converged = True
    return _hold_arrays(mf, arrays)


def restored_scf_from(mf, arrays):
    """A copy of the converged mean field `mf` holding `arrays` (`scf_arrays`, e.g. rank 0's)."""
    return _hold_arrays(mf.copy(), arrays)


def _hold_arrays(mf, arrays):
    """`mf` with the orbitals and energy of `arrays` (`scf_arrays`)."""
    mf.mo_coeff, mf.mo_energy, mf.mo_occ = arrays["mo_coeff"], arrays["mo_energy"], arrays["mo_occ"]
    mf.e_tot = float(arrays["e_tot"])
    return mf


def _scf_object(mol, scf, max_cycle, reference, jk_auxbasis, xc):
    """The configured (not yet run) PySCF mean-field object of `run_scf`."""
    from pyscf import dft
    from pyscf import scf as pyscf_scf

    if scf not in ("df", "exact"):
        raise InputError(f"unknown SCF mode {scf!r} (use 'df' or 'exact')")
    reference = choose_reference(mol.spin, reference)
    if xc is None:
        mf = {"rhf": pyscf_scf.RHF, "uhf": pyscf_scf.UHF, "rohf": pyscf_scf.ROHF}[reference](mol)
    else:
        check_xc(xc)
        mf = {"rhf": dft.RKS, "uhf": dft.UKS, "rohf": dft.ROKS}[reference](mol, xc=xc)
    if scf == "df":
        mf = mf.density_fit(auxbasis=jk_auxbasis if jk_auxbasis is not None else fitting_basis(mol, False).basis)
    mf.conv_tol = SCF_CONV_TOL if xc is None else KS_CONV_TOL
    mf.conv_tol_grad = SCF_CONV_TOL_GRAD if xc is None else KS_CONV_TOL_GRAD
    mf.max_cycle = max_cycle
    mf.verbose = 0
    _without_chkfile(mf)
    return mf


def _without_chkfile(mf) -> None:
    """dfmp2's SCF keeps no PySCF chkfile (a run's checkpoint is dfmp2's own): the temporary file
    PySCF opened for it when the object was made is closed (and so deleted) at once, and nothing
    is dumped, so that no run, however it ends, leaves one behind."""
    opened = getattr(mf, "_chkfile", None)
    mf.chkfile = None
    if opened is not None:
        opened.close()
        mf._chkfile = None


def scf_mode(mf) -> str:
    """'df' if the mean field used density fitting, else 'exact'."""
    return "df" if getattr(mf, "with_df", None) is not None else "exact"


def scf_auxbasis_name(mf):
    """Name of the JK-fit basis a density-fitted SCF used, or None."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        return None
    from pyscf import df

    aux = with_df.auxbasis or df.make_auxbasis(mf.mol)
    return _describe_basis(aux)


@dataclass
class MeanField:
    """A reference for MP2. RHF: orbitals C [nao, nmo], energies e [nmo] (Eh), occupations [nmo]
    (0/2). UHF and ROHF: each per spin, [2, nao, nmo], [2, nmo], [2, nmo] (0/1); ROHF's are the
    semicanonical orbitals, with fock_mo [2, nmo, nmo] (Eh) their Fock matrices (off-diagonal
    occupied-virtual blocks: the singles). spin_square: <S^2> of the reference."""

    reference: str  # rhf, uhf or rohf; rks, uks or roks for Kohn-Sham orbitals
    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    mo_occ: np.ndarray
    e_ref: float  # the reference's total energy (HF or KS), Eh
    nelectron: int
    spin_square: float = 0.0
    fock_mo: np.ndarray | None = None
    xc: str | None = None  # the functional of a Kohn-Sham reference


def mean_field_orbitals(mf, allow_non_aufbau: bool = False) -> MeanField:
    """Extract the reference from a converged PySCF RHF, UHF or ROHF object, or their Kohn-Sham
    counterparts (RKS, UKS, ROKS: `reference` rks/uks/roks, energy `e_ref`), density-fitted or
    not, refusing what DF-MP2 here cannot use: GHF, complex orbitals, unconverged SCF,
    occupations other than 0/2 (restricted) or 0/1 per spin summing to the electron count, and
    (unless allow_non_aufbau) a highest occupied orbital energy not below the lowest virtual."""
    from pyscf import scf as pyscf_scf
    from pyscf.dft.rks import KohnShamDFT

    kinds = (pyscf_scf.ghf.GHF, pyscf_scf.rohf.ROHF, pyscf_scf.uhf.UHF, pyscf_scf.hf.RHF)
    ks_kinds = (KohnShamDFT,)
    if is_periodic(mf):  # gamma-point PBC mean fields: their own classes
        from pyscf.pbc import scf as pbc_scf
        from pyscf.pbc.dft.rks import KohnShamDFT as PeriodicKohnShamDFT

        check_gamma_point(mf)
        kinds = (pbc_scf.ghf.GHF, pbc_scf.rohf.ROHF, pbc_scf.uhf.UHF, pbc_scf.hf.RHF)
        ks_kinds = (PeriodicKohnShamDFT,)
    if isinstance(mf, kinds[0]):
        raise InputError(f"{type(mf).__name__} is a generalized (GHF) reference: dfmp2 takes RHF, UHF or ROHF")
    if isinstance(mf, kinds[1]):
        reference = "rohf"
    elif isinstance(mf, kinds[2]):
        reference = "uhf"
    elif isinstance(mf, kinds[3]):
        reference = "rhf"
    else:
        raise InputError(f"{type(mf).__name__} is not a PySCF RHF, UHF or ROHF object (molecular, or periodic at "
                         "the gamma point)")
    if mf.mo_coeff is None or not getattr(mf, "converged", False):
        raise InputError(f"the {reference.upper()} mean field is not converged: run mf.kernel() to "
                         "convergence first")
    label = reference.replace("hf", "ks") if isinstance(mf, ks_kinds) else reference
    if np.iscomplexobj(mf.mo_coeff):
        raise InputError("complex orbitals: dfmp2 takes real RHF, UHF or ROHF references")
    if reference == "rhf" and mf.mol.spin != 0:
        raise InputError(f"molecule has spin {mf.mol.spin}: RHF needs a closed shell (use UHF or ROHF)")
    mo_coeff = np.asarray(mf.mo_coeff, dtype=np.float64)
    if mo_coeff.ndim != (3 if reference == "uhf" else 2):
        raise InputError(f"mo_coeff has shape {mo_coeff.shape}, not that of a {reference.upper()} reference")
    _check_occupations(np.asarray(mf.mo_occ, dtype=np.float64), reference, mf.mol)
    common = dict(reference=label, e_ref=float(mf.e_tot), nelectron=int(mf.mol.nelectron),
                  xc=getattr(mf, "xc", None) if isinstance(mf, ks_kinds) else None)
    if reference == "rhf":
        out = MeanField(mo_coeff=mo_coeff, mo_energy=np.asarray(mf.mo_energy, dtype=np.float64),
                        mo_occ=np.asarray(mf.mo_occ, dtype=np.float64), **common)
    elif reference == "uhf":
        out = MeanField(mo_coeff=mo_coeff, mo_energy=np.asarray(mf.mo_energy, dtype=np.float64),
                        mo_occ=np.asarray(mf.mo_occ, dtype=np.float64),
                        spin_square=float(mf.spin_square()[0]), **common)
    elif not np.any(np.asarray(mf.mo_occ) == 1):  # a closed-shell ROHF: its canonical orbitals for both
        # spins (the RHF arithmetic; semicanonical ones would re-diagonalise the last Fock build)
        occ = np.asarray(mf.mo_occ, dtype=np.float64) / 2
        energy = np.asarray(mf.mo_energy, dtype=np.float64)
        out = MeanField(mo_coeff=np.array([mo_coeff, mo_coeff]), mo_energy=np.array([energy, energy]),
                        mo_occ=np.array([occ, occ]), **common)
    else:
        out = MeanField(**semicanonical_orbitals(mf), spin_square=float(mf.spin_square()[0]), **common)
    if not allow_non_aufbau:
        _check_aufbau(out)
    return out


def with_orbitals(mf, mo_coeff, mo_occ, mo_energy=None):
    """A copy of the mean field `mf` holding other orbitals, as PySCF's DFMP2 takes them: their
    energies the diagonal of the Fock matrix they make (unless `mo_energy` is given) and e_tot
    the energy of their density."""
    dm = mf.make_rdm1(mo_coeff, mo_occ)
    vhf = mf.get_veff(mf.mol, dm)
    other = mf.copy()
    other.mo_coeff, other.mo_occ = mo_coeff, mo_occ
    if mo_energy is None:
        coeff, fock = np.asarray(mo_coeff), np.asarray(mf.get_fock(vhf=vhf, dm=dm))
        mo_energy = np.einsum("...mi,...mn,...ni->...i", coeff, fock, coeff)
    other.mo_energy = mo_energy
    other.e_tot = float(mf.energy_tot(dm=dm, vhf=vhf))
    return other


def overlap_matrix(mol) -> np.ndarray:
    """The AO overlap S [nao, nao]."""
    return mol.intor_symmetric("int1e_ovlp")


def reference_kind(mf) -> str:
    """'rhf', 'uhf' or 'rohf' of a PySCF mean field (Kohn-Sham ones too), by its class."""
    from pyscf import scf as pyscf_scf

    if mf.istype("ROHF"):
        return "rohf"
    if mf.istype("UHF") or isinstance(mf, pyscf_scf.uhf.UHF):
        return "uhf"
    return "rhf"


def is_kohn_sham(mf) -> bool:
    """True for a Kohn-Sham mean field (RKS, UKS, ROKS; molecular or periodic)."""
    from pyscf.dft.rks import KohnShamDFT

    return isinstance(mf, KohnShamDFT)


def _check_occupations(mo_occ, reference, mol):
    """Occupations 0/2 (RHF), 0/1 per spin (UHF), 0/1/2 with 2S singly occupied (ROHF), summing
    to the electron count; InputError naming the first problem otherwise."""
    nalpha, nbeta = mol.nelec
    allowed = {"rhf": (0.0, 2.0), "uhf": (0.0, 1.0), "rohf": (0.0, 1.0, 2.0)}[reference]
    channels = [("alpha ", mo_occ[0]), ("beta ", mo_occ[1])] if reference == "uhf" else [("", mo_occ)]
    for name, occ in channels:
        bad = [k for k, n in enumerate(occ) if min(abs(n - a) for a in allowed) > 1e-8]
        if bad:
            raise InputError(f"{name}orbital {bad[0]} has occupation {occ[bad[0]]:g}: a {reference.upper()} "
                             f"reference needs occupations {' or '.join(f'{a:g}' for a in allowed)}")
    expected = {"rhf": [mol.nelectron], "uhf": [nalpha, nbeta], "rohf": [mol.nelectron]}[reference]
    for (name, occ), n in zip(channels, expected):
        if abs(occ.sum() - n) > 1e-8:
            raise InputError(f"the {name}occupations sum to {occ.sum():g}, but the molecule has {n} "
                             f"{name}electrons")
    if reference == "rohf" and int(round(np.sum(np.abs(mo_occ - 1.0) < 1e-8))) != nalpha - nbeta:
        raise InputError(f"{int(round(np.sum(np.abs(mo_occ - 1.0) < 1e-8)))} singly occupied orbitals, "
                         f"but 2S = {nalpha - nbeta}")


def _check_aufbau(ref):
    """InputError unless every spin channel's highest occupied orbital energy is below its lowest
    virtual one (a non-aufbau reference, e.g. swapped occupations, is refused unless asked for)."""
    channels = [(ref.mo_energy, ref.mo_occ, "")] if ref.mo_coeff.ndim == 2 else \
        [(ref.mo_energy[s], ref.mo_occ[s], ("alpha ", "beta ")[s]) for s in range(2)]
    for energy, occ, name in channels:
        occupied, virtual = energy[occ > 0], energy[occ == 0]
        if occupied.size and virtual.size and occupied.max() >= virtual.min():
            homo, lumo = int(np.flatnonzero(occ > 0)[np.argmax(occupied)]), int(np.flatnonzero(occ == 0)[np.argmin(virtual)])
            raise InputError(
                f"not an aufbau reference: {name}occupied orbital {homo} ({occupied.max():.6f} Eh) is not below "
                f"virtual orbital {lumo} ({virtual.min():.6f} Eh); pass allow_non_aufbau=True if that is "
                "deliberate")


def semicanonical_orbitals(mf) -> dict:
    """ROHF -> semicanonical orbitals per spin (as Psi4's ROHF-MBPT(2)): the alpha (beta) Fock
    matrix F^s diagonalised separately in that spin's occupied and virtual spaces (alpha
    occupied: doubly and singly occupied; beta occupied: doubly occupied).
    Returns mo_coeff [2, nao, nmo], mo_energy [2, nmo], mo_occ [2, nmo] (occupied first, each
    space in ascending energy) and fock_mo [2, nmo, nmo] = C_s^T F^s C_s."""
    coeff = np.asarray(mf.mo_coeff, dtype=np.float64)
    fock = mf.get_fock(dm=mf.make_rdm1())  # ROHF: tagged with the spin Fock matrices
    out = {"mo_coeff": [], "mo_energy": [], "mo_occ": [], "fock_mo": []}
    for fock_ao, occupied in ((fock.focka, mf.mo_occ > 0), (fock.fockb, mf.mo_occ > 1)):
        fock_ao = np.asarray(fock_ao, dtype=np.float64)
        blocks = []
        for space in (np.flatnonzero(occupied), np.flatnonzero(~occupied)):
            c = coeff[:, space]
            e, u = np.linalg.eigh(c.T @ fock_ao @ c)  # F^s_pq in this space, diagonalised
            blocks.append((c @ u, e))
        c_s = np.hstack([blocks[0][0], blocks[1][0]])
        out["mo_coeff"].append(c_s)
        out["mo_energy"].append(np.concatenate([blocks[0][1], blocks[1][1]]))
        out["mo_occ"].append(np.concatenate([np.ones(blocks[0][1].size), np.zeros(blocks[1][1].size)]))
        out["fock_mo"].append(c_s.T @ fock_ao @ c_s)
    return {key: np.asarray(value) for key, value in out.items()}


NOBLE_GAS_CORES = (0, 2, 10, 18, 36, 54, 86, 118)  # electrons of the closed shells He ... Og


def frozen_core_count(mol) -> int:
    """Core orbitals to freeze. Atoms without an ECP: PySCF's `chemcore` table (0 for H-Be, 1 for
    B-Mg, 5 for Al-Ca, ...). Atoms with an ECP: Psi4's rule, the previous noble-gas core (and
    the 4f shell from Hf on) less the electrons the ECP replaces: 4 orbitals for every def2-ECP
    element (e.g. I: 36 - 28 = 8 electrons)."""
    from pyscf.data.elements import chemcore_atm

    frozen = 0
    for i in range(mol.natm):
        if mol.atom_charge(i) == 0:  # a ghost atom: no electrons
            continue
        z = _atomic_number(mol.atom_pure_symbol(i))
        ecp_electrons = mol.atom_nelec_core(i)
        if not ecp_electrons:
            frozen += chemcore_atm[z]
            continue
        period = next(n for n, closed in enumerate(NOBLE_GAS_CORES) if z <= closed)
        core = NOBLE_GAS_CORES[period - 1]
        if period >= 6 and z - core >= 18:  # the (n-2)f shell, full from Hf on
            core += 14
        frozen += max(core - ecp_electrons, 0) // 2
    return frozen


def ecp_record(mol) -> dict:
    """{element: {"name", "core_electrons"}} of the atoms of mol that carry an ECP (the name
    mol.ecp gives it; "given with the molecule" for ECP data)."""
    record = {}
    for i in range(mol.natm):
        electrons = mol.atom_nelec_core(i)
        symbol = mol.atom_pure_symbol(i)
        if not electrons or symbol in record:
            continue
        if isinstance(mol.ecp, str):
            name = mol.ecp
        else:
            given = (mol.ecp or {}).get(mol.atom_symbol(i), (mol.ecp or {}).get(symbol))
            name = given if isinstance(given, str) else "given with the molecule"
        record[symbol] = {"name": name, "core_electrons": int(electrons)}
    return record


# ----------------------------------------------------------------------------- integrals

def _describe_basis(basis) -> str:
    """Readable name of a basis given as a string or a per-element dict."""
    if isinstance(basis, str):
        return basis
    if isinstance(basis, dict):
        names = {v if isinstance(v, str) else "generated" for v in basis.values()}
        if len(names) == 1:
            return names.pop()
        return ", ".join(f"{k}:{v if isinstance(v, str) else 'generated'}"
                         for k, v in sorted(basis.items()))
    return "generated"


class ThreeCenterIntegrals:
    """DF integrals in one auxiliary basis, produced block by block of auxiliary functions: an
    IntegralProvider (`dfmp2.providers`).

    nao, naux: sizes. metric(): (P|Q) [naux, naux]. block(p0, p1): (mn|P) as [p1-p0, nao, nao].
    aux_blocks(limit): shell-aligned (p0, p1) ranges of at most `limit` functions where possible.
    fitting: the FittingSet (where each element's set came from).
    """

    def __init__(self, mol, auxbasis=None):
        from pyscf import df

        self.mol = mol
        if auxbasis is None:
            self.fitting = fitting_basis(mol, mp2fit=True)
        elif isinstance(auxbasis, str):
            self.fitting = named_fitting_set(auxbasis, mol)
        else:  # a basis as PySCF takes it (e.g. a with_df's auxmol._basis)
            self.fitting = FittingSet(auxbasis, {symbol: _describe_basis(auxbasis)
                                                 for symbol in _atom_labels(mol).values()})
        self.generated = self.fitting.generated  # elements given PySCF's generated (even-tempered) set
        self.auxbasis = self.basis_name = self.fitting.describe()
        self.auxmol = df.addons.make_auxmol(mol, self.fitting.basis)
        self.nao = mol.nao_nr()
        self.naux = self.auxmol.nao_nr()
        self._aux_loc = self.auxmol.ao_loc_nr()
        self.screening = None  # a sparse.ScreenedPattern: block() gives only its kept pair blocks
        self._tiles = None  # libcint set up for screened blocks (_TileIntegrals), made on first use
        if self.naux == 0:
            raise InputError(f"auxiliary basis {self.auxbasis!r} has no functions for this molecule")

    def metric(self) -> np.ndarray:
        """Coulomb metric (P|Q), [naux, naux], fp64."""
        return np.asarray(self.auxmol.intor("int2c2e", hermi=1), dtype=np.float64)

    def largest_shell(self) -> int:
        return int(np.max(np.diff(self._aux_loc)))

    def aux_blocks(self, limit: int) -> list:
        """Split [0, naux) at shell boundaries into ranges of at most max(limit, largest shell)."""
        loc = self._aux_loc
        blocks, p0 = [], 0
        for shell in range(len(loc) - 1):
            if loc[shell + 1] - p0 > limit and loc[shell] > p0:
                blocks.append((p0, int(loc[shell])))
                p0 = int(loc[shell])
        blocks.append((p0, int(loc[-1])))
        return blocks

    def block(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) for P in [p0, p1): [p1-p0, nao, nao], fp64, computed with mn symmetry; with
        self.screening set, only its kept pair blocks (`screened_block`)."""
        from pyscf import lib

        if self.screening is not None:
            return self.screened_block(p0, p1)
        return lib.unpack_tril(self.packed_rows(p0, p1))

    def packed(self) -> np.ndarray:
        """(mn|P) over the pairs m >= n (row-major lower triangle): [naux, npair], fp64."""
        return self.packed_rows(0, self.naux)

    def packed_rows(self, p0: int, p1: int) -> np.ndarray:
        """(mn|P) over the pairs m >= n for P in [p0, p1) (on shell boundaries): [p1 - p0, npair], fp64."""
        from pyscf import df

        shell0, shell1 = self._aux_shells(p0, p1)
        nbas = self.mol.nbas
        packed = df.incore.aux_e2(self.mol, self.auxmol, "int3c2e", aosym="s2ij",
                                  shls_slice=(0, nbas, 0, nbas, shell0, shell1))
        return np.asarray(packed.T, order="C")  # [npair, nP] in Fortran order: no copy

    def fitted_rows(self):
        """What the SCF's builds whiten: packed() [naux, npair], or with self.screening the kept
        pair blocks, each once, over every auxiliary function (`screened_lower`)."""
        return ThreeCenterIntegrals.packed(self) if self.screening is None else self.screened_lower(0, self.naux)

    # ---- screening (dfmp2.sparse) ------------------------------------------------------
    def screened_pattern(self, threshold, block_functions):
        """The pair blocks a Schwarz screening at `threshold` keeps (`sparse.ScreenedPattern`):
        q_mn = sqrt(max |(mn|mn)|) per shell pair, s = max_P sqrt((P|P)), blocks of whole atoms."""
        from .sparse import screen_pair_blocks

        aux_bound = math.sqrt(float(np.max(np.abs(np.diag(self.metric())))))
        atom_shells = [(int(a[0]), int(a[1])) for a in self.mol.aoslice_by_atom()]
        return screen_pair_blocks(pair_bounds(self.mol), aux_bound, self.mol.ao_loc_nr(), atom_shells, threshold,
                                  block_functions)

    def screened_block(self, p0: int, p1: int):
        """(mn|P) for P in [p0, p1) on the kept pair blocks of self.screening only, both
        orientations (a `sparse.ScreenedThreeCenter`, host fp64)."""
        return self.screened_lower(p0, p1).expand()

    def screened_lower(self, p0: int, p1: int):
        """(mn|P) for P in [p0, p1) on the kept pair blocks (M, N), N <= M, of self.screening
        (a `sparse.LowerPanels`, host fp64): each computed once by libcint."""
        from .sparse import LowerPanels

        shell0, shell1 = self._aux_shells(p0, p1)
        if self._tiles is None:  # libcint's set-up once (~20 ms for a 500-function molecule)
            self._tiles = _TileIntegrals(self.mol, self.auxmol)
        tiles, blocks = self._tiles, self.screening.blocks
        return LowerPanels.from_runs(self.screening, p1 - p0, lambda m, n0, n1: tiles.tile(
            blocks[m][2:], (blocks[n0][2], blocks[n1 - 1][3]), shell0, shell1))

    def _aux_shells(self, p0, p1) -> tuple:
        shell0 = int(np.searchsorted(self._aux_loc, p0))
        shell1 = int(np.searchsorted(self._aux_loc, p1))
        if self._aux_loc[shell0] != p0 or self._aux_loc[shell1] != p1:
            raise ValueError(f"aux range [{p0}, {p1}) does not fall on shell boundaries")
        return shell0, shell1


class _TileIntegrals:
    """(mn|P) of the shells rows [a0, a1) x cols [b0, b1) and auxiliary shells, libcint set up
    once: tile() -> [nP, nM, nN], fp64 (C order, no copy of libcint's output)."""

    def __init__(self, mol, auxmol):
        from pyscf import gto

        self.nbas = mol.nbas
        self.intor = mol._add_suffix("int3c2e")
        self.env = gto.mole.conc_env(mol._atm, mol._bas, mol._env, auxmol._atm, auxmol._bas, auxmol._env)
        self.cintopt = gto.moleintor.make_cintopt(*self.env, self.intor)

    def tile(self, rows, cols, aux0, aux1) -> np.ndarray:
        from pyscf import gto

        shls = (cols[0], cols[1], rows[0], rows[1], self.nbas + aux0, self.nbas + aux1)
        out = gto.moleintor.getints(self.intor, *self.env, shls, None, 0, "s1", None, self.cintopt)
        return out.T  # [nN, nM, nP] in Fortran order: [nP, nM, nN]


def pair_bounds(mol) -> np.ndarray:
    """sqrt(max |(mn|mn)|) of every shell pair [nbas, nbas] (PySCF's Schwarz conditions, libcvhf)."""
    try:
        from pyscf.scf import _vhf

        return np.asarray(_vhf._VHFOpt(mol, "int2e", qcondname="CVHFnr_int2e_q_cond").q_cond, dtype=np.float64)
    except (ImportError, AttributeError) as error:  # a PySCF without the optimizer dfmp2 was written against
        raise ComputationError(f"PySCF's Schwarz bounds (pyscf.scf._vhf._VHFOpt) are not available: {error}; "
                               f"use {option('screening', 'off')}") from error


class EarlyIntegrals(ThreeCenterIntegrals):
    """ThreeCenterIntegrals whose fitted_rows() (packed (mn|P), or the screened pair blocks) are
    computed on a thread from start() on: libcint runs without the GIL, so the caller's own work
    meanwhile (importing torch for the backend, ~1 s; PySCF's one-electron integrals and initial
    guess) overlaps them. fitted_rows() waits for them and hands them over once (the SCF whitens
    them in place); a failure on the thread is raised there. seconds: the thread's wall time;
    waited: fitted_rows()'s wait."""

    def __init__(self, mol, auxbasis=None):
        super().__init__(mol, auxbasis)
        self._packed = self._error = self._thread = None
        self.seconds = self.waited = 0.0

    def start(self):
        """Start computing them on a thread; returns self."""
        self._thread = threading.Thread(target=self._compute, name="dfmp2-jk-integrals", daemon=True)
        self._thread.start()
        return self

    def _compute(self):
        start = time.perf_counter()
        try:
            self._packed = ThreeCenterIntegrals.fitted_rows(self)
        except BaseException as error:  # handed to packed(), which raises it in the caller
            self._error = error
        self.seconds = time.perf_counter() - start

    def held_bytes(self) -> int:
        """Bytes of the computed integrals this provider holds (waits for them; 0 once handed over)."""
        self._wait()
        return 0 if self._packed is None else self._packed.nbytes

    def _wait(self):
        if self._thread is None:
            return
        start = time.perf_counter()
        self._thread.join()
        self.waited += time.perf_counter() - start
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def fitted_rows(self):
        """ThreeCenterIntegrals.fitted_rows, the thread's (computed anew if asked again, or if
        never started; self.screening must not change after start())."""
        self._wait()
        rows, self._packed = self._packed, None
        return rows if rows is not None else ThreeCenterIntegrals.fitted_rows(self)

    def packed(self) -> np.ndarray:
        """(mn|P) over the pairs m >= n: [naux, npair], fp64 (the thread's, as fitted_rows)."""
        if self.screening is not None:
            raise ValueError("screened integrals have no packed triangle: use fitted_rows()")
        return self.fitted_rows()


class CholeskyVectors:
    """The three-center integrals a PySCF density-fitting object already holds, whitened:
    L_mn^P with (mn|ls) ~ sum_P L_mn^P L_ls^P, from a molecular pyscf.df.DF's `_cderi` (a
    density-fitted SCF's, reused as PySCF's DFMP2 reuses them) or a periodic GDF's gamma-point
    integrals (built if need be). An IntegralProvider (`dfmp2.providers`) with the identity as metric,
    so that steps 1 and 3 of the pipeline leave them as they are. Periodic: only the positive-
    definite case (3-D, or infinite-vacuum 2-D); a negative part (truncated Coulomb of 2-D
    cells) is refused."""

    def __init__(self, with_df):
        self.with_df = with_df
        self.mol = getattr(with_df, "cell", None) or with_df.mol
        self.periodic = hasattr(with_df, "cell")
        if self.periodic:
            from pyscf.pbc import df as pbc_df

            if not isinstance(with_df, pbc_df.GDF):
                raise InputError(f"periodic mean fields are supported with Gaussian density fitting (GDF, "
                                 f"mf.density_fit()), not {type(with_df).__name__}")
            if self.mol.dimension == 2 and self.mol.low_dim_ft_type != "inf_vacuum":
                raise InputError("2-D cells with a truncated Coulomb operator have a negative-definite part in "
                                 "their density fitting, which dfmp2 does not handle")
        self.nao = self.mol.nao_nr()
        try:
            self.naux = int(with_df.get_naoaux())  # builds the integrals if they are not there yet
        except OSError as error:  # a _cderi file that is not there or not HDF5
            raise InputError(f"with_df's integrals {with_df._cderi!r} cannot be read: {error}") from None
        auxmol = getattr(with_df, "auxmol", None)
        named = with_df.auxbasis if with_df.auxbasis is not None else getattr(auxmol, "basis", None)
        self.basis_name = _describe_basis(named) if named is not None else "an unnamed set"
        self.auxbasis = f"{self.basis_name} ({'GDF integrals at the gamma point' if self.periodic else 'the integrals with_df holds'})"
        self.fitting = FittingSet(named, {symbol: self.auxbasis for symbol in _atom_labels(self.mol).values()})
        self.generated = []

    def metric(self) -> np.ndarray:
        """The identity [naux, naux]: the vectors are already whitened."""
        return np.eye(self.naux)

    def largest_shell(self) -> int:
        return 1

    def aux_blocks(self, limit: int) -> list:
        step = max(1, limit)
        return [(p0, min(p0 + step, self.naux)) for p0 in range(0, self.naux, step)]

    def block(self, p0: int, p1: int) -> np.ndarray:
        """L_mn^P for P in [p0, p1): [p1-p0, nao, nao], fp64 (gamma point: real)."""
        if self.periodic:
            packed = np.concatenate([real for real, _, sign in self.with_df.sr_loop(
                np.zeros((2, 3)), compact=False, blksize=p1 - p0, aux_slice=(p0, p1)) if sign == 1])
        else:
            import h5py
            from pyscf.df import addons, df as molecular_df

            with addons.load(self.with_df._cderi, self.with_df._dataname) as stored:
                packed = molecular_df._load_from_h5g(stored, p0, p1) if isinstance(stored, h5py.Group) \
                    else np.asarray(stored[p0:p1])
        if packed.shape[1] == self.nao * self.nao:
            return np.ascontiguousarray(packed.reshape(-1, self.nao, self.nao), dtype=np.float64)
        from pyscf import lib

        return lib.unpack_tril(np.asarray(packed, dtype=np.float64))


def check_gamma_point(mf) -> None:
    """InputError unless the periodic mean field `mf` is at the gamma point alone."""
    from pyscf.pbc import scf as pbc_scf

    if isinstance(mf, pbc_scf.khf.KSCF) or (isinstance(mf, pbc_scf.hf.SCF) and np.any(mf.kpt != 0)):
        raise InputError(f"{type(mf).__name__} samples k-points other than gamma: dfmp2 takes gamma-point "
                         "periodic mean fields (pyscf.pbc.scf.RHF/UHF/ROHF at kpt 0) only")


def is_periodic(mf) -> bool:
    """True for a PySCF PBC mean field (its `mol` is a pyscf.pbc Cell)."""
    return hasattr(getattr(mf, "mol", None), "lattice_vectors")


def write_molden(mol, path, mo_coeff, occupations) -> None:
    """Orbitals [nao, nmo] with their occupations to a Molden file at `path` (PySCF's writer;
    dfmp2.files stages it and puts it in place)."""
    from pyscf.tools import molden

    molden.from_mo(mol, path, mo_coeff, occ=occupations)


def basis_name(mol) -> str:
    return _describe_basis(mol.basis)


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


def fock_response_vo(mf, dms_mo, full=True, with_potentials=False):
    """The orbital-response Fock terms of densities given in the MO basis, virtual-occupied
    block per spin, through the mean field's own J/K (its density fitting or exact integrals):
    RHF  R_ai = [4 (ai|pq) - (ap|iq) - (aq|ip)] D_pq = C_a^T 2 V_eff[D + D^T] C_i
    UHF  R_ai^s = C_a^T V_eff^s[D + D^T] C_i  (both spins' densities together)
    dms_mo: per spin [nmo, nmo] (full) or [nvir_s, nocc_s] (full=False). Returns [[nvir_s, nocc_s]],
    with_potentials also the AO potentials V_eff^s[D + D^T] [nao, nao] per spin (response_potentials)."""
    coeffs, occs = per_spin_orbitals(mf)
    dms_ao = []
    for dm, coeff, occ in zip(dms_mo, coeffs, occs):
        c_occ, c_vir = coeff[:, occ > 0], coeff[:, occ == 0]
        dm_ao = coeff @ dm @ coeff.T if full else c_vir @ dm @ c_occ.T
        dms_ao.append(dm_ao + dm_ao.T)
    potentials = response_potentials(mf, dms_ao)
    scale = 2.0 if len(coeffs) == 1 else 1.0
    vo = [scale * coeff[:, occ == 0].T @ r @ coeff[:, occ > 0] for r, coeff, occ in zip(potentials, coeffs, occs)]
    return (vo, potentials) if with_potentials else vo


def response_potentials(mf, dms_ao) -> list:
    """The first-order change of the reference's Fock matrix for symmetric AO density changes
    given per spin (RHF: [the total]; UHF: [alpha, beta]), PySCF's gen_response (hermi=1):
    HF: V_eff (J - K/2 of the total; UHF J[Da + Db] - K[Ds]); Kohn-Sham: J - a_x K/2 plus the XC
    kernel f_xc on the SCF's grid. One [nao, nao] per spin."""
    response = mf.gen_response(hermi=1)
    if len(dms_ao) == 1:
        return [np.asarray(response(dms_ao[0]))]
    return list(np.asarray(response(np.array(dms_ao))))


def solve_cphf(mf, rhs_vo, tol=1e-10, max_cycle=100) -> list:
    """z per spin [nvir_s, nocc_s] with (e_i - e_a) z_ai - R_ai[z] = rhs_ai (PySCF's CPHF/UCPHF
    solvers, R: fock_response_vo of z as a virtual-occupied density)."""
    from pyscf.scf import cphf, ucphf

    coeffs, occs = per_spin_orbitals(mf)
    if len(coeffs) == 1:
        shape = rhs_vo[0].shape

        def response(z):
            return fock_response_vo(mf, [z.reshape(shape)], full=False)[0]

        return [cphf.solve(response, mf.mo_energy, mf.mo_occ, rhs_vo[0], max_cycle=max_cycle, tol=tol)[0]]
    sizes = [r.size for r in rhs_vo]

    def response_both(zflat):
        za, zb = zflat[0, :sizes[0]].reshape(rhs_vo[0].shape), zflat[0, sizes[0]:].reshape(rhs_vo[1].shape)
        ra, rb = fock_response_vo(mf, [za, zb], full=False)
        return np.hstack([ra.reshape(1, -1), rb.reshape(1, -1)])

    z = ucphf.solve(response_both, mf.mo_energy, mf.mo_occ, list(rhs_vo), max_cycle=max_cycle, tol=tol)[0]
    return [np.asarray(z[0]), np.asarray(z[1])]


def per_spin_orbitals(mf) -> tuple:
    """(mo_coeff per spin, mo_occ per spin) of an RHF (one spin) or UHF (two) mean field."""
    coeff, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    return ([coeff], [occ]) if coeff.ndim == 2 else (list(coeff), list(occ))


def dipole_moment(mol, dm_ao) -> np.ndarray:
    """Dipole moment [x, y, z] (a.u., e a0) of the total AO density dm_ao and the nuclei, about
    the coordinate origin."""
    from pyscf.scf import hf

    return np.asarray(hf.dip_moment(mol, dm_ao, unit="AU", verbose=0))


class SCFGradientTerms:
    """The mean field's own derivative terms, per atom [natm, 3] (Eh/bohr), from PySCF's SCF
    gradient object (its density fitting, or exact integrals): nuclear repulsion, and for AO
    matrices the core-Hamiltonian and overlap derivatives (PySCF's -d/dr convention: ip1)."""

    def __init__(self, mf):
        self.mf, self.mol = mf, mf.mol
        self.grad = mf.nuc_grad_method()
        self.hcore = self.grad.hcore_generator(self.mol)
        self.s1 = self.grad.get_ovlp(self.mol)  # [3, nao, nao]
        self.slices = self.mol.aoslice_by_atom()[:, 2:]

    def nuclear(self) -> np.ndarray:
        return np.asarray(self.grad.grad_nuc())

    def core(self, dm) -> np.ndarray:
        """sum_mn dh_mn/dR_A D_nm per atom."""
        return np.array([np.einsum("xij,ji->x", self.hcore(a), dm) for a in range(self.mol.natm)])

    def overlap(self, w) -> np.ndarray:
        """sum_mn dS_mn/dR_A W_mn per atom (W need not be symmetric), -d/dr convention as PySCF's s1."""
        out = np.zeros((self.mol.natm, 3))
        for a, (p0, p1) in enumerate(self.slices):
            out[a] = np.einsum("xij,ij->x", self.s1[:, p0:p1], w[p0:p1]) + np.einsum("xji,ij->x", self.s1[:, p0:p1],
                                                                                   w[:, p0:p1])
        return out

    def two_electron(self, dm) -> np.ndarray:
        """d/dR_A of 1/2 sum D V_eff[D] with D fixed (the SCF's two-electron gradient for the
        density D: RHF the total [nao, nao], J - K/2; UHF per spin [2, nao, nao]; its density
        fitting with the auxiliary response)."""
        vhf = self.grad.get_veff(self.mol, dm)
        spin = "s" if np.ndim(dm) == 3 else ""
        out = np.array([2.0 * np.einsum(f"{spin}xij,{spin}ij->x", vhf[..., p0:p1, :], dm[..., p0:p1, :])
                        for p0, p1 in self.slices])
        if getattr(self.grad, "auxbasis_response", False):  # a DF reference: its fitting set's own derivative
            out += np.asarray(vhf.aux)  # (PySCF's DF gradients always attach it; missing would be an error)
        return out

    def fitting_integrals(self):
        """The reference's own fitting set (reference_fitting_integrals), or None."""
        return reference_fitting_integrals(self.mf)

    def energy_weighted_hf(self) -> np.ndarray:
        """The reference's energy-weighted density sum_i n_i e_i C_mi C_ni, summed over spins."""
        w = np.asarray(self.grad.make_rdm1e(self.mf.mo_energy, self.mf.mo_coeff, self.mf.mo_occ))
        return w.sum(axis=0) if w.ndim == 3 else w

    def veff_per_spin(self, dms) -> list:
        """The reference's Fock response to symmetric densities given per spin (RHF: [the total];
        UHF: [alpha, beta]), one [nao, nao] per spin (response_potentials)."""
        return response_potentials(self.mf, dms)

    def reference_gradient(self) -> np.ndarray:
        """The reference's own energy gradient [natm, 3] (PySCF's: a Kohn-Sham one's with its XC
        on the SCF's grid, no grid response; a DF reference's with its auxiliary response)."""
        return np.asarray(self.grad.kernel())

    def exchange_fraction(self) -> float:
        """a_x, the exact-exchange fraction of the reference (1 for HF); range separation refused."""
        if not is_kohn_sham(self.mf):
            return 1.0
        omega, _, hyb = self.mf._numint.rsh_and_hybrid_coeff(self.mf.xc, spin=self.mol.spin)
        if omega:
            raise InputError(f"gradients of range-separated functionals ({self.mf.xc}) are not implemented")
        return float(hyb)

    def coulomb_exchange_pair(self, ds, ps, k_scale) -> np.ndarray:
        """d/dR of J(D_t, P_t) - k_scale sum_s K(D_s, P_s) with the AO matrices fixed (symmetric,
        given per spin: RKS one spin-summed each, k_scale a_x/2; UKS alpha and beta, k_scale a_x),
        through the reference's exact integrals, per atom [natm, 3]:
            2 sum_(m on A) (vj[P_t] D_t + vj[D_t] P_t - k_scale sum_s (vk[P_s] D_s + vk[D_s] P_s))_mn"""
        n = len(ds)
        vj, vk = self.grad.get_jk(self.mol, np.array([*ds, *ps]))  # [2n, 3, nao, nao] each
        vj, vk = np.reshape(vj, (2 * n, 3, *vj.shape[-2:])), np.reshape(vk, (2 * n, 3, *vk.shape[-2:]))
        d_t, p_t, vj_d, vj_p = sum(ds), sum(ps), vj[:n].sum(axis=0), vj[n:].sum(axis=0)
        pairs = [(vj_p, d_t), (vj_d, p_t)] + [(-k_scale * vk[n + s], ds[s]) for s in range(n)] + \
            [(-k_scale * vk[s], ps[s]) for s in range(n)]
        return np.array([2.0 * sum(np.einsum("xij,ij->x", v[:, p0:p1], m[p0:p1]) for v, m in pairs)
                         for p0, p1 in self.slices])

    def xc_response(self, ds, ps) -> np.ndarray:
        """The exchange-correlation part of d/dR sum_s sum_mn P_s,mn V^xc_s,mn[rho_D] with the AO
        matrices fixed, given per spin (RKS: one spin-summed each; UKS: alpha and beta): the basis
        functions' motion in V^xc's matrix elements, and in rho_D under the kernel f_xc rho_P
        (PySCF's TDDFT-gradient contractions, tdrks/tduks, the SCF's grid, no grid response):
        2 sum_s sum_(m on A) (v1_s P_s + f1_s D_s)_mn per atom [natm, 3]."""
        from types import SimpleNamespace

        from pyscf.grad import tdrks, tduks

        holder = SimpleNamespace(mol=self.mol, base=SimpleNamespace(_scf=self.mf))
        if len(ps) == 1:  # tdrks takes half the spin-summed density
            f1, _, v1, _ = tdrks._contract_xc_kernel(holder, self.mf.xc, 0.5 * ps[0], None, True, False)
            f1, v1 = f1[None], v1[None]
        else:
            f1, _, v1, _ = tduks._contract_xc_kernel(holder, self.mf.xc, tuple(ps), None, True, False)
        return np.array([2.0 * sum(np.einsum("xij,ij->x", v1[s, 1:, p0:p1], ps[s][p0:p1])
                                   + np.einsum("xij,ij->x", f1[s, 1:, p0:p1], ds[s][p0:p1]) for s in range(len(ps)))
                         for p0, p1 in self.slices])


DERIVATIVE_BLOCK_BYTES = 96 * 10**6  # int3c2e_ip1 of one auxiliary block: 3 nao^2 nP fp64 at most this


def three_center_derivative_contraction(integrals, gamma_blocks, gamma_aux, aux_block=None) -> np.ndarray:
    """The DF energy's explicit derivative through the fitting integrals, per atom [natm, 3]:
      sum_mnP G^P_mn d(mn|P)/dR_A - 1/2 sum_PQ Gbar_PQ d(P|Q)/dR_A
    gamma_blocks(p0, p1) -> G^P_mn [p1-p0, nao, nao] of one auxiliary block (only S^P = G^P + G^P^T
    enters; an array [naux, nao, nao] is taken too), gamma_aux [naux, naux] (Gbar, symmetric);
    integrals: chem.ThreeCenterIntegrals (their auxmol). One auxiliary block at a time (G is never
    held whole): int3c2e_ip1 (all mn, the derivative on m) and int2c2e_ip1 of the block's functions.
    The auxiliary function's own derivative needs no int3c2e_ip2: by translational invariance
    (mn|P') = -(m'n|P) - (mn'|P), so 1/2 sum_mn S^P_mn (mn|P') = -sum_mn S^P_mn (m'n|P), from the
    same ip1 block (PySCF's ip1 is -d/dR of the function on that atom). aux_block: at most this
    many auxiliary functions per block (and at most DERIVATIVE_BLOCK_BYTES of ip1)."""
    from pyscf import df

    mol, auxmol = integrals.mol, integrals.auxmol
    if not callable(gamma_blocks):
        whole = gamma_blocks
        gamma_blocks = lambda p0, p1: whole[p0:p1]  # noqa: E731
    nao = mol.nao
    ao_atom = np.zeros(nao, dtype=int)
    for a, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        ao_atom[p0:p1] = a
    aux_atom = np.zeros(integrals.naux, dtype=int)
    for a, (_, _, q0, q1) in enumerate(auxmol.aoslice_by_atom()):
        aux_atom[q0:q1] = a
    per_ao, per_aux = np.zeros((3, nao)), np.zeros((3, integrals.naux))
    for p0, p1 in integrals.aux_blocks(min(aux_block or integrals.naux,
                                           max(1, DERIVATIVE_BLOCK_BYTES // (24 * nao * nao)))):
        shells = (0, mol.nbas, 0, mol.nbas, *integrals._aux_shells(p0, p1))
        block = gamma_blocks(p0, p1)
        symmetric = block + block.transpose(0, 2, 1)  # S^P [nP, nao, nao]
        # w_x,mP = sum_n (m'n|P) S^P_mn: the AO m's share, and (summed over m) the auxiliary P's
        ip1 = df.incore.aux_e2(mol, auxmol, "int3c2e_ip1", comp=3, aosym="s1", shls_slice=shells)
        ip1 = ip1.reshape(3, nao, nao, p1 - p0)
        ip1 *= symmetric.transpose(1, 2, 0)[None]
        weighted = ip1.sum(axis=2)  # [3, nao, nP]
        del ip1
        per_ao -= weighted.sum(axis=2)
        per_aux[:, p0:p1] += weighted.sum(axis=1)
        # (dP|Q): -1/2 sum_Q Gbar_PQ (P'|Q) twice (P or Q on the atom), Gbar symmetric
        v1 = auxmol.intor("int2c2e_ip1", comp=3, shls_slice=(shells[4], shells[5], 0, auxmol.nbas))
        per_aux[:, p0:p1] += np.einsum("xPQ,PQ->xP", v1, gamma_aux[p0:p1] + gamma_aux[:, p0:p1].T) * 0.5
        block = symmetric = weighted = v1 = None
        release_freed_memory()
    out = np.zeros((mol.natm, 3))
    np.add.at(out, ao_atom, per_ao.T)
    np.add.at(out, aux_atom, per_aux.T)
    return out


def atom_symbols(mol) -> list:
    """The element symbols of the molecule's atoms, in its order."""
    return [mol.atom_pure_symbol(k) for k in range(mol.natm)]
