"""Emulated `nki.isa` (nisa): the instructions dfmp2's kernels use, executed with numpy.

Each instruction checks the NeuronCore rules it is subject to (and those of the emulated NKI
API version), reads only written memory, writes into `dst` (marking it written) and records
itself in the kernel's trace with the engine that runs it. Arithmetic is float32, as on the
device (PSUM accumulates in float32).

Partition rules (architecture guide): the Vector, Scalar and GpSimd engines read and write
the same partitions (they cannot move data across partitions; only the Tensor Engine's matmul
and transpose do), and an access that spans more than 64 partitions starts at partition 0.
"""

from __future__ import annotations

import math

import numpy as np

from . import language as nl
from .core import NkiConstraintError, Tile, current_run


def _read(tile: Tile, what: str) -> np.ndarray:
    if not isinstance(tile, Tile):
        raise NkiConstraintError(f"{what}: operand must be a tile, got {type(tile).__name__}")
    if tile.dtype == np.float64:
        raise NkiConstraintError(f"{what}: float64 operand {tile.shape} (no float64 on a NeuronCore)")
    if not tile.written.all():
        missing = int((~tile.written).sum())
        raise NkiConstraintError(
            f"{what}: reads {missing} element(s) of a {tile.buffer.upper()} tile {tile.shape} "
            "that no instruction wrote")
    return tile.data


def _write(dst: Tile, value: np.ndarray, what: str) -> None:
    if not isinstance(dst, Tile):
        raise NkiConstraintError(f"{what}: dst must be a tile")
    if value.size != dst.data.size:
        raise NkiConstraintError(f"{what}: writes {value.size} elements into dst {dst.shape}")
    dst.data[...] = value.reshape(dst.shape).astype(dst.dtype, copy=False)
    dst.written[...] = True
    dst.matmul_result[...] = False


def _on_chip(tile: Tile, what: str, allowed=("sbuf", "psum")) -> None:
    if not isinstance(tile, Tile):
        raise NkiConstraintError(f"{what}: operand must be a tile, got {type(tile).__name__}")
    if tile.buffer not in allowed:
        raise NkiConstraintError(f"{what}: operand {tile.shape} is in {tile.buffer}, must be in "
                                 f"{' or '.join(a.upper() for a in allowed)}")
    if tile.shape[0] > current_run().target.partitions:
        raise NkiConstraintError(f"{what}: tile {tile.shape} spans more than 128 partitions")
    start, count = tile.partitions
    if count > 64 and start != 0:
        raise NkiConstraintError(
            f"{what}: operand {tile.shape} spans {count} partitions starting at partition {start}; "
            "an access over 64 partitions must start at partition 0 (start-partition rule)")


def _same_partitions(dst: Tile, src: Tile, what: str) -> None:
    """Engines other than the Tensor Engine keep data on its partitions."""
    if dst.partitions != src.partitions:
        (d0, dn), (s0, sn) = dst.partitions, src.partitions
        raise NkiConstraintError(
            f"{what}: reads partitions {s0}..{s0 + sn - 1} but writes partitions {d0}..{d0 + dn - 1}; "
            "engine instructions cannot move data across partitions (operand and result "
            "partition ranges must match; use the Tensor Engine to move data between partitions)")


def _vector(dst: Tile, what: str, engine: str = "vector"):
    run = current_run()
    run.trace.vector_ops += 1
    run.trace.vector_elements += int(dst.data.size)
    run.issue(engine, dst.data.size)


def _per_partition(tile: Tile) -> int:
    return math.prod(tile.shape[1:])


