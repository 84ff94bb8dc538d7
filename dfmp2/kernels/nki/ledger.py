"""The NKI backend's cost ledger: what ran (`calls`), what it did (one summed emulator `Trace`)
and what it would cost on every target (the calibrated MODEL of model.py, in
total and per step, and the PEAK MODEL of Trace.modelled_seconds).

Every entry is a MODEL, never a measurement. Entries: kernel launches (their trace, with the
host -> device bytes of arguments not resident in HBM; results stay in HBM), host <-> device
transfers outside a kernel (`transfer`), and copies inside device HBM (`device_copy`, read +
write at the DMA rate). The order of entries is the order of the run: the sums are float sums.

A launch recorded `prefetched` had its arguments uploaded while the previous kernel ran (the
runtime executes asynchronously: the host hands over the next block's arguments and launches
without waiting, and host -> device copies run on their own DMA queues beside the kernel, the
previous block's arguments double-buffered in HBM). Its upload is then MODELLED as hidden up to
the device time since the host link was last busy (the previous launch, and the device copies
after it): for launches alone, total = up_1 + sum_k max(up_(k+1), device_k) + device_N +
launches. A synchronous transfer in between ends the window. An assumption about the runtime,
not a measurement; the hidden seconds are reported.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import nki_emulator as emulator
from nki_emulator.core import TARGETS, Trace

from . import model
from .tiles import P


class CostLedger:
    """Counts, trace and modelled cost of one backend's run, for every target in TARGETS."""

    def __init__(self):
        self.calls = Counter()  # kernel (or host:* / device:* step) -> count
        self.trace = Trace()  # every kernel call, transfer and device copy, summed
        self.model_costs = {name: {} for name in TARGETS}  # calibrated MODEL, per target
        self.model_costs_by_step = {name: {} for name in TARGETS}  # ... per kernel / transfer / copy
        self.useful_flops = 0  # minimal matmul FLOPs of the algorithm (unpadded shapes, done once)
        self._by_kernel = {}  # kernel -> [useful FLOPs, array columns issued, largest program's instructions, peak SBUF]
        self._device_window = {name: 0.0 for name in TARGETS}  # device seconds since the last upload
        self.hidden_upload_seconds = {name: 0.0 for name in TARGETS}  # uploads under a previous kernel

    def count_launch(self, kernel_name: str, useful_flops) -> None:
        """One call of `kernel_name` whose unpadded work needs `useful_flops` matmul FLOPs (its
        trace follows through `record`, except on a Trainium host where there is none)."""
        self.calls[kernel_name] += 1
        self.useful_flops += int(useful_flops)
        self._by_kernel.setdefault(kernel_name, [0, 0, 0, 0])[0] += int(useful_flops)

    def record(self, trace: Trace, host_bytes_in=None, step=None, prefetched=False) -> None:
        """Add a kernel trace (host_bytes_in: its arguments' host -> device bytes; the result
        stays on the device; step: the kernel's name; prefetched: its upload overlaps the
        previous entry's device time, see the module docstring) or a transfer/copy pseudo-trace
        to the run's trace and model."""
        if host_bytes_in is not None:
            trace = dataclasses.replace(trace, host_bytes_in=int(host_bytes_in), host_bytes_out=0)
        if step in self._by_kernel:
            stats = self._by_kernel[step]
            stats[1] += trace.matmul_columns
            # instructions of the compiled program (one per physical core under LNC=2; no
            # device-side loops here, so executed = unrolled)
            stats[2] = max(stats[2], max(sum(p.instructions.values()) for p in (trace.programs or [trace])))
            stats[3] = max(stats[3], trace.peak_sbuf_bytes)
        self.trace.add(trace)
        step = step or ("host<->device transfer" if trace.host_bytes_in or trace.host_bytes_out
                        else "device copy")
        for name, target in TARGETS.items():
            call = model.call_seconds(trace, target)
            if prefetched:  # the upload runs while the device works on what came before
                hidden = min(call["host_transfer"], self._device_window[name])
                call["host_transfer"] -= hidden
                call["seconds"] -= hidden
                self.hidden_upload_seconds[name] += hidden
            # device seconds since the host link was last busy: what the next upload may hide under
            crossed = trace.host_bytes_in or trace.host_bytes_out
            self._device_window[name] = call["device"] + (0.0 if crossed else self._device_window[name])
            model.add_costs(self.model_costs[name], call)
            by_step = self.model_costs_by_step[name].setdefault(
                step, {"seconds": 0.0, "launches": 0, "upload_seconds": 0.0})
            by_step["seconds"] += call["seconds"]
            by_step["launches"] += trace.launches
            by_step["upload_seconds"] += call["host_transfer"]  # host <-> device part

    def transfer(self, bytes_in: int, bytes_out: int) -> None:
        """MODEL a host <-> device copy outside a kernel call (no launch)."""
        self.record(Trace(host_bytes_in=int(bytes_in), host_bytes_out=int(bytes_out)))

    def device_copy(self, nbytes: int) -> None:
        """MODEL a copy inside device HBM: read + write at the DMA rate (no launch); counted as
        `device:copy`."""
        self.record(Trace(dma_bytes_in=nbytes, dma_bytes_out=nbytes))
        self.calls["device:copy"] += 1

    def modelled_seconds(self) -> dict:
        """PEAK MODEL (uncalibrated, not measured): kernel time on each target at published peaks
        with perfect overlap and no launch cost, from this run's trace: {target: seconds}."""
        return {name: self.trace.modelled_seconds(target) for name, target in TARGETS.items()}

    def modelled(self) -> dict:
        """Calibrated MODEL (not measured), per target: seconds, breakdown, launches, and the
        Tensor Engine's useful fraction: the algorithm's minimal matmul FLOPs over the FLOPs the
        128 x 128 array could do while it streams the issued columns (2 * 128 * 128 per column,
        matmuls and transposes; a ragged tile wastes its empty rows)."""
        issued = 2 * P * P * self.trace.matmul_columns
        out = {}
        for name, costs in self.model_costs.items():
            out[name] = {
                "seconds": costs.get("seconds", 0.0),
                "breakdown": {part: costs.get(part, 0.0) for part in model.PARTS + ("device",)},
                "launches": self.trace.launches,
                "tensor_engine_useful_fraction": self.useful_flops / issued if issued else None,
                # MODEL: argument uploads overlapped with the previous kernel (not in host_transfer)
                "hidden_upload_seconds": self.hidden_upload_seconds[name],
                # idealised: the calls spread evenly over the chip's cores, nothing shared
                "cores_per_chip": TARGETS[name].cores_per_chip,
                "chip_seconds_ideal_split": costs.get("seconds", 0.0) / TARGETS[name].cores_per_chip,
                # where the time goes: per kernel (launch + its argument transfers + device), and
                # the transfers and device copies between kernels
                "seconds_by_step": {step: dict(v) for step, v in self.model_costs_by_step[name].items()},
                "physical_cores_per_launch": TARGETS[name].max_lnc,
                "by_kernel": {kernel: {
                    "tensor_engine_useful_fraction": useful / (2 * P * P * columns) if columns else None,
                    "max_instructions_per_launch": instructions,
                    "peak_sbuf_bytes_per_partition": peak_sbuf}
                    for kernel, (useful, columns, instructions, peak_sbuf) in self._by_kernel.items()},
                "instruction_limit": emulator.INSTRUCTION_LIMIT,
            }
        return out
