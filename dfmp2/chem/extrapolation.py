"""Basis-set extrapolation: Psi4's bracket notation (`cc-pv[tq]z`) and the formulas of its `cbs()`.

Energies in Hartree; X is a basis set's cardinal number (D 2, T 3, Q 4, 5, 6).
"""

from __future__ import annotations

import math
import re

from ..util.errors import InputError, option

CARDINALS = {"d": 2, "t": 3, "q": 4, "5": 5, "6": 6}
BRACKET = re.compile(r"\[([^\]]*)\]")
SCF_ALPHA_2 = 1.63  # Halkier et al. 1999's exponent in Psi4's scf_xtpl_helgaker_2
SCF_SCHEMES = ("highest", "exponential")  # HF from the largest basis, or Psi4's scf_xtpl_helgaker_2/_3


def expand_basis(spec: str) -> list:
    """[(cardinal number X, basis spec)] of a basis spec in Psi4's notation: `cc-pv[tq]z` ->
    [(3, "cc-pvtz"), (4, "cc-pvqz")]; every bracket of a per-element spec alike
    ("O:aug-cc-pv[tq]z,H:cc-pv[tq]z"); a spec without brackets -> [(None, spec)]. InputError for
    letters that are no cardinal numbers, repeated or out of order, or brackets that differ."""
    found = {group.lower() for group in BRACKET.findall(spec)}
    separated = next((group for group in found if any(c in group for c in ", ;")), None)
    if separated is not None:
        raise InputError(f"basis {spec!r}: write the cardinal numbers in the bracket together, without separators "
                         f"(e.g. [{''.join(c for c in separated if c.isalnum())}] for [{separated}])")
    if not found:
        if "[" in spec or "]" in spec:
            raise InputError(f"basis {spec!r}: an unclosed bracket (extrapolation is written e.g. cc-pv[tq]z)")
        return [(None, spec)]
    if len(found) > 1:
        raise InputError(f"basis {spec!r}: every bracket must list the same cardinal numbers")
    plain = [entry.strip() for entry in spec.split(",") if not BRACKET.search(entry)]
    if plain:
        raise InputError(f"basis {spec!r}: {plain[0]!r} has no bracket; extrapolate every element's basis "
                         "(e.g. O:aug-cc-pv[tq]z,H:cc-pv[tq]z)")
    letters = found.pop()
    if not letters or any(c not in CARDINALS for c in letters):
        raise InputError(f"basis {spec!r}: [{letters}] is not a list of cardinal numbers (d, t, q, 5, 6; e.g. [tq])")
    numbers = [CARDINALS[c] for c in letters]
    if len(numbers) > 3 or numbers != sorted(set(numbers)):
        raise InputError(f"basis {spec!r}: [{letters}] must give 2 or 3 cardinal numbers, each once, smallest first")
    if len(numbers) == 1:
        raise InputError(f"basis {spec!r}: [{letters}] gives one basis; extrapolation needs two or three")
    if any(b != a + 1 for a, b in zip(numbers, numbers[1:])):
        raise InputError(f"basis {spec!r}: [{letters}] must be consecutive cardinal numbers (Psi4's formulas)")
    return [(x, BRACKET.sub(letter, spec)) for letter, x in zip(letters, numbers)]


def corl_xtpl_helgaker_2(x_lo: int, e_lo: float, x_hi: int, e_hi: float) -> float:
    """Correlation energy at the basis-set limit from two: E_X = E_CBS + A X^-3 (Helgaker 1997)."""
    # E_CBS = (X_hi^3 E_hi - X_lo^3 E_lo) / (X_hi^3 - X_lo^3)
    return (x_hi**3 * e_hi - x_lo**3 * e_lo) / (x_hi**3 - x_lo**3)


def scf_xtpl_helgaker_2(x_lo: int, e_lo: float, x_hi: int, e_hi: float, alpha: float = SCF_ALPHA_2) -> float:
    """HF energy at the limit from two consecutive X: E_X = E_CBS + B exp(-alpha X) (Halkier 1999)."""
    # B = (E_hi - E_lo) / (exp(-alpha X_lo) (exp(-alpha) - 1));  E_CBS = E_hi - B exp(-alpha X_hi)
    beta = (e_hi - e_lo) / (math.exp(-alpha * x_lo) * (math.exp(-alpha) - 1.0))
    return e_hi - beta * math.exp(-alpha * x_hi)


def scf_xtpl_helgaker_3(x_lo: int, e_lo: float, x_mid: int, e_mid: float, x_hi: int, e_hi: float) -> float:
    """HF energy at the limit from three consecutive X: E_X = E_CBS + B exp(-c X) (Feller 1992)."""
    # ratio = (E_hi - E_mid) / (E_mid - E_lo) = exp(-c);  B = (E_hi - E_mid) / (exp(-c X_mid) (ratio - 1))
    ratio = (e_hi - e_mid) / (e_mid - e_lo)
    if not ratio > 0 or ratio == 1:
        raise InputError("the three HF energies do not converge exponentially (the ratio of their steps is "
                         f"{ratio:.3g}); use --scf-extrapolation highest")
    c = -math.log(ratio)
    beta = (e_hi - e_mid) / (math.exp(-c * x_mid) * (ratio - 1.0))
    return e_hi - beta * math.exp(-c * x_hi)


def check_scf_scheme(scheme: str) -> str:
    """scheme, if it is one of SCF_SCHEMES; InputError naming it otherwise."""
    if scheme not in SCF_SCHEMES:
        raise InputError(f"{option('scf_extrapolation', scheme)}: expected one of {', '.join(SCF_SCHEMES)}")
    return scheme


def extrapolate_scf(points, scheme: str) -> float:
    """The HF (reference) energy at the limit from [(X, E)] smallest X first: 'highest' takes the
    largest basis's; 'exponential' Psi4's scf_xtpl_helgaker_2 (two) or scf_xtpl_helgaker_3 (three)."""
    if check_scf_scheme(scheme) == "highest":
        return points[-1][1]
    if len(points) == 2:
        return scf_xtpl_helgaker_2(*points[0], *points[1])
    return scf_xtpl_helgaker_3(*points[0], *points[1], *points[2])


def extrapolate_correlation(points) -> float:
    """A correlation energy at the limit from [(X, E)]: Helgaker's X^-3 on the two largest X."""
    return corl_xtpl_helgaker_2(*points[-2], *points[-1])


def scheme_names(scf_scheme: str, nbasis: int) -> dict:
    """The Psi4 names of the formulas used, for the record."""
    scf = "xtpl_highest_1" if scf_scheme == "highest" else f"scf_xtpl_helgaker_{nbasis}"
    return {"scf": scf, "corl": "corl_xtpl_helgaker_2 (the two largest bases)"}