# ---- data movement -----------------------------------------------------------------------
def dma_copy(dst, src, oob_mode=None, dge_mode=None, engine=None, name=None, priority=None):
    """dst <- src between HBM and SBUF; element counts must match. nki 0.2 may also read PSUM;
    0.3+ may not (copy PSUM to SBUF with tensor_copy first). No DMA writes PSUM."""
    what = f"nisa.dma_copy({src.shape} -> {dst.shape})"
    run = current_run()
    if dst.buffer == "psum":
        raise NkiConstraintError(f"{what}: DMA cannot write PSUM")
    if src.buffer == "psum" and run.api_at_least("0.3"):
        raise NkiConstraintError(
            f"{what}: under nki {run.api} dma_copy cannot read PSUM (allowed up to 0.2): "
            "nisa.tensor_copy the PSUM tile to SBUF first")
    value = _read(src, what)
    _write(dst, value.astype(np.float32, copy=False) if dst.dtype == np.float32 else value, what)
    run.issue("dma", value.size)
    run.trace.dma_transfers += 1
    nbytes = int(value.size) * dst.dtype.itemsize
    if dst.buffer == "sbuf" and src.buffer != "sbuf":
        run.trace.dma_bytes_in += nbytes
    elif src.buffer == "sbuf" and dst.buffer != "sbuf":
        run.trace.dma_bytes_out += nbytes
    else:
        run.trace.dma_bytes_in += nbytes
        run.trace.dma_bytes_out += nbytes


def tensor_copy(dst, src, engine=None, name=None):
    """On-chip copy with a cast (the usual way out of PSUM)."""
    what = f"nisa.tensor_copy({src.shape} -> {dst.shape})"
    _on_chip(src, what)
    _on_chip(dst, what)
    _same_partitions(dst, src, what)
    _write(dst, _read(src, what), what)
    _vector(dst, what)


def memset(dst, value, engine=None, name=None):
    """dst = value; under nki 0.3+ the value must be of the tile's dtype kind (0.0 for floats)."""
    what = f"nisa.memset({dst.shape}, value={value!r})"
    _on_chip(dst, what)
    run = current_run()
    if run.api_at_least("0.3"):
        is_float = isinstance(value, (float, np.floating))
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if (dst.dtype.kind == "f" and not is_float) or (dst.dtype.kind in "iu" and not is_int):
            raise NkiConstraintError(
                f"{what}: under nki {run.api} the memset value must match the tile dtype {dst.dtype} "
                f"(got {type(value).__name__})")
    _write(dst, np.full(dst.shape, value, dtype=dst.dtype), what)
    _vector(dst, what)


# ---- Tensor Engine -------------------------------------------------------------------------
_NOT_GIVEN = object()


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=_NOT_GIVEN, tile_position=(), tile_size=(),
              perf_mode=None, name=None):
    """dst[M, N] (PSUM, fp32) = stationary[K, M].T @ moving[K, N]; K, M <= 128, N <= 512.

    accumulate (nki 0.3+ only; 0.2 has no such argument): False overwrites, True adds (the
    region must already hold a matmul result); not given or None: the first write to a PSUM
    region overwrites and later writes add, as in 0.2.
    """
    run = current_run()
    target = run.target
    what = f"nisa.nc_matmul(stationary {stationary.shape}, moving {moving.shape} -> dst {dst.shape})"
    if accumulate is not _NOT_GIVEN and not run.api_at_least("0.3"):
        raise NkiConstraintError(
            f"{what}: nki {run.api} nc_matmul has no accumulate= argument (added in 0.3): the "
            "first write to a PSUM tile overwrites and later writes accumulate")
    if accumulate is _NOT_GIVEN:
        accumulate = None
    _on_chip(stationary, what, ("sbuf",))
    _on_chip(moving, what, ("sbuf",))
    if dst.buffer != "psum":
        raise NkiConstraintError(f"{what}: the output must be in PSUM, not {dst.buffer.upper()}")
    _on_chip(dst, what, ("psum",))
    if dst.dtype != np.float32:
        raise NkiConstraintError(f"{what}: the PSUM output must be float32, not {dst.dtype}")
    if len(stationary.shape) != 2 or len(moving.shape) != 2:
        raise NkiConstraintError(f"{what}: operands must be 2-D [K, M] and [K, N]")
    k, m = stationary.shape
    k2, n = moving.shape
    if k != k2:
        raise NkiConstraintError(f"{what}: contraction (partition) sizes differ: {k} vs {k2}")
    if k > target.partitions:
        raise NkiConstraintError(f"{what}: contraction K={k} exceeds {target.partitions} partitions")
    if m > target.stationary_free_max:
        raise NkiConstraintError(f"{what}: stationary free size M={m} exceeds {target.stationary_free_max}")
    if n > target.moving_free_max:
        raise NkiConstraintError(f"{what}: moving free size N={n} exceeds {target.moving_free_max}")
    if dst.shape[0] != m or _per_partition(dst) != n:
        raise NkiConstraintError(f"{what}: dst must be [{m}, {n}]")
    _check_one_bank(dst, what, target.psum_bank_bytes)
    if (stationary.dtype == np.float32) != (moving.dtype == np.float32):
        raise NkiConstraintError(f"{what}: float32 operands must be paired with float32")
    product = _read(stationary, what).astype(np.float32).T @ _read(moving, what).astype(np.float32)
    if accumulate is None:  # first write to this PSUM region overwrites, later ones add
        accumulate = bool(dst.matmul_result.all())
    if accumulate:
        if not dst.matmul_result.all():
            raise NkiConstraintError(f"{what}: accumulate=True into PSUM that holds no matmul result")
        dst.data[...] += product.reshape(dst.shape)
    else:
        dst.data[...] = product.reshape(dst.shape)
    dst.written[...] = True
    dst.matmul_result[...] = True
    run.trace.matmuls += 1
    run.trace.matmul_flops += 2 * k * m * n
    run.trace.matmul_shapes[(k, m, n)] += 1
    run.trace.matmul_columns += n
    run.issue("tensor", n)


