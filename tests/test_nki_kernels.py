"""NKI kernels on the emulator, through the NKI backend (padding, chunking, bucketing), against
fp64 references: every size in SIZES in each dimension on trn1 limits under nki 0.2 rules
(Neuron SDK 2.28) and trn2 limits under 0.6 rules, and every kernel at one size under seven
(target, release) pairs: trn1 0.2 and 0.3 (disputed), trn2 0.2, 0.6 and 0.7, trn3 0.6 and 0.7; relative
error <= 1e-5."""

import numpy as np
import pytest
import torch

from dfmp2.kernels.nki.backend import NkiBackend
from dfmp2.kernels.nki.launch import pair_blocks

SIZES = [1, 7, 127, 128, 129, 300, 513, 1100]
TARGETS = [("trn1", "0.2"), ("trn2", "0.6")]  # both targets, both rule sets (0.2 and 0.3+)
ALL_PAIRS = [("trn1", "0.2"), ("trn1", "0.3"), ("trn2", "0.2"), ("trn2", "0.6"), ("trn2", "0.7"), ("trn3", "0.6"),
             ("trn3", "0.7")]
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


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("dim, size", [("nao", 1), ("nao", 129), ("nao", 1100), ("nocc", 300), ("nvir", 513)])
def test_ao2mo_plain_fp32_transform(target, api, dim, size):
    """transform="fp32": one plain fp32 product per half, ragged sizes, against fp64."""
    d = sized({"naux": 3, "nao": 7, "nocc": 7, "nvir": 7}, dim, size)
    rng = np.random.default_rng(size + 5)
    ints = rng.standard_normal((d["naux"], d["nao"], d["nao"]))
    ints = ints + ints.transpose(0, 2, 1)
    c_occ = rng.standard_normal((d["nao"], d["nocc"]))
    c_vir = rng.standard_normal((d["nao"], d["nvir"]))
    backend = NkiBackend(target, simulate=True, nki_api=api, transform="fp32")
    out = backend.ao2mo(f32(ints), f32(c_occ), f32(c_vir))
    assert rel_err(out, np.einsum("pmn,mi,na->iap", ints, c_occ, c_vir)) <= REL_TOL
    assert "host:slice_operands" not in backend.calls


@pytest.mark.parametrize("target, api, nao, nocc, nvir, naux", [
    ("trn1", "0.2", 1408, 8, 1400, 3),  # the shape whose resident C_vir slices once overflowed SBUF
    ("trn2", "0.6", 3000, 230, 131, 2),  # nbasis 3,000: 2 occupied chunks of 115 (bf16 slices)
])
def test_ao2mo_streams_c_vir_for_any_nao(target, api, nao, nocc, nvir, naux):
    """Large nao: C_vir streamed per 128 x 128 tile, C_occ in chunks that fit, H per batch of
    functions; the exact transform against fp64, inside the target's usable SBUF."""
    rng = np.random.default_rng(nao)
    ints = rng.standard_normal((naux, nao, nao))
    ints = ints + ints.transpose(0, 2, 1)
    c_occ, c_vir = rng.standard_normal((nao, nocc)), rng.standard_normal((nao, nvir))
    backend = NkiBackend(target, simulate=True, nki_api=api)
    out = backend.ao2mo(f32(ints), f32(c_occ), f32(c_vir))
    assert rel_err(out, np.einsum("pmn,mi,na->iap", ints, c_occ, c_vir, optimize=True)) <= REL_TOL
    from nki_emulator import TARGETS as LIMITS
    assert backend.trace.peak_sbuf_bytes <= LIMITS[target].sbuf_usable_bytes_per_partition
    assert backend.calls["ao2mo_kernel"] == 1


