"""The emulator's fidelity to NKI 0.6/0.7 and NeuronCore-v4 (docs/nki-audit.md, rows IX, V, AD, DT, AS, TS8/TS12
on trn3, L2's seventh bank and L17-L23): for each rule a kernel that breaks it and must raise NkiConstraintError
naming its row ("[L17; trn2, nki 0.7]"), and a legal kernel that must run and compute what AWS documents, so that
no test passes by refusing everything (a wrong refusal is a defect too).

Rule-breaking bodies run inside one generic kernel (`body_kernel`), as in tests/test_nki_audit.py; launch-level
rules (the LNC degree, nested kernels, programs that diverge) have their own kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

import dfmp2.kernels.nki  # noqa: F401 (the emulator then follows the Neuron settings of dfmp2's environment)
import nki_emulator as nki
from nki_emulator import NkiConstraintError
from nki_emulator.core import round_to_bf16
from test_nki_audit import Case, assert_refused, body_kernel, sb  # the audit's kernel, cases and checks
from test_nki_limits import rows_by_program_kernel

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.nki_limits

P = 128
X = np.random.default_rng(63).standard_normal((P, 8)).astype(np.float32)


@pytest.fixture(autouse=True)
def _kernels_compiled_at_lnc_1(monkeypatch):
    """dfmp2 compiles its kernels at LNC=1 under nki 0.7 (rule L14); these tests launch as it does."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    monkeypatch.delenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", raising=False)


