"""Emulated `nki.isa` (nisa): the instructions dfmp2's kernels use, executed with numpy.

Long (one module for one NKI namespace, `nki.isa`: each instruction with the checks of its rules).

Each instruction checks the NeuronCore rules it is subject to (and those of the emulated NKI
API version and target), reads only written memory, writes into `dst` (marking it written) and
records itself in the kernel's trace with the engine that runs it. Arithmetic is float32, as on
the device (PSUM accumulates in float32); a write into a bfloat16 tile rounds to bf16 (RNE), and
a copy between different dtypes goes through float32. docs/nki-audit.md lists every rule, its
AWS source and the test that proves the refusal; a refusal names its rule there as [tag].

Partition rules (architecture guide): an engine access of n partitions starts at partition 0
if n > 64, at 0 or 64 if 32 < n <= 64, at 0/32/64/96 if n <= 32 (DMA is exempt); the Vector,
Scalar and GpSimd engines read and write the same partitions (the emulator refuses the
cross-half/cross-quadrant moves NeuronCore-v2 allows for n <= 64: the stricter reading); at
most 4 free dims; Vector/Scalar/GpSimd free size <= 64K elements (SBUF) or 4K (PSUM); GpSimd
cannot access PSUM. `engine=` arguments are validated per instruction and target.
"""

from __future__ import annotations

import functools
import inspect
import math
from enum import Enum

import numpy as np

from . import language as nl
from .core import (BFLOAT16, FLOAT8_E4M3FN, NkiConstraintError, RegisterValue, Tile, current_run, round_to_bf16,
                   is_int32, round_to_fp8_e4m3fn, running as _running, wrap_int32)


# ---- enums (members as in nki.isa; raw ints only under nki 0.2) --------------------------------
class engine(Enum):  # noqa: N801 - the NKI name
    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown


class dge_mode(Enum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(Enum):  # noqa: N801
    error = 0
    skip = 1


class reduce_cmd(Enum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class matmul_perf_mode(Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


def _at(run, rule: str) -> str:
    """The suffix every refusal carries: its audit row, the target and the NKI release."""
    return f" [{rule}; {run.target.name}, nki {run.api}]"


def _enum(value, kind, what: str, param: str):
    """An enum argument as a member of `kind` (None: the default); ints only under nki 0.2."""
    if value is None or isinstance(value, kind):
        return value
    run = current_run()
    if isinstance(value, int) and not isinstance(value, bool):
        if run.api_at_least("0.3"):
            raise NkiConstraintError(
                f"{what}: {param}={value}: nki {run.api} accepts no raw int for an enum (0.2 did); use "
                f"nisa.{kind.__name__} members" + _at(run, "X11"))
        try:
            return kind(value)
        except ValueError:
            pass
    raise NkiConstraintError(f"{what}: {param}={value!r} is not a nisa.{kind.__name__} member" + _at(run, "X11"))


def _engine(value, what: str, allowed: tuple, default: str, rule: str = "X11", hint: str = "") -> str:
    """The engine an instruction runs on: `default` when none is named (the compiler's choice)."""
    if value is None or value is engine.unknown:
        return default
    name = _enum(value, engine, what, "engine").name
    if name == "unknown":
        return default
    if name not in allowed:
        raise NkiConstraintError(
            f"{what}: engine={name} is not allowed; this instruction runs on {' or '.join(allowed)} "
            f"here{hint}" + _at(current_run(), rule))
    return name


def _no_gpsimd_psum(name: str, tiles, what: str, rule: str = "X10") -> None:
    if name == "gpsimd" and any(isinstance(t, Tile) and t.buffer == "psum" for t in tiles):
        raise NkiConstraintError(f"{what}: the GpSimd Engine cannot access PSUM" + _at(current_run(), rule))


def _in_scope(tile: Tile, what: str) -> None:
    if tile.out_of_scope:
        raise NkiConstraintError(
            f"{what}: the {tile.buffer.upper()} tensor {tile.shape} was allocated inside an nl.fori_loop body "
            "that has ended; tensors declared in a loop body cannot be used outside it" + _at(current_run(), "L15"))


def _read(tile: Tile, what: str) -> np.ndarray:
    if not isinstance(tile, Tile):
        raise NkiConstraintError(f"{what}: operand must be a tile, got {type(tile).__name__}" + _at(current_run(), "X15"))
    if tile.dtype == np.float64:
        raise NkiConstraintError(f"{what}: float64 operand {tile.shape} (no float64 on a NeuronCore)" + _at(current_run(), "X12"))
    _in_scope(tile, what)
    if not tile.written.all():
        missing = int((~tile.written).sum())
        raise NkiConstraintError(
            f"{what}: reads {missing} element(s) of a {tile.buffer.upper()} tile {tile.shape} "
            "that no instruction wrote" + _at(current_run(), "X14"))
    return tile.data


def _write(dst: Tile, value: np.ndarray, what: str) -> None:
    """dst <- value; a value of another dtype is cast through float32, a bf16 dst rounds (RNE), an
    integer dst rounds to nearest even and saturates to its range (`_to_integer`)."""
    if not isinstance(dst, Tile):
        raise NkiConstraintError(f"{what}: dst must be a tile" + _at(current_run(), "X15"))
    _in_scope(dst, what)
    data = dst.data
    if not data.flags.writeable:
        raise NkiConstraintError(f"{what}: dst {dst.shape} is a broadcast view, which repeats elements and cannot "
                                 "be written" + _at(current_run(), "V4"))
    if value.size != data.size:
        raise NkiConstraintError(f"{what}: writes {value.size} elements into dst {dst.shape}" + _at(current_run(), "X15"))
    if value.dtype != data.dtype and value.dtype != np.float32:
        value = value.astype(np.float32)
    if value.dtype != data.dtype and data.dtype.kind in "iu":
        value = _to_integer(value, data.dtype)
    if dst.dtype is BFLOAT16:
        value = round_to_bf16(value)
    elif dst.dtype is FLOAT8_E4M3FN:
        value = round_to_fp8_e4m3fn(value)
    data[...] = value.reshape(data.shape)
    dst.written[...] = True
    dst.matmul_result[...] = False


def _to_integer(value: np.ndarray, dtype) -> np.ndarray:
    """float32 values cast to an integer dtype as the hardware does (the nki 0.6 release notes: round
    to nearest, ties to even, saturate to the destination range; no truncation, no wrap-around)."""
    info = np.iinfo(dtype)
    rounded = np.rint(value.astype(np.float64))
    return np.clip(np.nan_to_num(rounded, nan=0.0), info.min, info.max).astype(dtype)


def _bit_patterns(op, a: np.ndarray, b, exact: bool) -> np.ndarray:
    """A bitvec operator on the 32-bit patterns of integer values a and b (an array or a scalar),
    -> the result's pattern as an int64 in [0, 2^32). exact=False (the Vector Engine): each input
    and the result are carried through fp32 first, exact below 2^24 only. AWS's operator table says
    bitvec operators read bit patterns; AWS's answer in aws-neuron-sdk #1308 (reported by the
    sibling trnrand, which saw 32-bit words above 2^24 rounded on trn1) says the Vector and Scalar
    engines carry 32-bit types through fp32: the emulator takes that stricter reading, so that a
    kernel exact here is exact under both. exact=True: GpSimd's native integer arithmetic."""
    def pattern(x):
        x = np.asarray(x).astype(np.int64)
        return (x if exact else _through_fp32(x)) & 0xFFFFFFFF

    result = op(pattern(a), pattern(b)) & 0xFFFFFFFF
    return result if exact else _through_fp32(result) & 0xFFFFFFFF


def _signed32(x: np.ndarray) -> np.ndarray:
    """32-bit patterns (int64) read as signed int32 values (int64)."""
    return ((x & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _through_fp32(x: np.ndarray) -> np.ndarray:
    """32-bit values (int64 holding a pattern or a signed value) as the engine carries them through
    fp32: read as signed int32, rounded to fp32 (exact below 2^24 in magnitude), back to an int64
    saturated to int32's range (`_to_integer`)."""
    return _to_integer(_signed32(x).astype(np.float32), np.int32).astype(np.int64)


def _pattern_into(dst: Tile, pattern: np.ndarray) -> np.ndarray:
    """A 32-bit pattern (int64 in [0, 2^32)) as dst's integer dtype: the same bits in a 32-bit tile;
    in a narrower one the value (read as signed int32 for a signed dst, as unsigned for an unsigned
    one) saturated to its range."""
    pattern = pattern & 0xFFFFFFFF
    if dst.dtype == nl.uint32:
        return pattern.astype(np.uint32)
    signed = _signed32(pattern)
    if dst.dtype == nl.int32:
        return signed.astype(np.int32)
    info = np.iinfo(dst.dtype)
    return np.clip(signed if dst.dtype.kind == "i" else pattern, info.min, info.max).astype(dst.dtype)


# each instruction's row of docs/nki-audit.md for the memories its operands may be in
_MEMORY_RULES = {"tensor_copy": "C1", "memset": "M1", "nc_matmul": "MM1", "nc_transpose": "T1", "tensor_tensor": "TT1",
                 "tensor_scalar": "TS1", "iota": "I2", "affine_select": "AS2", "tensor_reduce": "R5",
                 "activation": "A1", "reciprocal": "RC1"}


def _on_chip(tile: Tile, what: str, allowed=("sbuf", "psum")) -> None:
    """An engine operand: its memory, partition count and start, free dims and free size."""
    if not isinstance(tile, Tile):
        raise NkiConstraintError(f"{what}: operand must be a tile, got {type(tile).__name__}" + _at(current_run(), "X15"))
    if tile.buffer not in allowed:
        raise NkiConstraintError(f"{what}: operand {tile.shape} is in {tile.buffer}, must be in "
                                 f"{' or '.join(a.upper() for a in allowed)}"
                                 + _at(current_run(), _MEMORY_RULES.get(what.split("(")[0][len("nisa."):], "X10")))
    shape = tile.data.shape
    count = shape[0]
    if tile.partition_step != 1:
        raise NkiConstraintError(f"{what}: operand {shape} steps over partitions by {tile.partition_step}: an engine "
                                 "access has no partition-axis stride (a DMA may write or read one)"
                                 + _at(current_run(), "X5"))
    if count > 128:
        raise NkiConstraintError(f"{what}: tile {shape} spans more than 128 partitions" + _at(current_run(), "X1"))
    start = tile._first_partition
    if start and (count > 64 or (count > 32 and start != 64) or start % 32):
        _start_partition_error(tile, what)
    if len(shape) > 5:
        raise NkiConstraintError(f"{what}: operand {shape} has {len(shape) - 1} free dims; an engine "
                                 "access pattern has at most 4" + _at(current_run(), "X6"))
    if tile.data.size > 4096 * count:
        _free_size(tile, what)


def _start_partition_error(tile: Tile, what: str):
    start, count = tile.partitions
    if count > 64:
        rule, text = "X2", "an access over 64 partitions must start at partition 0"
    elif count > 32:
        rule, text = "X3", "an access over 32 and up to 64 partitions must start at partition 0 or 64"
    else:
        rule, text = "X4", "an access of up to 32 partitions must start at partition 0, 32, 64 or 96"
    raise NkiConstraintError(f"{what}: operand {tile.shape} spans {count} partitions starting at partition "
                             f"{start}; {text} (start-partition rule)" + _at(current_run(), rule))


def _free_size(tile: Tile, what: str) -> None:
    """Vector/Scalar/GpSimd access: <= 64K elements per partition in SBUF, 4K in PSUM; each free
    dim fits the ISA's uint16 size field."""
    per_partition = tile.data.size // tile.shape[0]
    limit = 4096 if tile.buffer == "psum" else 65536
    if per_partition > limit:
        raise NkiConstraintError(
            f"{what}: operand {tile.shape} has {per_partition} elements per partition; an engine access "
            f"of {tile.buffer.upper()} holds at most {limit}" + _at(current_run(), "X8"))
    if max(tile.shape[1:]) > 65535:
        raise NkiConstraintError(f"{what}: operand {tile.shape}: a free dim over 65535 does not fit the "
                                 "ISA's uint16 size field" + _at(current_run(), "X6"))


def _same_partitions(dst: Tile, src: Tile, what: str) -> None:
    """Engines other than the Tensor Engine keep data on its partitions."""
    if dst.partitions != src.partitions:
        (d0, dn), (s0, sn) = dst.partitions, src.partitions
        raise NkiConstraintError(
            f"{what}: reads partitions {s0}..{s0 + sn - 1} but writes partitions {d0}..{d0 + dn - 1}; "
            "engine instructions cannot move data across partitions (operand and result "
            "partition ranges must match; use the Tensor Engine to move data between partitions)"
            + _at(current_run(), "X7"))


def _vector(dst: Tile, what: str, engine: str = "vector"):
    run = current_run()
    run.trace.vector_ops += 1
    run.trace.vector_elements += int(dst.data.size)
    run.issue(engine, dst.data.size)


def _per_partition(tile: Tile) -> int:
    return math.prod(tile.shape[1:])


# ---- data movement -----------------------------------------------------------------------
def dma_copy(dst, src, oob_mode=None, dge_mode=None, engine=None, name=None, priority=None):
    """dst <- src between HBM and SBUF; element counts must match; a dtype change goes through
    float32. No DMA reads or writes PSUM (in every release: the stricter reading for 0.2)."""
    what = f"nisa.dma_copy({src.shape} -> {dst.shape})"
    run = current_run()
    if dst.buffer == "psum":
        raise NkiConstraintError(f"{what}: DMA cannot write PSUM" + _at(run, "D1"))
    if src.buffer == "psum":
        raise NkiConstraintError(
            f"{what}: dma_copy cannot read PSUM (0.3+ refuses it; 0.2's ISA page lists only HBM and SBUF: "
            "the stricter reading): nisa.tensor_copy the PSUM tile to SBUF first" + _at(run, "D2"))
    if engine is not None or dge_mode is not None or priority is not None:
        _dma_options(run, dst, src, dge_mode, engine, priority, what)
    value = _read(src, what)
    _write(dst, value, what)
    run.issue("dma", value.size)
    run.trace.dma_transfers += 1
    if dst.buffer == "sbuf" and src.buffer != "sbuf":  # bytes on the HBM side
        run.trace.dma_bytes_in += int(value.size) * src.dtype.itemsize
    elif src.buffer == "sbuf" and dst.buffer != "sbuf":
        run.trace.dma_bytes_out += int(value.size) * dst.dtype.itemsize
    else:
        run.trace.dma_bytes_in += int(value.size) * src.dtype.itemsize
        run.trace.dma_bytes_out += int(value.size) * dst.dtype.itemsize


def _dma_options(run, dst, src, mode, eng, priority, what) -> None:
    """dge_mode / engine / priority of a dma_copy, per release and target."""
    mode = _enum(mode, dge_mode, what, "dge_mode")
    if priority is not None:
        _dma_priority(run, mode, priority, what)
    if mode is dge_mode.hwdge:
        if run.target.name == "trn1":
            raise NkiConstraintError(f"{what}: hardware DGE (dge_mode=hwdge) needs NeuronCore-v3 or newer, "
                                     "not trn1 (NeuronCore-v2)" + _at(run, "D6"))
        if run.api_at_least("0.3") and dst.dtype != src.dtype:
            raise NkiConstraintError(f"{what}: dge_mode=hwdge moves raw bytes: src {src.dtype} and dst "
                                     f"{dst.dtype} must match from nki 0.3" + _at(run, "D5"))
    if eng is not None:
        if not run.api_at_least("0.3"):
            raise NkiConstraintError(f"{what}: 0.2 dma_copy has no engine= argument (added in 0.3)"
                                     + _at(run, "D7"))
        name = _engine(eng, what, ("sync", "scalar"), "unknown", "D7")
        if name != "unknown" and mode is not dge_mode.hwdge:
            raise NkiConstraintError(f"{what}: engine={name} is only valid with dge_mode=hwdge" + _at(run, "D7"))


def _dma_priority(run, mode, priority, what) -> None:
    """priority= (a DMA quality-of-service level, 0 highest to 3): in dma_copy's signature from nki 0.4,
    on NeuronCore-v4 (trn3) only; 0.4 also refuses it with DGE off (dge_mode=none). It does not
    change what is copied, and the time model leaves it out."""
    if not run.api_at_least("0.4"):
        raise NkiConstraintError(f"{what}: {run.api} dma_copy has no priority= argument (added in 0.4)"
                                 + _at(run, "D7"))
    if run.target.name != "trn3":
        raise NkiConstraintError(f"{what}: priority= needs NeuronCore-v4 (trn3), not {run.target.name}"
                                 + _at(run, "D7"))
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 3:
        raise NkiConstraintError(f"{what}: priority={priority!r}: the level is an int 0 to 3" + _at(run, "D7"))
    if mode is dge_mode.none and run.api == "0.4":
        raise NkiConstraintError(f"{what}: nki 0.4 supports priority= only with DGE on (not dge_mode=none)"
                                 + _at(run, "D7"))


_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}  # the permutation of each source rank


def dma_transpose(dst, src, axes=None, dge_mode=None, oob_mode=None, name=None, priority=None):
    """dst = src transposed by the DMA engines (the direct transpose: ISA-0.2..0.6:dma_transpose): axes
    (1, 0), (2, 1, 0) or (3, 1, 2, 0) for a 2-, 3- or 4-d source [DT2]; dst in SBUF, src in HBM or SBUF,
    one dtype [DT1] of 2 bytes [DT6]; lowered to the hardware DGE (NeuronCore-v3+ [DT4]) with its shape
    limits [DT5], which the emulator applies to dge_mode=unknown too (the stricter reading: the hardware
    DGE is the only documented lowering of a direct transpose). The indirect (software DGE) transpose
    is not emulated [DT3]."""
    what = f"nisa.dma_transpose({getattr(src, 'shape', src)} -> {getattr(dst, 'shape', dst)})"
    run = current_run()
    mode = _enum(dge_mode, globals()["dge_mode"], what, "dge_mode")
    if priority is not None:
        _dma_priority(run, mode, priority, what)
    if mode not in (None, globals()["dge_mode"].unknown, globals()["dge_mode"].hwdge):
        raise NkiConstraintError(f"{what}: dge_mode={mode.name}: a direct transpose takes unknown or hwdge (the "
                                 "software-DGE indirect transpose, with indices, is not emulated)" + _at(run, "DT3"))
    if not isinstance(dst, Tile) or not isinstance(src, Tile) or dst.buffer != "sbuf" or src.buffer == "psum":
        raise NkiConstraintError(f"{what}: dst must be an SBUF tile and src an HBM or SBUF tensor" + _at(run, "DT1"))
    if dst.dtype != src.dtype:
        raise NkiConstraintError(f"{what}: src {src.dtype} and dst {dst.dtype}: a DMA transpose does not cast "
                                 "(src.dtype == dst.dtype)" + _at(run, "DT1"))
    rank = len(src.shape)
    if rank not in _TRANSPOSE_AXES or (axes is not None and tuple(axes) != _TRANSPOSE_AXES[rank]):
        raise NkiConstraintError(f"{what}: axes={axes!r}: supported are (1, 0), (2, 1, 0) and (3, 1, 2, 0), for a "
                                 f"source of rank 2, 3 and 4" + _at(run, "DT2"))
    permutation = _TRANSPOSE_AXES[rank]
    expected = tuple(src.shape[a] for a in permutation)
    if dst.shape != expected:
        raise NkiConstraintError(f"{what}: dst must be the transposed source {expected} (same rank; nki 0.4+ "
                                 "asserts it)" + _at(run, "DT2"))
    if run.target.name == "trn1":
        raise NkiConstraintError(f"{what}: a direct DMA transpose is lowered to the hardware DGE, which needs "
                                 "NeuronCore-v3 or newer, not trn1" + _at(run, "DT4"))
    if src.dtype.itemsize != 2:
        raise NkiConstraintError(f"{what}: src is {src.dtype}; a DMA transpose moves 2-byte elements (bfloat16, "
                                 "float16, (u)int16)" + _at(run, "DT6"))
    first, last = src.shape[0], src.shape[-1]
    if not run.api_at_least("0.6"):
        if first != 16 or last != 128:
            raise NkiConstraintError(
                f"{what}: before nki 0.6 the hardware DGE transposes src.shape[0] == 16 and src.shape[-1] == 128 "
                "(the 0.6 notes: 'previously required ==128'; the ISA page's '% 128' read strictly)"
                + _at(run, "DT5"))
    elif (first != 16 if rank == 2 else first not in (1, 2, 4, 8, 16) or (first * src.shape[-2]) % 16) \
            or last > 128:
        raise NkiConstraintError(
            f"{what}: the hardware DGE transposes a 2-d src with src.shape[0] == 16, a 3-d/4-d src with "
            "src.shape[0] in {1, 2, 4, 8, 16} and src.shape[0] * src.shape[-2] a multiple of 16, and "
            "src.shape[-1] <= 128" + _at(run, "DT5"))
    value = _read(src, what)
    _write(dst, np.transpose(value, permutation), what)
    run.issue("dma", value.size)
    run.trace.dma_transfers += 1
    if src.buffer != "sbuf":
        run.trace.dma_bytes_in += int(value.size) * src.dtype.itemsize


# tensor_copy engines: NeuronCore-v2 has no Scalar Engine copy; v3 adds it. No page states the v4 set:
# trn3 takes v3's (the v4 docstrings of tensor_copy add only tensor indirection, not emulated)
_COPY_ENGINES = {"trn1": ("vector", "gpsimd"), "trn2": ("vector", "scalar", "gpsimd"),
                 "trn3": ("vector", "scalar", "gpsimd")}


def tensor_copy(dst, src, engine=None, name=None):
    """On-chip copy (the usual way out of PSUM): bit-exact for equal dtypes, else through fp32."""
    what = f"nisa.tensor_copy({src.shape} -> {dst.shape})"
    run = current_run()
    eng = "vector" if engine is None else _engine(
        engine, what, _COPY_ENGINES[run.target.name], "vector", "C3",
        " (NeuronCore-v2 has no Scalar Engine tensor_copy: use nisa.activation(op=nl.copy))"
        if run.target.name == "trn1" else "")
    _on_chip(src, what)
    _on_chip(dst, what)
    _no_gpsimd_psum(eng, (src, dst), what, "C4")
    _same_layout(dst, src, what, "C2")
    _same_partitions(dst, src, what)
    _write(dst, _read(src, what), what)
    _vector(dst, what, eng)


def memset(dst, value, engine=None, name=None):
    """dst = value (a compile-time constant); under nki 0.3+ of the tile's dtype kind."""
    what = f"nisa.memset({getattr(dst, 'shape', dst)}, value={value!r})"
    eng = _engine(engine, what, ("vector", "gpsimd"), "vector", "M2")
    _on_chip(dst, what)
    _no_gpsimd_psum(eng, (dst,), what, "M3")
    run = current_run()
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise NkiConstraintError(f"{what}: value must be a compile-time constant number, not "
                                 f"{type(value).__name__}" + _at(run, "M5"))
    if run.api_at_least("0.3"):
        is_float = isinstance(value, (float, np.floating))
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if (dst.dtype.kind == "f" and not is_float) or (dst.dtype.kind in "iu" and not is_int):
            raise NkiConstraintError(
                f"{what}: under nki {run.api} the memset value must match the tile dtype {dst.dtype} "
                f"(got {type(value).__name__})" + _at(run, "M4"))
    # a float value into an integer tile: rounded and saturated as every cast into one (`_to_integer`)
    float_into_int = isinstance(value, (float, np.floating)) and dst.dtype.kind in "iu"
    _write(dst, np.full(dst.shape, value, dtype=np.float32 if float_into_int else dst.data.dtype), what)
    _vector(dst, what, eng)


# ---- Tensor Engine -------------------------------------------------------------------------
_NOT_GIVEN = object()
_MATMUL_DTYPES = (nl.float32, nl.float16, nl.bfloat16, nl.float8_e4m3fn)  # + other fp8s, tfloat32 (not emulated)
_FP8_DTYPES = (nl.float8_e4m3fn,)  # the fp8 formats the emulator has (double_row takes fp8 only)


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=_NOT_GIVEN, tile_position=(), tile_size=(),
              perf_mode=None, name=None):
    """dst[M, N] (PSUM, fp32) = stationary[K, M].T @ moving[K, N]; K, M <= 128, N <= 512.

    Inputs fp32, fp16, bf16 or (trn3 only) float8_e4m3fn (fp32 only with fp32); products are exact
    in fp32 for bf16/fp16/fp8 and summed in float32. perf_mode=double_row (fp8 inputs only):
    operands [K, 2, M] and [K, 2, N], contraction over the 2K elements of partitions and the first
    free dim (NeuronCore-v3+ "FP8 double performance mode"; rule MM13).

    accumulate (nki 0.3+ only; 0.2 has no such argument): False overwrites, True adds (the region
    must already hold a matmul result); not given or None: the first write to a PSUM region
    overwrites and later writes add, as in 0.2 (a region that is only partly a matmul result is
    refused).
    """
    run = current_run()
    what = f"nisa.nc_matmul(stationary {stationary.shape}, moving {moving.shape} -> dst {dst.shape})"
    if accumulate is not _NOT_GIVEN and not run.api_at_least("0.3"):
        raise NkiConstraintError(
            f"{what}: nki {run.api} nc_matmul has no accumulate= argument (added in 0.3): the "
            "first write to a PSUM tile overwrites and later writes accumulate" + _at(run, "MM15"))
    double = _double_row(run, stationary, moving, is_transpose, tile_position, tile_size, perf_mode, what)
    k, m, n = _matmul_operands(run, dst, stationary, moving, what, 2 if double else 1)
    _matmul_modes(run, k, m, tile_position, tile_size, what)
    if is_transpose and run.target.name != "trn1" and stationary.dtype != dst.dtype:
        raise NkiConstraintError(
            f"{what}: is_transpose=True writes the input dtype ({stationary.dtype}) to PSUM from NeuronCore-v3; "
            "the emulator's PSUM holds float32 only" + _at(run, "MM14"))
    _in_scope(dst, what)
    rows = 2 * k if double else k  # contraction elements: double_row adds the first free dim (of 2)
    product = _read(stationary, what).astype(np.float32, copy=False).reshape(rows, m).T @ \
        _read(moving, what).astype(np.float32, copy=False).reshape(rows, n)
    done = dst.matmul_result
    if accumulate is _NOT_GIVEN or accumulate is None:  # first write overwrites, later ones add
        accumulate = bool(done.all())
        if not accumulate and done.any():
            raise NkiConstraintError(
                f"{what}: accumulate=None onto a PSUM region only partly holding a matmul result (the "
                "first-write rule is per location: split the matmul)" + _at(run, "MM18"))
    if accumulate:
        if not done.all():
            raise NkiConstraintError(f"{what}: accumulate=True into PSUM that holds no matmul result"
                                     + _at(run, "MM16"))
        dst.data[...] += product.reshape(dst.shape)
    else:
        dst.data[...] = product.reshape(dst.shape)
    dst.written[...] = True
    done[...] = True
    trace = run.trace
    trace.matmuls += 1
    trace.matmul_flops += 2 * rows * m * n
    trace.matmul_shapes[(rows, m, n)] += 1
    trace.matmul_columns += n
    # double_row columns under their own key: the cost model's rate for them is an assumption on v4
    trace.matmul_columns_by_dtype[moving.dtype.name + ("/double_row" if double else "")] += n
    run.issue("tensor", n)


def _double_row(run, stationary, moving, is_transpose, tile_position, tile_size, perf_mode, what) -> bool:
    """Whether perf_mode is double_row, after its rules (MM13): NeuronCore-v3+; both inputs fp8
    (of the emulated formats: float8_e4m3fn, which only trn3 has); operands [K, 2, M] and [K, 2, N];
    no transpose mode and no tiling mode (the docs exclude column tiling; the emulator refuses
    row tiling too: the stricter reading)."""
    perf = _enum(perf_mode, matmul_perf_mode, what, "perf_mode")
    if perf is not matmul_perf_mode.double_row:
        return False
    if run.target.name == "trn1":
        raise NkiConstraintError(f"{what}: perf_mode=double_row: not on NeuronCore-v2 (trn1)" + _at(run, "MM13"))
    if stationary.dtype not in _FP8_DTYPES or moving.dtype not in _FP8_DTYPES:
        raise NkiConstraintError(
            f"{what}: perf_mode=double_row: it needs fp8 inputs (emulated: float8_e4m3fn, on trn3), not "
            f"{stationary.dtype} x {moving.dtype}" + _at(run, "MM13"))
    if len(stationary.shape) != 3 or len(moving.shape) != 3 or stationary.shape[1] != 2 or moving.shape[1] != 2:
        raise NkiConstraintError(
            f"{what}: perf_mode=double_row splits the contraction over the partitions and a first free dim "
            "that must be 2: operands [K, 2, M] and [K, 2, N]" + _at(run, "MM13"))
    if is_transpose or tile_position or tile_size:
        raise NkiConstraintError(f"{what}: perf_mode=double_row does not combine with transpose or tiling "
                                 "mode" + _at(run, "MM13"))
    return True


def _matmul_operands(run, dst, stationary, moving, what, per_row=1):
    """Memories, dtypes and shapes of an nc_matmul; returns (K, M, N) (K: partitions; per_row = 2:
    double_row operands [K, 2, M] and [K, 2, N])."""
    target = run.target
    _on_chip(stationary, what, ("sbuf",))
    _on_chip(moving, what, ("sbuf",))
    if dst.buffer != "psum":
        raise NkiConstraintError(f"{what}: the output must be in PSUM, not {dst.buffer.upper()}" + _at(run, "MM2"))
    _on_chip(dst, what, ("psum",))
    if dst.dtype != np.float32:
        raise NkiConstraintError(f"{what}: the PSUM output must be float32, not {dst.dtype}" + _at(run, "MM5"))
    s_type, m_type = stationary.dtype, moving.dtype
    if s_type not in _MATMUL_DTYPES or m_type not in _MATMUL_DTYPES:
        raise NkiConstraintError(
            f"{what}: Tensor Engine inputs are fp8/bf16/fp16/tf32/fp32, not {s_type} x {m_type} (integers "
            "go through activation/tensor_copy to a float tile first)" + _at(run, "MM3"))
    if (s_type == np.float32) != (m_type == np.float32):
        raise NkiConstraintError(f"{what}: float32 operands must be paired with float32, not {s_type} x "
                                 f"{m_type}" + _at(run, "MM4"))
    if per_row == 1 and (len(stationary.shape) != 2 or len(moving.shape) != 2):
        raise NkiConstraintError(f"{what}: operands must be 2-D [K, M] and [K, N]" + _at(run, "MM19"))
    k, m = stationary.shape[0], stationary.shape[-1]
    k2, n = moving.shape[0], moving.shape[-1]
    if k != k2:
        raise NkiConstraintError(f"{what}: contraction (partition) sizes differ: {k} vs {k2}" + _at(run, "MM6"))
    if k > target.partitions:
        raise NkiConstraintError(f"{what}: contraction K={k} exceeds {target.partitions} partitions"
                                 + _at(run, "MM7"))
    if m > target.stationary_free_max:
        raise NkiConstraintError(f"{what}: stationary free size M={m} exceeds {target.stationary_free_max}"
                                 + _at(run, "MM8"))
    if n > target.moving_free_max:
        v4 = (" (NeuronCore-v4's nc_matmul allows up to 4096 for a float32 dst; the emulator keeps one PSUM "
              "bank per matmul output on trn3 too, the stricter reading)") if target.name == "trn3" else ""
        raise NkiConstraintError(f"{what}: moving free size N={n} exceeds {target.moving_free_max}{v4}"
                                 + _at(run, "MM9"))
    if dst.shape[0] != m or _per_partition(dst) != n:
        raise NkiConstraintError(f"{what}: dst must be [{m}, {n}]" + _at(run, "MM10"))
    _check_one_bank(dst, what, target.psum_bank_bytes, "MM11")
    return k, m, n


def _matmul_modes(run, k, m, tile_position, tile_size, what) -> None:
    """Tiling mode (row tiles of 64, or 32 from NeuronCore-v3; no column tiling: the stricter
    reading of the parameter text)."""
    if not tile_position and not tile_size:
        return
    if len(tuple(tile_position)) != 2 or len(tuple(tile_size)) != 2:
        raise NkiConstraintError(f"{what}: tiling mode needs both tile_position=(start_row, start_column) and "
                                 "tile_size=(row_size, column_size)" + _at(run, "MM12"))
    (row0, col0), (rows, cols) = tile_position, tile_size
    sizes = (128, 64) if run.target.name == "trn1" else (128, 64, 32)
    if rows not in sizes or cols != 128 or col0 != 0:
        raise NkiConstraintError(
            f"{what}: tile_size={tuple(tile_size)}, tile_position={tuple(tile_position)}: row_size must be one "
            f"of {sizes} on {run.target.name}, column_size 128 and start_column 0 (no column tiling)"
            + _at(run, "MM12"))
    if row0 % rows or row0 + rows > 128 or k > rows or m > cols:
        raise NkiConstraintError(
            f"{what}: row tile {rows} at start_row {row0}: start_row must be a multiple of row_size inside "
            f"the 128 rows and K={k} <= row_size, M={m} <= column_size" + _at(run, "MM12"))


def _check_one_bank(dst: Tile, what: str, bank_bytes: int, rule: str) -> None:
    """The output of one matmul must lie inside one 2 KiB PSUM bank of each partition."""
    base = dst._base or dst
    row_bytes = base.data.strides[0]
    offset = (dst.data.__array_interface__["data"][0] - base.data.__array_interface__["data"][0]) % row_bytes
    size = _per_partition(dst) * dst.dtype.itemsize
    if offset // bank_bytes != (offset + size - 1) // bank_bytes:
        raise NkiConstraintError(
            f"{what}: output spans bytes {offset}..{offset + size} of each partition, crossing a "
            f"{bank_bytes} B PSUM bank boundary (one matmul output must fit in one bank)"
            + _at(current_run(), rule))


def nc_transpose(dst, data, engine=None, name=None):
    """dst[N, M] = data[M, N]^T: Tensor Engine (default; <= 128 x 128, SBUF -> PSUM) or Vector
    Engine (engine=nisa.engine.vector; <= 32 x 32, SBUF or PSUM on both sides)."""
    run = current_run()
    what = f"nisa.nc_transpose({data.shape} -> {dst.shape})"
    eng = _engine(engine, what, ("tensor", "vector"), "tensor", "T8")
    if eng == "vector":
        _on_chip(data, what)
        _on_chip(dst, what)
        if data.shape[0] > 32 or _per_partition(data) > 32:
            raise NkiConstraintError(f"{what}: Vector Engine transpose is limited to 32 x 32" + _at(run, "T4"))
    else:
        _on_chip(data, what, ("sbuf",))
        if dst.buffer != "psum":
            raise NkiConstraintError(f"{what}: the Tensor Engine transpose writes PSUM" + _at(run, "T1"))
        _on_chip(dst, what, ("psum",))
        _check_one_bank(dst, what, run.target.psum_bank_bytes, "T7")
        if data.shape[0] > 128 or _per_partition(data) > 128:
            raise NkiConstraintError(f"{what}: Tensor Engine transpose is limited to 128 x 128" + _at(run, "T3"))
    if dst.dtype != data.dtype:
        raise NkiConstraintError(f"{what}: dst dtype must equal the input dtype" + _at(run, "T5"))
    if dst.shape[0] != _per_partition(data) or _per_partition(dst) != data.shape[0]:
        raise NkiConstraintError(f"{what}: dst must be [{_per_partition(data)}, {data.shape[0]}], the "
                                 "input's free size by its partitions" + _at(run, "T6"))
    value = _read(data, what).reshape(data.shape[0], -1).T
    if eng == "tensor" and run.target.name == "trn1" and not np.isfinite(value).all():
        raise NkiConstraintError(f"{what}: a NeuronCore-v2 Tensor Engine transpose of NaN/Inf is not "
                                 "bit-accurate (they spread through the matmul)" + _at(run, "T9"))
    _write(dst, value, what)
    if eng == "vector":
        _vector(dst, what)
        return
    columns = _per_partition(data)
    run.trace.matmuls += 1
    run.trace.matmul_flops += 2 * data.shape[0] * columns * data.shape[0]
    run.trace.matmul_columns += columns
    run.trace.matmul_columns_by_dtype[data.dtype.name] += columns
    run.issue("tensor", columns)


# ---- Vector / Scalar / GpSimd engines ----------------------------------------------------------
def _same_layout(a: Tile, b: Tile, what: str, rule: str) -> None:
    if a.shape[0] != b.shape[0] or _per_partition(a) != _per_partition(b):
        raise NkiConstraintError(f"{what}: operands {a.shape} and {b.shape} differ in partitions or "
                                 "elements per partition (no broadcasting)" + _at(current_run(), rule))


def _scalar_operand(operand, data: Tile, what: str, rule: str, dtype_rule: str, dtypes=(nl.float32,)):
    """A scalar, or a [P, 1] tile of `dtypes` on the same partitions as `data` (one value per
    partition); `rule` / `dtype_rule`: the audit rows of its layout and its dtype."""
    partitions = data.shape[0]
    if isinstance(operand, Tile):
        _on_chip(operand, what)
        if operand.shape[0] != partitions or _per_partition(operand) != 1:
            raise NkiConstraintError(f"{what}: tile operand must be [{partitions}, 1], got {operand.shape}"
                                     + _at(current_run(), rule))
        if operand.dtype not in dtypes:
            raise NkiConstraintError(f"{what}: tile operand is {operand.dtype}, must be "
                                     f"{'/'.join(str(d) for d in dtypes)}" + _at(current_run(), dtype_rule))
        _same_partitions(data, operand, what)
        return _read(operand, what).reshape(partitions, 1).astype(np.float32, copy=False)
    if isinstance(operand, (int, float, np.floating, np.integer)):
        return np.float32(operand)
    raise NkiConstraintError(f"{what}: operand must be a scalar or a [P, 1] tile" + _at(current_run(), rule))


def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    """dst = op(data1, data2) elementwise (a binary ALU op); at most one input in PSUM."""
    what = f"nisa.tensor_tensor({getattr(op, '__name__', op)}, {data1.shape}, {data2.shape})"
    eng = _engine(engine, what, ("vector", "gpsimd"), "vector", "TT4")
    bitvec = op in nl.BITVEC_OPS
    if op not in nl.BINARY_ALU_OPS and not bitvec:
        raise NkiConstraintError(f"{what}: op must be a binary ALU operator" + _at(current_run(), "TT6"))
    if bitvec and any(t.dtype.kind not in "iu" for t in (dst, data1, data2)):
        raise NkiConstraintError(f"{what}: a bitvec operator needs integer tiles, got "
                                 f"{', '.join(str(t.dtype) for t in (dst, data1, data2))}" + _at(current_run(), "TT7"))
    for tile in (dst, data1, data2):
        _on_chip(tile, what)
    _no_gpsimd_psum(eng, (dst, data1, data2), what, "TT5")
    if data1.buffer == "psum" and data2.buffer == "psum":
        raise NkiConstraintError(f"{what}: at most one input may be in PSUM" + _at(current_run(), "TT2"))
    _same_layout(data1, data2, what, "TT3")
    _same_layout(dst, data1, what, "TT3")
    _same_partitions(dst, data1, what)
    _same_partitions(dst, data2, what)
    a = _read(data1, what).reshape(dst.shape[0], -1)
    b = _read(data2, what).reshape(dst.shape[0], -1)
    exact = engine is None and _int32_on_gpsimd(dst, data1, data2)
    if exact:  # nki 0.3+: exact integer arithmetic
        eng = "gpsimd"
    if bitvec:  # 32-bit patterns; through fp32 unless on GpSimd (`_bit_patterns`)
        _write(dst, _pattern_into(dst, _bit_patterns(op, a, b, exact)), what)
    else:
        if not exact:  # arithmetic in fp32
            a, b = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
        _write(dst, op(a, b), what)
    _vector(dst, what, eng)


def _int32_on_gpsimd(*tiles) -> bool:
    """From nki 0.3, a tensor_tensor whose tiles are all int32/uint32 runs on GpSimd in exact
    integer arithmetic, unless a tile is in PSUM (then the Vector Engine, in fp32)."""
    return (tiles[0].dtype in (nl.int32, nl.uint32) and all(t.dtype == tiles[0].dtype for t in tiles)
            and all(t.buffer == "sbuf" for t in tiles) and current_run().api_at_least("0.3"))


def _unary_input(dst: Tile, data: Tile, what: str, rule: str):
    """Checks of a one-input elementwise instruction; returns (partitions, data as fp32 [P, F])."""
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_layout(dst, data, what, rule)
    _same_partitions(dst, data, what)
    partitions = data.shape[0]
    return partitions, _read(data, what).astype(np.float32, copy=False).reshape(partitions, -1)


_SCALAR_ENGINE_PAIRS = ((nl.multiply, nl.add), (nl.multiply, None), (nl.add, None))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None):
    """dst = (data op0 operand0) op1 operand1; operands are scalars or [P, 1] float32 tiles."""
    what = f"nisa.tensor_scalar({getattr(op0, '__name__', op0)}, {data.shape})"
    run = current_run()
    eng = _engine(engine, what, ("vector", "scalar", "gpsimd"), "vector", "TS7")
    _no_gpsimd_psum(eng, (dst, data, operand0, operand1), what, "TS9")
    if op0 in nl.BITVEC_OPS or op1 in nl.BITVEC_OPS:
        _bitvec_scalar(dst, data, ((op0, operand0, reverse0), (op1, operand1, reverse1)), eng, what)
        return
    if eng == "gpsimd":  # the docs allow GpSimd for rsqrt only, an op the emulator does not have
        raise NkiConstraintError(f"{what}: engine=gpsimd is only allowed for rsqrt" + _at(run, "TS7"))
    if eng == "scalar" and run.target.name != "trn3" and (op0, op1) not in _SCALAR_ENGINE_PAIRS:
        raise NkiConstraintError(  # NeuronCore-v4's Scalar Engine runs tensor_scalar "same as VectorE" (ARCH-v4)
            f"{what}: the Scalar Engine runs only (multiply, add), (multiply, None), (add, None) (documented "
            "for trn2; applied to trn1 too, the stricter reading; trn3's runs every pair)" + _at(run, "TS8"))
    for op, position in ((op0, "op0"), (op1, "op1")):
        if op in nl.V4_OP0_UNARY_OPS and (position == "op1" or run.target.name != "trn3"
                                          or not run.api_at_least("0.4")):
            raise NkiConstraintError(
                f"{what}: {op.__name__} as {position}: square and relu are accepted as op0 of tensor_scalar on "
                "trn3 (NeuronCore-v4) from nki 0.4 only (use nisa.activation elsewhere)" + _at(run, "TS12"))
    if op1 is None and operand1 is not None:
        raise NkiConstraintError(f"{what}: operand1 given without op1 (both must be None when unused)"
                                 + _at(run, "TS5"))
    partitions, x = _unary_input(dst, data, what, "TS2")
    for op, operand, reverse in ((op0, operand0, reverse0), (op1, operand1, reverse1)):
        if op is None:
            continue
        if op in nl.UNARY_ALU_OPS:
            if operand is not None and not (isinstance(operand, (int, float, np.integer, np.floating))
                                            and operand == 0):
                raise NkiConstraintError(f"{what}: a unary operator takes operand None or 0" + _at(run, "TS10"))
            x = op(x)
            continue
        if op not in nl.BINARY_ALU_OPS:
            raise NkiConstraintError(f"{what}: {getattr(op, '__name__', op)} is not an ALU operator"
                                     + _at(run, "TS10"))
        if operand is None:
            raise NkiConstraintError(f"{what}: a binary operator needs its operand" + _at(run, "TS5"))
        y = _scalar_operand(operand, data, what, "TS3", "TS4")
        x = op(y, x) if reverse else op(x, y)
    _write(dst, x.astype(np.float32, copy=False), what)
    _vector(dst, what, eng)


def _bitvec_scalar(dst, data, ops, eng, what) -> None:
    """tensor_scalar with bitvec operators: both operators bitvec, on the Vector Engine, integer
    tiles and integer operands (a Python int or a [P, 1] integer tile); 32-bit patterns carried
    through fp32 (`_bit_patterns`)."""
    run = current_run()
    if any(op is not None and op not in nl.BITVEC_OPS for op, _, _ in ops):
        raise NkiConstraintError(f"{what}: op0 and op1 must be of one class (both bitvec or both arithmetic)"
                                 + _at(run, "TS6"))
    if eng != "vector":
        raise NkiConstraintError(f"{what}: bitvec operators run on the Vector Engine, not {eng}" + _at(run, "TS6"))
    if dst.dtype.kind not in "iu" or data.dtype.kind not in "iu":
        raise NkiConstraintError(f"{what}: bitvec operators need integer tiles, got {data.dtype} -> {dst.dtype}"
                                 + _at(run, "TS6"))
    if ops[1][0] is None and ops[1][1] is not None:
        raise NkiConstraintError(f"{what}: operand1 given without op1 (both must be None when unused)"
                                 + _at(run, "TS5"))
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_layout(dst, data, what, "TS2")
    _same_partitions(dst, data, what)
    partitions = data.shape[0]
    x = _read(data, what).reshape(partitions, -1)
    for op, operand, reverse in ops:
        if op is None:
            continue
        if isinstance(operand, Tile):
            _scalar_operand(operand, data, what, "TS3", "TS6", dtypes=(nl.int32, nl.uint32, nl.int16, nl.uint16,
                                                                          nl.int8, nl.uint8))
            operand = _read(operand, what).reshape(partitions, 1)
        elif not isinstance(operand, (int, np.integer)) or isinstance(operand, bool):
            raise NkiConstraintError(f"{what}: a bitvec operand must be an integer (or an integer [P, 1] tile), "
                                     f"got {operand!r}" + _at(run, "TS6"))
        x = _bit_patterns(op, operand, x, False) if reverse else _bit_patterns(op, x, operand, False)
    _write(dst, _pattern_into(dst, x), what)
    _vector(dst, what, eng)


def iota(dst, pattern, offset=_NOT_GIVEN, channel_multiplier=0, name=None):
    """dst[p, i_1, ..., i_k] = offset + channel_multiplier * p + sum_j step_j * i_j for pattern
    [[step_1, num_1], ..., [step_k, num_k]] over dst's free axes (their sizes' product = dst's free
    size), computed in 32-bit integer arithmetic on GpSimd, into SBUF (ISA-0.2/0.6:iota; offset is
    required under nki 0.2, 0 by default from 0.3)."""
    what = f"nisa.iota({getattr(dst, 'shape', dst)}, pattern={pattern!r})"
    run = current_run()
    if offset is _NOT_GIVEN:
        if not run.api_at_least("0.3"):
            raise NkiConstraintError(f"{what}: nki {run.api} needs offset (optional from 0.3)" + _at(run, "I1"))
        offset = 0
    _on_chip(dst, what, allowed=("sbuf",))
    try:
        steps = [(int(step), int(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise NkiConstraintError(f"{what}: pattern must be [[step, num], ...]" + _at(run, "I2")) from None
    if not steps or math.prod(num for _, num in steps) != _per_partition(dst) or any(n < 1 for _, n in steps):
        raise NkiConstraintError(f"{what}: the pattern's sizes must multiply to dst's free size "
                                 f"{_per_partition(dst)}" + _at(run, "I2"))
    values = np.full((dst.shape[0], 1), int(offset), dtype=np.int64) + \
        int(channel_multiplier) * np.arange(dst.shape[0], dtype=np.int64)[:, None]
    for step, num in steps:  # row-major over the pattern's axes
        values = (values[:, :, None] + step * np.arange(num, dtype=np.int64)[None, None, :]).reshape(dst.shape[0], -1)
    pattern32 = values & 0xFFFFFFFF  # 32-bit integer arithmetic
    _write(dst, _pattern_into(dst, pattern32) if dst.dtype.kind in "iu" else
           _signed32(pattern32).astype(np.float32), what)
    _vector(dst, what, "gpsimd")


def affine_select(dst, pattern, *args, name=None, **kwargs):
    """dst = on_true_tile where cmp_op(offset + channel_multiplier p + sum step i, 0), else on_false_value
    (ISA-0.2..0.6:affine_select, on GpSimd). Signatures: 0.2 (dst, pattern, offset, channel_multiplier,
    on_true_tile, on_false_value, cmp_op=nl.equal); 0.3+ (dst, pattern, channel_multiplier, on_true_tile,
    on_false_value, cmp_op=nl.equal, offset=0) [AS1]. dst and on_true_tile in SBUF, equal partitions and
    elements per partition, the pattern covering them [AS2]; on_false_value a float32 number [AS3];
    cmp_op a comparison operator [AS4]; the affine values in 32-bit integer arithmetic."""
    what = f"nisa.affine_select({getattr(dst, 'shape', dst)}, pattern={pattern!r})"
    run = current_run()
    names = (("offset", "channel_multiplier", "on_true_tile", "on_false_value", "cmp_op") if not run.api_at_least("0.3")
             else ("channel_multiplier", "on_true_tile", "on_false_value", "cmp_op", "offset"))
    if len(args) > len(names) or any(key not in names for key in kwargs) or \
            any(key in kwargs for key in names[:len(args)]):
        raise NkiConstraintError(f"{what}: nki {run.api}'s signature is affine_select(dst, pattern, "
                                 f"{', '.join(names)}) (0.3 moved offset to a keyword with default 0)"
                                 + _at(run, "AS1"))
    given = dict(zip(names, args), **kwargs)
    given.setdefault("cmp_op", nl.equal)
    if not run.api_at_least("0.3") and "offset" not in given:
        raise NkiConstraintError(f"{what}: nki {run.api} needs offset (a keyword with default 0 from 0.3)"
                                 + _at(run, "AS1"))
    given.setdefault("offset", 0)
    missing = [key for key in names if key not in given]
    if missing:
        raise NkiConstraintError(f"{what}: missing {', '.join(missing)}" + _at(run, "AS1"))
    on_true, on_false, cmp_op = given["on_true_tile"], given["on_false_value"], given["cmp_op"]
    if not isinstance(on_true, Tile):
        raise NkiConstraintError(f"{what}: on_true_tile is {type(on_true).__name__}, not a tile: nki {run.api}'s "
                                 f"signature is affine_select(dst, pattern, {', '.join(names)}) (0.3 moved offset "
                                 "to a keyword with default 0)" + _at(run, "AS1"))
    _on_chip(dst, what, allowed=("sbuf",))
    _on_chip(on_true, what, allowed=("sbuf",))
    _same_layout(dst, on_true, what, "AS2")
    _same_partitions(dst, on_true, what)
    if cmp_op not in nl.COMPARISON_OPS:
        raise NkiConstraintError(f"{what}: cmp_op must be a comparison operator (nl.equal, nl.greater_equal, ...)"
                                 + _at(run, "AS4"))
    if isinstance(on_false, bool) or not isinstance(on_false, (float, np.floating)):
        raise NkiConstraintError(f"{what}: on_false_value {on_false!r} must be a float32 number" + _at(run, "AS3"))
    try:
        steps = [(int(step), int(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise NkiConstraintError(f"{what}: pattern must be [[step, num], ...]" + _at(run, "AS2")) from None
    if not 1 <= len(steps) <= 4 or math.prod(num for _, num in steps) != _per_partition(dst) or \
            any(n < 1 for _, n in steps):
        raise NkiConstraintError(f"{what}: the pattern (up to 4 [step, num] pairs) must cover dst's "
                                 f"{_per_partition(dst)} elements per partition" + _at(run, "AS2"))
    values = np.full((dst.shape[0], 1), int(given["offset"]), dtype=np.int64) + \
        int(given["channel_multiplier"]) * np.arange(dst.shape[0], dtype=np.int64)[:, None]
    for step, num in steps:
        values = (values[:, :, None] + step * np.arange(num, dtype=np.int64)[None, None, :]).reshape(dst.shape[0], -1)
    keep = cmp_op(_signed32(values), 0)
    x = _read(on_true, what).reshape(dst.shape[0], -1)
    if on_true.dtype != dst.dtype:
        x = x.astype(np.float32)
    chosen = np.where(keep, x, np.asarray(on_false, dtype=np.float32).astype(x.dtype) if x.dtype.kind == "f"
                      else np.float32(on_false))
    _write(dst, chosen, what)
    _vector(dst, what, "gpsimd")


# ---- registers (nki 0.3+: VirtualRegister; 0.7: NkiScalar) ----------------------------------------
def register_alloc(x=None):
    """A new register (32-bit), initialised with int x or uninitialised (nki 0.3+; LANG-0.6)."""
    run = current_run()
    _registers_exist(run, "nisa.register_alloc")
    if x is not None and not is_int32(x):
        raise NkiConstraintError(f"nisa.register_alloc({x!r}): the initial value is a 32-bit int" + _at(run, "L17"))
    return RegisterValue(x, "a register")


def register_move(dst, src):
    """dst <- src (an int or another register)."""
    run = current_run()
    _registers_exist(run, "nisa.register_move")
    _writable_register(dst, "nisa.register_move")
    if not isinstance(src, RegisterValue) and not is_int32(src):
        raise NkiConstraintError(f"nisa.register_move: the source {src!r} is a 32-bit int or a register" + _at(run, "L17"))
    dst.value = src.read() if isinstance(src, RegisterValue) else int(src)


def register_load(dst, src):
    """dst <- the one element of src (an HBM or SBUF tensor of shape [1] or [1, 1], an integer)."""
    run = current_run()
    what = f"nisa.register_load({getattr(src, 'shape', src)})"
    _registers_exist(run, "nisa.register_load")
    _writable_register(dst, "nisa.register_load")
    if not isinstance(src, Tile) or src.buffer == "psum" or src.data.size != 1 or src.dtype.kind not in "iu":
        raise NkiConstraintError(f"{what}: the source is a one-element integer tensor in HBM or SBUF" + _at(run, "L17"))
    dst.value = wrap_int32(int(_read(src, what).reshape(-1)[0]))


def register_store(dst, src):
    """dst (a one-element integer tensor in HBM or SBUF) <- the register src."""
    run = current_run()
    what = f"nisa.register_store({getattr(dst, 'shape', dst)})"
    _registers_exist(run, "nisa.register_store")
    if not isinstance(src, RegisterValue):
        raise NkiConstraintError(f"{what}: the source is a register" + _at(run, "L17"))
    if not isinstance(dst, Tile) or dst.buffer == "psum" or dst.data.size != 1 or dst.dtype.kind not in "iu":
        raise NkiConstraintError(f"{what}: the destination is a one-element integer tensor in HBM or SBUF"
                                 + _at(run, "L17"))
    _write(dst, np.array([src.read()], dtype=np.int64).astype(dst.data.dtype), what)
    run.issue("dma", 1)


def scalar_load(src):
    """An NkiScalar holding the one element of src, an int32 tile of shape [1, 1] (nki 0.7)."""
    run = current_run()
    what = f"nisa.scalar_load({getattr(src, 'shape', src)})"
    if not run.api_at_least("0.7"):
        raise NkiConstraintError(f"{what}: NkiScalar and nisa.scalar_load are new in nki 0.7" + _at(run, "L17"))
    if not isinstance(src, Tile) or src.data.size != 1 or src.dtype != nl.int32:
        raise NkiConstraintError(f"{what}: the source is an int32 tile of one element (unsigned dtypes are "
                                 "rejected)" + _at(run, "L17"))
    return RegisterValue(int(_read(src, what).reshape(-1)[0]), "an NkiScalar")


def _registers_exist(run, what: str) -> None:
    if not run.api_at_least("0.3"):
        raise NkiConstraintError(f"{what}: registers are not emulated before nki 0.3" + _at(run, "L17"))


def _writable_register(dst, what: str) -> None:
    if not isinstance(dst, RegisterValue):
        raise NkiConstraintError(f"{what}: the destination is a register (nisa.register_alloc)"
                                 + _at(current_run(), "L17"))
    if dst.frozen:
        raise NkiConstraintError(f"{what}: {dst.what} is frozen (a loop's induction variable cannot be written, "
                                 "so the loop's termination stays defined)" + _at(current_run(), "L17"))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce `data` over free axes only (never the partition axis 0), at most 4 of them."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    what = f"nisa.tensor_reduce({getattr(op, '__name__', op)}, {data.shape}, axis={axes})"
    run = current_run()
    axes = tuple(a % len(data.shape) for a in axes)  # negative axes count from the end
    if 0 in axes:
        raise NkiConstraintError(
            f"{what}: reduction over the partition axis is not possible on the vector engine "
            "(use a matmul with a ones vector)" + _at(run, "R1"))
    if len(axes) > 4:
        raise NkiConstraintError(f"{what}: at most 4 free axes can be reduced" + _at(run, "R3"))
    ndim = len(data.shape)
    if sorted(axes) != list(range(ndim - len(axes), ndim)):
        raise NkiConstraintError(
            f"{what}: tensor_reduce reduces only the last free axes, contiguous and ending at the "
            f"final axis (axis {ndim - 1}); got axes {tuple(sorted(axes))}" + _at(run, "R2"))
    if op not in nl._REDUCERS:
        raise NkiConstraintError(f"{what}: unsupported reduction op (emulated: add, maximum, minimum)"
                                 + _at(run, "R4"))
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_partitions(dst, data, what)
    value = nl._REDUCERS[op](_read(data, what).astype(np.float32, copy=False), axis=axes, keepdims=True)
    if negate:
        value = -value
    if value.size != dst.data.size:
        raise NkiConstraintError(f"{what}: result has {value.size} elements, dst {dst.shape}" + _at(run, "R7"))
    _write(dst, value, what)
    _vector(data, what)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=None,
               name=None):
    """dst = op(data * scale + bias) on the Scalar Engine; bias: a [P, 1] tile (or, from
    NeuronCore-v3, a scalar). reduce_op=nl.add sums the result per partition into the engine's
    reduce registers (reduce_cmd) and reduce_res [P, 1] reads them out."""
    what = f"nisa.activation({getattr(op, '__name__', op)}, {data.shape})"
    run = current_run()
    if op not in nl.ACTIVATIONS:
        raise NkiConstraintError(f"{what}: op must be an activation function" + _at(run, "A3"))
    partitions, x = _unary_input(dst, data, what, "A2")
    x = x * _scalar_operand(scale, data, what, "A4", "A4")
    if bias is not None:
        x = x + _activation_bias(run, op, bias, data, what)
    bounds = nl.ACTIVATIONS[op]
    if bounds is not None:
        size = np.abs(x)
        if not ((size >= bounds[0]) & (size <= bounds[1])).all():
            raise NkiConstraintError(f"{what}: input outside the valid range +-[{bounds[0]:g}, {bounds[1]:g}] "
                                     "of the function (the hardware output is invalid)" + _at(run, "A10"))
    result = op(x).astype(np.float32, copy=False)
    _write(dst, result, what)
    _vector(dst, what, engine="scalar")
    if reduce_op is not None or reduce_res is not None or reduce_cmd is not None:
        _activation_reduce(run, result, data, reduce_op, reduce_res, reduce_cmd, what)


def _activation_bias(run, op, bias, data, what):
    if not isinstance(bias, Tile) and run.target.name == "trn1":
        raise NkiConstraintError(f"{what}: NeuronCore-v2 needs bias as a [N, 1] tile, not a scalar" + _at(run, "A5"))
    if op is nl.reciprocal and run.target.name == "trn1":
        raise NkiConstraintError(f"{what}: activation(op=nl.reciprocal) takes no bias on NeuronCore-v2"
                                 + _at(run, "A9"))
    dtypes = nl.DTYPES if run.api_at_least("0.3") else (nl.float32, nl.float16, nl.bfloat16)
    return _scalar_operand(bias, data, what, "A5", "A6", dtypes)


def _activation_reduce(run, result, data, reduce_op, reduce_res, command, what) -> None:
    """The Scalar Engine's per-partition reduce registers (reduce_op must be nl.add)."""
    command = _enum(command, reduce_cmd, what, "reduce_cmd") or reduce_cmd.idle
    if command is reduce_cmd.load_reduce:
        raise NkiConstraintError(f"{what}: reduce_cmd=load_reduce is not an activation command" + _at(run, "A7"))
    if reduce_op is not nl.add and (reduce_op is not None or command in (reduce_cmd.reduce, reduce_cmd.reset_reduce)):
        raise NkiConstraintError(f"{what}: reduce_op must be nl.add" + _at(run, "A7"))
    start, count = data.partitions
    if run.scalar_reduce_regs is None:  # (values, which partitions were reset)
        run.scalar_reduce_regs = (np.zeros(128, dtype=np.float32), np.zeros(128, dtype=bool))
    regs, reset = run.scalar_reduce_regs
    if command in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        regs[start:start + count] = 0.0
        reset[start:start + count] = True
    if not reset[start:start + count].all():
        raise NkiConstraintError(f"{what}: the reduce registers of partitions {start}..{start + count - 1} "
                                 "were never reset (reduce_cmd=reset or reset_reduce first)" + _at(run, "A7"))
    if command in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        regs[start:start + count] += result.reshape(count, -1).sum(axis=1, dtype=np.float32)
    if reduce_res is not None:
        _on_chip(reduce_res, what)
        if reduce_res.shape[0] != count or _per_partition(reduce_res) != 1:
            raise NkiConstraintError(f"{what}: reduce_res must be [{count}, 1], got {reduce_res.shape}"
                                     + _at(run, "A8"))
        _same_partitions(reduce_res, data, what)
        _write(reduce_res, regs[start:start + count].copy(), what)


def reciprocal(dst, data, name=None):
    """dst = 1 / data on the Vector Engine (fp32 math, cast to dst)."""
    what = f"nisa.reciprocal({data.shape})"
    partitions, x = _unary_input(dst, data, what, "RC2")
    _write(dst, np.reciprocal(x), what)
    _vector(dst, what)


# ---- traced device loops -----------------------------------------------------------------------
_TENSOR_PARAMETERS = ("dst", "src", "data", "data1", "data2", "stationary", "moving")


def _traced(instruction):
    """The instruction, its tensor parameters checked to be tiles (X15: AWS types them NkiTensor), recorded
    into the open traced device loops (nl.fori_loop, nl.while_loop) so that every iteration is checked
    to issue the first iteration's code (rule L17)."""
    parameters = list(inspect.signature(instruction).parameters)
    registers = instruction.__name__.startswith("register_") or instruction.__name__ == "scalar_load"
    # (name, position) of the tensor parameters: looked up per call without Signature.bind, which cost ~5% of
    # an emulated kernel's time (every instruction passes here)
    tensors = [] if registers else [(name, parameters.index(name)) for name in _TENSOR_PARAMETERS if name in parameters]

    @functools.wraps(instruction)
    def issue(*args, **kwargs):
        run = current_run(check=False) if _running() else None
        if run is not None:
            for name, position in tensors:
                value = kwargs.get(name, args[position] if position < len(args) else _NOT_GIVEN)
                if value is not _NOT_GIVEN and not isinstance(value, Tile):
                    raise NkiConstraintError(
                        f"nisa.{instruction.__name__}: {name} is a {type(value).__name__}, not an NKI tensor "
                        "(a host array is passed to the kernel as an argument)" + _at(run, "X15"))
        if run is not None and run._traced_loops:
            run.record(instruction.__name__, args + tuple(sorted(kwargs.items())))
        return instruction(*args, **kwargs)
    return issue


INSTRUCTIONS = ("dma_copy", "dma_transpose", "tensor_copy", "memset", "nc_matmul", "nc_transpose", "tensor_tensor",
                "tensor_scalar", "iota", "affine_select", "tensor_reduce", "activation", "reciprocal", "register_move",
                "register_load", "register_store", "scalar_load")
for _name in INSTRUCTIONS:
    globals()[_name] = _traced(globals()[_name])
del _name
