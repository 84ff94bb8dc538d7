"""The charge and spin of a molecule and of its fragments: one set of rules for every input
(an XYZ file's `charge multiplicity` lines and `--charge`/`--spin`, a QCSchema molecule's
fragment and molecular fields, the API's charge and spin).

The rules are QCElemental's (`validate_and_fill_chgmult`, which Psi4 uses), the one difference
noted below:
  - a fragment without a line is neutral, at the lowest spin its electrons allow (2S 0 or 1);
  - the whole's charge is the fragments' sum; a whole charge given beyond what the lines hold
    lands, as one block, on the first fragment without a line that can hold it;
  - the whole's 2S, where none is given, is the fragments' 2S added high-spin; a 2S given
    otherwise lands, as one block, on the first fragment without a line that can hold it;
    where every fragment has its line, any 2S the whole's electrons allow is taken as given;
  - a fragment of ghost atoms only is neutral and closed-shell; a real one may be left without
    electrons (a bare nucleus, H+), which only a run of the whole can take;
  - (dfmp2) a frame of one fragment is the whole: its line and a given charge or 2S must agree.
Where the rules place a charge or a spin on one of several fragments without a line, the
fragments' own states are a guess (QCElemental takes it): `ChargeSpin.fragments` is None and
`undetermined` says why, so that a counterpoise computation, which runs each fragment, refuses
it while a run of the whole goes on. Every impossible value is bad input naming its fragment and,
where a file gives it, its line.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from ..util.errors import InputError, option
from .basis import atomic_number


@dataclass(frozen=True)
class ChargeSpin:
    """charge and spin (2S) of the whole; fragments: ((charge, 2S), ...) per fragment, or None
    where the input leaves them a guess (undetermined: why); notes: defaults a user should see."""

    charge: int
    spin: int
    fragments: tuple | None
    undetermined: str | None = None
    notes: tuple = ()


def charge_and_spin(frame, charge=None, spin=None, charge_name=None, spin_name=None) -> ChargeSpin:
    """The charge and 2S of `frame` (a chem.Frame: atoms, fragments with the charge and
    multiplicity their input gives, or None) and of each of its fragments, by the module's
    rules; charge / spin: the whole's where given (None: from the fragments). charge_name /
    spin_name: how messages name them (default: the --charge / --spin option, or the API's
    keyword). InputError naming the first impossible value."""
    charge_name = charge_name or option("charge")
    spin_name = spin_name or option("spin")
    fragments = frame.fragments
    neutral = [sum(atomic_number(a.symbol) for a in frame.atoms[f.start:f.stop] if not a.ghost) for f in fragments]
    ghosts_only = [all(a.ghost for a in frame.atoms[f.start:f.stop]) for f in fragments]
    for k, fragment in enumerate(fragments):
        if fragment.charge is not None:
            _check_fragment(frame, k, neutral[k], ghosts_only[k])
    if len(fragments) == 1 and fragments[0].charge is not None:  # the line is the whole's
        return _one_fragment(frame, charge, spin, neutral[0], charge_name, spin_name)
    open_ = [k for k, f in enumerate(fragments) if f.charge is None]
    charges, undetermined = _placed_charge(frame, charge, neutral, ghosts_only, open_, charge_name)
    electrons = [n - q for n, q in zip(neutral, charges)]
    spins = [fragments[k].multiplicity - 1 if fragments[k].charge is not None else electrons[k] % 2
             for k in range(len(fragments))]
    whole_electrons = sum(electrons)
    _check_electrons(frame, whole_electrons, f"charge {sum(charges)}")
    notes = ()
    if spin is None:
        if sum(s > 0 for s in spins) > 1:
            notes = (f"2S {sum(spins)}: the fragments' 2S ({', '.join(map(str, spins))}) added high-spin, as Psi4 and "
                     f"QCElemental do (give {spin_name} for another coupling)",)
        elif any(spins[k] for k in open_):
            notes = (f"2S {sum(spins)}: the lowest spin of {whole_electrons} electrons (no {spin_name} or 'charge "
                     "multiplicity' line gave one)",)
        return ChargeSpin(sum(charges), sum(spins), None if undetermined else tuple(zip(charges, spins)),
                          undetermined, notes)
    _check_whole_spin(frame, spin, whole_electrons, spin_name)
    spin = int(spin)
    if spin != sum(spins) and open_:
        undetermined = undetermined or _place_spin(frame, spin, spins, electrons, open_, spin_name)
    return ChargeSpin(sum(charges), spin, None if undetermined else tuple(zip(charges, spins)), undetermined)


def _placed_charge(frame, charge, neutral, ghosts_only, open_, charge_name) -> tuple:
    """([charge of each fragment], why that split is a guess or None): the lines' charges, the
    rest of a given whole charge as one block on the first fragment without a line that can hold it."""
    charges = [f.charge or 0 for f in frame.fragments]
    if charge is None:
        return charges, None
    if isinstance(charge, bool) or not isinstance(charge, Integral):  # (Settings checks its own: ASE's too)
        raise InputError(f"{charge_name} must be a whole number, got {charge!r}")
    charge = int(charge)
    _check_electrons(frame, sum(neutral) - charge, f"{charge_name} {charge}")
    rest = charge - sum(charges)
    if not rest:
        return charges, None
    if not open_:
        raise InputError(f"{frame.name}: {charge_name} {charge} disagrees with the fragments' 'charge "
                         f"multiplicity' lines (charge {sum(charges)} in all)")
    holders = [k for k in open_ if not ghosts_only[k] and neutral[k] - rest >= 0]
    if not holders:
        raise InputError(f"{frame.name}: {charge_name} {charge} leaves charge {rest:+d} beyond the fragments' "
                         "lines, and no fragment without a line can hold it")
    charges[holders[0]] += rest
    if len(open_) == 1:
        return charges, None
    return charges, (f"{frame.name}: {charge_name} {charge} leaves charge {rest:+d} to fragments {_listed(open_)}, "
                     "which have no 'charge multiplicity' line: which one holds it is not given; write each "
                     "fragment's line after its '--'")


def _place_spin(frame, spin, spins, electrons, open_, spin_name):
    """Put the whole's 2S `spin` beyond the fragments' (`spins`, changed in place) as one block on
    the first fragment without a line that can take it; why the split is a guess, or None."""
    holder = next((k for k in open_ if _possible(spin - sum(spins) + spins[k], electrons[k])), None)
    if holder is None:
        return (f"{frame.name}: 2S {spin} ({spin_name}) is not the fragments' 2S added high-spin "
                f"({' + '.join(map(str, spins))}), and no fragment without a line can take the difference: "
                "write each fragment's 'charge multiplicity' line after its '--'")
    spins[holder] += spin - sum(spins)
    if len(open_) == 1:
        return None
    return (f"{frame.name}: 2S {spin} ({spin_name}) leaves unpaired electrons to fragments {_listed(open_)}, "
            "which have no 'charge multiplicity' line: which one holds them is not given; write each fragment's "
            "line after its '--'")


def _one_fragment(frame, charge, spin, neutral, charge_name, spin_name) -> ChargeSpin:
    """A frame of one fragment with its `charge multiplicity` line: the line is the whole's."""
    line = frame.fragments[0]
    given = [(name, value, stated) for name, value, stated in
             ((charge_name, charge, line.charge), (spin_name, spin, line.multiplicity - 1))
             if value is not None and value != stated]
    if given:
        name, value, stated = given[0]
        what = "charge" if name == charge_name else "2S"
        raise InputError(f"{_where(frame, line)}: {name} {value} disagrees with the file's 'charge multiplicity' line "
                         f"'{line.charge} {line.multiplicity}' ({what} {stated})")
    return ChargeSpin(line.charge, line.multiplicity - 1, ((line.charge, line.multiplicity - 1),))