def loaded(src, dtype=nl.float32):
    """An SBUF tile holding `src` (an HBM view), copied by DMA."""
    t = nl.ndarray(src.shape if len(src.shape) > 1 else (src.shape[0], 1), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def fori(body, lower=0, upper=3, step=1):
    return lambda x: nl.fori_loop(lower, upper, lambda i: body(x, i), step=step)


# ---- bodies that break one rule each ---------------------------------------------------------------------
def _branch_on_the_loop_variable(x, i):
    if i == 0:
        nisa.memset(dst=sb((P, 8)), value=0.0)


def _python_state_across_iterations(x):
    """A Python counter picks a different tile each iteration: on the device the body is the first
    iteration's code, so every iteration would write tiles[0]."""
    tiles, count = [sb((P, 8)), sb((P, 8))], [0]

    def body(i):
        nisa.tensor_scalar(dst=tiles[count[0] % 2], data=tiles[count[0] % 2], op0=nl.add, operand0=1.0)
        count[0] += 1
    nl.fori_loop(0, 2, body)


def _allocates_in_the_first_iteration_only(x):
    made = []

    def body(i):
        if not made:
            made.append(sb((P, 8)))
    nl.fori_loop(0, 2, body)


def _fori_in_no_reorder(x):
    with nl.no_reorder():
        nl.fori_loop(0, 2, lambda i: None)


def _write_the_loop_variable(x, i):
    nisa.register_move(i, 5)


def _nested_jit(x):
    sub_kernel(x)


def _nested_grid(x):
    sub_kernel[2](x)


@nki.jit
def sub_kernel(x):
    """A helper decorated with nki.jit and called from a running kernel (rule L20)."""
    t = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _while_returning_nothing(x):
    nl.while_loop(nisa.register_alloc(1), lambda r: None)


def _eight_banks_with_pe_transposes(x):
    tiles = [nl.ndarray((P, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
    nisa.memset(dst=tiles[0], value=0.0)


def _transpose(src_shape, dst_shape=None, dtype=nl.bfloat16, **kw):
    def body(x):
        src = sb(src_shape, dtype)
        shape = dst_shape or tuple(reversed(src_shape)) if len(src_shape) == 2 else dst_shape
        dst = nl.ndarray(shape, dtype=kw.pop("dst_dtype", dtype), buffer=kw.pop("dst_buffer", nl.sbuf))
        nisa.dma_transpose(dst=dst, src=src, **kw)
    return body


def _select(on_true_width=8, **kw):
    def body(x):
        args = {"dst": nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), "pattern": [[-1, 8]],
                "channel_multiplier": 1, "on_true_tile": sb((P, on_true_width)), "on_false_value": -9.0, **kw}
        nisa.affine_select(**args)
    return body


REFUSALS = [
    # indexing (LANG-0.6: integer, slice, ellipsis and tuple keys; negative indices; nl.ds)
    Case("IX1", lambda x: sb((P, 8))[..., ...], "a single ellipsis", "IX1"),
    Case("IX2", lambda x: sb((P, 8))[:, 1.5], "unsupported index 1.5", "IX2"),
    Case("IX2b", lambda x: sb((P, 8))[:, nl.ds(0, nisa.register_alloc(4))], "the size must be a compile-time int",
         "IX2"),
    Case("IX3", lambda x: sb((P, 8))[:, -9], "index -9 is outside axis 1", "IX3"),
    Case("IX3b", lambda x: sb((P, 8))[:, 4:12], "no clamping", "IX3"),
    # views
    Case("V1", lambda x: sb((P, 8)).reshape((P, 6)), "a view keeps the element count", "V1"),
    Case("V2", lambda x: sb((P, 8, 4))[:, :, 0:2].reshape((P, 16)), "a view cannot reorder memory", "V2"),
    Case("V3", lambda x: sb((P, 8, 4)).permute((1, 0, 2)), "dims[0] must be 0", "V3"),
    Case("V4", lambda x: sb((P, 2)).broadcast(1, 8), "the axis must have size 1", "V4"),
    Case("V4b", lambda x: nisa.memset(dst=sb((P, 1)).broadcast(1, 8), value=1.0), "a broadcast view", "V4"),
    # ndarray(address=)
    Case("AD1", lambda x: nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0)),
         "has no address= (added in 0.3)", "AD1", api="0.2", target="trn1"),
    Case("AD1b", lambda x: nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf, address=[0, 0]),
         "is a tuple (partition_offset, free_offset)", "AD1"),
    Case("AD1c", lambda x: nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.shared_hbm, address=(0,)),
         "an HBM address, a 1-tuple, is documented from 0.7", "AD1", api="0.6"),
    Case("AD2", lambda x: nl.ndarray((P, 128), dtype=nl.float32, buffer=nl.psum, address=(0, 100)),
         "must start at the beginning of a 2048 B bank", "AD2"),
    Case("AD3", lambda x: nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf, address=(96, 0)),
         "outside the 128 partitions", "AD3"),
    Case("AD3b", lambda x: nl.ndarray((P, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 7 * 512 + 512)),
         "outside the 128 partitions x 16384 B of PSUM", "AD3"),
    Case("X3c", lambda x: nisa.memset(dst=nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf, address=(32, 0)),
                                      value=0.0), "must start at partition 0 or 64", "X3"),
    # dma_transpose
    Case("DT1", _transpose((16, 8), dst_buffer=nl.psum, dst_dtype=nl.float32), "dst must be an SBUF tile", "DT1"),
    Case("DT1b", _transpose((16, 8), dst_dtype=nl.float16), "does not cast", "DT1"),
    Case("DT2", _transpose((16, 8), axes=(0, 1)), "supported are (1, 0), (2, 1, 0) and (3, 1, 2, 0)", "DT2"),
    Case("DT2b", _transpose((16, 8), dst_shape=(8, 8)), "dst must be the transposed source (8, 16)", "DT2"),
    Case("DT3", _transpose((16, 8), dge_mode=nisa.dge_mode.swdge), "the software-DGE indirect transpose", "DT3"),
    Case("DT4", _transpose((16, 128)), "needs NeuronCore-v3 or newer, not trn1", "DT4", target="trn1", api="0.2"),
    Case("DT5", _transpose((32, 8)), "a 2-d src with src.shape[0] == 16", "DT5"),
    Case("DT5b", _transpose((2, 4, 8), dst_shape=(8, 4, 2)), "a multiple of 16", "DT5"),
    Case("DT5c", _transpose((16, 8)), "before nki 0.6 the hardware DGE transposes", "DT5", api="0.5"),
    Case("DT6", _transpose((16, 8), dtype=nl.float32), "moves 2-byte elements", "DT6"),
    # affine_select
    Case("AS1", lambda x: nisa.affine_select(nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), [[-1, 8]], 0, 1,
                                             sb((P, 8)), -9.0, nl.greater_equal),
         "signature is affine_select(dst, pattern, channel_multiplier, on_true_tile", "AS1"),
    Case("AS1b", lambda x: nisa.affine_select(nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), [[-1, 8]],
                                              channel_multiplier=1, on_true_tile=sb((P, 8)), on_false_value=-9.0),
         "needs offset", "AS1", target="trn1", api="0.2"),
    Case("AS2", _select(pattern=[[-1, 4]]), "must cover dst's 8 elements per partition", "AS2"),
    Case("AS2b", _select(on_true_width=4), "differ in partitions or elements per partition", "AS2"),
    Case("AS3", _select(on_false_value=0), "must be a float32 number", "AS3"),
    Case("AS4", _select(cmp_op=nl.add), "cmp_op must be a comparison operator", "AS4"),
    # tensor_scalar: Trn3's unary op0s
    Case("TS12", lambda x: nisa.tensor_scalar(dst=sb((P, 8)), data=sb((P, 8)), op0=nl.square, operand0=None),
         "square and relu are accepted as op0 of tensor_scalar on trn3", "TS12"),
    Case("TS12b", lambda x: nisa.tensor_scalar(dst=sb((P, 8)), data=sb((P, 8)), op0=nl.relu, operand0=None),
         "from nki 0.4 only", "TS12", target="trn3", api="0.3"),
    Case("TS12c", lambda x: nisa.tensor_scalar(dst=sb((P, 8)), data=sb((P, 8)), op0=nl.add, operand0=1.0,
                                               op1=nl.square, operand1=None), "square as op1", "TS12", target="trn3"),
    # PSUM: bank 7 kept for nc_transpose where dma_transpose becomes PE transposes (see the test below)
    # device loops and registers
    Case("L17", fori(_branch_on_the_loop_variable), "Python control flow (if/while/and/or) of an expression of the "
                                                    "nl.fori_loop variable", "L17"),
    Case("L17b", fori(lambda x, i: [sb((P, 8)) for _ in range(i)]), "a Python int conversion", "L17"),
    Case("L17c", fori(lambda x, i: loaded(x[i * 2, :])), "Python arithmetic ('*')", "L17", api="0.6"),
    Case("L17d", fori(lambda x, i: loaded(x[i // 2, :])), "0.7's NkiScalar documents +, - and *", "L17"),
    Case("L17e", _python_state_across_iterations, "iteration 1 of nl.fori_loop issues tensor_scalar", "L17"),
    Case("L17f", _allocates_in_the_first_iteration_only, "ends after 0 of the traced body's 2 instructions", "L17"),
    Case("L17g", fori(_write_the_loop_variable), "is frozen", "L17"),
    Case("L17h", lambda x: nisa.scalar_load(sb((1, 1), nl.uint32)), "the source is an int32 tile of one element",
         "L17"),
    Case("L17i", lambda x: nisa.scalar_load(sb((1, 1), nl.int32)), "new in nki 0.7", "L17", api="0.6"),
    Case("L17j", fori(lambda x, i: loaded(x[nl.ds(i == 0, 1), :])), "its result cannot be used", "L17"),
    Case("L17k", fori(lambda x, i: loaded(x[nl.ds(i ** 2, 1), :])), "'**'", "L17"),
    Case("L17l", fori(lambda x, i: loaded(x[nl.ds(i + 1.0, 1), :])), "combines with ints and other scalars only",
         "L17"),
    Case("L17m", lambda x: nisa.register_alloc(2 ** 31), "the initial value is a 32-bit int", "L17"),
    Case("L17n", lambda x: nisa.register_move(nisa.register_alloc(), 2.7), "is a 32-bit int or a register", "L17"),
    Case("IX2c", fori(lambda x, i: loaded(x[:, i:i + 2])), "has a register bound", "IX2"),
    Case("IX2d", lambda x: loaded(x[nl.ds(0, 2.0), :]), "with size 2.0", "IX2"),
    Case("X15", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=2.0, op=nl.add),
         "data2 is a float, not an NKI tensor", "X15"),
    Case("X15b", lambda x: nisa.dma_copy(dst=sb((P, 8)), src=X), "src is a ndarray, not an NKI tensor", "X15"),
    Case("L15", lambda x: nl.fori_loop(0, 3, lambda i: None, step=nisa.register_alloc(1)),
         "must be a positive compile-time int", "L15"),
    Case("L18", _fori_in_no_reorder, "inside an nl.no_reorder() block", "L18"),
    Case("L20", _nested_jit, "a sub-kernel must not be decorated", "L20", api="0.6"),
    Case("L20b", _nested_grid, "a kernel with a launch grid cannot be called from another kernel", "L20"),
    Case("L19", lambda x: None, "nki 0.4 does not support trn1", "L19", target="trn1", api="0.4"),
    Case("L19b", lambda x: None, "nki 0.2 does not support trn3", "L19", target="trn3", api="0.2"),
    Case("L23", lambda x: nl.while_loop(1, lambda r: r), "the condition is a register", "L23"),
    Case("L23b", _while_returning_nothing, "it returns the condition register of the next iteration", "L23"),
    Case("L23c", lambda x: nl.while_loop(nisa.register_alloc(1), lambda r: r), "nl.while_loop does not exist in nki "
                                                                               "0.5", "L23", api="0.5"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[case.id for case in REFUSALS])
def test_rule_is_refused(case):
    assert_refused(case, X)


def test_every_refusal_id_is_unique():
    assert len({case.id for case in REFUSALS}) == len(REFUSALS)


def test_python_uses_of_a_register_raise_type_error():
    """AWS: under the tracer, a register in Python control flow or int()/range() raises TypeError."""
    with nki.target("trn2"), pytest.raises(TypeError, match=r"\[L17; trn2, nki 0\.7\]"):
        body_kernel(X, fori(_branch_on_the_loop_variable))


# ---- legal kernels: each runs, and computes what AWS documents ----------------------------------------------
def _negative_and_ellipsis(x):
    last = loaded(x[:, -1])  # an int on an HBM axis drops it; -1 is the last column
    assert np.array_equal(last.data, X[:, 7:8])
    tail = loaded(x[..., -3:])
    assert np.array_equal(tail.data, X[:, 5:8])
    t = loaded(x)
    assert t[..., 2].shape == (P, 1)  # on chip a result stays 2-D: the last free dim kept at 1
    assert t[0:64, ...].shape == (64, 8) and t[-32:, -2].shape == (32, 1)


def _free_axis_step(x):
    assert np.array_equal(loaded(x[:, ::2]).data, X[:, ::2])
    t, half = loaded(x), nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=half, src=t[:, 1::2])
    assert np.array_equal(half.data, X[:, 1::2])
    even = sb((P, 8), fill=0.0)  # a DMA may step over partitions (X5 binds the engines)
    nisa.dma_copy(dst=even[0:P:2, :], src=x[0:64, :])
    assert np.array_equal(even.data[0::2], X[0:64]) and (even.data[1::2] == 0).all()


def _permute_and_broadcast(x):
    t = loaded(x).reshape((P, 2, 4))
    swapped = nl.ndarray((P, 4, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=swapped, src=t.permute((0, 2, 1)))
    assert np.array_equal(swapped.data, X.reshape(P, 2, 4).transpose(0, 2, 1))
    scaled = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=scaled, data1=loaded(x), data2=sb((P, 1), fill=2.0).broadcast(1, 8), op=nl.multiply)
    assert np.array_equal(scaled.data, 2 * X)


def _placed_tiles(x):
    quarter = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf, address=(32, 0))
    nisa.memset(dst=quarter, value=1.0)
    bank3 = nl.ndarray((P, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 3 * 512))
    nisa.memset(dst=bank3, value=0.0)
    top = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf, address=(64, 100))
    nisa.memset(dst=top, value=2.0)


