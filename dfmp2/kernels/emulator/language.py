"""Emulated `nki.language` (nl): buffers, dtypes, tile sizes, allocation, loops, ALU ops.

The subset dfmp2's kernels use, with the signatures common to NKI 0.2-0.6 (Neuron SDK
2.28-2.32). Loops: affine/sequential/static ranges are unrolled (0.3+) or traced (0.2) and
count every iteration's instructions (0.7: deprecated, Python `range`, still unrolled);
`dynamic_range` (0.2-0.6, removed in 0.7) and `fori_loop` (0.6+) are device-side loops whose body is
compiled once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .core import BFLOAT16, FLOAT8_E4M3FN, FP8_E4M3FN_TARGETS, NkiConstraintError, Tile, current_run


# ---- buffers ---------------------------------------------------------------------------
class Buffer(str):
    """A buffer object (nl.sbuf, nl.psum, ...). It equals its name, but nki 0.3+ refuses the
    plain string ('sbuf') that 0.2 accepted (MIG-0.3, "String Buffer Names No Longer Supported")."""


sbuf = Buffer("sbuf")
psum = Buffer("psum")
shared_hbm = Buffer("shared_hbm")
private_hbm = Buffer("private_hbm")
hbm = private_hbm
_BUFFERS = {"sbuf": sbuf, "psum": psum, "shared_hbm": shared_hbm, "private_hbm": private_hbm, "hbm": hbm}

# ---- dtypes (the NKI dtype table; no float64 on a NeuronCore) --------------------------
float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = BFLOAT16  # values held in float32 arrays, every write rounded to bf16 (RNE)
float8_e4m3fn = FLOAT8_E4M3FN  # OCP fp8, trn3 only (L16); float32 arrays, every write rounded (RNE, overflow NaN)
int32 = np.dtype(np.int32)
uint32 = np.dtype(np.uint32)
int16 = np.dtype(np.int16)
uint16 = np.dtype(np.uint16)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)
# the emulated part of AWS's dtype table (the other fp8 formats, the packed x4 types and tfloat32 are not
# emulated; float8_e4m3fn only on NeuronCore-v4, rule L16)
DTYPES = (float32, float16, bfloat16, float8_e4m3fn, int32, uint32, int16, uint16, int8, uint8, bool_)


class tile_size:  # noqa: N801 - the NKI name
    pmax = 128
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    psum_fmax = 512
    psum_bank_fmax = 512


# ---- ALU operators (used as op= arguments) ---------------------------------------------
def add(x, y):
    return np.add(x, y)


def subtract(x, y):
    return np.subtract(x, y)


def multiply(x, y):
    return np.multiply(x, y)


def maximum(x, y):
    return np.maximum(x, y)


def minimum(x, y):
    return np.minimum(x, y)


def copy(x):
    return np.array(x, copy=True)


def reciprocal(x):
    return np.reciprocal(x)


def square(x):
    return np.square(x)


# bitvec operators (AWS's operator table: elements as bit patterns, integer tiles only); on 32-bit
# patterns held in int64 by the instructions (isa._bit_patterns), a logical right shift
def bitwise_and(x, y):
    return np.bitwise_and(x, y)


def bitwise_or(x, y):
    return np.bitwise_or(x, y)


def bitwise_xor(x, y):
    return np.bitwise_xor(x, y)


def left_shift(x, y):
    return np.left_shift(x, y)


def right_shift(x, y):
    return np.right_shift(x, y)


_REDUCERS = {add: np.sum, maximum: np.max, minimum: np.min}
# AWS's operator tables (SHARED tbl-aluop, tbl-act-func), restricted to the emulated operators
BINARY_ALU_OPS = (add, subtract, multiply, maximum, minimum)
BITVEC_OPS = (bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift)  # (invert: not emulated)
UNARY_ALU_OPS = (reciprocal,)  # arithmetic ALU ops of one input (tensor_scalar: operand None or 0)
# activation functions and their valid input ranges (|x| bounds; None: any value)
ACTIVATIONS = {copy: None, square: None, reciprocal: (2.0 ** -42, 2.0 ** 42)}


# ---- indexing and loops ----------------------------------------------------------------
@dataclass(frozen=True)
class ds:  # noqa: N801 - the NKI name
    """Dynamic slice: elements [start, start + size)."""

    start: int
    size: int


def affine_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = affine_range
static_range = affine_range


def dynamic_range(start, stop=None, step=1):
    """A device-side loop (nki 0.2-0.6; deprecated in 0.6 for nl.fori_loop, removed in 0.7): the body
    is compiled once, so only the first iteration's instructions count toward the instruction limit."""
    run = current_run()
    if run.api_at_least("0.7"):
        raise NkiConstraintError(
            f"{run.name}: nl.dynamic_range was removed in nki {run.api} (deprecated in 0.6): use "
            f"nl.fori_loop or nl.while_loop [L11; {run.target.name}, nki {run.api}]")
    for n, value in enumerate(affine_range(start, stop, step)):
        with run.device_loop_iteration(first=n == 0):
            yield value


INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def fori_loop(lower, upper, body_fun, step=1):
    """nl.fori_loop (nki 0.6+): body_fun(i) for i in range(lower, upper, step) as a device-side
    loop, compiled once (only the first iteration's instructions count toward the instruction
    limit). AWS's rules [L15]: 32-bit bounds, a positive compile-time int step, a body that returns
    nothing, and tensors allocated in the body are not usable after the loop."""
    run = current_run()
    where = f"[L15; {run.target.name}, nki {run.api}]"
    if not run.api_at_least("0.6"):
        raise NkiConstraintError(f"{run.name}: nl.fori_loop does not exist in nki {run.api} (new in 0.6; "
                                 f"use nl.dynamic_range there) {where}")
    if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
        raise NkiConstraintError(f"{run.name}: nl.fori_loop step {step!r}: it must be a positive compile-time "
                                 f"int {where}")
    for name, bound in (("lower", lower), ("upper", upper)):
        if not isinstance(bound, (int, np.integer)) or isinstance(bound, bool) \
                or not INT32_MIN <= int(bound) <= INT32_MAX:
            raise NkiConstraintError(f"{run.name}: nl.fori_loop {name} bound {bound!r}: a bound must be a "
                                     f"32-bit int (the loop compiles to a compare-and-branch with no "
                                     f"64-bit form) {where}")
    with run.loop_scope():
        for n, value in enumerate(range(int(lower), int(upper), step)):
            with run.device_loop_iteration(first=n == 0):
                returned = body_fun(value)
            if returned is not None:
                raise NkiConstraintError(f"{run.name}: the nl.fori_loop body returned {type(returned).__name__}; "
                                         f"a body returns nothing (write results into tensors) {where}")


# ---- allocation ------------------------------------------------------------------------
def _check_dtype(dtype, what, run=None):
    if dtype is BFLOAT16:
        return dtype
    if dtype is FLOAT8_E4M3FN:
        if run is not None and run.target.name not in FP8_E4M3FN_TARGETS:
            raise NkiConstraintError(
                f"{what}: Data type F8E4M3FN is not supported on TRN1/TRN2. (neuronx-cc error EVRF051: "
                f"float8_e4m3fn is native on NeuronCore-v4 (trn3) and later) [L16; {run.target.name}, nki {run.api}]")
        return dtype
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise NkiConstraintError(f"{what}: {dtype!r} is not an NKI dtype") from None
    if dtype == np.float64:
        raise NkiConstraintError(f"{what}: float64 does not exist on a NeuronCore (use float32) [X12]")
    if dtype not in DTYPES:
        raise NkiConstraintError(
            f"{what}: {dtype} is not an NKI dtype (emulated: {', '.join(str(d) for d in DTYPES)}) [X13]")
    return dtype


