"""dfmp2's one clock: every timing, interval and progress tick reads `clock()` (the run's Timer in
run.context, the CPU products' measurements in kernels.torch.cpu_gemm; tests/test_architecture.py::test_one_clock)."""

from __future__ import annotations

import time


def clock() -> float:
    """Seconds on a monotonic clock (`time.perf_counter`)."""
    return time.perf_counter()
