"""The Laplace quadrature of 1/Delta for the opposite-spin MP2 energy (Almlof 1991; Jung, Lochan,
Dutoi, Head-Gordon 2004), fitted here for the run's orbital-energy range, with its error bound.

    1/x ~ sum_k w_k exp(-t_k x)   for x in [x_min, x_max] (Eh): x = Delta_ijab = e_a + e_b - e_i - e_j
    relative error  r(x) = 1 - x sum_k w_k exp(-t_k x),   bound  eps = max |r(x)| over [x_min, x_max]
    E_os = - sum_ijab (ia|jb)^2 / Delta   ->   E_os(L) = - sum_k w_k sum_PQ Z^a_PQ(t_k) Z^b_PQ(t_k)
    Z_PQ(t) = sum_ia B_ia^P B_ia^Q exp(-(e_a - e_i) t)                      (per spin channel)
Every term (ia|jb)^2 is >= 0, so |E_os(L) - E_os| <= eps |E_os| <= eps |E_os(L)| / (1 - eps):
the bound on the energy follows from the quadrature's alone (`energy_error_bound`).

The fit (no tables): on y = x / x_min in [1, R], R = x_max / x_min, the exponents log t_k are
optimised by Levenberg-Marquardt with the weights w_k solved by linear least squares inside each
evaluation (variable projection), on a log-spaced grid of y; the grid's weights are then moved
towards the largest errors (Lawson's iteration), which takes the least-squares fit towards the
minimax one, and the best fit seen is kept. The bound is measured, not assumed: |r| on a dense
log grid with every local maximum refined by a bounded scalar search (`relative_error_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..run.settings import LAPLACE_MOST_POINTS
from ..util.errors import InputError, option

MOST_POINTS = LAPLACE_MOST_POINTS  # the most quadrature points `quadrature_for` fits before it says the range needs more
LAWSON_STEPS = 12  # grid re-weightings towards the minimax fit
BOUND_GRID = 20001  # points of the dense log grid the bound starts from


@dataclass(frozen=True)
class LaplaceQuadrature:
    """1/x ~ sum_k weights[k] exp(-exponents[k] x) on [x_min, x_max] (Eh); exponents in 1/Eh,
    weights in 1/Eh; error_bound: max relative error over the range (measured)."""

    exponents: tuple
    weights: tuple
    x_min: float
    x_max: float
    error_bound: float

    @property
    def points(self) -> int:
        return len(self.exponents)

    def record(self) -> dict:
        """The result's `laplace` entry (JSON)."""
        return {"points": self.points, "error_bound": self.error_bound, "x_min": self.x_min, "x_max": self.x_max,
                "exponents": list(self.exponents), "weights": list(self.weights)}


def _weights(tau, y, grid_weights):
    """The w minimising sum_j u_j (1 - y_j sum_k w_k exp(-tau_k y_j))^2 for fixed exponents tau."""
    root = np.sqrt(grid_weights)
    design = y[:, None] * np.exp(-np.outer(y, tau)) * root[:, None]
    w, *_ = np.linalg.lstsq(design, root, rcond=None)
    return w


def _relative_error(y, tau, w):
    """r(y) = 1 - y sum_k w_k exp(-tau_k y) on the scaled range."""
    return 1.0 - y * (np.exp(-np.outer(y, tau)) @ w)


def _fit_scaled(points: int, ratio: float, start=None) -> tuple:
    """(max |r| on the fitting grid, tau, w) of a `points`-term fit on y in [1, ratio]."""
    from scipy.optimize import least_squares

    y = np.exp(np.linspace(0.0, math.log(ratio), max(400, 60 * points)))
    s = np.linspace(math.log(0.3 / ratio), math.log(1.0 + points), points) if start is None else np.asarray(start)
    u = np.full(y.size, 1.0 / y.size)
    best = None
    for _ in range(LAWSON_STEPS):
        def residual(log_tau, u=u):
            tau = np.exp(log_tau)
            return np.sqrt(u) * _relative_error(y, tau, _weights(tau, y, u))

        s = np.sort(least_squares(residual, s, method="lm", xtol=1e-12, ftol=1e-14, max_nfev=200 * points).x)
        tau = np.exp(s)
        w = _weights(tau, y, u)
        r = np.abs(_relative_error(y, tau, w))
        if best is None or r.max() < best[0]:
            best = (float(r.max()), tau, w)
        u = u * (r + 1e-300)  # Lawson: more weight where the error is largest
        u /= u.sum()
    return best


def relative_error_bound(exponents, weights, x_min: float, x_max: float) -> float:
    """max |1 - x sum_k w_k exp(-t_k x)| over [x_min, x_max]: |r| on a dense log grid, each local
    maximum refined by a bounded search between its neighbours, and the ends."""
    from scipy.optimize import minimize_scalar

    t, w = np.asarray(exponents, dtype=float), np.asarray(weights, dtype=float)
    z = np.linspace(math.log(x_min), math.log(x_max), BOUND_GRID)
    r = np.abs(_relative_error(np.exp(z), t, w))
    bound = float(r.max())  # (the grid holds both ends)
    peaks = np.where((r[1:-1] >= r[:-2]) & (r[1:-1] >= r[2:]))[0] + 1

    def negative(log_x):
        return -abs(float(_relative_error(np.array([math.exp(log_x)]), t, w)[0]))

    for i in peaks:
        found = minimize_scalar(negative, bounds=(z[i - 1], z[i + 1]), method="bounded", options={"xatol": 1e-13})
        bound = max(bound, -found.fun)
    return float(bound)


