"""The linalg layer (dfmp2/linalg/): the exact (sliced) product and the batched GEMM on every backend
against numpy's fp64; the blocked potrf against numpy's fp64 Cholesky on the torch backend (fp64: 1e-12) and on the emulated NeuronCores (fp32 panels and updates: a few 1e-7 of L),
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


@pytest.mark.parametrize("device, api", [("cpu", None), ("trn1", "0.2"), ("trn2", "0.7")])
def test_exact_product_keeps_what_fp32_loses(monkeypatch, device, api):
    """linalg.exact_product C = A^T B of fp64 operands, with columns whose products cancel to 1e-6
    of their terms: every element within 2^-30 of sum_k |A_km| |B_kn| of numpy's fp64 product, the
    cancelled ones to 1e-4 of themselves, on every backend (NeuronCores: Ozaki slices through
    exact_matmul_kernel), where the same product in fp32 misses the cancelled ones by more."""
    import torch

    from dfmp2.linalg import exact_product

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    rng = np.random.default_rng(8)
    k, m, n = 300, 70, 40
    a = rng.standard_normal((k, m))
    b = rng.standard_normal((k, n))
    b -= a[:, :n] * (a[:, :n] * b).sum(0) / (a[:, :n] ** 2).sum(0)  # column j of B against A's j: ~0
    b[:, :n] += 1e-6 * a[:, :n]
    reference = a.T @ b
    backend = get_backend(device, "fp64" if device == "cpu" else "fp32", simulate=device != "cpu", nki_api=api)
    c = exact_product(backend, a, b)
    assert (np.abs(c - reference) <= 2.0**-30 * (np.abs(a).T @ np.abs(b))).all()  # fp32: ~2^-24 of it
    cancelled = np.abs(np.diag(reference)).min()
    assert np.abs(np.diag(c) - np.diag(reference)).max() < 1e-4 * cancelled
    fp32 = (torch.from_numpy(a.T).float() @ torch.from_numpy(b).float()).double().numpy()
    assert np.abs(np.diag(fp32) - np.diag(reference)).max() > 1e-4 * cancelled
    if device != "cpu":
        assert backend.calls["exact_matmul_kernel"] == 1


@pytest.mark.parametrize("device", ["cpu", "trn2"])
def test_batched_gemm_is_a_gemm_per_batch(monkeypatch, device):
    import torch

    from dfmp2.linalg import batched_gemm

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((3, 130, 70)), rng.standard_normal((3, 70, 50))
    backend = get_backend(device, "fp32", simulate=device != "cpu", nki_api="0.7" if device != "cpu" else None)
    c = batched_gemm(backend, torch.from_numpy(a).float(), torch.from_numpy(b).float())
    reference = np.einsum("bmk,bkn->bmn", a, b)
    assert tuple(c.shape) == (3, 130, 50)
    assert np.abs(c.double().numpy() - reference).max() < 1e-5 * np.abs(reference).max()
    if device != "cpu":
        assert backend.calls["gemm_kernel"] == 3