def _check_fragment(frame, k, neutral, ghosts_only) -> None:
    """InputError unless fragment k's line is possible for its atoms."""
    fragment = frame.fragments[k]
    stated = f"fragment {k + 1} ('{fragment.charge} {fragment.multiplicity}')"
    if ghosts_only and (fragment.charge, fragment.multiplicity) != (0, 1):
        raise InputError(f"{_where(frame, fragment)}: {stated} holds ghost atoms only (no nuclei, no electrons): "
                         "its line can only be '0 1'")
    electrons = neutral - fragment.charge
    if electrons < 0:  # (none left: a bare nucleus, such as H+, is a fragment QCElemental allows)
        raise InputError(f"{_where(frame, fragment)}: {stated}: charge {fragment.charge} leaves {electrons} electrons")
    if not _possible(fragment.multiplicity - 1, electrons):
        raise InputError(f"{_where(frame, fragment)}: {stated}: multiplicity {fragment.multiplicity} "
                         f"(2S {fragment.multiplicity - 1}) is impossible with its {electrons} electrons")


def _check_electrons(frame, electrons, given) -> None:
    if electrons <= 0:
        raise InputError(f"{frame.name}: {given} leaves {electrons} electrons")


def _check_whole_spin(frame, spin, electrons, spin_name) -> None:
    if isinstance(spin, bool) or not isinstance(spin, Integral):
        raise InputError(f"{spin_name} must be a whole number (2S), got {spin!r}")
    if not _possible(spin, electrons):
        if spin == 0 and electrons % 2:
            raise InputError(f"{frame.name}: 2S 0 ({spin_name}) with an odd electron count ({electrons}): a closed "
                             "shell needs an even number")
        raise InputError(f"{frame.name}: 2S {spin} ({spin_name}) is impossible with {electrons} electrons")


def _possible(spin, electrons) -> bool:
    """Whether 2S `spin` is possible for `electrons` electrons: 0 <= 2S <= n, of n's parity."""
    return 0 <= spin <= electrons and (electrons - spin) % 2 == 0


def _where(frame, fragment) -> str:
    line = getattr(fragment, "line", None)
    return f"{frame.name}, line {line}" if line else frame.name


def _listed(indices) -> str:
    numbers = [str(k + 1) for k in indices]
    return ", ".join(numbers[:-1]) + f" and {numbers[-1]}" if len(numbers) > 1 else numbers[0]