def fit_quadrature(x_min: float, x_max: float, points: int, start=None) -> LaplaceQuadrature:
    """A `points`-term quadrature of 1/x on [x_min, x_max] (Eh, 0 < x_min <= x_max), its bound measured.
    start: log exponents of the scaled range to start from (a fit with one point fewer, extended)."""
    if not (x_min > 0 and x_max >= x_min and math.isfinite(x_max)):
        raise InputError(f"the Laplace quadrature needs 0 < x_min <= x_max, got [{x_min:g}, {x_max:g}] Eh")
    if not (isinstance(points, int) and 1 <= points <= MOST_POINTS):
        raise InputError(f"{option('laplace')}: the number of quadrature points must be 1-{MOST_POINTS}, got {points!r}")
    ratio = max(x_max / x_min, 1.0 + 1e-9)
    _, tau, w = _fit_scaled(points, ratio, start)
    exponents, weights = tau / x_min, w / x_min  # 1/x = (1/x_min) (1/y): t = tau / x_min, w = w_y / x_min
    bound = relative_error_bound(exponents, weights, x_min, x_min * ratio)
    return LaplaceQuadrature(tuple(float(t) for t in exponents), tuple(float(v) for v in weights),
                             float(x_min), float(x_max), bound)


def quadrature_for(x_min: float, x_max: float, relative_error: float) -> LaplaceQuadrature:
    """The quadrature with the fewest points whose bound is <= relative_error: fits at two sizes,
    the count extrapolated from their errors (which fall about geometrically with the points),
    then one point more or fewer until the bound holds with the fewest."""
    if not (0 < relative_error < 1):
        raise InputError(f"the Laplace quadrature's relative error must be in (0, 1), got {relative_error:g}")
    fits = {}

    def fit(n):
        if n not in fits:
            fits[n] = fit_quadrature(x_min, x_max, n)
            if n - 1 in fits:  # also from the exponents of the fit with one point fewer, one added above them
                s = np.log(np.asarray(fits[n - 1].exponents) * x_min)
                grown = fit_quadrature(x_min, x_max, n, np.append(s, s[-1] + 0.7))
                fits[n] = min(fits[n], grown, key=lambda q: q.error_bound)
        return fits[n]

    low, high = fit(3), fit(6)
    slope = (math.log(high.error_bound) - math.log(low.error_bound)) / 3.0  # log error per point (< 0)
    guess = 6 + (math.ceil((math.log(relative_error) - math.log(high.error_bound)) / slope) if slope < 0 else 0)
    n = min(max(guess, 1), MOST_POINTS)
    while n < MOST_POINTS and fit(n).error_bound > relative_error:
        n += 1
    while n > 1 and fit(n - 1).error_bound <= relative_error:
        n -= 1
    if fit(n).error_bound > relative_error:
        raise InputError(f"{option('laplace', 'auto')}: {MOST_POINTS} points reach a relative error of {fit(n).error_bound:.2g} "
                         f"on [{x_min:.4g}, {x_max:.4g}] Eh, not {relative_error:.2g}: use canonical MP2 "
                         f"({option('laplace', 'off')}) for this system")
    return fit(n)


def energy_error_bound(quadrature: LaplaceQuadrature, e_os: float) -> float:
    """|E_os(L) - E_os| <= eps |E_os(L)| / (1 - eps) (Eh), for the quadrature's eps and E_os(L) = e_os."""
    eps = quadrature.error_bound
    return eps * abs(e_os) / (1.0 - eps)


def denominator_range(channel_pairs) -> tuple:
    """(x_min, x_max) of Delta = (e_a - e_i) + (e_b - e_j) over the opposite-spin pairs of channels:
    channel_pairs [((e_occ, e_vir) of spin a, (e_occ, e_vir) of spin b)] (numpy, Eh, active orbitals).
    A zero or negative gap has no Laplace transform: InputError, one line."""
    lows, highs = [], []
    for (occ_a, vir_a), (occ_b, vir_b) in channel_pairs:
        gap_a, gap_b = np.min(vir_a) - np.max(occ_a), np.min(vir_b) - np.max(occ_b)
        if gap_a <= 0 or gap_b <= 0:
            raise InputError(f"the Laplace transform needs a positive orbital-energy gap (e_LUMO - e_HOMO), got "
                             f"{min(gap_a, gap_b):.6g} Eh: run canonical MP2 ({option('laplace', 'off')})")
        lows.append(gap_a + gap_b)
        highs.append((np.max(vir_a) - np.min(occ_a)) + (np.max(vir_b) - np.min(occ_b)))
    return float(min(lows)), float(max(highs))
