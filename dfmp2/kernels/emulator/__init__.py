"""An emulator of the NKI API subset dfmp2's kernels use, executed with numpy.

It stands in for the `nki` package (`nki.jit`, `nki.simulate`, `nki.language`, `nki.isa`)
when kernels run with --simulate, and enforces the NeuronCore limits that AWS's own
simulator does not: SBUF/PSUM capacity of live allocations, partition and matmul tile
limits, one-PSUM-bank matmul outputs, no float64, no partition-axis reductions. New
on-chip and output memory is NaN-filled and tracked, so reading unwritten memory or
returning a partly written output raises NkiConstraintError. Every call leaves a trace
(matmuls, DMA bytes, vector work) from which a *modelled* trn1/trn2 time is derived.

What it cannot tell: real timing (the model assumes perfect overlap and no launch cost),
the compiler's own verifier errors, instruction scheduling, or numerical differences of
the hardware's fp32 units beyond IEEE float32 rounding.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import numpy as np

from . import isa, language
from .core import TARGETS, NkiConstraintError, Tile, Trace, kernel_run

__all__ = ["jit", "simulate", "language", "isa", "NkiConstraintError", "TARGETS", "Trace",
           "target", "EmulatedKernel"]


class _Config(threading.local):
    def __init__(self):
        name = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
        self.target = {"gen2": "trn1", "inf2": "trn1", "gen3": "trn2"}.get(name, name)


_config = _Config()


@contextlib.contextmanager
def target(name: str):
    """Run emulated kernels with the limits of `name` ('trn1' or 'trn2')."""
    if name not in TARGETS:
        raise ValueError(f"unknown NeuronCore target {name!r}")
    previous, _config.target = _config.target, name
    try:
        yield TARGETS[name]
    finally:
        _config.target = previous


class EmulatedKernel:
    """A kernel function run on the emulator: numpy arrays in, numpy arrays out."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.last_trace = None

    def __getitem__(self, logical_cores):
        if logical_cores != 1:
            raise NkiConstraintError("the emulator runs one logical NeuronCore (LNC=1)")
        return self

    def __call__(self, *args):
        with kernel_run(TARGETS[_config.target], self.fn.__name__) as run:
            result = self.fn(*(_as_hbm(arg, self.fn.__name__, n) for n, arg in enumerate(args)))
            run.checkpoint()
            outputs = result if isinstance(result, tuple) else (result,)
            arrays = tuple(_returned(tile, self.fn.__name__) for tile in outputs)
        self.last_trace = run.trace
        return arrays if isinstance(result, tuple) else arrays[0]


def jit(fn=None, **kwargs):
    """`@nki.jit`: on the emulator, a kernel called with numpy arrays runs eagerly."""
    if fn is None:
        return lambda f: EmulatedKernel(f)
    return EmulatedKernel(fn)


def simulate(kernel):
    """`nki.simulate(kernel)(*arrays)`: run a kernel (jitted or not) on the emulator."""
    return kernel if isinstance(kernel, EmulatedKernel) else EmulatedKernel(kernel)


def _as_hbm(arg, kernel_name, position):
    if isinstance(arg, np.ndarray):
        if arg.dtype == np.float64:
            raise NkiConstraintError(
                f"{kernel_name}: argument {position} is float64 {arg.shape}; there is no float64 on "
                "a NeuronCore (convert to float32 on the host)")
        data = np.ascontiguousarray(arg)
        ones = np.ones(data.shape, dtype=bool)
        return Tile(data, ones, np.zeros(data.shape, dtype=bool), "shared_hbm")
    return arg  # compile-time constants: ints, floats, tuples


def _returned(tile, kernel_name) -> np.ndarray:
    if not isinstance(tile, Tile) or tile.buffer != "shared_hbm":
        raise NkiConstraintError(f"{kernel_name}: kernel outputs must be nl.shared_hbm tensors")
    if not tile.written.all():
        missing = int((~tile.written).sum())
        raise NkiConstraintError(
            f"{kernel_name}: output {tile.shape} has {missing} element(s) no instruction wrote")
    return np.array(tile.data, copy=True)