def _buffer(buffer, run):
    """The buffer object; a plain string name only under nki 0.2."""
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, str) and buffer in _BUFFERS:
        if run.api_at_least("0.3"):
            raise NkiConstraintError(
                f"nl.ndarray: buffer={buffer!r}: nki {run.api} accepts no string buffer names (0.2 "
                f"did); use nl.{buffer} [L10; {run.target.name}, nki {run.api}]")
        return _BUFFERS[buffer]
    raise NkiConstraintError(f"nl.ndarray: unknown buffer {buffer!r}")


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """Uninitialised tensor: on-chip memory is NaN-filled and marked unwritten."""
    shape = tuple(int(n) for n in shape)
    run = current_run(check=False)
    dtype = _check_dtype(dtype, f"nl.ndarray{shape}", run)
    if any(n <= 0 for n in shape):
        raise NkiConstraintError(f"nl.ndarray: empty shape {shape}")
    buffer = _buffer(buffer, run)
    storage = getattr(dtype, "storage", dtype)
    data = np.full(shape, np.nan, dtype=storage) if dtype.kind == "f" else np.full(shape, 4, dtype=storage)
    tile = Tile(data, np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool), buffer, dtype=dtype)
    if buffer == shared_hbm:
        return _shared(run, tile)
    if buffer in (sbuf, psum):
        if len(shape) < 2:
            raise NkiConstraintError(f"on-chip tile {shape} needs a partition and a free axis [L5]")
        if shape[0] > run.target.partitions:
            raise NkiConstraintError(
                f"nl.ndarray: tile of shape {shape} has {shape[0]} partitions; the limit is "
                f"{run.target.partitions} [X1]")
        if buffer == psum and dtype != np.float32:
            raise NkiConstraintError(f"nl.ndarray: PSUM tile {shape} must be float32, not {dtype} "
                                     f"[L3; {run.target.name}, nki {run.api}]")
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        if buffer == psum and per_partition > run.target.psum_bank_bytes:
            raise NkiConstraintError(
                f"nl.ndarray: PSUM tile {shape} of {per_partition} B per partition is wider than one "
                f"{run.target.psum_bank_bytes} B PSUM bank (tile_size.psum_fmax = 512 fp32; the stricter "
                f"reading): use a list of one-bank tiles [L1; {run.target.name}, nki {run.api}]")
        run.allocate(buffer, per_partition, shape, tile)
        run.scoped(tile)
    return tile


def _shared(run, tile):
    """The n-th nl.shared_hbm tensor of a launch: made by program 0, the same tensor in the others."""
    n = run._shared_allocations
    run._shared_allocations += 1
    if run.program_id == 0:
        run.shared_outputs.append(tile)
        return tile
    if n >= len(run.shared_outputs) or run.shared_outputs[n].shape != tile.shape:
        raise NkiConstraintError(
            f"{run.name}: program {run.program_id} allocates shared_hbm tensor #{n} {tile.shape}, "
            "unlike program 0: every program of an SPMD launch must allocate the same outputs")
    return run.shared_outputs[n]


# ---- SPMD grid (logical NeuronCores) -------------------------------------------------------
def program_id(axis=0):
    """Index of this program in the launch grid: the physical core of a logical NeuronCore."""
    if axis != 0:
        raise NkiConstraintError("dfmp2 kernels use a one-dimensional launch grid (axis 0)")
    return current_run().program_id


def num_programs(axes=None):
    """Programs in the launch grid (1 without a grid)."""
    return current_run().programs


def program_ndim():
    return 1 if current_run().programs > 1 else 0


def zeros(shape, dtype, buffer=sbuf, name=""):
    tile = ndarray(shape, dtype, buffer, name)
    tile.data[...] = 0
    tile.written[...] = True
    current_run().trace.vector_ops += 1
    return tile
