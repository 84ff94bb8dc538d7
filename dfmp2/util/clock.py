"""dfmp2's one clock: every timing, interval and progress tick reads `clock()` (the run's Timer in
run.context, the CPU products' measurements in kernels.torch.cpu_gemm, the drop-ins' timer line);
`cpu_seconds()` is the process's CPU time beside it, which PySCF's timer lines print
(tests/test_architecture.py::test_one_clock: no other module reads a clock, PySCF's logger's included)."""

from __future__ import annotations

import time


def clock() -> float:
    """Seconds on a monotonic clock (`time.perf_counter`)."""
    return time.perf_counter()


def cpu_seconds() -> float:
    """CPU seconds this process has used, every thread's (`time.process_time`)."""
    return time.process_time()