def _check_one_bank(dst: Tile, what: str, bank_bytes: int) -> None:
    """The output of one matmul must lie inside one 2 KiB PSUM bank of each partition."""
    base = dst._base or dst
    row_bytes = base.data.strides[0]
    offset = (dst.data.__array_interface__["data"][0] - base.data.__array_interface__["data"][0]) % row_bytes
    size = _per_partition(dst) * dst.dtype.itemsize
    if offset // bank_bytes != (offset + size - 1) // bank_bytes:
        raise NkiConstraintError(
            f"{what}: output spans bytes {offset}..{offset + size} of each partition, crossing a "
            f"{bank_bytes} B PSUM bank boundary (one matmul output must fit in one bank)")


def nc_transpose(dst, data, engine=None, name=None):
    """dst[N, M] = data[M, N]^T on the Tensor Engine (<= 128 x 128, SBUF -> PSUM)."""
    run = current_run()
    what = f"nisa.nc_transpose({data.shape} -> {dst.shape})"
    _on_chip(data, what, ("sbuf",))
    if dst.buffer != "psum":
        raise NkiConstraintError(f"{what}: the Tensor Engine transpose writes PSUM")
    _on_chip(dst, what, ("psum",))
    _check_one_bank(dst, what, run.target.psum_bank_bytes)
    if data.shape[0] > 128 or _per_partition(data) > 128:
        raise NkiConstraintError(f"{what}: Tensor Engine transpose is limited to 128 x 128")
    if dst.dtype != data.dtype:
        raise NkiConstraintError(f"{what}: dst dtype must equal the input dtype")
    value = _read(data, what).reshape(data.shape[0], -1).T
    _write(dst, value, what)
    run.trace.matmuls += 1
    run.trace.matmul_flops += 2 * data.shape[0] * _per_partition(data) * data.shape[0]
    run.trace.matmul_columns += _per_partition(data)
    run.issue("tensor", _per_partition(data))


# ---- Vector / Scalar engines -----------------------------------------------------------------
def _same_layout(a: Tile, b: Tile, what: str) -> None:
    if a.shape[0] != b.shape[0] or _per_partition(a) != _per_partition(b):
        raise NkiConstraintError(f"{what}: operands {a.shape} and {b.shape} differ in partitions or "
                                 "elements per partition (no broadcasting)")


