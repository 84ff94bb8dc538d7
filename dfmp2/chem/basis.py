"""Basis sets, fitting sets and ECPs: PySCF's library, then the Basis Set Exchange."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..util.errors import InputError, option
from .molecule import element_symbols

# what PySCF's basis and ECP loaders raise for a name or element they do not have
BASIS_LOOKUP_ERRORS = (KeyError, RuntimeError, OSError, ValueError, AttributeError, IndexError)


ECP_FROM_BSE_MIN_Z = 37  # ECPs are also looked up in the Basis Set Exchange's data from Rb on, where


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


def basis_by_element(spec: str, symbols) -> dict:
    """{element: basis name} of a basis spec for the elements `symbols`: one name for every element
    ("cc-pvdz"), or comma-separated `Element:name` entries and at most one bare name for the
    rest ("O:aug-cc-pvtz,H:cc-pvdz", "cc-pvdz,O:aug-cc-pvtz"). InputError for an entry that
    names no element, an element named twice, or an element of `symbols` the spec leaves out."""
    known = element_symbols()
    rest, chosen = None, {}
    for entry in (part.strip() for part in str(spec).split(",")):
        element, colon, name = entry.partition(":")
        element, name = element.strip(), name.strip()
        if not colon:
            if not element or rest is not None:
                raise InputError(f"basis {spec!r}: give one name for every element, or 'Element:name' entries "
                                 "separated by commas with at most one bare name for the rest")
            rest = element
            continue
        symbol = known.get(element.upper())
        if symbol is None or not name:
            raise InputError(f"basis {spec!r}: {entry!r} is not 'Element:name' (e.g. O:aug-cc-pvtz)")
        if symbol in chosen:
            raise InputError(f"basis {spec!r}: {symbol} is given twice")
        chosen[symbol] = name
    missing = sorted(set(symbols) - set(chosen)) if rest is None else []
    if missing:
        raise InputError(f"basis {spec!r} gives no basis for {', '.join(missing)}: add '{missing[0]}:NAME' or a bare "
                         "name for the other elements")
    return {symbol: chosen.get(symbol, rest) for symbol in sorted(set(symbols))}


def pyscf_basis(spec: str, symbols):
    """The basis as PySCF's molecule takes it: the name where the spec gives one name for every
    element of `symbols`, else {element: name}."""
    names = basis_by_element(spec, symbols)
    if len(set(names.values())) == 1 and ":" not in str(spec):
        return next(iter(names.values()))
    return names


def choose_ecp(symbols, basis: str, ecp: str | None = "auto", ghost_symbols=()) -> EffectiveCorePotentials:
    """ECPs for the elements `symbols` (of the real atoms; ghosts carry none). ecp "auto" (or
    None): the ECP that ships with the orbital basis `basis` for each element that has one
    (def2: Rb-Rn), as Psi4, ORCA and Turbomole do; "none": all-electron (what auto would have
    used is kept in `off`, for a note); any other name: that ECP library for every element it
    covers (InputError if it covers none of `symbols` and `ghost_symbols`)."""
    choice = "auto" if ecp is None else str(ecp).strip()
    every = sorted(set(symbols) | set(ghost_symbols))
    names = basis_by_element(basis if choice.lower() in ("auto", "none") else choice, every)
    found = {}
    for symbol in sorted(set(symbols)):
        potential = _ecp_of(names[symbol], symbol)
        if potential is not None:
            found[symbol] = potential
    if choice.lower() == "none":
        return EffectiveCorePotentials({}, {}, {el: f"{n}-electron {label}" for el, (_, label, n) in found.items()})
    if choice.lower() != "auto" and not found and not any(_ecp_of(names[g], g) for g in set(ghost_symbols)):
        raise InputError(f"{option('ecp', choice)}: no ECP of that name for any element here ({', '.join(every)}); "
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
    if atomic_number(symbol) >= ECP_FROM_BSE_MIN_Z:
        potential = _bse_shells(name, symbol)[1]
        if potential:
            return potential, f"{_bse_name(name)} ({BSE})", int(potential[0])
    return None


def build_molecule(atoms: list, basis: str, charge: int = 0, spin: int = 0, max_memory=None,
                   ecp: EffectiveCorePotentials | None = None, cartesian: bool = False):
    """PySCF Mole from atoms (Angstrom; ghosts carry basis functions only) in the basis spec
    `basis` (`basis_by_element`; cartesian: Cartesian d, f, ... functions instead of spherical)
    with the ECPs `ecp` (choose_ecp; None: all-electron).
    Checks the basis, and that charge and spin (2S) are possible for the electron count (the
    electrons an ECP replaces not counted). max_memory (MB, the whole process's, PySCF's
    meaning): what PySCF's SCF and integral code may use (they go out of core beyond it)."""
    from pyscf import gto

    ecp = ecp or EffectiveCorePotentials({}, {}, {})
    symbols = sorted({a.symbol for a in atoms})
    _check_basis_name(basis, symbols)
    nuclear_charge = sum(atomic_number(a.symbol) - ecp.core_electrons(a.symbol) for a in atoms if not a.ghost)
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
    mol.atom = [(a.label, a.xyz) for a in atoms]  # a ghost: its element's functions, no nucleus, no ECP
    mol.unit = "Angstrom"
    mol.basis = pyscf_basis(basis, symbols)
    mol.ecp = dict(ecp.pyscf)
    mol.cart = cartesian
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


def atomic_number(symbol: str) -> int:
    from pyscf.data.elements import charge

    return charge(symbol)


def _check_basis_name(basis: str, symbols: list) -> None:
    """Raise InputError unless PySCF has `basis` for every element in `symbols` (its library, or
    the Basis Set Exchange's data it loads names it lacks from)."""
    from pyscf.gto import basis as basis_lib

    for symbol, name in basis_by_element(basis, symbols).items():
        if not _loaded(basis_lib.load, name, symbol):
            raise InputError(f"basis {name!r} is unknown or has no functions for {symbol}")


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
    labels = atom_labels(mol)
    if isinstance(aux, str):
        return FittingSet(aux, {symbol: aux for symbol in labels.values()})
    sources = {}
    for label, value in list(aux.items()):
        symbol = labels.get(label, label)
        if isinstance(value, str):
            sources[symbol] = value
            continue
        orbital = mol.basis if isinstance(mol.basis, str) else mol.basis.get(symbol)
        wanted = predefined_auxbasis(mol, orbital, mp2fit=mp2fit) if isinstance(orbital, str) else None
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


def named_fitting_set(spec: str, mol) -> FittingSet:
    """The auxiliary basis spec `spec` (a name, or per element as `basis_by_element`) for every
    element of mol: PySCF's where its library has the element, else the Basis Set Exchange's set
    of that name (PySCF's "-ri" sets are BSE's "-rifit"); InputError naming an element neither has."""
    labels = atom_labels(mol)
    names = basis_by_element(spec, labels.values())
    basis, sources = {}, {}
    for label, symbol in labels.items():
        name = names[symbol]
        if _pyscf_library_has(name, symbol):
            basis[label], sources[symbol] = name, name
            continue
        shells = _bse_shells(name, symbol)[0]
        if not shells:
            raise InputError(f"auxiliary basis {name!r} is unknown or has no functions for {symbol}")
        basis[label], sources[symbol] = shells, f"{_bse_name(name)} ({BSE})"
    if len(set(names.values())) == 1 and all(source == name for source in sources.values()):
        return FittingSet(name, sources)
    return FittingSet(basis, sources)


def atom_labels(mol) -> dict:
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


def describe_basis(basis) -> str:
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


def basis_name(mol) -> str:
    return describe_basis(mol.basis)
