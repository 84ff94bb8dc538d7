"""The NKI ISA audit (docs/nki-audit.md): for every documented rule of every instruction the
emulator models, a small kernel that breaks it and must raise NkiConstraintError naming the rule
(its audit tag in brackets, e.g. "[X3; trn2, nki 0.6]"), and where useful a legal twin that must
run, so that no test can pass by refusing everything. Also the bfloat16 support: RNE rounding of
every write into a bf16 tile, bf16 matmuls, bf16 byte accounting and the Tensor Engine's cheaper
bf16 columns in the cost model.

Rule-breaking kernels are small bodies run inside one generic kernel (`body_kernel`); kernel-level
rules (outputs, arguments) have their own kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import nki_emulator as nki
from nki_emulator import NkiConstraintError
from dfmp2.kernels.nki import model as cost_model

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.nki_limits

P = 128
X = np.random.default_rng(0).standard_normal((P, 8)).astype(np.float32)


@pytest.fixture(autouse=True)
def _kernels_compiled_at_lnc_1(monkeypatch):
    """Under nki 0.7 (the emulated default on trn2) every kernel must run at neuronx-cc's LNC degree
    (rule L14), and dfmp2 compiles its kernels at LNC=1 there: these rule tests launch as dfmp2 does.
    Before 0.7 the setting changes nothing the emulator checks."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")


# ---- helpers (called inside a kernel) ----------------------------------------------------------
def sb(shape, dtype=nl.float32, fill=1.0, buffer=nl.sbuf):
    """A written on-chip tile (memset to `fill`)."""
    t = nl.ndarray(shape, dtype=dtype, buffer=buffer)
    nisa.memset(dst=t, value=int(fill) if dtype.kind in "iu" else float(fill))
    return t


def ps(shape, fill=1.0):
    return sb(shape, fill=fill, buffer=nl.psum)


def psum(shape):
    return nl.ndarray(shape, dtype=nl.float32, buffer=nl.psum)


def mm(k=P, m=P, n=64, s_dtype=nl.float32, m_dtype=nl.float32):
    """nc_matmul's (dst, stationary, moving): an unwritten PSUM dst [m, n] and written SBUF
    operands [k, m] and [k, n]."""
    return psum((m, n)), sb((k, m), s_dtype), sb((k, n), m_dtype)


@nki.jit
def body_kernel(x, body):
    """Runs body(x) (x: an HBM tensor [128, 8]), then returns a dummy output."""
    body(x)
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    nisa.dma_copy(dst=out, src=t)
    return out


@dataclass
class Case:
    id: str  # the audit row (docs/nki-audit.md), with a letter suffix for a second case
    body: Callable
    fragment: str  # a piece of the expected message
    rule: str | None = None  # the tag the message must carry, e.g. "X3" in "[X3; trn2, nki 0.6]"
    target: str = "trn2"
    api: str | None = None


E = nisa.engine


def copy_(dst, src, **kw):
    nisa.tensor_copy(dst=dst, src=src, **kw)


def _tensor_scalar(x, **kw):
    a, b = sb((P, 8)), sb((P, 8))
    nisa.tensor_scalar(**{"dst": b, "data": a, "op0": nl.multiply, "operand0": 2.0, **kw})


def _activation(x, data=None, **kw):
    a = data if data is not None else sb((P, 8))
    nisa.activation(**{"dst": nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf), "op": nl.copy,
                       "data": a, **kw})


def _matmul_tiled(k, tile_position, tile_size):
    acc, s, m = mm(k=k)
    nisa.nc_matmul(dst=acc, stationary=s, moving=m, tile_position=tile_position, tile_size=tile_size)


def _mixed_region(x):
    _, s, m = mm()
    acc = psum((P, 128))
    nisa.nc_matmul(dst=acc[:, 0:64], stationary=s, moving=m)
    nisa.memset(dst=acc[:, 64:128], value=0.0)
    nisa.nc_matmul(dst=acc[:, 32:96], stationary=s, moving=m)


def _nine_banks(x):
    tiles = [psum((P, 512)) for _ in range(9)]
    nisa.memset(dst=tiles[0], value=0.0)


def _reduce(x, data_shape, axis, dst_shape=(P, 1), op=nl.add):
    nisa.tensor_reduce(dst=nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.sbuf), op=op,
                       data=sb(data_shape), axis=axis)


def _reduce_5_axes(x):
    """Data of 5 free dims can only be written by DMA (engines refuse them, X6); reduce all 5."""
    data = nl.ndarray((P, 1, 1, 1, 1, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=data, src=x[:, 0:2])
    nisa.tensor_reduce(dst=nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf), op=nl.add, data=data,
                       axis=(1, 2, 3, 4, 5))