def _scalar_operand(operand, data: Tile, what: str):
    """A scalar, or a [P, 1] tile on the same partitions as `data` (one value per partition)."""
    partitions = data.shape[0]
    if isinstance(operand, Tile):
        _on_chip(operand, what)
        if operand.shape[0] != partitions or _per_partition(operand) != 1:
            raise NkiConstraintError(f"{what}: tile operand must be [{partitions}, 1], got {operand.shape}")
        if operand.dtype != np.float32:
            raise NkiConstraintError(f"{what}: tile operand must be float32")
        _same_partitions(data, operand, what)
        return _read(operand, what).reshape(partitions, 1)
    if isinstance(operand, (int, float, np.floating, np.integer)):
        return np.float32(operand)
    raise NkiConstraintError(f"{what}: operand must be a scalar or a [P, 1] tile")


def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    """dst = op(data1, data2) elementwise; at most one input in PSUM."""
    what = f"nisa.tensor_tensor({op.__name__}, {data1.shape}, {data2.shape})"
    for tile in (dst, data1, data2):
        _on_chip(tile, what)
    if data1.buffer == "psum" and data2.buffer == "psum":
        raise NkiConstraintError(f"{what}: at most one input may be in PSUM")
    _same_layout(data1, data2, what)
    _same_layout(dst, data1, what)
    _same_partitions(dst, data1, what)
    _same_partitions(dst, data2, what)
    a = _read(data1, what).astype(np.float32).reshape(dst.shape[0], -1)
    b = _read(data2, what).astype(np.float32).reshape(dst.shape[0], -1)
    _write(dst, op(a, b), what)
    _vector(dst, what)


def _unary_input(dst: Tile, data: Tile, what: str):
    """Checks of a one-input elementwise instruction; returns (partitions, data as fp32 [P, F])."""
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_layout(dst, data, what)
    _same_partitions(dst, data, what)
    partitions = data.shape[0]
    return partitions, _read(data, what).astype(np.float32).reshape(partitions, -1)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None):
    """dst = (data op0 operand0) op1 operand1; operands are scalars or [P, 1] tiles."""
    what = f"nisa.tensor_scalar({op0.__name__}, {data.shape})"
    partitions, x = _unary_input(dst, data, what)
    for op, operand, reverse in ((op0, operand0, reverse0), (op1, operand1, reverse1)):
        if op is None:
            continue
        y = _scalar_operand(operand, data, what)
        x = op(y, x) if reverse else op(x, y)
    _write(dst, x.astype(np.float32), what)
    _vector(dst, what)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce `data` over free axes only (never the partition axis 0)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    what = f"nisa.tensor_reduce({op.__name__}, {data.shape}, axis={axes})"
    axes = tuple(a % len(data.shape) for a in axes)  # negative axes count from the end
    if 0 in axes:
        raise NkiConstraintError(
            f"{what}: reduction over the partition axis is not possible on the vector engine "
            "(use a matmul with a ones vector)")
    ndim = len(data.shape)
    if sorted(axes) != list(range(ndim - len(axes), ndim)):
        raise NkiConstraintError(
            f"{what}: tensor_reduce reduces only the last free axes, contiguous and ending at the "
            f"final axis (axis {ndim - 1}); got axes {tuple(sorted(axes))}")
    if op not in nl._REDUCERS:
        raise NkiConstraintError(f"{what}: unsupported reduction op")
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_partitions(dst, data, what)
    value = nl._REDUCERS[op](_read(data, what).astype(np.float32), axis=axes, keepdims=True)
    if negate:
        value = -value
    if value.size != dst.data.size:
        raise NkiConstraintError(f"{what}: result has {value.size} elements, dst {dst.shape}")
    _write(dst, value, what)
    _vector(data, what)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=None,
               name=None):
    """dst = op(data * scale + bias) on the Scalar Engine; bias is a [P, 1] tile."""
    what = f"nisa.activation({op.__name__}, {data.shape})"
    partitions, x = _unary_input(dst, data, what)
    x = x * _scalar_operand(scale, data, what)
    if bias is not None:
        x = x + _scalar_operand(bias, data, what)
    _write(dst, op(x).astype(np.float32), what)
    _vector(dst, what, engine="scalar")


def reciprocal(dst, data, name=None):
    what = f"nisa.reciprocal({data.shape})"
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_layout(dst, data, what)
    _same_partitions(dst, data, what)
    _write(dst, np.reciprocal(_read(data, what).astype(np.float32)), what)
    _vector(dst, what)