def _transposes(x):
    src = loaded(x[0:16, :], nl.bfloat16)
    dst = nl.ndarray((8, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=dst, src=src, axes=(1, 0))
    assert np.array_equal(dst.data, round_to_bf16(X[0:16].T))
    src3 = loaded(x[0:8, :], nl.bfloat16).reshape((8, 2, 4))  # [1, 2, 4, 8, 16] x a multiple of 16 / shape[0]
    dst3 = nl.ndarray((4, 2, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=dst3, src=src3)
    assert np.array_equal(dst3.data, round_to_bf16(X[0:8].reshape(8, 2, 4).transpose(2, 1, 0)))


def _transpose_0_5(x):
    src = sb((16, 128), nl.float16, fill=3.0)
    dst = nl.ndarray((128, 16), dtype=nl.float16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge)
    assert (dst.data == 3.0).all()


def _causal_mask(x, signature="0.3"):
    dst = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    on_true = loaded(x)
    if signature == "0.2":  # offset the third positional argument
        nisa.affine_select(dst, [[-1, 8]], 0, 1, on_true, -9.0, nl.greater_equal)
    else:
        nisa.affine_select(dst, [[-1, 8]], 1, on_true, -9.0, nl.greater_equal)
    p, j = np.meshgrid(np.arange(P), np.arange(8), indexing="ij")
    assert np.array_equal(dst.data, np.where(p >= j, X, np.float32(-9.0)))


def _square_and_relu_op0(x):
    t, out = loaded(x), nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=t, op0=nl.square, operand0=None, op1=nl.add, operand1=1.0)
    assert np.array_equal(out.data, X * X + 1)
    nisa.tensor_scalar(dst=out, data=t, op0=nl.relu, operand0=0)
    assert np.array_equal(out.data, np.maximum(X, 0))


def _scalar_engine_pair_on_trn3(x):
    t, out = loaded(x), nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=t, op0=nl.subtract, operand0=1.0, op1=nl.maximum, operand1=0.0,
                       engine=nisa.engine.scalar)
    assert np.array_equal(out.data, np.maximum(X - 1, 0))


