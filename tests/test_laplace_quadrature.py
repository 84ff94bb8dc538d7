"""The Laplace quadrature of 1/x (dfmp2.mp2.laplace, issue 75 item 1) against exact 1/x."""

import numpy as np
import pytest

from dfmp2.mp2.laplace import denominator_range, energy_error_bound, fit_quadrature, quadrature_for
from dfmp2.util.errors import InputError


@pytest.mark.parametrize("x_min, x_max, eps", [(1.34, 49.0, 6e-7), (0.5, 100.0, 1e-6), (1.0, 5.0, 1e-9)])
def test_the_bound_holds_against_exact_inverse_and_meets_the_request(x_min, x_max, eps):
    q = quadrature_for(x_min, x_max, eps)
    assert q.error_bound <= eps
    x = np.concatenate([[x_min, x_max], np.exp(np.random.default_rng(0).uniform(np.log(x_min), np.log(x_max), 50000))])
    approx = np.exp(-np.outer(x, q.exponents)) @ np.asarray(q.weights)
    measured = np.max(np.abs(approx * x - 1.0))
    assert measured <= q.error_bound * (1 + 1e-9)
    assert measured >= 0.5 * q.error_bound  # the bound is tight, not a loose overestimate
    fewer = fit_quadrature(x_min, x_max, q.points - 1) if q.points > 1 else None
    assert fewer is None or fewer.error_bound > eps  # the fewest points that meet it


def test_the_energy_bound_holds_for_a_sum_of_positive_terms():
    """E = -sum c / Delta with c >= 0 (the (ia|jb)^2): |E(L) - E| <= energy_error_bound."""
    rng = np.random.default_rng(1)
    delta, c = rng.uniform(1.0, 30.0, 20000), rng.uniform(0, 1e-6, 20000)
    q = fit_quadrature(1.0, 30.0, 6)
    exact = -np.sum(c / delta)
    laplace = -np.sum(c * (np.exp(-np.outer(delta, q.exponents)) @ np.asarray(q.weights)))
    assert abs(laplace - exact) <= energy_error_bound(q, laplace)


def test_a_zero_or_negative_gap_is_refused():
    occ, vir = np.array([-1.0, -0.3]), np.array([-0.3, 1.0])
    with pytest.raises(InputError, match="positive orbital-energy gap"):
        denominator_range([((occ, vir), (occ, vir))])
    assert denominator_range([((occ, vir + 0.5), (occ, vir + 0.5))]) == pytest.approx((1.0, 5.0))
