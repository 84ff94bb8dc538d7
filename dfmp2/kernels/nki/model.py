"""A calibrated time MODEL of NKI kernel calls on trn1 / trn2 / trn3, from emulator traces.

Everything here is a model, never a measurement. One kernel call costs

    launch + host_transfer + device
    device = max(tensor_engine, dma, vector, scalar, gpsimd)      (the engines run concurrently)

    launch         fixed cost of one call (runtime dispatch, NEFF start)            [fitted]
    host_transfer  (argument + result bytes) / host<->device rate                    [fitted]
    tensor_engine  per matmul/transpose: (fixed + columns x cycles per column) / clock;
                   a 128 x 128 systolic array streams one moving column per cycle in bf16 (and
                   fp16/fp8) and 4 cycles per column in fp32, whatever K and M are (small tiles
                   waste it): the trace counts the columns per moving dtype (CYCLES_PER_COLUMN;
                   fp8 double_row: 256 contraction rows per column, its v4 rate ASSUMED)
    dma            bytes / (16 DMA engines x 27.2 GB/s, capped by the core's HBM share, x 65%)
                   + a fixed cost per dma_copy
    vector/scalar  per instruction: (fixed + elements per partition) / engine clock
    gpsimd         the same per-instruction cost as the Vector Engine: an ASSUMPTION (AWS documents the
                   GpSimd engine's processors, not an element rate); before the NKI random-number
                   generator (rng/nki_philox.py: iota, and int32 tensor_tensor from nki 0.3) dfmp2's
                   kernels issued almost nothing there, and the model charged it nothing

Constants and where they come from (see docs/benchmarks.md, "Calibration"):
  - peaks, clocks, DMA engines, HBM bandwidth: AWS's architecture guides (docs/hardware-facts.md);
  - 64 cycles fixed cost per instruction: the performance guide's "60-100 cycles";
  - 65% DMA efficiency: the guides' "60-70% of HBM bandwidth is good";
  - launch and host_transfer: fitted (two unknowns, two equations) to a sibling library's warm
    trn1.2xlarge figures for its NKI GEMM, 512^3 in 1.3 ms and 1024^3 in 2.3 ms per call
    (neuronx-cc 2.24), through dfmp2's own gemm_kernel traces (B panel resident): launch 0.982 ms, 10.30 GB/s.
    trn2 and trn3 reuse them (no published trn2 or trn3 per-call figure): an assumption.

trn3 (NeuronCore-v4), assumptions on top of AWS's figures: the DMA rate per engine is not published
for v4, so the model takes v2's 27.2 GB/s x 16 engines per core (AWS gives 128 DMA engines per
Trainium3 chip, 16 per core when shared evenly), capped by the core's share of the chip's HBM
bandwidth (4.9 TB/s / 8); the Tensor Engine's column rate follows from its 79 bf16 TFLOPS per core
(= 2.4 GHz x 128 x 128 x 2, the documented clock); the Vector/Scalar/GpSimd engines run at 1.2 GHz.

Why here and not in nki_emulator: the mechanism (a trace to seconds) is a dozen lines and exists for its
constants, and those are dfmp2's calibration: launch and host_transfer fitted through dfmp2's own
gemm_kernel traces, the engine rates and the fp8 assumptions chosen for dfmp2's kernels. The emulator
keeps what it counts (nki_emulator.core.Trace) and its uncalibrated peak model (Trace.modelled_seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

from nki_emulator.core import TARGETS, Target, Trace

DMA_ENGINES = 16
DMA_ENGINE_GB_PER_S = 27.2
DMA_EFFICIENCY = 0.65
FIXED_CYCLES = 64  # per instruction, any engine (performance guide: 60-100)
FP32_CYCLES_PER_COLUMN = 4  # fp32 matmul costs ~4x bf16 on the Tensor Engine
# Tensor Engine cycles per moving column, by the trace's key (matmul_columns_by_dtype); any other
# key (bf16, fp16): 1. fp8 (float8_e4m3fn, NeuronCore-v4): 1, the bf16 rate, per the Trainium3 guide's
# data path "2x128 (non-MXFP8 dense input)". fp8 in perf_mode=double_row: 1 cycle per column of an
# instruction contracting 256 rows (2x the FLOPs of bf16): an ASSUMPTION carried over from the
# Trainium2 guide's "double FP8" (v3); the v4 docs list the mode for nc_matmul but give no v4 rate
# for it, and their data-path table (2x128 for non-MX inputs) would make it 2 (no gain).
CYCLES_PER_COLUMN = {"float32": FP32_CYCLES_PER_COLUMN, "float8_e4m3fn": 1, "float8_e4m3fn/double_row": 1}
PARTITIONS = 128


@dataclass(frozen=True)
class Calibration:
    """Per-target model constants (seconds, bytes/s, Hz)."""

    launch_s: float  # fitted
    host_bytes_per_s: float  # fitted
    tensor_columns_per_s: float  # bf16 moving columns per second = bf16 peak / (2 * 128 * 128)
    engine_clock_hz: float  # Vector / Scalar / GpSimd engines
    dma_bytes_per_s: float  # effective


def _calibration(target: Target, engine_clock_hz: float) -> Calibration:
    dma_peak = min(DMA_ENGINES * DMA_ENGINE_GB_PER_S, target.hbm_gb_per_s_per_core) * 1e9
    return Calibration(launch_s=0.982e-3, host_bytes_per_s=10.30e9,
                       tensor_columns_per_s=target.bf16_tflops * 1e12 / (2 * PARTITIONS * PARTITIONS),
                       engine_clock_hz=engine_clock_hz, dma_bytes_per_s=DMA_EFFICIENCY * dma_peak)


# vector engine clocks: 1.12 GHz (NeuronCore-v2), 0.96 GHz (NeuronCore-v3), 1.2 GHz (NeuronCore-v4:
# Vector, Scalar and GpSimd, AWS's NKI Trainium3 guide)
ENGINE_CLOCK_HZ = {"trn1": 1.12e9, "trn2": 0.96e9, "trn3": 1.2e9}
CALIBRATIONS = {name: _calibration(target, ENGINE_CLOCK_HZ[name]) for name, target in TARGETS.items()}
PARTS = ("launch", "host_transfer", "tensor_engine", "dma", "vector", "scalar", "gpsimd")


ENGINES = ("tensor_engine", "dma", "vector", "scalar", "gpsimd")


def _column_cycles(trace: Trace) -> int:
    """Tensor Engine cycles streaming moving columns: 4 per fp32 column, 1 per bf16/fp16/fp8 one.
    Columns a trace does not attribute to a dtype (traces built elsewhere) count as fp32."""
    by_dtype = trace.matmul_columns_by_dtype
    unattributed = trace.matmul_columns - sum(by_dtype.values())
    return (unattributed * FP32_CYCLES_PER_COLUMN
            + sum(columns * CYCLES_PER_COLUMN.get(dtype, 1) for dtype, columns in by_dtype.items()))


def _engine_seconds(trace: Trace, cal: Calibration) -> dict:
    """MODEL: busy seconds of each engine of one core running `trace`."""
    te_clock = cal.tensor_columns_per_s
    out = {"tensor_engine": (trace.instructions["tensor"] * FIXED_CYCLES + _column_cycles(trace)) / te_clock,
           "dma": ((trace.dma_bytes_in + trace.dma_bytes_out) / cal.dma_bytes_per_s
                   + trace.instructions["dma"] * FIXED_CYCLES / te_clock)}
    for engine in ("vector", "scalar", "gpsimd"):
        per_partition = trace.engine_elements[engine] / PARTITIONS
        out[engine] = (trace.instructions[engine] * FIXED_CYCLES + per_partition) / cal.engine_clock_hz
    return out


def call_seconds(trace: Trace, target: Target) -> dict:
    """MODEL: seconds of one kernel call from its trace -> {part: seconds, 'device', 'seconds'}.

    launch and host_transfer are serial; tensor_engine, dma, vector and scalar are the busy
    times of engines that overlap, so `device` is their maximum, not their sum. A launch on a
    logical core of several physical cores (trace.programs) runs its programs concurrently:
    `device` is the slowest program's, and each engine entry the largest over the programs.
    """
    cal = CALIBRATIONS[target.name]
    per_core = [_engine_seconds(program, cal) for program in (trace.programs or [trace])]
    parts = {
        "launch": cal.launch_s * trace.launches,
        "host_transfer": (trace.host_bytes_in + trace.host_bytes_out) / cal.host_bytes_per_s,
    }
    for engine in ENGINES:
        parts[engine] = max(core[engine] for core in per_core)
    parts["device"] = max(max(core.values()) for core in per_core)
    parts["seconds"] = parts["launch"] + parts["host_transfer"] + parts["device"]
    return parts


def add_costs(total: dict, call: dict) -> dict:
    """Accumulate per-call costs (sums of per-call maxima for `device` and `seconds`)."""
    for key, value in call.items():
        total[key] = total.get(key, 0.0) + value
    return total
