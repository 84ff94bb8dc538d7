"""The NKI emulator enforces the NeuronCore limits: every violation below raises
NkiConstraintError naming the instruction, the tile shape and the limit, and each has a
passing twin -- the same kernel at a legal size runs and returns the right numbers -- so the
limit itself is what triggers the error.

Kernels are written in NKI 0.x style against the emulator (`nki`, `nl`, `nisa` as in
dfmp2/kernels/nki/kernels.py). Integer kernel arguments are compile-time constants.
"""

import numpy as np
import pytest

import dfmp2.kernels.nki  # noqa: F401 (the emulator then follows the Neuron settings of dfmp2's environment)
import nki_emulator as nki
from nki_emulator import TARGETS, NkiConstraintError

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.nki_limits

P = 128
BIG = 25 * 1024  # fp32 elements per partition: 100 KiB, so two such tiles need 200 KiB


@pytest.fixture(autouse=True)
def _kernels_compiled_at_lnc_1(monkeypatch):
    """Under nki 0.7 (the emulated default on trn2) every kernel must run at neuronx-cc's LNC degree
    (rule L14), and dfmp2 compiles its kernels at LNC=1 there: these rule tests launch as dfmp2 does.
    Before 0.7 the setting changes nothing the emulator checks."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- kernels ------------------------------------------------------------------------------
@nki.jit
def copy_kernel(x):
    """HBM -> SBUF -> SBUF -> HBM through tiles of x's shape (partitions = x.shape[0])."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b, src=a)
    nisa.dma_copy(dst=out, src=b)
    return out


@nki.jit
def psum_roundtrip_kernel(x, rows):
    """A PSUM tile of `rows` partitions, memset and copied out (x only supplies the free size)."""
    F = x.shape[1]
    out = nl.ndarray((rows, F), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((rows, F), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=acc, value=2.5)
    res = nl.ndarray((rows, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def matmul_kernel(a_t, b):
    """out[M, N] = a_t[K, M]^T @ b[K, N] in one nc_matmul. The PSUM tile is at most [128, 512]
    (one bank) so that M = 129 or N = 513 reaches nc_matmul instead of failing at allocation."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((min(M, P), min(N, 512)), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving)
    res = nl.ndarray((min(M, P), N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def matmul_reshaped_k_kernel(a, b, k):
    """Operands of contraction size k made by reshaping [128, F] SBUF tiles to [k, -1]:
    k = 128 is the identity, k = 129 gives 129-partition operands (a [128, 129] tile viewed
    as [129, 128]). out = a.reshape(k, -1)^T @ b.reshape(k, -1)."""
    M = a.shape[0] * a.shape[1] // k
    N = b.shape[0] * b.shape[1] // k
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    a_sb = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    b_sb = nl.ndarray(b.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a)
    nisa.dma_copy(dst=b_sb, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a_sb.reshape((k, M)), moving=b_sb.reshape((k, N)),
                   )
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def matmul_out_buffer_kernel(a_t, b, in_psum):
    """One matmul whose output tile is in PSUM (legal) or SBUF (illegal)."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum if in_psum else nl.sbuf)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def psum_dtype_kernel(a_t, b, psum_f16):
    """out = a_t^T @ b with a float32 PSUM tile, or an attempted float16 one."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float16 if psum_f16 else nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def bank_offset_kernel(a_t, b, col):
    """out = a_t^T @ b [128, 512] computed into columns col:col+512 of a two-bank PSUM tile
    (refused at allocation: a PSUM tile is at most one bank, so no output can cross one)."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    two_banks = nl.ndarray((M, 2 * 512), dtype=nl.float32, buffer=nl.psum)  # 4 KiB per partition
    nisa.nc_matmul(dst=two_banks[:, col:col + N], stationary=stationary, moving=moving,
                   )
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=two_banks[:, col:col + N])
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def second_bank_kernel(a_t, b):
    """out = a_t^T @ b [128, 512] computed into the second of two one-bank PSUM tiles."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    banks = [nl.ndarray((M, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
    nisa.nc_matmul(dst=banks[1][:, 0:N], stationary=stationary, moving=moving)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=banks[1][:, 0:N])
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def two_big_tiles_kernel(x, y):
    """out = x + y with both operands resident in SBUF at once (2 x 100 KiB per partition)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray(y.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=y)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=a)
    return out


@nki.jit
def sequential_big_tiles_kernel(x, y, z):
    """Three 100 KiB-per-partition tiles, never live together: each is released with `del`
    before the next one is allocated. out[:, i] = sum of row slice i of x, y, z."""
    F = x.shape[1]
    out = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    sums = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.sbuf)
    for i, src in enumerate((x, y, z)):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        nisa.tensor_reduce(dst=sums[:, i:i + 1], op=nl.add, data=t, axis=(1,))
        del t
    nisa.dma_copy(dst=out, src=sums)
    return out


@nki.jit
def loop_rebound_big_tile_kernel(x, y, z):
    """Like sequential_big_tiles_kernel, but the tile name is simply rebound by the next loop
    iteration (no del): the previous tile is dead once its reduction has run."""
    F = x.shape[1]
    out = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    sums = nl.ndarray((P, 3), dtype=nl.float32, buffer=nl.sbuf)
    for i, src in enumerate((x, y, z)):
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        nisa.tensor_reduce(dst=sums[:, i:i + 1], op=nl.add, data=t, axis=(1,))
    nisa.dma_copy(dst=out, src=sums)
    return out