# ---- the rule-breaking kernels, one per audit row ------------------------------------------------
REFUSALS = [
    # cross-cutting rules of every engine operand
    Case("X1", lambda x: nl.ndarray((129, 8), dtype=nl.float32, buffer=nl.sbuf), "129 partitions; the limit is 128"),
    Case("X2", lambda x: copy_(sb((P, 8))[32:128], sb((P, 8))[32:128]), "spans 96 partitions starting at partition 32",
         "X2"),
    Case("X3", lambda x: copy_(sb((P, 8))[16:64], sb((P, 8))[16:64]), "must start at partition 0 or 64", "X3"),
    Case("X3b", lambda x: copy_(sb((P, 8))[32:96], sb((P, 8))[32:96]), "must start at partition 0 or 64", "X3"),
    Case("X4", lambda x: nisa.memset(dst=sb((P, 8))[5:6, :], value=2.0), "must start at partition 0, 32, 64 or 96",
         "X4"),
    Case("X4b", lambda x: nisa.tensor_scalar(dst=sb((P, 8))[8:24], data=sb((P, 8))[8:24], op0=nl.multiply,
                                             operand0=2.0), "must start at partition 0, 32, 64 or 96", "X4"),
    Case("X5", lambda x: copy_(sb((64, 8)), sb((P, 8))[0:P:2, :]), "an engine access has no partition-axis stride",
         "X5"),
    Case("X6", lambda x: sb((P, 2, 2, 2, 2, 2)), "has 5 free dims; an engine access pattern has at most 4", "X6"),
    Case("X6b", lambda x: sb((1, 65536), nl.int8), "does not fit the ISA's uint16 size field", "X6"),
    Case("X7", lambda x: copy_(sb((P, 8))[64:128], sb((P, 8))[0:64]), "cannot move data across partitions", "X7"),
    Case("X8", lambda x: sb((2, 70000), nl.int8), "70000 elements per partition; an engine access of SBUF holds "
                                                  "at most 65536", "X8"),
    Case("X9", lambda x: sb((P, 50000)), "exceeds SBUF capacity on trn1", target="trn1"),
    Case("X10", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=ps((P, 8)), op=nl.add,
                                             engine=E.gpsimd), "the GpSimd Engine cannot access PSUM", "TT5"),
    Case("X11", lambda x: copy_(sb((P, 8)), sb((P, 8)), engine="vector"), "is not a nisa.engine member", "X11"),
    Case("X11b", lambda x: copy_(sb((P, 8)), sb((P, 8)), engine=5), "accepts no raw int for an enum", "X11",
         api="0.3"),
    Case("X12", lambda x: nl.ndarray((P, 8), dtype=np.float64, buffer=nl.sbuf), "float64 does not exist"),
    Case("X13", lambda x: nl.ndarray((P, 8), dtype=np.int64, buffer=nl.sbuf), "int64 is not an NKI dtype"),
    Case("X14", lambda x: copy_(sb((P, 8)), nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)),
         "that no instruction wrote"),
    # dma_copy
    Case("D1", lambda x: nisa.dma_copy(dst=psum((P, 8)), src=x), "DMA cannot write PSUM", "D1"),
    Case("D2", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=ps((P, 8))),
         "dma_copy cannot read PSUM", "D2", target="trn1", api="0.2"),
    Case("D2b", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=ps((P, 8))),
         "dma_copy cannot read PSUM", "D2", api="0.6"),
    Case("D3", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf), src=x),
         "writes 1024 elements into dst (128, 4)"),
    Case("D5", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float16, buffer=nl.sbuf), src=x,
                                       dge_mode=nisa.dge_mode.hwdge), "dge_mode=hwdge moves raw bytes", "D5",
         api="0.3"),
    Case("D6", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                       dge_mode=nisa.dge_mode.hwdge), "hardware DGE (dge_mode=hwdge) needs "
                                                                      "NeuronCore-v3", "D6", target="trn1"),
    Case("D7", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                       engine=E.sync), "only valid with dge_mode=hwdge", "D7"),
    Case("D7b", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        engine=E.sync), "0.2 dma_copy has no engine= argument", "D7", target="trn1"),
    Case("D7c", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=0), "priority= needs NeuronCore-v4", "D7"),
    Case("D7d", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=0), "0.2 dma_copy has no priority= argument", "D7", target="trn1"),
    Case("D7e", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        engine=E.vector, dge_mode=nisa.dge_mode.hwdge),
         "engine=vector is not allowed; this instruction runs on sync or scalar", "D7"),
    Case("D7f", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=4), "priority=4: the level is an int 0 to 3", "D7", target="trn3"),
    Case("D7g", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=0), "0.3 dma_copy has no priority= argument (added in 0.4)", "D7",
         target="trn3", api="0.3"),
    Case("D7h", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=1, dge_mode=nisa.dge_mode.none),
         "nki 0.4 supports priority= only with DGE on", "D7", target="trn3", api="0.4"),
    # tensor_copy
    Case("C1", lambda x: copy_(sb((P, 8)), x), "is in shared_hbm, must be in SBUF or PSUM"),
    Case("C2", lambda x: copy_(sb((64, 8)), sb((P, 8))), "differ in partitions or elements per partition", "C2"),
    Case("C2b", lambda x: copy_(sb((P, 4)), sb((P, 8))), "differ in partitions or elements per partition", "C2"),
    Case("C3", lambda x: copy_(sb((P, 8)), sb((P, 8)), engine=E.scalar), "NeuronCore-v2 has no Scalar Engine "
                                                                          "tensor_copy", "C3", target="trn1"),
    Case("C4", lambda x: copy_(sb((P, 8)), ps((P, 8)), engine=E.gpsimd), "the GpSimd Engine cannot access PSUM", "C4"),
    # memset
    Case("M1", lambda x: nisa.memset(dst=x, value=0.0), "is in shared_hbm, must be in SBUF or PSUM"),
    Case("M2", lambda x: nisa.memset(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), value=0.0,
                                     engine=E.scalar), "engine=scalar is not allowed", "M2"),
    Case("M3", lambda x: nisa.memset(dst=psum((P, 8)), value=0.0, engine=E.gpsimd),
         "the GpSimd Engine cannot access PSUM", "M3"),
    Case("M4", lambda x: nisa.memset(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), value=0),
         "the memset value must match the tile dtype float32", "M4", api="0.3"),
    Case("M4b", lambda x: nisa.memset(dst=nl.ndarray((P, 8), dtype=nl.int32, buffer=nl.sbuf), value=1.5),
         "the memset value must match the tile dtype int32", "M4"),
    Case("M5", lambda x: nisa.memset(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), value=sb((P, 1))),
         "value must be a compile-time constant number", "M5"),
    # nc_matmul
    Case("MM1", lambda x: nisa.nc_matmul(dst=psum((P, 64)), stationary=ps((P, P)), moving=sb((P, 64))),
         "is in psum, must be in SBUF"),
    Case("MM1b", lambda x: nisa.nc_matmul(dst=psum((8, 64)), stationary=x, moving=sb((P, 64))),
         "is in shared_hbm, must be in SBUF"),
    Case("MM2", lambda x: nisa.nc_matmul(dst=sb((P, 64)), stationary=sb((P, P)), moving=sb((P, 64))),
         "the output must be in PSUM, not SBUF", "MM2"),
    Case("MM3", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.int8, m_dtype=nl.int8))),
         "Tensor Engine inputs are fp8/bf16/fp16/tf32/fp32, not int8 x int8", "MM3"),
    Case("MM3b", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.int32, m_dtype=nl.bfloat16))),
         "not int32 x bfloat16", "MM3"),
    Case("MM4", lambda x: nisa.nc_matmul(*(mm(m_dtype=nl.float16))),
         "float32 operands must be paired with float32, not float32 x float16", "MM4"),
    Case("MM4b", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.bfloat16))),
         "float32 operands must be paired with float32, not bfloat16 x float32", "MM4"),
    Case("MM5", lambda x: nl.ndarray((P, 64), dtype=nl.float16, buffer=nl.psum), "PSUM tile (128, 64) must be float32"),
    Case("MM6", lambda x: nisa.nc_matmul(dst=psum((P, 64)), stationary=sb((P, P)), moving=sb((64, 64))),
         "contraction (partition) sizes differ: 128 vs 64", "MM6"),
    Case("MM7", lambda x: nisa.nc_matmul(dst=psum((P, 64)), stationary=sb((P, P)).reshape((256, 64)),
                                         moving=sb((P, 64))), "would move data across partitions"),
    Case("MM8", lambda x: nisa.nc_matmul(dst=psum((P, 64)), stationary=sb((P, 129)), moving=sb((P, 64))),
         "stationary free size M=129 exceeds 128", "MM8"),
    Case("MM9", lambda x: nisa.nc_matmul(dst=psum((P, 64)), stationary=sb((P, P)), moving=sb((P, 513))),
         "moving free size N=513 exceeds 512", "MM9"),
    Case("MM10", lambda x: nisa.nc_matmul(dst=psum((P, 32)), stationary=sb((P, P)), moving=sb((P, 64))),
         "dst must be [128, 64]", "MM10"),
    Case("MM12", lambda x: _matmul_tiled(64, (), (64, 128)), "tiling mode needs both tile_position", "MM12",
         target="trn1"),
    Case("MM12b", lambda x: _matmul_tiled(32, (32, 0), (32, 128)), "row_size must be one of (128, 64) on trn1",
         "MM12", target="trn1"),
    Case("MM12c", lambda x: _matmul_tiled(P, (0, 64), (128, 64)), "column_size 128 and start_column 0", "MM12"),
    Case("MM12d", lambda x: _matmul_tiled(P, (64, 0), (64, 128)), "K=128 <= row_size", "MM12", target="trn1"),
    Case("MM12e", lambda x: _matmul_tiled(32, (32, 0), (64, 128)), "start_row must be a multiple of row_size",
         "MM12"),
    Case("MM13", lambda x: nisa.nc_matmul(*(mm()), perf_mode=nisa.matmul_perf_mode.double_row),
         "perf_mode=double_row: not on NeuronCore-v2", "MM13", target="trn1"),
    Case("MM13b", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.bfloat16, m_dtype=nl.bfloat16)),
                                           perf_mode=nisa.matmul_perf_mode.double_row), "it needs fp8 inputs", "MM13"),
    Case("MM13c", lambda x: nisa.nc_matmul(*(mm()), perf_mode="double_row"),
         "is not a nisa.matmul_perf_mode member", "X11"),
    Case("MM13d", lambda x: nisa.nc_matmul(psum((8, 16)), sb((P, 3, 8), nl.float8_e4m3fn),
                                           sb((P, 3, 16), nl.float8_e4m3fn),
                                           perf_mode=nisa.matmul_perf_mode.double_row),
         "a first free dim that must be 2", "MM13", target="trn3"),
    Case("MM13e", lambda x: nisa.nc_matmul(psum((8, 16)), sb((64, 2, 8), nl.float8_e4m3fn),
                                           sb((64, 2, 16), nl.float8_e4m3fn), tile_position=(0, 0),
                                           tile_size=(64, 128), perf_mode=nisa.matmul_perf_mode.double_row),
         "does not combine with transpose or tiling mode", "MM13", target="trn3"),
    Case("MM14", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.bfloat16, m_dtype=nl.bfloat16)), is_transpose=True),
         "is_transpose=True writes the input dtype (bfloat16) to PSUM", "MM14"),
    Case("MM15", lambda x: nisa.nc_matmul(*(mm()), accumulate=False),
         "nc_matmul has no accumulate= argument (added in 0.3)", "MM15", target="trn1"),
    Case("MM16", lambda x: nisa.nc_matmul(*(mm()), accumulate=True),
         "accumulate=True into PSUM that holds no matmul result", "MM16"),
    Case("MM17", lambda x: nisa.nc_matmul(dst=ps((P, 64)), stationary=sb((P, P)), moving=sb((P, 64)), accumulate=True),
         "accumulate=True into PSUM that holds no matmul result", "MM16"),
    Case("MM18", _mixed_region, "only partly holding a matmul result", "MM18"),
    Case("MM19", lambda x: nisa.nc_matmul(dst=psum((P, 64)), stationary=sb((P, P)), moving=sb((P, 2, 32))),
         "operands must be 2-D", "MM19"),
    # nc_transpose
    Case("T1", lambda x: nisa.nc_transpose(dst=sb((P, P)), data=sb((P, P))), "the Tensor Engine transpose writes PSUM",
         "T1"),
    Case("T1b", lambda x: nisa.nc_transpose(dst=psum((P, P)), data=ps((P, P))), "is in psum, must be in SBUF"),
    Case("T2", lambda x: nisa.nc_transpose(dst=sb((8, P)), data=x, engine=E.vector), "is in shared_hbm, must be in "
                                                                                     "SBUF or PSUM"),
    Case("T3", lambda x: nisa.nc_transpose(dst=psum((P, 129)), data=sb((P, 129))),
         "Tensor Engine transpose is limited to 128 x 128", "T3"),
    Case("T4", lambda x: nisa.nc_transpose(dst=sb((64, 64)), data=sb((64, 64)), engine=E.vector),
         "Vector Engine transpose is limited to 32 x 32", "T4"),
    Case("T5", lambda x: nisa.nc_transpose(dst=psum((P, P)), data=sb((P, P), nl.float16)),
         "dst dtype must equal the input dtype", "T5"),
    Case("T6", lambda x: nisa.nc_transpose(dst=psum((64, 32)), data=sb((64, 32))), "dst must be [32, 64]", "T6"),
    Case("T9", lambda x: nisa.nc_transpose(dst=psum((8, P)), data=sb((P, 8), fill=float("inf"))),
         "Tensor Engine transpose of NaN/Inf is not bit-accurate", "T9", target="trn1"),
    Case("T8", lambda x: nisa.nc_transpose(dst=psum((P, P)), data=sb((P, P)), engine=E.gpsimd),
         "engine=gpsimd is not allowed; this instruction runs on tensor or vector", "T8"),
    # tensor_tensor
    Case("TT1", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=x, data2=sb((P, 8)), op=nl.add),
         "is in shared_hbm, must be in SBUF or PSUM"),
    Case("TT2", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=ps((P, 8)), data2=ps((P, 8)), op=nl.add),
         "at most one input may be in PSUM", "TT2"),
    Case("TT3", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=sb((P, 4)), op=nl.add),
         "differ in partitions or elements per partition", "TT3"),
    Case("TT4", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=sb((P, 8)), op=nl.add,
                                             engine=E.scalar), "engine=scalar is not allowed", "TT4"),
    Case("TT5", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=ps((P, 8)), data2=sb((P, 8)), op=nl.add,
                                             engine=E.gpsimd), "the GpSimd Engine cannot access PSUM", "TT5"),
    Case("TT6", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=sb((P, 8)), op=nl.copy),
         "op must be a binary ALU operator", "TT6"),
    Case("TT6b", lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=sb((P, 8)), op=nl.reciprocal),
         "op must be a binary ALU operator", "TT6"),
    # tensor_scalar
    Case("TS1", lambda x: nisa.tensor_scalar(dst=sb((P, 8)), data=x, op0=nl.multiply, operand0=2.0),
         "is in shared_hbm, must be in SBUF or PSUM"),
    Case("TS2", lambda x: nisa.tensor_scalar(dst=sb((P, 4)), data=sb((P, 8)), op0=nl.multiply, operand0=2.0),
         "differ in partitions or elements per partition", "TS2"),
    Case("TS3", lambda x: _tensor_scalar(x, operand0=sb((P, 2))), "tile operand must be [128, 1]", "TS3"),
    Case("TS4", lambda x: _tensor_scalar(x, operand0=sb((P, 1), nl.int32)), "tile operand is int32, must be float32",
         "TS4"),
    Case("TS5", lambda x: _tensor_scalar(x, operand1=3.0), "operand1 given without op1", "TS5"),
    Case("TS5b", lambda x: _tensor_scalar(x, op1=nl.add), "a binary operator needs its operand", "TS5"),
    Case("TS7", lambda x: _tensor_scalar(x, engine=E.gpsimd), "engine=gpsimd is only allowed for rsqrt", "TS7"),
    Case("TS8", lambda x: _tensor_scalar(x, op0=nl.subtract, engine=E.scalar),
         "the Scalar Engine runs only (multiply, add)", "TS8"),
    Case("TS8b", lambda x: _tensor_scalar(x, op0=nl.subtract, engine=E.scalar),
         "applied to trn1 too, the stricter reading", "TS8", target="trn1"),
    Case("TS9", lambda x: nisa.tensor_scalar(dst=sb((P, 8)), data=ps((P, 8)), op0=nl.multiply, operand0=2.0,
                                             engine=E.gpsimd), "the GpSimd Engine cannot access PSUM", "TS9"),
    Case("TS10", lambda x: _tensor_scalar(x, op0=nl.reciprocal, operand0=2.0), "a unary operator takes operand None "
                                                                               "or 0", "TS10"),
    Case("TS10b", lambda x: _tensor_scalar(x, op0=nl.copy), "copy is not an ALU operator", "TS10"),
    # tensor_reduce
    Case("R1", lambda x: _reduce(x, (P, 8), (0,), (1, 8)), "reduction over the partition axis", "R1"),
    Case("R2", lambda x: _reduce(x, (P, 4, 8), (1,), (P, 1, 8)), "reduces only the last free axes", "R2"),
    Case("R3", lambda x: _reduce_5_axes(x), "at most 4 free axes can be reduced", "R3"),
    Case("R4", lambda x: _reduce(x, (P, 8), (1,), op=nl.copy), "unsupported reduction op", "R4"),
    Case("R5", lambda x: nisa.tensor_reduce(dst=sb((P, 1)), op=nl.add, data=x, axis=(1,)), "is in shared_hbm"),
    Case("R6", lambda x: _reduce(x, (P, 8), (1,), (64, 1)), "reads partitions 0..127 but writes partitions 0..63",
         "X7"),
    Case("R7", lambda x: _reduce(x, (P, 8), (1,), (P, 2)), "result has 128 elements, dst (128, 2)", "R7"),
    # activation
    Case("A1", lambda x: _activation(x, data=x), "is in shared_hbm, must be in SBUF or PSUM"),
    Case("A2", lambda x: nisa.activation(dst=sb((P, 4)), op=nl.copy, data=sb((P, 8))),
         "differ in partitions or elements per partition", "A2"),
    Case("A3", lambda x: _activation(x, op=nl.add), "op must be an activation function", "A3"),
    Case("A4", lambda x: _activation(x, scale=sb((P, 1), nl.float16)), "tile operand is float16, must be float32",
         "A4"),
    Case("A4b", lambda x: _activation(x, scale=sb((P, 2))), "tile operand must be [128, 1]", "A4"),
    Case("A5", lambda x: _activation(x, bias=1.0), "NeuronCore-v2 needs bias as a [N, 1] tile", "A5", target="trn1"),
    Case("A6", lambda x: _activation(x, bias=sb((P, 1), nl.int8)), "tile operand is int8, must be "
                                                                   "float32/float16/bfloat16", "A6", target="trn1"),
    Case("A7", lambda x: _activation(x, reduce_op=nl.maximum, reduce_res=nl.ndarray((P, 1), dtype=nl.float32),
                                     reduce_cmd=nisa.reduce_cmd.reset_reduce), "reduce_op must be nl.add", "A7"),
    Case("A7b", lambda x: _activation(x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce), "were never reset",
         "A7"),
    Case("A7c", lambda x: _activation(x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.load_reduce),
         "load_reduce is not an activation command", "A7"),
    Case("A8", lambda x: _activation(x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                                     reduce_res=nl.ndarray((P, 2), dtype=nl.float32)), "reduce_res must be [128, 1]",
         "A8"),
    Case("A8b", lambda x: _activation(x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                                      reduce_res=nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)),
         "is in shared_hbm, must be in SBUF or PSUM"),
    Case("A9", lambda x: _activation(x, op=nl.reciprocal, bias=sb((P, 1))), "takes no bias on NeuronCore-v2", "A9",
         target="trn1"),
    Case("A10", lambda x: _activation(x, data=sb((P, 8), fill=1e-20), op=nl.reciprocal),
         "outside the valid range", "A10"),
    # reciprocal
    Case("RC1", lambda x: nisa.reciprocal(dst=sb((P, 8)), data=x), "is in shared_hbm, must be in SBUF or PSUM"),
    Case("RC2", lambda x: nisa.reciprocal(dst=sb((P, 4)), data=sb((P, 8))),
         "differ in partitions or elements per partition", "RC2"),
    # allocation
    Case("L1", lambda x: psum((P, 1024)), "wider than one 2048 B PSUM bank", "L1"),
    Case("L2", _nine_banks, "exceeds PSUM capacity on trn2: 16384 B already live"),
    Case("L3", lambda x: nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.psum), "must be float32, not bfloat16"),
    Case("L4", lambda x: sb((P, 46000)), "exceeds SBUF capacity on trn1", target="trn1"),
    Case("L5", lambda x: nl.ndarray((8,), dtype=nl.float32, buffer=nl.sbuf), "needs a partition and a free axis"),
    Case("L6", lambda x: sb((P, 8)).reshape((256, 4)), "would move data across partitions"),
    Case("L10", lambda x: nl.ndarray((P, 8), dtype=nl.float32, buffer="sbuf"), "accepts no string buffer names",
         "L10", api="0.3"),
    Case("L16", lambda x: nl.ndarray((P, 8), dtype=nl.float8_e4m3fn, buffer=nl.sbuf),
         "Data type F8E4M3FN is not supported on TRN1/TRN2.", "L16"),
    Case("L16b", lambda x: nl.ndarray((P, 8), dtype=nl.float8_e4m3fn, buffer=nl.shared_hbm),
         "Data type F8E4M3FN is not supported on TRN1/TRN2.", "L16", target="trn1"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[case.id for case in REFUSALS])
