"""NKI kernels on the emulator, through the NKI backend (padding, chunking, bucketing), against
fp64 references: every size in SIZES in each dimension on trn1 limits under nki 0.2 rules
(Neuron SDK 2.28) and trn2 limits under 0.6 rules, and every kernel at one size under all four
(target, release) pairs, 0.3 on trn1 (disputed) and 0.2 on trn2 included; relative error <= 1e-5."""

import numpy as np
import pytest
import torch

from dfmp2.kernels.nki_backend import NkiBackend

SIZES = [1, 7, 127, 128, 129, 300, 513, 1100]
TARGETS = [("trn1", "0.2"), ("trn2", "0.6")]  # both targets, both rule sets (0.2 and 0.3+)
ALL_PAIRS = [("trn1", "0.2"), ("trn1", "0.3"), ("trn2", "0.2"), ("trn2", "0.6")]
REL_TOL = 1e-5


def rel_err(value, reference):
    value, reference = np.asarray(value, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return float(np.max(np.abs(value - reference)) / np.max(np.abs(reference)))


def f32(array):
    return torch.from_numpy(np.asarray(array, dtype=np.float32))


def sized(base, dim, size):
    dims = dict(base)
    dims[dim] = size
    return dims


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("dim", ["m", "k", "n"])
@pytest.mark.parametrize("size", SIZES)
def test_gemm(target, api, dim, size):
    d = sized({"m": 129, "k": 129, "n": 129}, dim, size)
    rng = np.random.default_rng(size)
    a, b = rng.standard_normal((d["m"], d["k"])), rng.standard_normal((d["k"], d["n"]))
    backend = NkiBackend(target, simulate=True, nki_api=api)
    out = backend.gemm(f32(a), f32(b))
    assert out.shape == (d["m"], d["n"])
    assert rel_err(out, a @ b) <= REL_TOL
    assert backend.calls["gemm_kernel"] == 1


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("dim", ["n", "w"])
@pytest.mark.parametrize("size", SIZES)
def test_syrk_lower_triangle(target, api, dim, size):
    d = sized({"n": 129, "w": 128}, dim, size)
    rng = np.random.default_rng(size + 1)
    c = rng.standard_normal((d["n"], d["n"]))
    panel = rng.standard_normal((d["n"], d["w"]))
    out = NkiBackend(target, simulate=True, nki_api=api).syrk(f32(c), f32(panel)).numpy()
    lower = np.tril_indices(d["n"])
    assert rel_err(out[lower], (c - panel @ panel.T)[lower]) <= REL_TOL


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("dim", ["rows", "naux"])
@pytest.mark.parametrize("size", SIZES)
def test_trsm_whitening(target, api, dim, size):
    d = sized({"rows": 129, "naux": 129}, dim, size)
    rng = np.random.default_rng(size + 2)
    g = rng.standard_normal((d["naux"], d["naux"]))
    lower = np.linalg.cholesky(g @ g.T / d["naux"] + np.eye(d["naux"]))  # well conditioned
    x = rng.standard_normal((d["rows"], d["naux"]))
    out = NkiBackend(target, simulate=True, nki_api=api).solve_lower_transposed(f32(lower), f32(x))
    assert rel_err(out, x @ np.linalg.inv(lower).T) <= REL_TOL


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("dim, size", [(dim, size) for dim in ("nao", "nocc", "nvir") for size in SIZES]
                         # the auxiliary index only batches the same work: no need for 1100 of them
                         + [("naux", size) for size in (1, 7, 129)])
def test_ao2mo(target, api, dim, size):
    d = sized({"naux": 7, "nao": 7, "nocc": 7, "nvir": 7}, dim, size)
    rng = np.random.default_rng(size + 3)
    ints = rng.standard_normal((d["naux"], d["nao"], d["nao"]))
    ints = ints + ints.transpose(0, 2, 1)
    c_occ = rng.standard_normal((d["nao"], d["nocc"]))
    c_vir = rng.standard_normal((d["nao"], d["nvir"]))
    out = NkiBackend(target, simulate=True, nki_api=api).ao2mo(f32(ints), f32(c_occ), f32(c_vir))
    reference = np.einsum("pmn,mi,na->iap", ints, c_occ, c_vir)
    assert out.shape == reference.shape
    assert rel_err(out, reference) <= REL_TOL


def reference_pair_energy(b_i, b_j, e_i, e_j, e_vir):
    """fp64: E_os = sum (ia|jb)^2 / D, E_ss = sum (ia|jb)[(ia|jb) - (ib|ja)] / D."""
    iajb = np.einsum("iaq,jbq->iajb", b_i, b_j)
    denom = (e_i[:, None, None, None] - e_vir[None, :, None, None]
             + e_j[None, None, :, None] - e_vir[None, None, None, :])
    e_os = np.sum(iajb * iajb / denom)
    return e_os, e_os - np.sum(iajb * iajb.transpose(0, 3, 2, 1) / denom)


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("dim", ["ni", "nj", "nvir", "naux"])
@pytest.mark.parametrize("size", SIZES)
def test_pair_energy(target, api, dim, size):
    d = sized({"ni": 2, "nj": 3, "nvir": 7, "naux": 7}, dim, size)
    rng = np.random.default_rng(size + 4)
    b_i = rng.standard_normal((d["ni"], d["nvir"], d["naux"])) * 0.1
    b_j = rng.standard_normal((d["nj"], d["nvir"], d["naux"])) * 0.1
    e_i, e_j = rng.uniform(-2, -0.5, d["ni"]), rng.uniform(-2, -0.5, d["nj"])
    e_vir = rng.uniform(0.2, 3.0, d["nvir"])
    backend = NkiBackend(target, simulate=True, nki_api=api)
    e_os, e_ss = backend.pair_energy(f32(b_i), f32(b_j), f32(e_i), f32(e_j), f32(e_vir))
    ref_os, ref_ss = reference_pair_energy(b_i, b_j, e_i, e_j, e_vir)
    assert abs(e_os - ref_os) <= REL_TOL * abs(ref_os)
    assert abs(e_ss - ref_ss) <= REL_TOL * max(abs(ref_ss), abs(ref_os))
    # (ia|jb) never leaves the chip: each call writes only its [128, 2 * pairs] partial sums
    padded_i, padded_j = (shape[1] for shape in backend._largest["pair_energy_kernel"][:2])
    calls = backend.calls["pair_energy_kernel"]
    assert backend.trace.dma_bytes_out == calls * 4 * 128 * 2 * padded_i * padded_j


@pytest.mark.parametrize("target, api", ALL_PAIRS)
def test_every_kernel_under_every_release_pair(target, api):
    """gemm, syrk, trsm, ao2mo and pair energy at one ragged size under each (target, nki) pair."""
    test_gemm(target, api, "m", 300)
    test_syrk_lower_triangle(target, api, "n", 300)
    test_trsm_whitening(target, api, "naux", 300)
    test_ao2mo(target, api, "nao", 300)
    test_pair_energy(target, api, "nvir", 300)