@nki.jit
def psum_tiles_kernel(x, eye, count):
    """`count` PSUM tiles of one bank each, all live at once, each holding I^T x (a matmul
    with an identity stationary, DMA'd from `eye`: a memset per partition would break the
    start-partition rule); out = their sum = count * x."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    ident = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=moving, src=x)
    nisa.dma_copy(dst=ident, src=eye)
    tiles = []
    for _ in range(count):
        acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=ident, moving=moving)
        tiles.append(acc)
    total = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=total, src=tiles[0])
    for acc in tiles[1:]:
        nisa.tensor_tensor(dst=total, data1=total, data2=acc, op=nl.add)
    nisa.dma_copy(dst=out, src=total)
    return out


@nki.jit
def ndarray_dtype_kernel(x, dtype):
    """out = x, passing through an SBUF tile of the given dtype."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def reduce_kernel(x, axis):
    """Sum of x [128, F] over `axis` of the SBUF tile, keepdims."""
    parts, F = x.shape
    shape = (1, F) if axis in (0, -2) else (parts, 1)
    out = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((parts, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=(axis,))
    nisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def write_rows_kernel(x, rows):
    """out[128, F]: only rows 0:rows are written (from x)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((rows, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:rows, :])
    nisa.dma_copy(dst=out[0:rows, :], src=t)
    return out


@nki.jit
def partial_sbuf_kernel(x, cols):
    """Load x[:, :cols] into an SBUF tile of x's full width, then read the whole tile."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:cols], src=x[:, 0:cols])
    res = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=t)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def accumulate_kernel(a_t, b, c, first_matmul):
    """acc = a_t^T b (if first_matmul, else acc is only memset), then acc += a_t^T c with
    accumulate=True."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    mov_b = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    mov_c = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=mov_b, src=b)
    nisa.dma_copy(dst=mov_c, src=c)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    if first_matmul:
        nisa.nc_matmul(dst=acc, stationary=stationary, moving=mov_b)
    else:  # written, but not by a matmul: accumulation is undefined
        nisa.memset(dst=acc, value=0.0)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=mov_c, accumulate=True)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def fresh_psum_accumulate_kernel(a_t, b, accumulate):
    """One nc_matmul with an explicit accumulate= (nki 0.3+) into a freshly allocated PSUM tile:
    True is undefined there (nothing to add to), False overwrites."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving, accumulate=accumulate)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def reshape_partitions_kernel(x):
    """x [256, 64] through a [128, 2, 64] SBUF tile viewed as [256, 64]."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 2, 64), dtype=nl.float32, buffer=nl.sbuf)
    view = t.reshape((256, 64))
    nisa.dma_copy(dst=view, src=x)
    nisa.dma_copy(dst=out, src=view)
    return out


# ---- 1. partition limit of on-chip tiles -----------------------------------------------------
def test_sbuf_tile_128_partitions_works():
    x = rand((128, 32))
    np.testing.assert_array_equal(copy_kernel(x), x)


def test_sbuf_tile_129_partitions_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nl\.ndarray: tile of shape \(129, 32\) has 129 partitions; the limit is 128"):
        copy_kernel(rand((129, 32)))


def test_psum_tile_128_partitions_works():
    np.testing.assert_array_equal(psum_roundtrip_kernel(rand((128, 16)), 128),
                                  np.full((128, 16), 2.5, np.float32))


def test_psum_tile_129_partitions_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"tile of shape \(129, 16\) has 129 partitions; the limit is 128"):
        psum_roundtrip_kernel(rand((128, 16)), 129)


# ---- 2. nc_matmul tile limits ----------------------------------------------------------------
def test_matmul_k128_m128_n512_works():
    a_t, b = rand((128, 128), 1), rand((128, 512), 2)
    out = matmul_kernel(a_t, b)
    np.testing.assert_allclose(out, a_t.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert matmul_kernel.last_trace.matmul_shapes == {(128, 128, 512): 1}


def test_matmul_k129_fails_at_allocation():
    """K = 129 cannot even be loaded: the [129, M] stationary tile has too many partitions."""
    with pytest.raises(NkiConstraintError,
                       match=r"nl\.ndarray: tile of shape \(129, 64\) has 129 partitions; the limit is 128"):
        matmul_kernel(rand((129, 64), 1), rand((129, 64), 2))


def test_matmul_reshaped_k128_works():
    a, b = rand((128, 128), 3), rand((128, 128), 4)
    out = matmul_reshaped_k_kernel(a, b, 128)
    np.testing.assert_allclose(out, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_matmul_k129_operands_fail():
    """[128, 129] SBUF tiles viewed as [129, 128] operands: refused (at the reshape, which would
    move data across partitions, or at nc_matmul's 128-partition limit)."""
    with pytest.raises(NkiConstraintError,
                       match=r"\(129, 128\).*(spans more than 128 partitions|across partitions)"):
        matmul_reshaped_k_kernel(rand((128, 129), 3), rand((128, 129), 4), 129)


def test_matmul_stationary_m129_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nisa\.nc_matmul\(stationary \(128, 129\), moving \(128, 512\).*"
                             r"stationary free size M=129 exceeds 128"):
        matmul_kernel(rand((128, 129), 1), rand((128, 512), 2))


def test_matmul_moving_n513_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nisa\.nc_matmul\(stationary \(128, 128\), moving \(128, 513\).*"
                             r"moving free size N=513 exceeds 512"):
        matmul_kernel(rand((128, 128), 1), rand((128, 513), 2))


# ---- 3. matmul output buffer and dtype ---------------------------------------------------------
def test_matmul_output_in_psum_works():
    a_t, b = rand((128, 64), 5), rand((128, 256), 6)
    out = matmul_out_buffer_kernel(a_t, b, True)
    np.testing.assert_allclose(out, a_t.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_matmul_output_in_sbuf_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nisa\.nc_matmul\(.*dst \(64, 256\)\): the output must be in PSUM, not SBUF"):
        matmul_out_buffer_kernel(rand((128, 64), 5), rand((128, 256), 6), False)


def test_psum_float32_works():
    a_t, b = rand((128, 32), 7), rand((128, 64), 8)
    out = psum_dtype_kernel(a_t, b, False)
    np.testing.assert_allclose(out, a_t.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_psum_float16_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nl\.ndarray: PSUM tile \(32, 64\) must be float32, not float16"):
        psum_dtype_kernel(rand((128, 32), 7), rand((128, 64), 8), True)


# ---- 4. one matmul output inside one PSUM bank ----------------------------------------------------
def test_matmul_output_in_second_bank_works():
    a_t, b = rand((128, 128), 9), rand((128, 512), 10)
    out = second_bank_kernel(a_t, b)
    np.testing.assert_allclose(out, a_t.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert second_bank_kernel.last_trace.peak_psum_bytes == 4096


def test_matmul_output_crossing_bank_boundary_fails():
    """The two-bank PSUM tile such an output needs is refused at allocation (audit rows L1, MM11)."""
    with pytest.raises(NkiConstraintError,
                       match=r"nl\.ndarray: PSUM tile \(128, 1024\) of 4096 B per partition is wider than one "
                             r"2048 B PSUM bank"):
        bank_offset_kernel(rand((128, 128), 9), rand((128, 512), 10), 256)


# ---- 5. SBUF capacity of live allocations ---------------------------------------------------------
def test_two_100k_sbuf_tiles_fit_on_trn2():
    x, y = rand((P, BIG), 11), rand((P, BIG), 12)
    with nki.target("trn2"):
        out = two_big_tiles_kernel(x, y)
    np.testing.assert_array_equal(out, x + y)
    assert two_big_tiles_kernel.last_trace.peak_sbuf_bytes == 2 * BIG * 4
    assert 2 * BIG * 4 <= TARGETS["trn2"].sbuf_bytes_per_partition


def test_two_100k_sbuf_tiles_exceed_trn1():
    x, y = rand((P, BIG), 11), rand((P, BIG), 12)
    with nki.target("trn1"):
        with pytest.raises(NkiConstraintError,
                           match=r"allocating a SBUF tile of shape \(128, 25600\) \(102400 B per partition\) "
                                 r"exceeds SBUF capacity on trn1: 102400 B already live, limit 180224 B per partition "
                                     r"\(usable: 196608 B physical minus 16384 B the compiler reserves\)"):
            two_big_tiles_kernel(x, y)


def test_released_sbuf_tiles_free_space_on_trn1():
    """Three 100 KiB tiles, each deleted before the next allocation: 300 KiB in total but at
    most 100 KiB (+ the small sums tile) live, so it runs on trn1."""
    x, y, z = rand((P, BIG), 13), rand((P, BIG), 14), rand((P, BIG), 15)
    with nki.target("trn1"):
        out = sequential_big_tiles_kernel(x, y, z)
    expected = np.stack([a.astype(np.float64).sum(axis=1) for a in (x, y, z)], axis=1)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    assert sequential_big_tiles_kernel.last_trace.peak_sbuf_bytes == BIG * 4 + 3 * 4


def test_loop_rebound_sbuf_tile_frees_space_on_trn1():
    x, y, z = rand((P, BIG), 13), rand((P, BIG), 14), rand((P, BIG), 15)
    with nki.target("trn1"):
        out = loop_rebound_big_tile_kernel(x, y, z)
    expected = np.stack([a.astype(np.float64).sum(axis=1) for a in (x, y, z)], axis=1)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


# ---- 6. PSUM capacity --------------------------------------------------------------------
@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_eight_psum_banks_work(target):
    x = rand((P, 512), 16)
    with nki.target(target):
        out = psum_tiles_kernel(x, np.eye(P, dtype=np.float32), 8)
    np.testing.assert_allclose(out, 8 * x, rtol=1e-6)
    assert psum_tiles_kernel.last_trace.peak_psum_bytes == 16 * 1024


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_nine_psum_banks_fail(target):
    with nki.target(target), pytest.raises(
            NkiConstraintError,
            match=rf"allocating a PSUM tile of shape \(128, 512\) \(2048 B per partition\) "
                  rf"exceeds PSUM capacity on {target}: 16384 B already live, limit 16384 B"):
        psum_tiles_kernel(rand((P, 512), 16), np.eye(P, dtype=np.float32), 9)


# ---- 7. no float64 on the device ------------------------------------------------------------
def test_float32_input_works():
    x = rand((64, 16), 17)
    np.testing.assert_array_equal(copy_kernel(x), x)


def test_float64_input_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"copy_kernel: argument 0 is float64 \(64, 16\); there is no float64"):
        copy_kernel(rand((64, 16), 17).astype(np.float64))


def test_float32_ndarray_works():
    x = rand((64, 16), 18)
    np.testing.assert_array_equal(ndarray_dtype_kernel(x, nl.float32), x)


def test_float64_ndarray_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nl\.ndarray\(64, 16\): float64 does not exist on a NeuronCore"):
        ndarray_dtype_kernel(rand((64, 16), 18), np.float64)


# ---- 8. no reductions over the partition axis ----------------------------------------------------
@pytest.mark.parametrize("axis", [1, -1])
def test_free_axis_reduce_works(axis):
    x = rand((P, 64), 19)
    out = reduce_kernel(x, axis)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_partition_axis_reduce_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nisa\.tensor_reduce\(add, \(128, 64\), axis=\(0,\)\): reduction over "
                             r"the partition axis is not possible"):
        reduce_kernel(rand((P, 64), 19), 0)


def test_partition_axis_reduce_negative_index_fails():
    with pytest.raises(NkiConstraintError, match=r"partition axis"):
        reduce_kernel(rand((P, 64), 19), -2)


# ---- 9. every output element must be written ------------------------------------------------------
def test_fully_written_output_works():
    x = rand((P, 32), 20)
    np.testing.assert_array_equal(write_rows_kernel(x, 128), x)


def test_partly_written_output_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"write_rows_kernel: output \(128, 32\) has 2048 element\(s\) no instruction wrote"):
        write_rows_kernel(rand((P, 32), 20), 64)


# ---- 10. no reads of unwritten on-chip memory; accumulation needs a matmul result --------------------
def test_fully_written_sbuf_read_works():
    x = rand((P, 32), 21)
    np.testing.assert_array_equal(partial_sbuf_kernel(x, 32), x)


def test_partly_written_sbuf_read_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nisa\.tensor_copy\(\(128, 32\) -> \(128, 32\)\): reads 2048 element\(s\) "
                             r"of a SBUF tile \(128, 32\) that no instruction wrote"):
        partial_sbuf_kernel(rand((P, 32), 21), 16)


