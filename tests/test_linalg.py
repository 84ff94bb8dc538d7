"""The linalg layer (dfmp2/linalg/): the blocked potrf against numpy's fp64 Cholesky on the torch
backend (fp64: 1e-12) and on the emulated NeuronCores (fp32 panels and updates: a few 1e-7 of L),
with its work on the device (trsm_kernel, syrk_kernel launches), ragged sizes, and the refusal of an
indefinite matrix."""

import numpy as np
import pytest

from dfmp2.kernels import get_backend
from dfmp2.linalg import potrf
from dfmp2.util.errors import ComputationError


def spd(n, seed=0):
    """A metric-like symmetric positive definite matrix: A A^T / n + I (eigenvalues 1 to ~5)."""
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a @ a.T / n + np.eye(n)


@pytest.mark.parametrize("n", [100, 128, 300])
def test_potrf_on_torch_is_numpys_cholesky(n):
    a = spd(n)
    lower = potrf(get_backend("cpu", "fp64"), a)
    assert np.abs(lower - np.linalg.cholesky(a)).max() < 1e-12
    assert np.array_equal(lower, np.tril(lower))


@pytest.mark.parametrize("target, api", [("trn1", "0.2"), ("trn2", "0.7")])
def test_potrf_on_a_neuroncore_runs_its_panels_and_updates_there(monkeypatch, target, api):
    """n = 300: three block columns, ragged; trsm_kernel and syrk_kernel run twice each; L within
    5e-7 of numpy's fp64 factor (fp32 updates of a well-conditioned matrix), A = L L^T to 5e-7."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    a = spd(300, seed=1)
    backend = get_backend(target, simulate=True, nki_api=api)
    lower = potrf(backend, a)
    reference = np.linalg.cholesky(a)
    assert np.abs(lower - reference).max() < 5e-7 * np.abs(reference).max()  # measured 4.8e-8
    assert np.abs(lower @ lower.T - a).max() < 5e-7 * np.abs(a).max()  # measured 8.0e-8
    assert backend.calls["trsm_kernel"] == 2 and backend.calls["syrk_kernel"] == 2


def test_potrf_refuses_an_indefinite_matrix():
    a = spd(200)
    a[150, 150] = -1.0
    with pytest.raises(ComputationError, match="diagonal block at 128 is not positive definite"):
        potrf(get_backend("cpu", "fp64"), a)
