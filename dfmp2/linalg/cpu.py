"""The CPU side of the BLAS layer: which library (torch's MKL, oneDNN, numpy's OpenBLAS) runs each
kind of product, and which (torch's MKL, SciPy's OpenBLAS) each triangular solve, chosen by measuring
them on this machine. The dispatch point and the measurement
are in kernels.torch.cpu_gemm (the torch backend calls it for every product); this is the user's side:

    tune()                 measure again every shape the cache holds (none yet: TUNE_SHAPES) -> record
    describe(record)       `dfmp2 tune`'s table
    summary()              `dfmp2 info`'s line: the cache and what it holds, or why runs are untuned
    cache_unwritable()     None where the cache can be written, else why not
"""

from __future__ import annotations

from ..kernels.torch import cpu_gemm, cpu_solves

# the products `dfmp2 tune` measures where the cache holds none, as (kind, precision, (batch, m, k, n),
# the operands' layouts: "n" row-major, "t" a transposed view):
# a run's on naphthalene/cc-pVTZ (412 functions, 34 occupied, 378 virtuals, ~1100 fitting functions;
# the SCF's blocks of 23 fitting functions)
TUNE_SHAPES = (("pair", "fp32", (1, 756, 1100, 756), "nt"), ("pair", "fp64", (1, 756, 1100, 756), "nt"),
               ("transform", "fp64", (1, 782, 412, 378), "nn"), ("half", "fp32", (23, 34, 412, 412), "tn"),
               ("half", "fp64", (23, 34, 412, 412), "tn"), ("exchange", "fp32", (1, 412, 782, 412), "tn"),
               ("exchange", "fp64", (1, 412, 782, 412), "tn"))
# and the triangular solves X L^-T, as (kind, precision, (m, n)): the SCF's whitening (fp64, blocks of
# ~3,900 pair columns of ~1,030 fitting functions) and the MP2 step's (fp32, o v = 12,852 rows of 1,050)
TUNE_SOLVES = (("trsm", "fp64", (3883, 1030)), ("trsm", "fp32", (12852, 1050)))


def parse_key(key: str):
    """"pair/fp32/1024x1024x1024x16/nt" -> ("pair", "fp32", (16, 1024, 1024, 1024), "nt")."""
    kind, precision, shape, layouts = key.split("/")
    dims = [int(d) for d in shape.split("x")]
    return kind, precision, (dims[3] if len(dims) > 3 else 1, dims[0], dims[1], dims[2]), layouts


def parse_solve_key(key: str):
    """"trsm/fp64/4096x1024/solve" -> ("trsm", "fp64", (4096, 1024))."""
    kind, precision, shape, _ = key.split("/")
    m, n = (int(d) for d in shape.split("x"))
    return kind, precision, (m, n)


def tune() -> dict:
    """Measure every cached bucket again at its shape (none cached: TUNE_SHAPES and TUNE_SOLVES) and
    rewrite the cache -> kernels.torch.cpu_gemm.record(). A pinned precision is measured too; the pin still
    decides."""
    held = cpu_gemm.held_keys()
    products = [parse_key(key) for key in held if not key.endswith("/solve")]
    solves = [parse_solve_key(key) for key in held if key.endswith("/solve")]
    if not held:
        products, solves = list(TUNE_SHAPES), list(TUNE_SOLVES)
    cpu_gemm.remeasure(products)
    cpu_solves.remeasure(solves)
    return cpu_gemm.record()


def cache_unwritable() -> str | None:
    """None where this machine's cache file can be written, else why not."""
    return cpu_gemm._writable(cpu_gemm.cache_directory())


def summary() -> str:
    """One line for `dfmp2 info`."""
    state = cpu_gemm.state_summary()
    if state["untuned"] is not None:
        return f"untuned ({cache_unwritable()})"
    pins = ", ".join(f"{p} on {lib}" for p, lib in sorted(state["pins"].items()))
    return (f"{state['cached']} measured choices in {state['path']}" + (f"; pinned by DFMP2_GEMM: {pins}" if pins else "")
            + " (`dfmp2 tune` measures again)")


def describe(measured: dict) -> str:
    """`dfmp2 tune`'s table: each kind, precision and shape bucket, every library's GF/s, the choice."""
    libraries = list(dict.fromkeys([*cpu_gemm._CALLS, *cpu_gemm._SOLVES]))
    width = {lib: max(9, len(lib)) for lib in libraries}
    header = " ".join(f"{lib:>{width[lib]}s}" for lib in libraries)
    lines = [f"{'product':36s} {header}   chosen (GF/s, measured)"]
    for key, entry in measured["choices"].items():
        rates = " ".join(f"{entry['rates_gflops'][lib]:{width[lib]}.1f}" if lib in entry["rates_gflops"]
                         else f"{'-':>{width[lib]}s}" for lib in libraries)
        lines.append(f"{key:36s} {rates}   {entry['library']}")
    lines.append(f"cache: {measured['cache']}  ({measured['measure_seconds']:.1f} s measuring)")
    lines += [f"note: {note}" for note in measured["notes"]]
    return "\n".join(lines)