def test_accumulate_onto_matmul_result_works():
    a_t, b, c = rand((128, 64), 22), rand((128, 128), 23), rand((128, 128), 24)
    with nki.target("trn1", api="0.3"):
        out = accumulate_kernel(a_t, b, c, True)
    expected = a_t.T.astype(np.float64) @ b + a_t.T.astype(np.float64) @ c
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert accumulate_kernel.last_trace.matmuls == 2


def test_accumulate_onto_memset_psum_fails():
    with nki.target("trn1", api="0.3"), pytest.raises(
            NkiConstraintError,
            match=r"nisa\.nc_matmul\(.*\): accumulate=True into PSUM that holds no matmul result"):
        accumulate_kernel(rand((128, 64), 22), rand((128, 128), 23), rand((128, 128), 24), False)


def test_accumulate_onto_fresh_psum_fails():
    with nki.target("trn1", api="0.3"), pytest.raises(
            NkiConstraintError,
            match=r"nisa\.nc_matmul\(stationary \(128, 64\), moving \(128, 128\) -> dst \(64, 128\)\): "
                  r"accumulate=True into PSUM that holds no matmul result"):
        fresh_psum_accumulate_kernel(rand((128, 64), 22), rand((128, 128), 23), True)


# ---- partition limit through reshaped views ---------------------------------------------------
def test_reshape_to_256_partitions_fails():
    with pytest.raises(NkiConstraintError, match=r"256.*partitions|partitions.*256"):
        reshape_partitions_kernel(rand((256, 64), 25))