def test_rule_is_refused(case):
    assert_refused(case, X)


def assert_refused(case: Case, x) -> None:
    """case.body run in body_kernel on x is refused with case.fragment in the message, which ends with its row of
    docs/nki-audit.md (case.rule where given), the target and the release."""
    with nki.target(case.target, api=case.api), pytest.raises(NkiConstraintError) as info:
        body_kernel(x, case.body)
    message = str(info.value)
    assert case.fragment in message, message
    api = case.api or nki.NEWEST_API[case.target]
    assert re.search(rf"\[{case.rule or '[A-Z]+[0-9]+[a-z]?(/[A-Z0-9]+)?'}; {case.target}, nki {api}\]", message), message


def test_every_refusal_id_is_unique():
    ids = [case.id for case in REFUSALS]
    assert len(ids) == len(set(ids))


# ---- legal twins: the same kernels at a legal size, memory, engine or release run ------------------
def _legal_tiled(k, tile_position, tile_size):
    acc, s, m = mm(k=k)
    nisa.nc_matmul(dst=acc, stationary=s, moving=m, tile_position=tile_position, tile_size=tile_size)
    copy_(sb((P, 64)), acc)


def _legal_reduce_regs(x):
    a = sb((P, 8), fill=0.5)
    res = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    dst = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=nl.copy, data=a, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst=dst, op=nl.copy, data=a, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce,
                    reduce_res=res)
    assert (res.data == 8.0).all()  # two activations of 8 x 0.5 per partition


