"""Which library runs each triangular solve on a CPU (the whitenings' B = X L^-T: the SCF's fitted
integrals in fp64, the MP2 step's (ia|P) in the run's precision), chosen as kernels.torch.cpu_gemm
chooses the products' (measured once per kind, precision and shape bucket, cached in the same
file under the same identity, recorded in `cpu_configuration.gemm.solves`):

    solve_lower_transposed(kind, lower, rows)   B = X L^-T, X [m, n], L [n, n] lower triangular
    remeasure(solves)                           measure again (`dfmp2 tune`: linalg.cpu.tune)

Libraries (kernels.torch.cpu_libraries._SOLVES, util.cpu_config.SOLVE_LIBRARIES): torch's (mkl) and SciPy's own
OpenBLAS (its ?trsm on the tensors' memory; numpy's OpenBLAS has no solve numpy calls). Measured
on the AMD EPYC of family 26 model 2 (Zen 5, 2 threads, docs/benchmarking.md): with the machine's
OPENBLAS_CORETYPE=Haswell, fp64 MKL 68-76 GF/s against OpenBLAS 60-69 (the SCF's shapes), fp32
MKL 79-103 against OpenBLAS 101-146 (the MP2 step's); with OPENBLAS_* unset OpenBLAS wins both.
"""

from __future__ import annotations

import torch

from ...util import cpu_config
from . import cpu_gemm
from .cpu_libraries import _SOLVES

# a measured solve's rows hold at most this (each library's result is kept for the comparison: two
# copies beside the run's own arrays, which the memory plan does not count; water8 at --max-memory 470
# went 30-50 MB over its budget on the first run when whole solves were measured)
MEASURE_BYTES = 8 * 10**6


def solve_key(kind: str, precision: str, rows) -> str:
    """The cache key of a solve X L^-T, X [m, n]: e.g. "trsm/fp64/4096x1024/solve"."""
    m, n = rows.shape
    return f"{kind}/{precision}/{cpu_gemm._bucket(m)}x{cpu_gemm._bucket(n)}/solve"


def _measure(precision, lower, rows, notes):
    """Each library with a solve in this precision, on rows sliced to MEASURE_FLOPS (m n^2 flops) and
    MEASURE_BYTES, torch's the reference (kernels.torch.cpu_gemm._timed_choice) -> its Entry."""
    m, n = rows.shape
    keep = max(1, min(m, int(cpu_gemm.MEASURE_FLOPS / max(1, n * n)), MEASURE_BYTES // (n * rows.element_size())))
    sliced = rows[:keep]
    calls = {lib: (lambda lib=lib: _SOLVES[lib](lower, sliced))
             for lib in sorted(_SOLVES, key=lambda lib: lib != cpu_gemm.DEFAULT_LIBRARY)
             if precision in cpu_config.SOLVE_LIBRARIES[lib]}
    return cpu_gemm._timed_choice(calls, precision, float(keep) * n * n, notes)[0]


def solve_lower_transposed(kind: str, lower, rows):
    """B = X L^-T for rows X [m, n] and L [n, n] lower triangular (CPU torch tensors of one dtype), on
    the library chosen for (kind, precision, shape): measured once per bucket and cached; under a
    DFMP2_GEMM pin (which names GEMM libraries), in an untuned run or for a small solve, torch's."""
    precision = cpu_gemm._DTYPES.get(rows.dtype)
    if rows.device.type != "cpu" or precision is None or lower.dtype != rows.dtype or rows.dim() != 2:
        return _SOLVES[cpu_gemm.DEFAULT_LIBRARY](lower, rows)
    m, n = rows.shape
    flops = float(m) * n * n
    state = cpu_gemm._STATE
    with state.lock:
        state.load()
        library = cpu_gemm.DEFAULT_LIBRARY
        if not state.pins and state.untuned is None and flops >= cpu_gemm.MIN_TUNED_FLOPS:
            key = solve_key(kind, precision, rows)
            entry = state.entries.get(key)
            if entry is None:
                entry, _ = cpu_gemm._remember(state, key, lambda: (_measure(precision, lower, rows, state.notes), None))
            state.used.add(key)
            library = entry.library
        counted = (precision, library)
        state.solve_flops[counted] = state.solve_flops.get(counted, 0.0) + flops
    return _SOLVES[library](lower, rows)


def remeasure(solves) -> None:
    """Measure each solve (kind, precision, (m, n)) again on random rows and a well-conditioned
    random L, and rewrite the cache (`linalg.cpu.tune`)."""
    state = cpu_gemm._STATE
    with state.lock:
        state.load()
        generator = torch.Generator().manual_seed(0)
        for kind, precision, (m, n) in solves:
            dtype = torch.float32 if precision == "fp32" else torch.float64
            rows = torch.randn((m, n), generator=generator, dtype=dtype)
            lower = torch.tril(torch.randn((n, n), generator=generator, dtype=dtype)) / n ** 0.5 + \
                torch.eye(n, dtype=dtype) * 2.0
            cpu_gemm._remember(state, solve_key(kind, precision, rows),
                               lambda rows=rows, lower=lower, precision=precision: (
                                   _measure(precision, lower, rows, state.notes), None))
        state.save()