# ---- 11. the trace and the timing model ------------------------------------------------------------
def test_trace_of_one_matmul():
    K, M, N = 128, 128, 512
    a_t, b = rand((K, M), 26), rand((K, N), 27)
    out = matmul_kernel(a_t, b)
    np.testing.assert_allclose(out, a_t.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    trace = matmul_kernel.last_trace
    assert trace.matmuls == 1
    assert trace.matmul_flops == 2 * K * M * N
    assert trace.matmul_shapes == {(K, M, N): 1}
    assert trace.dma_bytes_in == 4 * (K * M + K * N)
    assert trace.dma_bytes_out == 4 * M * N
    assert trace.vector_ops == 1 and trace.vector_elements == M * N  # the PSUM -> SBUF copy
    assert trace.peak_psum_bytes == 4 * N
    assert trace.peak_sbuf_bytes == 4 * (M + N + N)
    t1 = trace.modelled_seconds(TARGETS["trn1"])
    t2 = trace.modelled_seconds(TARGETS["trn2"])
    # this kernel is DMA-bound in the (peak) model: its time scales with the bytes it moves, not
    # with its FLOPs. The same kernel with N halved moves 1.8x fewer bytes for 2x fewer FLOPs.
    nbytes = trace.dma_bytes_in + trace.dma_bytes_out
    matmul_kernel(rand((K, M), 26), rand((K, N // 2), 27))
    half = matmul_kernel.last_trace
    half_bytes = half.dma_bytes_in + half.dma_bytes_out
    assert nbytes / half_bytes == pytest.approx(1.8) and trace.matmul_flops == 2 * half.matmul_flops
    for target, t in (("trn1", t1), ("trn2", t2)):
        assert t / half.modelled_seconds(TARGETS[target]) == pytest.approx(nbytes / half_bytes, rel=1e-9), target
    # ... so it is faster where one core has the larger share of HBM bandwidth: a trn1 core
    # (820 GB/s over 2 cores) beats a trn2 core (2.9 TB/s over 8)
    assert 0 < t1 < t2


def test_trace_is_per_call():
    """A second call with other shapes leaves its own trace, not an accumulated one."""
    matmul_kernel(rand((128, 128), 26), rand((128, 512), 27))
    matmul_kernel(rand((64, 32), 28), rand((64, 16), 29))
    trace = matmul_kernel.last_trace
    assert trace.matmuls == 1
    assert trace.matmul_flops == 2 * 64 * 32 * 16
    assert trace.dma_bytes_in == 4 * (64 * 32 + 64 * 16)
    assert trace.dma_bytes_out == 4 * 32 * 16


# ---- 12. rules the compiler enforces that the emulator checks too ----------------------------------
@nki.jit
def shifted_copy_kernel(x, src0, dst0, rows):
    """Copy partitions src0..src0+rows of an SBUF tile into partitions dst0..dst0+rows of another."""
    F = x.shape[1]
    out = nl.ndarray((rows, F), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b[dst0:dst0 + rows, :], src=a[src0:src0 + rows, :])
    nisa.dma_copy(dst=out, src=b[dst0:dst0 + rows, :])
    return out


def test_engine_copy_on_same_partitions_works():
    x = rand((P, 16), 30)
    np.testing.assert_array_equal(shifted_copy_kernel(x, 0, 0, 64), x[0:64])


def test_engine_copy_across_partitions_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"nisa\.tensor_copy\(\(64, 16\) -> \(64, 16\)\): reads partitions 0\.\.63 but "
                             r"writes partitions 64\.\.127; engine instructions cannot move data across partitions"):
        shifted_copy_kernel(rand((P, 16), 30), 0, 64, 64)


def test_64_partitions_from_partition_64_works():
    x = rand((P, 16), 31)
    np.testing.assert_array_equal(shifted_copy_kernel(x, 64, 64, 64), x[64:128])


def test_96_partitions_from_partition_32_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"spans 96 partitions starting at partition 32; an access over 64 partitions "
                             r"must start at partition 0 \(start-partition rule\)"):
        shifted_copy_kernel(rand((P, 16), 31), 32, 32, 96)


@nki.jit
def offset_matmul_kernel(a_t, b, k0):
    """out = a_t[k0:]^T @ b[k0:] with the contraction rows taken from partition k0 of SBUF tiles."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=stationary[k0:K, :], moving=moving[k0:K, :])
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_matmul_operands_from_partition_0_work():
    a_t, b = rand((112, 32), 32), rand((112, 64), 33)
    np.testing.assert_allclose(offset_matmul_kernel(a_t, b, 0), a_t.T.astype(np.float64) @ b,
                               rtol=1e-4, atol=1e-4)


def test_matmul_operands_of_112_partitions_from_partition_16_fail():
    with pytest.raises(NkiConstraintError, match=r"nisa\.nc_matmul\(.*\): operand \(112, 32\) spans 112 "
                                                 r"partitions starting at partition 16"):
        offset_matmul_kernel(rand((128, 32), 32), rand((128, 64), 33), 16)


@nki.jit
def reduce3d_kernel(x, axes):
    """Reduce an SBUF tile of shape [P, 4, 8] over `axes` into [P, 1]."""
    out = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if len(axes) == 1:
        part = nl.ndarray((P, 4, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=part, op=nl.add, data=t, axis=axes)
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=part, axis=(1, 2))
    else:
        total = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=t, axis=axes)
    nisa.dma_copy(dst=out, src=total)
    return out


@pytest.mark.parametrize("axes", [(2,), (1, 2), (-1,)])
def test_reduce_over_last_free_axes_works(axes):
    x = rand((P, 4, 8), 34)
    np.testing.assert_allclose(reduce3d_kernel(x, axes)[:, 0], x.sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_reduce_over_a_middle_free_axis_fails():
    with pytest.raises(NkiConstraintError,
                       match=r"tensor_reduce reduces only the last free axes, contiguous and ending at the "
                             r"final axis \(axis 2\); got axes \(1,\)"):
        reduce3d_kernel(rand((P, 4, 8), 34), (1,))


@nki.jit
def transpose_kernel(x, col0, width):
    """out = x^T for x [128, 128], transposed into columns col0..col0+128 of a PSUM tile [128, width]."""
    out = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    acc = nl.ndarray((P, width), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=acc[:, col0:col0 + P], data=t)
    res = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc[:, col0:col0 + P])
    nisa.dma_copy(dst=out, src=res)
    return out


def test_transpose_inside_one_psum_bank_works():
    x = rand((P, P), 35)
    np.testing.assert_array_equal(transpose_kernel(x, 384, 512), x.T)


def test_transpose_crossing_a_psum_bank_fails():
    """The two-bank PSUM tile such an output needs is refused at allocation (audit rows L1, T7)."""
    with pytest.raises(NkiConstraintError, match=r"PSUM tile \(128, 1024\) of 4096 B per partition is wider than "
                                                 r"one 2048 B PSUM bank"):
        transpose_kernel(rand((P, P), 35), 448, 1024)


@nki.jit
def memset_kernel(x, value):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=value)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("api, value", [("0.3", 1.5), ("0.6", 0.0), ("0.2", 0)])
def test_memset_value_of_the_tile_dtype_works(api, value):
    with nki.target("trn2", api=api):
        assert (memset_kernel(rand((P, 4)), value) == value).all()


def test_memset_int_value_on_float_tile_fails_under_0_3():
    with nki.target("trn2", api="0.3"), pytest.raises(
            NkiConstraintError, match=r"nisa\.memset\(\(128, 4\), value=0\): under nki 0\.3 the memset value "
                                      r"must match the tile dtype float32 \(got int\)"):
        memset_kernel(rand((P, 4)), 0)


@nki.jit
def psum_dma_kernel(a_t, b):
    """A matmul result DMA'd straight from PSUM to HBM (refused in every release: 0.3+ documents
    it, and for 0.2 the emulator takes the stricter reading of its ISA page)."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving)
    nisa.dma_copy(dst=out, src=acc)
    return out


@pytest.mark.parametrize("api", ["0.2", "0.3"])
def test_dma_out_of_psum_fails_in_every_release(api):
    with nki.target("trn1", api=api), pytest.raises(
            NkiConstraintError, match=rf"dma_copy cannot read PSUM .*\[D2; trn1, nki {api}\]"):
        psum_dma_kernel(rand((64, 32), 36), rand((64, 16), 37))


def test_matmul_accumulate_argument_works_under_0_3():
    a_t, b = rand((64, 32), 38), rand((64, 16), 39)
    with nki.target("trn1", api="0.3"):
        np.testing.assert_allclose(fresh_psum_accumulate_kernel(a_t, b, False), a_t.T.astype(np.float64) @ b,
                                   rtol=1e-4, atol=1e-4)


def test_matmul_accumulate_argument_fails_under_0_2():
    with nki.target("trn1", api="0.2"), pytest.raises(
            NkiConstraintError, match=r"nki 0\.2 nc_matmul has no accumulate= argument \(added in 0\.3\)"):
        fresh_psum_accumulate_kernel(rand((64, 32), 38), rand((64, 16), 39), False)


def star_kernel_source():
    @nki.jit
    def star_kernel(x, *rest):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out
    return star_kernel


@nki.jit
def identity_test_kernel(x, flag):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if flag is not None:
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def equality_test_kernel(x, flag):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if flag != 0:
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_python_subset_of_0_3_works():
    x = rand((P, 4), 40)
    with nki.target("trn2", api="0.3"):
        np.testing.assert_array_equal(equality_test_kernel(x, 1), 2 * x)
    with nki.target("trn1", api="0.2"):  # 0.2 has Python semantics
        np.testing.assert_array_equal(identity_test_kernel(x, 1), 2 * x)
        np.testing.assert_array_equal(star_kernel_source()(x), x)


def test_is_comparison_fails_under_0_3():
    with nki.target("trn2", api="0.3"), pytest.raises(
            NkiConstraintError, match=r"identity_test_kernel: nki 0\.3 rejects 'is' / 'is not'"):
        identity_test_kernel(rand((P, 4), 40), 1)


def test_star_in_signature_fails_under_0_3():
    with nki.target("trn2", api="0.4"), pytest.raises(
            NkiConstraintError, match=r"star_kernel: nki 0\.4 rejects '\*' or '\*\*' in the kernel signature"):
        star_kernel_source()(rand((P, 4), 40))


@nki.jit
def many_instructions_kernel(x, count, device_loop):
    """`count` memsets of one small tile, in a static loop or a device-side loop."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    loop = nl.dynamic_range if device_loop else nl.affine_range
    for n in loop(count):
        nisa.memset(dst=t, value=1.0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_instruction_limit_is_the_documented_one():
    assert nki.INSTRUCTION_LIMIT == 5_000_000


@pytest.mark.parametrize("api, device_loop", [("0.3", True), ("0.2", False)])
def test_long_loop_works_on_the_device_or_under_0_2(monkeypatch, api, device_loop):
    from nki_emulator import core

    monkeypatch.setattr(core, "INSTRUCTION_LIMIT", 100)  # the real 5,000,000 would take minutes
    with nki.target("trn2", api=api):
        assert (many_instructions_kernel(rand((1, 1)), 150, device_loop) == 1.0).all()
    trace = many_instructions_kernel.last_trace
    assert trace.instructions["vector"] == 150  # every iteration runs ...


def test_unrolled_loop_over_the_instruction_limit_fails_under_0_3(monkeypatch):
    from nki_emulator import core

    monkeypatch.setattr(core, "INSTRUCTION_LIMIT", 100)
    with nki.target("trn2", api="0.3"), pytest.raises(
            NkiConstraintError, match=r"many_instructions_kernel: more than 100 instructions after unrolling "
                                      r"\(nki 0\.3 unrolls every static loop at trace time; the compiler stops with XTP002\)"):
        many_instructions_kernel(rand((1, 1)), 150, False)


def test_dynamic_range_is_removed_in_0_7():
    with nki.target("trn2", api="0.7", lnc=1), pytest.raises(
            NkiConstraintError, match=r"nl\.dynamic_range was removed in nki 0\.7 \(deprecated in 0\.6\): use "
                                      r"nl\.fori_loop or nl\.while_loop \[L11; trn2, nki 0\.7\]"):
        many_instructions_kernel(rand((1, 1)), 3, True)


def test_dynamic_range_still_runs_in_0_6_where_it_is_deprecated(monkeypatch):
    from nki_emulator import core

    monkeypatch.setattr(core, "INSTRUCTION_LIMIT", 100)
    with nki.target("trn2", api="0.6"):
        assert (many_instructions_kernel(rand((1, 1)), 150, True) == 1.0).all()


@nki.jit
def fori_sum_kernel(x, count, lower, step, leak, give_back):
    """out = x * count, added one tile at a time in an nl.fori_loop of `count` iterations; leak: read
    a tile allocated in the body after the loop; give_back: the body returns a value."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x_sb = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    nisa.memset(dst=total, value=0.0)
    inside = []

    def body(i):
        scratch = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=scratch, src=x_sb)
        nisa.tensor_tensor(dst=total, data1=total, data2=scratch, op=nl.add)
        inside.append(scratch)
        return i if give_back else None

    nl.fori_loop(lower, lower + count * step, body, step=step)
    nisa.dma_copy(dst=out, src=inside[-1] if leak else total)
    return out