def _accumulate_twice():
    acc, s, m = mm()
    nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # the first write overwrites ...
    nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # ... the second accumulates
    assert (acc.data == 2 * P).all()


LEGAL = [
    Case("X2", lambda x: copy_(sb((P, 8))[0:128], sb((P, 8))[0:128]), ""),
    Case("X3", lambda x: copy_(sb((P, 8))[64:128], sb((P, 8))[64:128]), ""),
    Case("X4", lambda x: nisa.memset(dst=sb((P, 8))[96:128, :], value=2.0) or
         nisa.memset(dst=sb((P, 8))[32:33, :], value=2.0), ""),
    Case("X6", lambda x: sb((P, 2, 2, 2, 2)), ""),
    Case("X8", lambda x: sb((2, 256, 256), nl.int8), ""),
    Case("X11", lambda x: copy_(sb((P, 8)), sb((P, 8)), engine=5), "", target="trn1"),
    Case("X11b", lambda x: copy_(sb((P, 8)), sb((P, 8)), engine=E.gpsimd), ""),
    Case("D5", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float16, buffer=nl.sbuf), src=x,
                                       dge_mode=nisa.dge_mode.hwdge), "", api="0.2"),
    Case("D7", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                       engine=E.sync, dge_mode=nisa.dge_mode.hwdge), ""),
    Case("D7b", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=0), "", target="trn3"),
    Case("D7c", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x,
                                        priority=3, dge_mode=nisa.dge_mode.none), "", target="trn3", api="0.5"),
    Case("D9", lambda x: nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=sb((P, 8))), ""),
    Case("C3", lambda x: copy_(sb((P, 8)), ps((P, 8)), engine=E.scalar), ""),
    Case("M2", lambda x: nisa.memset(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), value=0.0,
                                     engine=E.gpsimd), ""),
    Case("M4", lambda x: nisa.memset(dst=nl.ndarray((P, 8), dtype=nl.int32, buffer=nl.sbuf), value=1.5), "",
         target="trn1"),
    Case("MM4", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.bfloat16, m_dtype=nl.float16))), ""),
    Case("MM12", lambda x: _legal_tiled(64, (64, 0), (64, 128)), "", target="trn1"),
    Case("MM12b", lambda x: _legal_tiled(32, (96, 0), (32, 128)), ""),
    Case("MM13", lambda x: nisa.nc_matmul(*(mm()), perf_mode=nisa.matmul_perf_mode.none), ""),
    Case("MM13b", lambda x: nisa.nc_matmul(psum((8, 16)), sb((P, 2, 8), nl.float8_e4m3fn),
                                           sb((P, 2, 16), nl.float8_e4m3fn),
                                           perf_mode=nisa.matmul_perf_mode.double_row), "", target="trn3"),
    Case("MM14", lambda x: nisa.nc_matmul(*(mm(s_dtype=nl.bfloat16, m_dtype=nl.bfloat16)), is_transpose=True), "",
         target="trn1"),
    Case("MM14b", lambda x: nisa.nc_matmul(*(mm()), is_transpose=True), ""),
    Case("MM18", lambda x: _accumulate_twice(), ""),
    Case("T9", lambda x: nisa.nc_transpose(dst=psum((8, P)), data=sb((P, 8), fill=float("inf"))), ""),
    Case("T2", lambda x: nisa.nc_transpose(dst=nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.sbuf),
                                           data=sb((32, 32)), engine=E.vector), ""),
    Case("T4", lambda x: nisa.nc_transpose(dst=psum((8, 32)), data=sb((32, 8)), engine=E.vector), ""),
    Case("TS8", lambda x: _tensor_scalar(x, op1=nl.add, operand1=1.0, engine=E.scalar), ""),
    Case("TS10", lambda x: _tensor_scalar(x, op0=nl.reciprocal, operand0=None), ""),
    Case("TS11", lambda x: nisa.tensor_scalar(dst=sb((P, 8), nl.int32), data=sb((P, 8)), op0=nl.multiply,
                                              operand0=2.5), ""),
    Case("A5", lambda x: _activation(x, bias=1.0), ""),
    Case("A6", lambda x: _activation(x, bias=sb((P, 1), nl.int8)), "", api="0.3"),
    Case("A6b", lambda x: _activation(x, bias=sb((P, 1), nl.bfloat16)), "", target="trn1"),
    Case("A7", _legal_reduce_regs, ""),
    Case("A9", lambda x: _activation(x, op=nl.reciprocal, bias=sb((P, 1))), ""),
    Case("A10", lambda x: _activation(x, data=sb((P, 8), fill=2.0 ** -42), op=nl.reciprocal), ""),
    Case("A11", lambda x: _activation(x, data=sb((P, 8), nl.int8, fill=3)), ""),
    Case("RC3", lambda x: nisa.reciprocal(dst=sb((P, 8), nl.int32), data=sb((P, 8), nl.int8, fill=1)), ""),
    Case("L1", lambda x: psum((P, 512)), ""),
    Case("L10", lambda x: nl.ndarray((P, 8), dtype=nl.float32, buffer="sbuf"), "", target="trn1"),
    Case("L16", lambda x: sb((P, 8), nl.float8_e4m3fn), "", target="trn3"),
]