def _even_rows_summed(x, api):
    """sum over i of x[2 i] through a device loop: the register indexes HBM (0.7: by arithmetic on it; 0.6: a
    register offset, no arithmetic), the sum stays in SBUF across iterations."""
    acc = sb((1, 8), fill=0.0)

    def body(i):
        row = x[nl.ds(i * 2, 1), :] if api == "0.7" else x[nl.ds(i, 1), :]
        nisa.tensor_tensor(dst=acc, data1=acc, data2=loaded(row), op=nl.add)
    nl.fori_loop(0, 4, body)
    rows = X[0:8:2] if api == "0.7" else X[0:4]
    np.testing.assert_allclose(acc.data, rows.sum(axis=0, keepdims=True), rtol=1e-6)


def _register_bound_and_while(x):
    bound = sb((1, 1), nl.int32, fill=3)
    n = nisa.register_alloc()
    nisa.register_load(n, bound)
    count = sb((1, 1), nl.int32, fill=0)
    nl.fori_loop(0, n, lambda i: nisa.tensor_scalar(dst=count, data=count, op0=nl.add, operand0=1.0))
    assert count.data[0, 0] == 3

    left = sb((1, 1), nl.int32, fill=0)

    def body(condition):  # left = 5 - (iterations so far); stop at 0
        nisa.tensor_scalar(dst=count, data=count, op0=nl.add, operand0=1.0)
        nisa.tensor_scalar(dst=left, data=count, op0=nl.subtract, operand0=8.0, reverse0=True)
        nisa.register_load(condition, left)
        return condition
    nl.while_loop(nisa.register_alloc(1), body)
    assert count.data[0, 0] == 8
    stored = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(stored, n)
    assert stored.data[0, 0] == 3