@pytest.mark.parametrize("target, api", TARGETS)
def test_exact_transform_survives_cancellation_that_plain_fp32_does_not(target, api):
    """A nearly linearly dependent AO basis (pairs of functions that differ by ~3%) and MO
    coefficients of +-30 on each pair, as diffuse sets produce: each half's sums cancel to a few
    % of their terms. The exact-product transform keeps the fp64 result to the fp32 rounding of
    the output; plain fp32 products and sums lose 100x more."""
    rng = np.random.default_rng(11)
    SCALE, DELTA = 30.0, 3e-2
    nprim, naux, nocc, nvir = 32, 2, 5, 9
    basis = np.empty((nprim, 2 * nprim))
    basis[:, 0::2] = rng.standard_normal((nprim, nprim))
    basis[:, 1::2] = basis[:, 0::2] + DELTA * rng.standard_normal((nprim, nprim))
    metric = rng.standard_normal((naux, nprim, nprim))
    ints = np.einsum("km,pkl,ln->pmn", basis, metric + metric.transpose(0, 2, 1), basis)

    def coefficients(n):
        c = rng.standard_normal((2 * nprim, n))
        c[1::2] = -SCALE * c[0::2] + rng.standard_normal((nprim, n))
        c[0::2] *= SCALE
        return c

    c_occ, c_vir = coefficients(nocc), coefficients(nvir)
    reference = np.einsum("pmn,mi,na->iap", ints, c_occ, c_vir)
    errors = {}
    for transform in ("exact", "fp32"):
        backend = NkiBackend(target, simulate=True, nki_api=api, transform=transform)
        errors[transform] = rel_err(backend.ao2mo(torch.from_numpy(ints), torch.from_numpy(c_occ),
                                                  torch.from_numpy(c_vir)), reference)
    assert errors["exact"] < 3e-7 and errors["fp32"] > 100 * errors["exact"], errors


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
    assert abs(e_ss - ref_ss) <= REL_TOL * max(abs(ref_os), abs(ref_ss))
    # (ia|jb) never leaves the chip: each launch writes only its [128, 2 * NI * NJ] partials,
    # one launch per block of <= PAIR_BLOCK x PAIR_BLOCK pairs, ragged shapes, no padding
    blocks_i, blocks_j = pair_blocks(d["ni"]), pair_blocks(d["nj"])
    assert backend.calls["pair_energy_kernel"] == len(blocks_i) * len(blocks_j)
    written = sum(4 * 128 * 2 * (i1 - i0) * (j1 - j0) for i0, i1 in blocks_i for j0, j1 in blocks_j)
    assert backend.trace.dma_bytes_out == written


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("n, nvir, naux", [(1, 7, 7), (7, 127, 129), (33, 7, 7), (3, 513, 300)])
def test_pair_energy_diagonal_block(target, api, n, nvir, naux):
    """A block I = J forms only the pairs j <= i (triangle launches) and still gives the sum
    over all ordered pairs; (ia|jb) is formed once per pair: the issued Tensor Engine columns
    are the minimal ones plus ragged tiles and the diagonal transposes only."""
    rng = np.random.default_rng(n + nvir)
    b = rng.standard_normal((n, nvir, naux)) * 0.1
    e_occ, e_vir = rng.uniform(-2, -0.5, n), rng.uniform(0.2, 3.0, nvir)
    backend = NkiBackend(target, simulate=True, nki_api=api)
    block = f32(b)
    e_os, e_ss = backend.pair_energy(block, block, f32(e_occ), f32(e_occ), f32(e_vir))
    ref_os, ref_ss = reference_pair_energy(b, b, e_occ, e_occ, e_vir)
    assert abs(e_os - ref_os) <= REL_TOL * abs(ref_os)
    assert abs(e_ss - ref_ss) <= REL_TOL * max(abs(ref_os), abs(ref_ss))
    nblocks = len(pair_blocks(n))
    assert backend.calls["pair_energy_kernel"] == nblocks * (nblocks + 1) // 2
    pairs = n * (n + 1) // 2
    tiles = -(-nvir // 128)
    # every 128-row block A streams V and X columns once per auxiliary tile, plus one transpose
    minimal_columns = pairs * -(-naux // 128) * sum(nvir - 128 * a + max(0, nvir - 128 * (a + 1))
                                                     for a in range(tiles))
    assert backend.trace.matmul_columns == minimal_columns + pairs * sum(
        min(128, nvir - 128 * a) for a in range(tiles))


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("ni, nj, nvir_a, nvir_b, naux", [
    (1, 1, 7, 9, 7), (2, 3, 129, 127, 129), (3, 2, 300, 513, 200), (33, 2, 7, 1, 7), (2, 1, 1, 1100, 300)])
def test_opposite_spin_pair_energy(target, api, ni, nj, nvir_a, nvir_b, naux):
    """An alpha-beta block (exchange = 0): sum_iJaB (ia|JB)^2 / D over all a, B, different
    virtual counts per spin, ragged sizes; no exchange term; matmul columns all of V, once."""
    rng = np.random.default_rng(ni + nvir_a + nvir_b)
    b_i = rng.standard_normal((ni, nvir_a, naux)) * 0.1
    b_j = rng.standard_normal((nj, nvir_b, naux)) * 0.1
    e_i, e_j = rng.uniform(-2, -0.5, ni), rng.uniform(-2, -0.5, nj)
    e_a, e_b = rng.uniform(0.2, 3.0, nvir_a), rng.uniform(0.2, 3.0, nvir_b)
    backend = NkiBackend(target, simulate=True, nki_api=api)
    e_os, e_ss = backend.pair_energy(f32(b_i), f32(b_j), f32(e_i), f32(e_j), f32(e_a), f32(e_b))
    iajb = np.einsum("iaq,jbq->iajb", b_i, b_j)
    denom = e_i[:, None, None, None] - e_a[None, :, None, None] + e_j[None, None, :, None] - e_b[None, None, None, :]
    reference = np.sum(iajb ** 2 / denom)
    assert abs(e_os - reference) <= REL_TOL * abs(reference) and e_ss == 0.0
    assert backend.trace.matmul_columns == ni * nj * -(-naux // 128) * -(-nvir_a // 128) * nvir_b


def test_pair_energy_streams_b_j_for_any_size():
    """naux 2304 with nvir 1400: a B_j row (100 KB per partition) does not fit next to B_i, so it
    is streamed over the auxiliary index; model-only (one emulated launch per shape)."""
    rng = np.random.default_rng(5)
    b = rng.standard_normal((2, 1400, 2304)) * 0.03
    e_occ, e_vir = rng.uniform(-2, -0.5, 2), rng.uniform(0.2, 3.0, 1400)
    backend = NkiBackend("trn1", simulate=True, model_only=True)
    block = f32(b)
    e_os, e_ss = backend.pair_energy(block, block, f32(e_occ), f32(e_occ), f32(e_vir))
    ref_os, ref_ss = reference_pair_energy(b, b, e_occ, e_occ, e_vir)
    assert abs(e_os - ref_os) <= REL_TOL * abs(ref_os)
    assert abs(e_ss - ref_ss) <= REL_TOL * max(abs(ref_os), abs(ref_ss))
    usable = backend.trace.peak_sbuf_bytes
    assert usable <= 192 * 1024 - 16 * 1024
    assert backend.modelled()["trn1"]["tensor_engine_useful_fraction"] > 0.95


def test_pair_energy_splits_over_both_cores_of_a_trn2_logical_core():
    """trn2 under nki 0.6 launches on LNC=2 (two physical cores, nl.program_id): the modelled device
    time is the slower core's, about half of one core doing everything. (0.7: every kernel at LNC=1.)"""
    rng = np.random.default_rng(6)
    b = f32(rng.standard_normal((8, 300, 256)) * 0.1)
    e_occ, e_vir = f32(rng.uniform(-2, -0.5, 8)), f32(rng.uniform(0.2, 3.0, 300))
    split = NkiBackend("trn2", simulate=True, nki_api="0.6")
    single = NkiBackend("trn2", simulate=True, nki_api="0.6", lnc=1)
    assert (split.lnc, single.lnc) == (2, 1)
    assert split.pair_energy(b, b, e_occ, e_occ, e_vir) == pytest.approx(
        single.pair_energy(b, b, e_occ, e_occ, e_vir), rel=1e-6)
    two, one = (be.modelled()["trn2"]["breakdown"]["device"] for be in (split, single))
    assert 0.45 < two / one < 0.62


@pytest.mark.parametrize("operation", ["gemm", "syrk"])
def test_gemm_and_syrk_split_their_row_tiles_over_both_cores(operation):
    """gemm and syrk, like trsm and the MP2 kernels, take their row tiles p, p + 2, ... on program p
    of an LNC=2 launch: the same result as one core's, and the modelled device time near half."""
    rng = np.random.default_rng(12)
    a, b = f32(rng.standard_normal((1024, 256))), f32(rng.standard_normal((256, 512)))
    c = f32(rng.standard_normal((1024, 1024)))

    def call(backend):
        return backend.gemm(a, b) if operation == "gemm" else backend.syrk(c, a)

    split = NkiBackend("trn2", simulate=True, nki_api="0.6")
    single = NkiBackend("trn2", simulate=True, nki_api="0.6", lnc=1)
    lower = np.tril_indices(1024) if operation == "syrk" else np.indices((1024, 512)).reshape(2, -1)
    assert np.array_equal(call(split).numpy()[lower], call(single).numpy()[lower])
    two, one = (be.modelled()["trn2"]["breakdown"]["device"] for be in (split, single))
    assert 0.45 < two / one < 0.7


@pytest.mark.parametrize("target, api", ALL_PAIRS)
def test_every_kernel_under_every_release_pair(target, api):
    """Every kernel dfmp2 ships (kernels/nki/kernels.py, rng/nki_philox.py) at one ragged size under each (target, nki)
    pair AWS supports (and trn1 with nki 0.3, disputed), against fp64 or host references: gemm, syrk, trsm,
    ao2mo, the pair energies, the exact product of slices, the densities (density_kernel, gamma_kernel), the
    SCF's fitted J/K and the random-number generator."""
    test_gemm(target, api, "m", 300)
    test_syrk_lower_triangle(target, api, "n", 300)
    test_trsm_whitening(target, api, "naux", 300)
    test_ao2mo(target, api, "nao", 300)
    test_pair_energy(target, api, "nvir", 300)
    test_exact_product_of_slices(target, api, False)
    _densities_against_fp64(target, api)
    _fitted_jk_against_fp64(target, api)
    _random_words_against_the_host(target, api)


def _densities_against_fp64(target, api):
    """density_kernel and gamma_kernel (density_block with G) against the torch backend's fp64 formulas."""
    from dfmp2.kernels.torch.backend import TorchBackend

    rng = np.random.default_rng(29)
    nocc, nvir, naux = 5, 130, 140
    b = torch.from_numpy(rng.standard_normal((nocc, nvir, naux)) * 0.1)
    e_occ, e_vir = torch.from_numpy(rng.uniform(-2, -0.5, nocc)), torch.from_numpy(rng.uniform(0.2, 3, nvir))
    ref = TorchBackend("cpu", "fp64").density_block(b, b[:3], e_occ, e_occ[:3], e_vir, (1.2, 1 / 3), "closed",
                                                    with_gamma=True)
    nki = NkiBackend(target, simulate=True, nki_api=api)
    out = nki.density_block(b.float(), b[:3].float(), e_occ.float(), e_occ[:3].float(), e_vir.float(), (1.2, 1 / 3),
                            "closed", with_gamma=True)
    for value, reference in zip(out, ref):
        assert rel_err(value, reference) < 1e-5
    assert nki.calls["density_kernel"] >= 1 and nki.calls["gamma_kernel"] >= 1


def _fitted_jk_against_fp64(target, api):
    """fitted_jk_kernel: J = sum_P rho_P B^P, K = sum_P B^P D B^P for D = L diag(w) R^T, against numpy in fp64."""
    rng = np.random.default_rng(31)
    naux, nao, r = 6, 140, 9
    b = rng.standard_normal((naux, nao, nao)) * 0.1
    b = (b + b.transpose(0, 2, 1)).astype(np.float32)
    left, right, w = rng.standard_normal((nao, r)), rng.standard_normal((nao, r)), rng.uniform(0.5, 2, r)
    nki = NkiBackend(target, simulate=True, nki_api=api)
    j, k = nki.fitted_jk(torch.from_numpy(b), left, right, w, False, True)
    b64 = b.astype(np.float64)
    d = (left * w) @ right.T
    assert rel_err(j, np.einsum("P,Pmn->mn", np.einsum("Pmn,mn->P", b64, d), b64)) < 1e-5
    assert rel_err(k, np.einsum("Pml,ls,Psn->mn", b64, d, b64)) < 1e-5


def _random_words_against_the_host(target, api):
    """philox_kernel: the host's Philox words bit for bit."""
    from dfmp2.kernels import get_backend
    from dfmp2.rng import nki_random_words, random_words

    backend = get_backend(target, simulate=True, nki_api=api)
    assert np.array_equal(nki_random_words(backend, 7, 3, 5, 1500, max_blocks=2, max_tiles=2),
                          random_words(7, 3, 5, 1500))


@pytest.mark.parametrize("target, api", TARGETS)
@pytest.mark.parametrize("shared_y", [True, False])
def test_exact_product_of_slices(target, api, shared_y):
    """exact_matmul_kernel (the SCF's exact builds; bf16 slice products into fp32 PSUM, TwoSum
    over groups and 512-term chunks): hi + lo against numpy's fp64 product of the slice values,
    to the Ozaki truncation (~1e-10 relative per column), far inside one fp32 rounding (6e-8). Ragged K over
    two chunks, ragged MX over two stationary tiles, NY over two moving tiles; int8 digits on one
    side, fp32 slices (7-bit integers times 2^(-7 (s + 1)) times a power of two per column) on
    the other; Y shared by both batches (resident in SBUF) or one per batch (streamed)."""
    rng = np.random.default_rng(11)
    slices, nb, k, mx, ny = 5, 2, 600, 200, 600
    weights = 2.0 ** (-7 * (np.arange(slices) + 1))
    x = rng.integers(-127, 128, (slices, nb, k, mx)).astype(np.int8)
    column_scale = 2.0 ** rng.integers(-10, 11, ny)
    y_ints = rng.integers(-127, 128, (slices, 1 if shared_y else nb, k, ny))
    y = (y_ints * weights[:, None, None, None] * column_scale).astype(np.float32)
    x_value = np.einsum("s,sbkm->bkm", weights, x.astype(np.float64))
    y_value = np.broadcast_to(y.astype(np.float64).sum(axis=0), (nb, k, ny))
    reference = np.einsum("bkm,bkn->bmn", x_value, y_value)
    backend = NkiBackend(target, simulate=True, nki_api=api)
    out = backend.exact_product(x, y)
    assert out.shape == (nb, mx, ny)
    plain = np.einsum("bkm,bkn->bmn", x_value.astype(np.float32), y_value.astype(np.float32))
    per_column = lambda a: np.max(np.abs(a - reference) / np.max(np.abs(reference), axis=(0, 1)))  # noqa: E731
    assert per_column(plain) > 1e-8  # one fp32 product would not pass the bound below
    assert per_column(out) <= 5e-10  # dropped slice pairs (s + t >= 5): ~2^-35 per term
    assert backend.calls["exact_matmul_kernel"] == 1


def test_the_kernel_file_names_every_release_it_is_checked_under():
    """kernels/nki/kernels.py's header states the releases its kernels are valid under: 0.2 and 0.3 to the newest release
    kernels.nki.support knows (issue 64: the header stopped at 0.6 after 0.7 was added)."""
    import ast
    import pathlib

    import dfmp2.kernels
    from dfmp2.kernels.nki.support import NEURON_SDK_OF_NKI

    source = (pathlib.Path(dfmp2.kernels.__file__).parent / "nki" / "kernels.py").read_text()
    header = ast.get_docstring(ast.parse(source)).split("\n\n")[0].replace("\n", " ")
    newest = max(NEURON_SDK_OF_NKI, key=lambda release: tuple(map(int, release.split("."))))
    assert f"NKI 0.2 (Neuron SDK {NEURON_SDK_OF_NKI['0.2']}" in header
    assert f"0.3-{newest} (SDK {NEURON_SDK_OF_NKI['0.3']}-{NEURON_SDK_OF_NKI[newest]}" in header