@pytest.mark.parametrize("case", LEGAL, ids=[case.id for case in LEGAL])
def test_legal_twin_runs(case):
    with nki.target(case.target, api=case.api):
        body_kernel(X, case.body)


# trn3 (NeuronCore-v4) takes trn2's (NeuronCore-v3) rules where no v4 difference is documented; the
# documented ones among the emulated instructions: dma_copy's priority= (D7, its own cases above),
# float8_e4m3fn (L16: native on v4 only; tests/test_nki_fp8.py) and nc_matmul's moving free size up to
# 4096 (MM9, kept at 512 on trn3: test_nki_limits)
TRN2_ONLY = {"D7c", "L16", "TS8"}  # refused on trn2, legal on trn3


ON_TRN3 = [c for c in REFUSALS if c.target == "trn2" and c.id not in TRN2_ONLY and c.api != "0.2"]  # (L19)


@pytest.mark.parametrize("case", ON_TRN3, ids=[c.id for c in ON_TRN3])
def test_trn2_rule_is_refused_on_trn3(case):
    with nki.target("trn3", api=case.api), pytest.raises(NkiConstraintError) as info:
        body_kernel(X, case.body)
    message = str(info.value)
    assert case.fragment.replace("trn2", "trn3") in message, message
    if case.rule:
        assert re.search(rf"\[{case.rule}; trn3, nki {case.api or nki.NEWEST_API['trn3']}\]", message), message


