"""Emulated `nki.language` (nl): buffers, dtypes, tile sizes, allocation, loops, ALU ops.

The subset dfmp2's kernels use, with the signatures common to NKI 0.2-0.6 (Neuron SDK
2.28-2.32). Loops: affine/sequential/static ranges are unrolled (0.3+) or traced (0.2) and
count every iteration's instructions (0.7: deprecated, Python `range`, still unrolled);
`dynamic_range` (0.2-0.6, removed in 0.7), `fori_loop` and `while_loop` (0.6+) are device-side loops whose
body is compiled once (fori_loop and while_loop: traced once, checked per iteration, rule L17).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from .core import (BFLOAT16, FLOAT8_E4M3FN, FP8_E4M3FN_TARGETS, NkiConstraintError, RegisterValue, Tile, current_run,
                   is_int32, rule_tag)


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


def relu(x):
    return np.maximum(x, np.float32(0))


# comparison operators (AWS's operator table: 1.0 where true, else 0.0; affine_select's cmp_op)
def equal(x, y):
    return np.equal(x, y)


def not_equal(x, y):
    return np.not_equal(x, y)


def greater(x, y):
    return np.greater(x, y)


def greater_equal(x, y):
    return np.greater_equal(x, y)


def less(x, y):
    return np.less(x, y)


def less_equal(x, y):
    return np.less_equal(x, y)


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
UNARY_ALU_OPS = (reciprocal, square, relu)  # arithmetic ALU ops of one input (tensor_scalar: operand None or 0)
V4_OP0_UNARY_OPS = (square, relu)  # "accepted as op0 on trn3" (nki 0.4 release notes; rule TS12)
COMPARISON_OPS = (equal, not_equal, greater, greater_equal, less, less_equal)
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
    trips = 0
    for n, value in enumerate(affine_range(start, stop, step)):
        with run.device_loop_iteration(first=n == 0):
            yield value
        trips += 1
    run.dynamic_loops.append(("nl.dynamic_range", trips))


WHILE_LOOP_LIMIT = 2 ** 24  # iterations after which an emulated nl.while_loop is taken as not terminating


@contextlib.contextmanager
def no_reorder():
    """nl.no_reorder(): the instructions of the block keep their program order (the emulator runs every
    kernel in program order). Device loops with register bounds (nl.fori_loop, nl.while_loop) may not
    sit inside one (rule L18)."""
    run = current_run()
    run.no_reorder += 1
    try:
        yield
    finally:
        run.no_reorder -= 1


def _device_loop_checks(run, name: str, where: str) -> None:
    if not run.api_at_least("0.6"):
        raise NkiConstraintError(f"{run.name}: {name} does not exist in nki {run.api} (new in 0.6; "
                                 f"use nl.dynamic_range there) {where}")
    if run.no_reorder:
        raise NkiConstraintError(
            f"{run.name}: {name} inside an nl.no_reorder() block: register-based dynamic loops (nl.fori_loop, "
            "nl.while_loop) are not supported there; put the no_reorder block inside the loop body "
            f"[L18; {run.target.name}, nki {run.api}]")


def _loop_bound(run, name: str, bound, where: str) -> int:
    """A fori_loop bound: a 32-bit int, or a register (its run-time value)."""
    if isinstance(bound, RegisterValue):
        return bound.read()
    if not is_int32(bound):
        raise NkiConstraintError(f"{run.name}: nl.fori_loop {name} bound {bound!r}: a bound must be a 32-bit int "
                                 "or a register (the loop compiles to a compare-and-branch with no 64-bit form) "
                                 + where)
    return int(bound)


def fori_loop(lower, upper, body_fun, step=1):
    """nl.fori_loop (nki 0.6+): body_fun(i) for i in range(lower, upper, step) as a device-side loop
    whose body is traced once. AWS's rules [L15]: bounds are 32-bit ints or registers, the step a
    positive compile-time int, the body returns nothing, tensors allocated in the body are not usable
    after the loop; [L17] i is a register (0.6: a read-only VirtualRegister; 0.7: an NkiScalar), and
    every iteration must issue the code of the first; [L18] not inside nl.no_reorder()."""
    run = current_run()
    where = f"[L15; {run.target.name}, nki {run.api}]"
    _device_loop_checks(run, "nl.fori_loop", where)
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step <= 0:
        raise NkiConstraintError(f"{run.name}: nl.fori_loop step {step!r}: it must be a positive compile-time "
                                 f"int {where}")
    first, last = (_loop_bound(run, name, bound, where) for name, bound in (("lower", lower), ("upper", upper)))
    step = int(step)
    run.record("nl.fori_loop", (lower, upper, step))
    variable = "the nl.fori_loop variable"
    trips = 0
    with run.loop_scope(), run.traced_loop("nl.fori_loop") as loop:
        for value in range(first, last, step):
            with run.traced_iteration(loop):
                returned = body_fun(RegisterValue(value, variable, frozen=True))
            trips += 1
            if returned is not None:
                raise NkiConstraintError(f"{run.name}: the nl.fori_loop body returned {type(returned).__name__}; "
                                         f"a body returns nothing (write results into tensors) {where}")
    run.dynamic_loops.append(("nl.fori_loop", trips))


def while_loop(init, body_fun):
    """nl.while_loop (nki 0.6+): while the condition register is nonzero (checked before each iteration),
    cond = body_fun(cond); `init` is a register and the body returns the next iteration's condition
    register and nothing else. The body is traced once (rule L17), not inside nl.no_reorder() (L18)."""
    run = current_run()
    where = f"[L23; {run.target.name}, nki {run.api}]"
    _device_loop_checks(run, "nl.while_loop", where)
    if not isinstance(init, RegisterValue):
        raise NkiConstraintError(f"{run.name}: nl.while_loop init {init!r}: the condition is a register "
                                 f"(nisa.register_alloc), not a Python value or a tensor {where}")
    run.record("nl.while_loop", (init,))
    condition, trips = init, 0
    with run.loop_scope(), run.traced_loop("nl.while_loop") as loop:
        while condition.read() != 0:
            if trips == WHILE_LOOP_LIMIT:
                raise NkiConstraintError(f"{run.name}: nl.while_loop ran {WHILE_LOOP_LIMIT:,} iterations without its "
                                         f"condition register reaching 0 {where}")
            with run.traced_iteration(loop):
                condition = body_fun(condition)
            trips += 1
            if not isinstance(condition, RegisterValue):
                raise NkiConstraintError(
                    f"{run.name}: the nl.while_loop body returned {type(condition).__name__}; it returns the "
                    f"condition register of the next iteration and nothing else {where}")
    run.dynamic_loops.append(("nl.while_loop", trips))


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
        raise NkiConstraintError(f"{what}: {dtype!r} is not an NKI dtype" + rule_tag("X13")) from None
    if dtype == np.float64:
        raise NkiConstraintError(f"{what}: float64 does not exist on a NeuronCore (use float32)" + rule_tag("X12"))
    if dtype not in DTYPES:
        raise NkiConstraintError(
            f"{what}: {dtype} is not an NKI dtype (emulated: {', '.join(str(d) for d in DTYPES)})" + rule_tag("X13"))
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
    if address is not None:
        tile._first_partition = _placed(run, shape, dtype, buffer, address)
    run.number(tile)
    if run._traced_loops:
        run.record("nl.ndarray", (shape, str(dtype), str(buffer)))
    if buffer == shared_hbm:
        return _shared(run, tile)
    if buffer in (sbuf, psum):
        if len(shape) < 2:
            raise NkiConstraintError(f"on-chip tile {shape} needs a partition and a free axis" + rule_tag("L5"))
        if shape[0] > run.target.partitions:
            raise NkiConstraintError(
                f"nl.ndarray: tile of shape {shape} has {shape[0]} partitions; the limit is "
                f"{run.target.partitions}" + rule_tag("X1"))
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


def _placed(run, shape, dtype, buffer, address) -> int:
    """nl.ndarray(address=): the tile's first partition. AWS (nki 0.3+; LANG-0.6, the 0.7 ndarray page): on
    SBUF/PSUM a 2-tuple (partition_offset, free_offset), on HBM (0.7) a 1-tuple (free_offset,); the free
    offset counts elements within each partition; a PSUM tensor starts at the beginning of a bank [AD2].
    The emulator also keeps a placed tile inside the memory [AD3] (the stricter reading: AWS states no
    bound) and its first partition is checked by the start-partition rules (X2-X4) at each access."""
    where = f"[AD1; {run.target.name}, nki {run.api}]"
    what = f"nl.ndarray({shape}, buffer=nl.{buffer}, address={address!r})"
    if not run.api_at_least("0.3"):
        raise NkiConstraintError(f"{what}: nki {run.api} has no address= (added in 0.3) {where}")
    on_chip = buffer in (sbuf, psum)
    size = 2 if on_chip else 1
    if not on_chip and not run.api_at_least("0.7"):
        raise NkiConstraintError(f"{what}: nki {run.api} places SBUF and PSUM tensors only (an HBM address, a "
                                 f"1-tuple, is documented from 0.7) {where}")
    if not isinstance(address, tuple) or len(address) != size or any(
            not isinstance(a, (int, np.integer)) or isinstance(a, bool) or a < 0 for a in address):
        form = "(partition_offset, free_offset)" if on_chip else "(free_offset,)"
        raise NkiConstraintError(f"{what}: the address of a tensor in {buffer} is a tuple {form} of non-negative "
                                 f"ints {where}")
    if not on_chip:
        return 0
    partition, free = (int(a) for a in address)
    start, end = free * dtype.itemsize, (free + math.prod(shape[1:])) * dtype.itemsize  # bytes per partition
    bank = run.target.psum_bank_bytes
    if buffer == psum and start % bank:
        raise NkiConstraintError(f"{what}: a PSUM tensor must start at the beginning of a {bank} B bank (byte "
                                 f"{start} of the partition is not) [AD2; {run.target.name}, nki {run.api}]")
    limit = run.psum_capacity() if buffer == psum else run.target.sbuf_usable_bytes_per_partition
    if partition + shape[0] > run.target.partitions or end > limit:
        raise NkiConstraintError(
            f"{what}: partitions {partition}..{partition + shape[0] - 1}, bytes {start}..{end} of each partition: "
            f"outside the {run.target.partitions} partitions x {limit} B of {buffer.upper()} "
            f"[AD3; {run.target.name}, nki {run.api}]")
    return partition


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