def test_fori_loop_body_is_compiled_once_under_0_7(monkeypatch):
    from nki_emulator import core

    monkeypatch.setattr(core, "INSTRUCTION_LIMIT", 100)  # 3 instructions a body, 150 bodies
    x = rand((4, 8), 42)
    with nki.target("trn2", api="0.7", lnc=1):
        out = fori_sum_kernel(x, 150, 0, 1, False, False)
    np.testing.assert_allclose(out, 150 * x, rtol=1e-5)
    assert fori_sum_kernel.last_trace.instructions["vector"] >= 300  # every iteration ran


@pytest.mark.parametrize("lower, step, leak, give_back, api, message", [
    (0, 0, False, False, "0.7", r"nl\.fori_loop step 0: it must be a positive compile-time int \[L15"),
    (2 ** 31, 1, False, False, "0.7", r"nl\.fori_loop lower bound 2147483648: a bound must be a 32-bit int"),
    (0, 1, True, False, "0.7", r"tensors declared in a loop body cannot be used outside it \[L15; trn2, nki 0\.7\]"),
    (0, 1, False, True, "0.6", r"the nl\.fori_loop body returned RegisterValue; a body returns nothing"),
    (0, 1, False, False, "0.5", r"nl\.fori_loop does not exist in nki 0\.5 \(new in 0\.6"),
])
def test_fori_loop_rules_are_enforced(lower, step, leak, give_back, api, message):
    with nki.target("trn2", api=api, lnc=1), pytest.raises(NkiConstraintError, match=message):
        fori_sum_kernel(rand((4, 8), 43), 3, lower, step, leak, give_back)