@pytest.mark.parametrize("case", [c for c in LEGAL if c.target == "trn2" and c.api != "0.2"],
                         ids=[c.id for c in LEGAL if c.target == "trn2" and c.api != "0.2"])
def test_trn2_legal_twin_runs_on_trn3(case):
    with nki.target("trn3", api=case.api):
        body_kernel(X, case.body)


# ---- kernel-level rules ----------------------------------------------------------------------------
@nki.jit
def private_output_kernel(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_private_hbm_output_is_refused(target):
    """L7: outputs are nl.shared_hbm (0.3+; the emulator applies it to 0.2 as well)."""
    with nki.target(target), pytest.raises(NkiConstraintError,
                                           match=rf"kernel outputs must be nl\.shared_hbm.*\[L7; {target}, nki "):
        private_output_kernel(X)


@nki.jit
def sized_kernel(x, sizes):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_list_argument_is_refused_under_0_3():
    """L9: list kernel arguments (0.3+); a tuple, or any list under 0.2, works."""
    with nki.target("trn2", api="0.3"):
        with pytest.raises(NkiConstraintError, match=r"accepts no list kernel argument .*\[L9; trn2, nki 0\.3\]"):
            sized_kernel(X, [1, 2])
        np.testing.assert_array_equal(sized_kernel(X, (1, 2)), X)
    with nki.target("trn1", api="0.2"):
        np.testing.assert_array_equal(sized_kernel(X, [1, 2]), X)


def test_list_default_is_refused_under_0_3():
    @nki.jit
    def list_default_kernel(x, sizes=[1, 2]):  # noqa: B006 - the rule under test
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out

    with nki.target("trn2", api="0.6"), pytest.raises(NkiConstraintError, match=r"a list default in the kernel"):
        list_default_kernel(X)


def test_argument_of_a_non_nki_dtype_is_refused():
    """X13 at the kernel boundary: an int64 host array has no NKI dtype."""
    with pytest.raises(NkiConstraintError, match=r"argument 0 is int64 \(128, 8\), not an NKI dtype \[X13; trn"):
        sized_kernel(np.zeros((P, 8), dtype=np.int64), (1,))


@pytest.mark.parametrize("name", ["float8_e4m3", "float8_e5m2", "tfloat32", "float8_e4m3fn_x4", "invert",
                                  "power", "rsqrt"])
def test_unemulated_language_features_are_absent(name):
    """N/A rows (fp8/tfloat32/x4 dtypes, invert, power, rsqrt): a kernel cannot even name them."""
    assert not hasattr(nl, name)


def test_removed_dma_arguments_do_not_exist():
    """D8: dst_rmw_op / unique_indices (0.2 only; 0.3+ has nisa.dma_compute) are not emulated."""
    def body(x):
        nisa.dma_copy(dst=nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf), src=x, dst_rmw_op=nl.add)
    with pytest.raises(TypeError, match="dst_rmw_op"):
        body_kernel(X, body)


@nki.jit
def int_add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    tb = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=out, src=ta)
    return out


@pytest.mark.parametrize("target, api, exact", [("trn1", "0.2", False), ("trn2", "0.3", True), ("trn2", "0.6", True),
                                                   ("trn3", "0.6", True)])
def test_int32_tensor_tensor_is_exact_from_0_3(target, api, exact):
    """TT8: from nki 0.3, int32 tensor_tensor runs on GpSimd in integer arithmetic (exact); 0.2
    computes in fp32, which cannot hold 2^24 + 1."""
    a, b = np.full((P, 4), 2 ** 24, dtype=np.int32), np.ones((P, 4), dtype=np.int32)
    with nki.target(target, api=api):
        out = int_add_kernel(a, b)
    assert (out == 2 ** 24 + 1).all() == exact
    assert int_add_kernel.last_trace.instructions["gpsimd" if exact else "vector"] == 1


@pytest.mark.parametrize("instruction", ["tensor_reduce", "reciprocal"])
def test_vector_only_instructions_take_no_engine(instruction):
    """R9, RC4: Vector Engine only, as in AWS's signatures (no engine= parameter)."""
    def body(x):
        getattr(nisa, instruction)(dst=sb((P, 1)), data=sb((P, 1)), engine=E.vector,
                                   **({"op": nl.add, "axis": (1,)} if instruction == "tensor_reduce" else {}))
    with pytest.raises(TypeError, match="engine"):
        body_kernel(X, body)


# ---- casts through float32 and bfloat16 -------------------------------------------------------------
@nki.jit
def cast_kernel(x, mid_dtype, engine, out_dtype=nl.float32):
    """x (fp32 or int) -> SBUF of x's dtype -> SBUF of mid_dtype (tensor_copy on `engine`) -> out
    (out_dtype)."""
    out = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    mid = nl.ndarray(x.shape, dtype=mid_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=mid, src=a, engine=engine)
    back = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=back, src=mid, engine=engine)
    nisa.dma_copy(dst=out, src=back)
    return out