def _scalar_load(x):
    start = nisa.scalar_load(sb((1, 1), nl.int32, fill=5))
    assert np.array_equal(loaded(x[nl.ds(start + 1, 2), :]).data, X[6:8])


def _no_reorder_inside_the_body(x):
    def body(i):
        with nl.no_reorder():
            nisa.memset(dst=sb((P, 8)), value=0.0)
    nl.fori_loop(0, 2, body)


def _nested_loops(x):
    acc = sb((1, 8), fill=0.0)
    nl.fori_loop(0, 2, lambda i: nl.fori_loop(0, 3, lambda j: nisa.tensor_tensor(
        dst=acc, data1=acc, data2=loaded(x[nl.ds(i * 3 + j, 1), :]), op=nl.add)))
    np.testing.assert_allclose(acc.data, X[0:6].sum(axis=0, keepdims=True), rtol=1e-6)


def _inner_loops_whose_trips_follow_the_outer_variable(x):
    """The inner bound is the outer variable (0.7: register bounds): the inner loops run 0, 1, 2 times, and
    a while_loop inside runs i times; the inner bodies are traced the first time they run."""
    acc = sb((1, 8), fill=0.0)
    nl.fori_loop(0, 3, lambda i: nl.fori_loop(0, i, lambda j: nisa.tensor_tensor(
        dst=acc, data1=acc, data2=loaded(x[nl.ds(j, 1), :]), op=nl.add)))
    np.testing.assert_allclose(acc.data, 2 * X[0:1] + X[1:2], rtol=1e-6)
    count = sb((1, 1), nl.int32, fill=0)

    def body(i):
        left = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(left, i)

        def step(condition):
            nisa.tensor_scalar(dst=count, data=count, op0=nl.add, operand0=1.0)
            nisa.tensor_scalar(dst=left, data=left, op0=nl.subtract, operand0=1.0)
            nisa.register_load(condition, left)
            return condition
        start = nisa.register_alloc()
        nisa.register_move(start, i)
        nl.while_loop(start, step)
    nl.fori_loop(0, 4, body)
    assert count.data[0, 0] == 0 + 1 + 2 + 3