@nki.jit
def one_sbuf_tile_kernel(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_sbuf_tile_of_the_usable_size_works_on_trn1():
    usable = TARGETS["trn1"].sbuf_usable_bytes_per_partition // 4
    with nki.target("trn1"):
        x = rand((2, usable), 41)
        np.testing.assert_array_equal(one_sbuf_tile_kernel(x), x)


def test_sbuf_tile_over_the_usable_size_but_under_the_physical_fails_on_trn1():
    usable = TARGETS["trn1"].sbuf_usable_bytes_per_partition // 4
    assert 4 * (usable + 1) < TARGETS["trn1"].sbuf_bytes_per_partition
    with nki.target("trn1"), pytest.raises(NkiConstraintError, match=r"exceeds SBUF capacity on trn1.*"
                                                                    r"minus 16384 B the compiler reserves"):
        one_sbuf_tile_kernel(rand((2, usable + 1), 41))


# trn3 (NeuronCore-v4): 32 MiB SBUF per core over 128 partitions = 256 KiB per partition (AWS's NKI
# Trainium3 guide), less the emulator's assumed 16 KiB compiler reserve: 245760 B usable; trn2
# (NeuronCore-v3): 224 KiB, 212992 B usable
def test_sbuf_tile_that_fits_trn3_but_not_trn2():
    columns = 245760 // 4  # fp32 elements of trn3's whole usable SBUF per partition
    assert 4 * columns > 212992
    x = rand((2, columns), 42)
    with nki.target("trn3"):
        np.testing.assert_array_equal(one_sbuf_tile_kernel(x), x)
    assert one_sbuf_tile_kernel.last_trace.peak_sbuf_bytes == 245760
    with nki.target("trn2"), pytest.raises(NkiConstraintError, match=r"exceeds SBUF capacity on trn2: 0 B already "
                                                                    r"live, limit 212992 B per partition"):
        one_sbuf_tile_kernel(x)
    with nki.target("trn3"), pytest.raises(
            NkiConstraintError, match=r"exceeds SBUF capacity on trn3: 0 B already live, limit 245760 B per "
                                      r"partition \(usable: 262144 B physical minus 16384 B the compiler "
                                      r"reserves\) \[L4/X9; trn3"):
        one_sbuf_tile_kernel(rand((2, columns + 1), 42))


def test_trn3_keeps_one_psum_bank_per_matmul_output():
    """NeuronCore-v4's nc_matmul documents a moving free size up to 4096 (fp32 dst); the emulator
    keeps 512 (one 2 KiB PSUM bank) on trn3 too, and says so (audit row MM9, stricter)."""
    with nki.target("trn3"), pytest.raises(
            NkiConstraintError, match=r"moving free size N=513 exceeds 512 \(NeuronCore-v4's nc_matmul allows up to "
                                      r"4096 .*stricter reading\) \[MM9; trn3, nki 0\.7\]"):
        matmul_kernel(rand((P, P), 26), rand((P, 513), 27))
    with nki.target("trn2"), pytest.raises(NkiConstraintError, match=r"N=513 exceeds 512 \[MM9; trn2, nki 0\.7\]"):
        matmul_kernel(rand((P, P), 26), rand((P, 513), 27))


# ---- SPMD launch grid (logical NeuronCores) -------------------------------------------------
@nki.jit
def rows_by_program_kernel(x):
    """Each program copies the rows i = program_id, program_id + programs, ... of x [R, 128]
    (one row per partition 0) into the shared output."""
    R, F = x.shape
    out = nl.ndarray((R, F), dtype=nl.float32, buffer=nl.shared_hbm)
    for i in range(nl.program_id(0), R, nl.num_programs()):
        row = nl.ndarray((1, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=x[i:i + 1, :])
        nisa.dma_copy(dst=out[i:i + 1, :], src=row)
    return out


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_lnc2_launch_splits_rows_over_two_programs(target, monkeypatch):
    x = rand((5, P))
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG")  # 0.6: a grid must match the variable where it is set (L21)
    with nki.target(target, api="0.6"):
        out = rows_by_program_kernel[2](x)
    assert np.array_equal(out, x)
    trace = rows_by_program_kernel.last_trace
    assert trace.launches == 1 and len(trace.programs) == 2
    assert [p.dma_transfers for p in trace.programs] == [6, 4]  # rows 0, 2, 4 and 1, 3


def test_lnc2_is_refused_on_trn1():
    with nki.target("trn1"), pytest.raises(NkiConstraintError, match="LNC=1"):
        rows_by_program_kernel[2](rand((4, P)))


def test_nki_0_7_launches_every_kernel_at_the_compilers_lnc(monkeypatch):
    """L14 (nki 0.7, compiler error EVRF066): a kernel's LNC degree must be neuronx-cc's, which
    defaults to 2 on trn2; NEURON_LOGICAL_NC_CONFIG (or the run's choice) sets it. 0.6 checks nothing."""
    x = rand((4, P))
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    with nki.target("trn2", api="0.7"), pytest.raises(
            NkiConstraintError, match=r"NKI kernel 'rows_by_program_kernel' is configured with LNC=1, but neuronx-cc "
                                      r"is using LNC=2\. .*\[L14; trn2, nki 0\.7\]"):
        rows_by_program_kernel(x)
    with nki.target("trn2", api="0.7"):
        assert np.array_equal(rows_by_program_kernel[2](x), x)
    with nki.target("trn2", api="0.7", lnc=1):
        assert np.array_equal(rows_by_program_kernel(x), x)
        with pytest.raises(NkiConstraintError, match="configured with LNC=2, but neuronx-cc is using LNC=1"):
            rows_by_program_kernel[2](x)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    with nki.target("trn2", api="0.7"):
        assert np.array_equal(rows_by_program_kernel(x), x)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    with nki.target("trn2", api="0.7"), pytest.raises(NkiConstraintError, match="supports LNC 1 or 2"):
        rows_by_program_kernel(x)
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG")
    with nki.target("trn2", api="0.6"):  # before 0.7: unchecked
        assert np.array_equal(rows_by_program_kernel(x), x)
    with nki.target("trn1", api="0.7"), pytest.raises(  # nki 0.7 does not support trn1 at all
            NkiConstraintError, match=r"nki 0\.7 does not support trn1 .*\[L19; trn1, nki 0\.7\]"):
        rows_by_program_kernel(x)
    with nki.target("trn3", api="0.7"), pytest.raises(  # "LNC=2 on Trn2 and later"
            NkiConstraintError, match=r"is using LNC=2\. .*\[L14; trn3, nki 0\.7\]"):
        rows_by_program_kernel(x)
    with nki.target("trn3", api="0.7"):
        assert np.array_equal(rows_by_program_kernel[2](x), x)


def test_a_program_that_leaves_its_rows_unwritten_is_caught():
    """With one program only, half the rows would stay unwritten; a grid of 2 is needed."""
    @nki.jit
    def half_kernel(x):
        R, F = x.shape
        out = nl.ndarray((R, F), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(0, R, 2):  # only the even rows, as if program 0 of 2
            row = nl.ndarray((1, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=row, src=x[i:i + 1, :])
            nisa.dma_copy(dst=out[i:i + 1, :], src=row)
        return out

    with nki.target("trn2"), pytest.raises(NkiConstraintError, match="no instruction wrote"):
        half_kernel(rand((4, P)))