def _bf16_edge_values():
    """float32 values around bf16 rounding points: exact ties (even and odd), just above and
    below, the largest finite values (overflow to inf), subnormals and signed zeros."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                     0x00008000, 0x00018000, 0x00000001, 0x80000000, 0xBF808000, 0xC0418000, 0x4B000000],
                    dtype=np.uint32)
    rng = np.random.default_rng(7)
    random = (rng.standard_normal(P * 8 - bits.size) * 10.0 ** rng.integers(-30, 30, P * 8 - bits.size))
    values = np.concatenate([bits.view(np.float32), random.astype(np.float32)])
    return values.reshape(P, 8)


@pytest.mark.parametrize("target, engine", [("trn2", None), ("trn2", nisa.engine.scalar), ("trn1", nisa.engine.gpsimd),
                                            ("trn3", nisa.engine.scalar)])
def test_bf16_cast_rounds_to_nearest_even_like_torch(target, engine):
    torch = pytest.importorskip("torch")
    x = _bf16_edge_values()
    with nki.target(target):
        out = cast_kernel(x, nl.bfloat16, engine)
    expected = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    assert np.isinf(out.ravel()[[4, 5]]).all() and out.ravel()[6] == np.float32(3.3895314e38)  # inf; max bf16


def test_bf16_cast_keeps_nan():
    x = np.full((P, 8), np.nan, dtype=np.float32)
    assert np.isnan(cast_kernel(x, nl.bfloat16, None)).all()


def test_int8_to_bf16_to_fp32_is_exact():
    x = np.arange(-128, 128, dtype=np.int8).reshape(32, 8).repeat(4, axis=0)
    np.testing.assert_array_equal(cast_kernel(x, nl.bfloat16, None), x.astype(np.float32))


def test_casts_go_through_float32():
    """D4/C5: int32 2^24 + 65537 -> bf16 goes through fp32 (2^24 + 65536, a bf16 tie that rounds
    to even: 2^24), not directly (which would round up to 2^24 + 131072)."""
    x = np.full((P, 8), 2 ** 24 + 65537, dtype=np.int32)
    np.testing.assert_array_equal(cast_kernel(x, nl.bfloat16, None), np.float32(2 ** 24))


@nki.jit
def bf16_matmul_kernel(a_t, b, s_dtype, m_dtype):
    """out = a_t^T @ b with the operands loaded (DMA-cast) into tiles of s_dtype and m_dtype."""
    K, M = a_t.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    stationary = nl.ndarray((K, M), dtype=s_dtype, buffer=nl.sbuf)
    moving = nl.ndarray((K, N), dtype=m_dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=stationary, src=a_t)
    nisa.dma_copy(dst=moving, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def _scaled_digits(shape, axis, seed):
    """7-bit integers (|v| <= 127) times a power of two per row or column: exact in bf16."""
    rng = np.random.default_rng(seed)
    digits = rng.integers(-127, 128, shape).astype(np.float64)
    scale = 2.0 ** rng.integers(-20, 20, shape[axis])
    return (digits * (scale[None, :] if axis == 1 else scale[:, None])).astype(np.float32)


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_bf16_matmul_of_scaled_7_bit_integers_is_exact(target):
    a_t, b = _scaled_digits((P, P), 1, 1), _scaled_digits((P, 512), 1, 2)
    with nki.target(target):
        out = bf16_matmul_kernel(a_t, b, nl.bfloat16, nl.bfloat16)
    np.testing.assert_array_equal(out, a_t.astype(np.float64).T @ b.astype(np.float64))
    trace = bf16_matmul_kernel.last_trace
    assert trace.matmul_columns == 512 and trace.matmul_columns_by_dtype == {"bfloat16": 512}


def test_bf16_operand_rounds_inexact_inputs():
    """A value that bf16 cannot hold is rounded (RNE) when the DMA writes the bf16 tile."""
    a_t = np.ones((P, 1), dtype=np.float32)
    b = np.full((P, 1), 1 + 2 ** -8 + 2 ** -10, dtype=np.float32)  # rounds up to 1 + 2^-7
    np.testing.assert_array_equal(bf16_matmul_kernel(a_t, b, nl.bfloat16, nl.bfloat16), [[P * (1 + 2 ** -7)]])


def _small_ints(shape, seed):
    return np.random.default_rng(seed).integers(-100, 100, shape).astype(np.float32)


def test_bf16_times_fp16_is_a_legal_pairing():
    a_t, b = _small_ints((64, 32), 3), _small_ints((64, 16), 4)
    out = bf16_matmul_kernel(a_t, b, nl.bfloat16, nl.float16)
    np.testing.assert_array_equal(out, a_t.astype(np.float64).T @ b)
    assert bf16_matmul_kernel.last_trace.matmul_columns_by_dtype == {"float16": 16}


@pytest.mark.parametrize("s_dtype, m_dtype, fragment", [
    (nl.bfloat16, nl.float32, "float32 operands must be paired with float32, not bfloat16 x float32"),
    (nl.float32, nl.bfloat16, "float32 operands must be paired with float32, not float32 x bfloat16"),
    (nl.int8, nl.bfloat16, "not int8 x bfloat16"),
    (nl.bfloat16, nl.uint8, "not bfloat16 x uint8"),
])
def test_illegal_bf16_pairings_are_refused(s_dtype, m_dtype, fragment):
    a_t, b = np.abs(_small_ints((64, 32), 3)), np.abs(_small_ints((64, 16), 4))
    with pytest.raises(NkiConstraintError, match=re.escape(fragment)):
        bf16_matmul_kernel(a_t, b, s_dtype, m_dtype)


@nki.jit
def bf16_roundtrip_kernel(x, dtype):
    """x -> an SBUF tile of `dtype` -> an HBM output of `dtype` (DMA only)."""
    out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_bf16_tile_counts_two_bytes_per_element():
    """90,000 bf16 elements per partition (180,000 B) fit trn1's usable 180,224 B; in fp32 they do not."""
    x = np.ones((2, 90_000), dtype=np.float32)
    with nki.target("trn1"):
        np.testing.assert_array_equal(bf16_roundtrip_kernel(x, nl.bfloat16), x)
        trace = bf16_roundtrip_kernel.last_trace
        assert trace.peak_sbuf_bytes == 2 * 90_000
        assert trace.dma_bytes_in == 4 * x.size  # read from an fp32 HBM tensor
        assert trace.dma_bytes_out == 2 * x.size  # written to a bf16 HBM tensor
        with pytest.raises(NkiConstraintError, match="exceeds SBUF capacity on trn1"):
            bf16_roundtrip_kernel(x, nl.float32)


def test_cost_model_charges_a_quarter_of_the_tensor_engine_time_in_bf16():
    a_t, b = _scaled_digits((P, P), 1, 1), _scaled_digits((P, 512), 1, 2)
    cal = cost_model.CALIBRATIONS["trn2"]
    seconds = {}
    for dtype in (nl.float32, nl.bfloat16):
        with nki.target("trn2"):
            bf16_matmul_kernel(a_t, b, dtype, dtype)
        trace = bf16_matmul_kernel.last_trace
        fixed = trace.instructions["tensor"] * cost_model.FIXED_CYCLES / cal.tensor_columns_per_s
        seconds[dtype.name] = cost_model._engine_seconds(trace, cal)["tensor_engine"] - fixed
    assert seconds["bfloat16"] == pytest.approx(seconds["float32"] / 4, rel=1e-12)
    assert seconds["bfloat16"] == pytest.approx(512 / cal.tensor_columns_per_s, rel=1e-12)


def test_cost_model_counts_unattributed_columns_as_fp32():
    trace = nki.Trace(matmul_columns=100)
    assert cost_model._column_cycles(trace) == 100 * cost_model.FP32_CYCLES_PER_COLUMN