def _inlined_sub_kernel(x):
    assert np.array_equal(sub_kernel(x).data, X)


def _seven_banks_with_pe_transposes(x):
    tiles = [nl.ndarray((P, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(7)]
    nisa.memset(dst=tiles[0], value=0.0)


LEGAL = [
    Case("IX1", _negative_and_ellipsis, ""),
    Case("IX1b", _negative_and_ellipsis, "", target="trn1", api="0.2"),
    Case("X5", _free_axis_step, ""),
    Case("V3", _permute_and_broadcast, ""),
    Case("AD2", _placed_tiles, ""),
    Case("DT5", _transposes, ""),
    Case("DT5b", _transposes, "", target="trn3"),
    Case("DT5c", _transpose_0_5, "", api="0.5"),
    Case("AS1", _causal_mask, ""),
    Case("AS1b", lambda x: _causal_mask(x, "0.2"), "", target="trn1", api="0.2"),
    Case("TS12", _square_and_relu_op0, "", target="trn3"),
    Case("TS8", _scalar_engine_pair_on_trn3, "", target="trn3"),
    Case("L17", lambda x: _even_rows_summed(x, "0.7"), ""),
    Case("L17b", lambda x: _even_rows_summed(x, "0.6"), "", api="0.6"),
    Case("L17c", _register_bound_and_while, ""),
    Case("L17d", _register_bound_and_while, "", target="trn3", api="0.6"),
    Case("L17e", _scalar_load, ""),
    Case("L17f", _nested_loops, ""),
    Case("L17g", _inner_loops_whose_trips_follow_the_outer_variable, ""),
    Case("L15", lambda x: nl.fori_loop(0, 4, lambda i: None, step=np.int64(2)), ""),
    Case("L18", _no_reorder_inside_the_body, ""),
    Case("L20", _inlined_sub_kernel, ""),
    Case("L19", lambda x: None, "", target="trn1", api="0.3"),  # disputed: a sibling library ran it (announced)
]


@pytest.mark.parametrize("case", LEGAL, ids=[case.id for case in LEGAL])
def test_legal_kernel_runs(case):
    with nki.target(case.target, api=case.api):
        body_kernel(X, case.body)


def test_psum_keeps_its_seventh_bank_for_nc_transpose_when_dma_transposes_are_pe_transposes(monkeypatch):
    """L2 (TILE_SIZE psum_num_banks, nki 0.4+): with NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true on trn2+, bank 7 is
    reserved for nc_transpose, so 7 banks are left; unset (or on trn1) all 8."""
    with nki.target("trn2"):
        body_kernel(X, _eight_banks_with_pe_transposes)
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    with nki.target("trn2"):
        body_kernel(X, _seven_banks_with_pe_transposes)
        with pytest.raises(NkiConstraintError, match=r"exceeds PSUM capacity on trn2.*limit 14336 B.*\[L2; trn2"):
            body_kernel(X, _eight_banks_with_pe_transposes)
        with pytest.raises(NkiConstraintError, match=r"outside the 128 partitions x 14336 B of PSUM \[AD3; trn2"):
            body_kernel(X, lambda x: nl.ndarray((P, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 7 * 512)))
    with nki.target("trn2", api="0.3"):
        body_kernel(X, _eight_banks_with_pe_transposes)
    with nki.target("trn1"):
        body_kernel(X, _eight_banks_with_pe_transposes)


# ---- launch rules: the LNC degree, programs that must agree ---------------------------------------------
@nki.jit
def rows_in_a_device_loop_kernel(x, uneven):
    """Rows of this program in nl.fori_loop; uneven: program 0 loops over one row more than program 1."""
    R, F = x.shape
    pid, programs = nl.program_id(0), nl.num_programs()
    out = nl.ndarray((R, F), dtype=nl.float32, buffer=nl.shared_hbm)
    mine = (R - pid + programs - 1) // programs if uneven else R // programs

    def body(k):
        row = nl.ndarray((1, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=x[nl.ds(k * programs + pid, 1), :])
        nisa.dma_copy(dst=out[nl.ds(k * programs + pid, 1), :], src=row)
    nl.fori_loop(0, mine, body)
    return out


def test_a_plain_call_runs_at_the_degree_neuron_logical_nc_config_sets_under_0_7(monkeypatch):
    """L14 (the 0.7 nki.jit page): the LNC degree is set by NEURON_LOGICAL_NC_CONFIG before the call (1 when unset);
    a plain call under NEURON_LOGICAL_NC_CONFIG=2 is a two-program launch (the EVRF066 page's example), legal."""
    x = np.random.default_rng(1).standard_normal((5, P)).astype(np.float32)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    for target in ("trn2", "trn3"):
        with nki.target(target, api="0.7"):
            assert np.array_equal(rows_by_program_kernel(x), x)
        assert len(rows_by_program_kernel.last_trace.programs) == 2
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG")
    with nki.target("trn2", api="0.7", lnc=1):  # unset: LNC=1, which a compiler at LNC=1 accepts
        assert np.array_equal(rows_by_program_kernel(x), x)
    with nki.target("trn2", api="0.7"), pytest.raises(NkiConstraintError, match=r"configured with LNC=1.*\[L14"):
        rows_by_program_kernel(x)  # unset, and neuronx-cc at its default LNC=2


def test_a_grid_must_match_neuron_logical_nc_config_under_0_6(monkeypatch):
    """L21 (nki.jit, nki 0.6): 'The LNC value must match the NEURON_LOGICAL_NC_CONFIG environment variable' (a
    plain call's is 1, kernel[n]'s n); unset, any grid the target allows."""
    x = np.random.default_rng(2).standard_normal((4, P)).astype(np.float32)
    with nki.target("trn2", api="0.6"), pytest.raises(
            NkiConstraintError, match=r"launched at LNC=2 .* must match the variable.*\[L21; trn2, nki 0\.6\]"):
        rows_by_program_kernel[2](x)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with nki.target("trn2", api="0.6"):
        assert np.array_equal(rows_by_program_kernel[2](x), x)
        with pytest.raises(NkiConstraintError, match=r"launched at LNC=1 .*a plain call: 1.*\[L21; trn2, nki 0\.6\]"):
            rows_by_program_kernel(x)
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG")
    with nki.target("trn2", api="0.6"):
        assert np.array_equal(rows_by_program_kernel[2](x), x)


@nki.jit
def rows_in_a_dynamic_range_kernel(x):
    """nki 0.2-0.6's device loop (nl.dynamic_range) over this program's rows: 3 and 2 of 5."""
    R, F = x.shape
    pid, programs = nl.program_id(0), nl.num_programs()
    out = nl.ndarray((R, F), dtype=nl.float32, buffer=nl.shared_hbm)
    for r in nl.dynamic_range(pid, R, programs):
        row = nl.ndarray((1, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=x[r:r + 1, :])
        nisa.dma_copy(dst=out[r:r + 1, :], src=row)
    return out


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_device_loops_that_differ_between_the_programs_of_a_launch_are_refused(target, monkeypatch):
    """L22 (AWS's LNC guide: dynamic control flow that differs between the cores is undefined behaviour): with 5
    rows over 2 programs, program 0's device loop runs 3 times and program 1's 2; with 4 rows both run 2."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    rng = np.random.default_rng(3)
    even, odd = (rng.standard_normal((n, P)).astype(np.float32) for n in (4, 5))
    with nki.target(target, api="0.7"):
        assert np.array_equal(rows_in_a_device_loop_kernel(even, False), even)
        with pytest.raises(NkiConstraintError, match=r"program 0: nl\.fori_loop x3; program 1: nl\.fori_loop x2.*"
                                                     rf"\[L22; {target}, nki 0\.7\]"):
            rows_in_a_device_loop_kernel(odd, True)
    with nki.target(target, api="0.6"):
        assert np.array_equal(rows_in_a_dynamic_range_kernel[2](even), even)
        with pytest.raises(NkiConstraintError, match=r"nl\.dynamic_range x3; program 1: nl\.dynamic_range x2"):
            rows_in_a_dynamic_range_kernel[2](odd)