# ---- integers: bitvec operators, iota, casts (the NKI random-number generator's instructions) ------
@nki.jit
def int_kernel(a, b, op, scalar, engine):
    """dst = a op b (tensor_tensor, scalar "tile"), or a op scalar (tensor_scalar), on int32 tiles;
    returns dst."""
    out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    tb = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    if scalar == "tile":
        nisa.tensor_tensor(dst=tb, data1=ta, data2=tb, op=op, engine=engine)
    else:
        nisa.tensor_scalar(dst=tb, data=ta, op0=op, operand0=scalar, engine=engine)
    nisa.dma_copy(dst=out, src=tb)
    return out


@pytest.mark.parametrize("target, api, exact", [("trn1", "0.2", False), ("trn2", "0.6", True), ("trn3", "0.7", True)])
def test_bitvec_words_from_2_24_are_exact_only_on_gpsimd(target, api, exact):
    """TT7/TT8: an int32 xor on the Vector Engine carries its words through fp32 (2^24 + 1 -> 2^24:
    the stricter reading of AWS's answer in aws-neuron-sdk #1308); from 0.3 the all-int32 tensor_tensor
    runs on GpSimd in native integer arithmetic; tensor_scalar's bitvec ops always on the Vector Engine.
    Below 2^24 both are exact."""
    big = np.full((P, 4), 2 ** 24 + 1, dtype=np.int32)
    zero = np.zeros((P, 4), dtype=np.int32)
    with nki.target(target, api=api):
        assert (int_kernel(big, zero, nl.bitwise_xor, "tile", None) == (2 ** 24 + 1 if exact else 2 ** 24)).all()
        assert (int_kernel(big, zero, nl.bitwise_xor, 0, None) == 2 ** 24).all()  # tensor_scalar: Vector
        small = np.arange(P * 4, dtype=np.int32).reshape(P, 4) * 30000 + 7  # < 2^24
        assert (int_kernel(small, zero, nl.bitwise_and, 255, None) == (small & 255)).all()
        assert (int_kernel(small, zero, nl.right_shift, 8, None) == (small >> 8)).all()
        assert (int_kernel(small, zero + 5, nl.bitwise_or, "tile", None) == (small | 5)).all()
        negative = np.full((P, 4), -5, dtype=np.int32)  # small in magnitude: exact as signed values
        assert (int_kernel(negative, zero, nl.bitwise_or, "tile", None) == -5).all()
        assert (int_kernel(negative, zero, nl.bitwise_and, -1, None) == -5).all()


def test_bitvec_rules_are_enforced():
    """TT7 (bitvec operators need integer tiles), TS6 (op0 and op1 of one class; bitvec on the Vector
    Engine; integer operands), each with its legal twin above."""
    x = np.zeros((P, 8), dtype=np.int32)
    with nki.target("trn2", api="0.6"):
        with pytest.raises(NkiConstraintError, match=r"bitvec operator needs integer tiles.*\[TT7"):
            body_kernel(X, lambda x: nisa.tensor_tensor(dst=sb((P, 8)), data1=sb((P, 8)), data2=sb((P, 8)),
                                                        op=nl.bitwise_xor))
        with pytest.raises(NkiConstraintError, match=r"one class.*\[TS6"):
            body_kernel(X, lambda x: nisa.tensor_scalar(dst=sb((P, 8), nl.int32), data=sb((P, 8), nl.int32),
                                                        op0=nl.right_shift, operand0=8, op1=nl.add, operand1=1.0))
        with pytest.raises(NkiConstraintError, match=r"Vector Engine, not scalar.*\[TS6"):
            body_kernel(X, lambda x: nisa.tensor_scalar(dst=sb((P, 8), nl.int32), data=sb((P, 8), nl.int32),
                                                        op0=nl.bitwise_and, operand0=255, engine=nisa.engine.scalar))
        with pytest.raises(NkiConstraintError, match=r"bitvec operand must be an integer.*\[TS6"):
            int_kernel(x, x, nl.bitwise_and, 255.0, None)
        with pytest.raises(NkiConstraintError, match=r"need integer tiles.*\[TS6"):
            body_kernel(X, lambda x: nisa.tensor_scalar(dst=sb((P, 8)), data=sb((P, 8)), op0=nl.bitwise_and,
                                                        operand0=1))


@nki.jit
def iota_kernel(shape, pattern, offset, multiplier):
    out = nl.ndarray(shape, dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray(shape, dtype=nl.int32, buffer=nl.sbuf)
    if offset == "default":
        nisa.iota(dst=t, pattern=pattern, channel_multiplier=multiplier)
    else:
        nisa.iota(dst=t, pattern=pattern, offset=offset, channel_multiplier=multiplier)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_iota_values_and_rules():
    """iota: offset + channel_multiplier p + sum_j step_j i_j over the pattern's axes (row-major),
    on GpSimd; offset required under 0.2 (I1), optional from 0.3; the pattern covers dst's free size (I2)."""
    p, i, j = np.meshgrid(np.arange(P), np.arange(3), np.arange(4), indexing="ij")
    with nki.target("trn1", api="0.2"):
        out = iota_kernel((P, 12), ((5, 3), (1, 4)), 7, 100)
        assert np.array_equal(out, (7 + 100 * p + 5 * i + j).reshape(P, 12))
        assert iota_kernel.last_trace.instructions["gpsimd"] == 1
        with pytest.raises(NkiConstraintError, match=r"needs offset.*\[I1"):
            iota_kernel((P, 12), ((1, 12),), "default", 0)
        with pytest.raises(NkiConstraintError, match=r"multiply to dst's free size 12.*\[I2"):
            iota_kernel((P, 12), ((1, 10),), 0, 0)
    with nki.target("trn2", api="0.6"):
        assert np.array_equal(iota_kernel((P, 12), ((1, 12),), "default", 12), np.arange(P * 12).reshape(P, 12))


@nki.jit
def memset_int32_kernel(value):
    out = nl.ndarray((P, 4), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=value)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("target, api", [("trn1", "0.2"), ("trn2", "0.6"), ("trn3", "0.7")])
def test_float_to_integer_casts_round_to_nearest_even_and_saturate(target, api):
    """C5 (0.6 release notes: fp32 -> integer casts round to nearest, ties to even, and saturate, as
    the hardware does; no truncation, no wrap-around)."""
    values = np.array([2.5, 3.5, -2.5, 1.4, -1.6, 3e9, -3e9, 0.5], dtype=np.float32)
    x = np.tile(values, (P, 1))
    with nki.target(target, api=api):
        out = cast_kernel(x, nl.int32, None, nl.int32)
        if api == "0.2":  # (0.3+ refuses a float memset value into an integer tile, M4)
            assert (memset_int32_kernel(2.7) == 3).all() and (memset_int32_kernel(3e9) == 2 ** 31 - 1).all()
    assert np.array_equal(out[0], [2, 4, -2, 1, -2, 2 ** 31 - 1, -2 ** 31, 0])
