"""How dfmp2 configures itself for the CPU it runs on: one table per CPU vendor, each entry
measured on a machine of that vendor (docs/benchmarking.md, "The CPU configuration"); an
environment variable the user set wins; every result records what was chosen and why.

    choice("scf_fp64_square")      -> Choice(value=False, source="table for AuthenticAMD (...)")
    configuration_record()         -> {"cpu": ..., "choices": ..., "environment": ...}

`set_thread_defaults()` runs at `import dfmp2`, before numpy, torch or PySCF load: the OpenMP and
OpenBLAS idle-thread policies dfmp2 wants unless the user set them (recorded either way). A
variable read by a library that is already loaded (numpy's OpenBLAS in a script that imported
numpy before dfmp2) no longer changes it: the record says what was set, not what a library read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import environment
from .errors import InputError

# the environment dfmp2 sets for itself when the user has not: idle threads sleep at once instead of
# spinning on the cores the other library's threads need (torch's and PySCF's OpenMP runtimes, numpy's
# and SciPy's OpenBLAS pools; measured on 2 cores: docs/benchmarking.md)
THREAD_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}
# the variables a CPU run's speed depends on, recorded when set (by the user or by dfmp2)
RECORDED_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                      "OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_L2_SIZE", "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS",
                      "GLIBC_TUNABLES")
_SET_BY_DFMP2 = set()


@dataclass(frozen=True)
class Setting:
    """One configuration choice: its environment variable (the user's value wins: "1"/"0"), the
    value where no vendor's table says otherwise, and the vendors' values, each with the
    measurement that decided it."""

    variable: str
    default: bool
    default_why: str
    by_vendor: dict  # vendor_id -> (value, why)


SETTINGS = {
    # The SCF's fp64 square copy of B [naux, nao, nao] beside the fp32 one (mixed precision, cpu):
    # it spares each fp64 anchor build the unpacking of the triangle, and costs the first touch of
    # its pages. Measured, each alternating quiet runs, the same energies:
    "scf_fp64_square": Setting(
        "DFMP2_SCF_FP64_SQUARE", True,
        "Intel Xeon, 2026-11-28: the square saved 0.4-1.7 s per SCF at 384-412 functions (unpacking the "
        "triangle took as long as an anchor's GEMMs)",
        {"AuthenticAMD": (False, "AMD EPYC, 2026-11-28: without it the SCF took 1.5-2.8 s less (naphthalene/cc-pVTZ "
                                 "10.1 -> 8.5 s, (H2O)16/cc-pVDZ 22.6 -> 20.9 s, C16H34/cc-pVDZ 22.6 -> 20.2 s) and "
                                 "1.4-2.3 GB less: the first touch of fresh pages (0.8-4 GB/s here) cost more than "
                                 "the two anchors' unpacking (0.2-0.4 s each)")}),
}


@dataclass(frozen=True)
class Choice:
    name: str
    value: bool
    source: str  # where the value came from: the user's variable, or the table and its measurement


def set_thread_defaults(environ=None) -> None:
    """THREAD_DEFAULTS into the environment where the user has not set them (at import, before the
    libraries that read them load); which ones dfmp2 set is remembered for the record."""
    for name, value in THREAD_DEFAULTS.items():
        if environment.set_default(name, value, environ):
            _SET_BY_DFMP2.add(name)


# the /proc/cpuinfo flags that decide which GEMM kernels a library can run (AVX2 and FMA; AVX-512's
# foundation, VNNI and BF16; AMX's tiles): Zen 4 and Zen 5 both say "AMD EPYC", and differ here
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16",
                "amx_int8")


@functools.lru_cache(maxsize=4)
def cpu_identity(path: str = "/proc/cpuinfo") -> dict:
    """{"vendor": vendor_id (GenuineIntel, AuthenticAMD, ... or "" where none is given), "model":
    the model name, "family", "model_number", "stepping": the numbers that tell CPU generations
    apart (None where not given), "kernel_flags": which of KERNEL_FLAGS the CPU has, in that
    order} of the first processor in `path` (Linux)."""
    found = {"vendor": "", "model": "", "family": None, "model_number": None, "stepping": None, "kernel_flags": []}
    keys = {"vendor_id": "vendor", "model name": "model", "cpu family": "family", "model": "model_number",
            "stepping": "stepping"}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if not line.strip() and found["vendor"]:
                    break  # the first processor's block has ended
                if key == "flags":
                    flags = set(value.split())
                    found["kernel_flags"] = [flag for flag in KERNEL_FLAGS if flag in flags]
                elif key in keys and found[keys[key]] in ("", None):
                    found[keys[key]] = int(value) if keys[key] in ("family", "model_number", "stepping") \
                        and value.isdigit() else value
    except OSError:
        pass
    return found


def choice(name: str, environ=None, identity=None) -> Choice:
    """The value of configuration choice `name` (SETTINGS) on this machine, and where it came
    from: the user's environment variable ("1" or "0"; anything else: `check_environment`'s
    InputError), else this CPU vendor's table entry, else the default."""
    setting = SETTINGS[name]
    check_environment(environ)
    given = environment.get(setting.variable, environ=environ)
    if given is not None:
        return Choice(name, given.strip() == "1", f"{setting.variable}={given.strip()} (set by the user)")
    vendor = (identity or cpu_identity())["vendor"]
    if vendor in setting.by_vendor:
        value, why = setting.by_vendor[vendor]
        return Choice(name, value, f"table for {vendor}: {why}")
    return Choice(name, setting.default, f"default ({vendor or 'vendor unknown'}): {setting.default_why}")


# the libraries a CPU product can run on (kernels.torch.cpu_gemm measures them) and the precisions each
# computes in: torch's own BLAS (MKL in the pinned wheel), oneDNN through torch (fp32 only: it has no
# fp64 matmul), numpy's OpenBLAS through zero-copy views
GEMM_LIBRARIES = {"mkl": ("fp32", "fp64"), "onednn": ("fp32",), "openblas": ("fp32", "fp64")}
SOLVE_LIBRARIES = {"mkl": ("fp32", "fp64"), "scipy-openblas": ("fp32", "fp64")}  # the triangular solves'


def gemm_pins(environ=None) -> dict:
    """{precision: library} the user pinned with DFMP2_GEMM ("onednn": every precision the library
    computes in; "fp32=onednn,fp64=openblas": each named one), {} where it is not set. InputError,
    one line, for an unknown library or precision, or a library that does not compute in a
    precision it is pinned for."""
    given = environment.get("DFMP2_GEMM", environ=environ)
    if given is None or not given.strip():
        return {}
    pins, known = {}, ", ".join(GEMM_LIBRARIES)
    for part in given.split(","):
        precision, _, library = part.strip().rpartition("=")
        library = library.strip().lower()
        if library not in GEMM_LIBRARIES:
            raise InputError(f"environment variable DFMP2_GEMM={given!r}: unknown library {library!r} (use one of: "
                             f"{known}, or fp32=LIBRARY,fp64=LIBRARY)")
        precisions = [precision.strip().lower()] if precision else list(GEMM_LIBRARIES[library])
        for name in precisions:
            if name not in ("fp32", "fp64"):
                raise InputError(f"environment variable DFMP2_GEMM={given!r}: unknown precision {name!r} (fp32, fp64)")
            if name not in GEMM_LIBRARIES[library]:
                raise InputError(f"environment variable DFMP2_GEMM={given!r}: {library} has no {name} products "
                                 f"(it computes in {', '.join(GEMM_LIBRARIES[library])})")
            pins[name] = library
    return pins


def check_environment(environ=None) -> None:
    """InputError naming a configuration variable set to something other than 1 or 0, or a
    DFMP2_GEMM that `gemm_pins` refuses."""
    gemm_pins(environ)
    for setting in SETTINGS.values():
        given = environment.get(setting.variable, environ=environ)
        if given is not None and given.strip() not in ("0", "1"):
            raise InputError(f"environment variable {setting.variable}={given!r}: expected 1 or 0")


def configuration_record(environ=None) -> dict:
    """What the result records: the CPU, each choice with its source, and the recorded variables
    that are set, each with who set it (the user, or dfmp2 at import)."""
    recorded = {name: environment.get(name, environ=environ) for name in RECORDED_VARIABLES}
    return {"cpu": dict(cpu_identity()),
            "choices": {name: {"value": c.value, "source": c.source}
                        for name, c in ((n, choice(n, environ)) for n in SETTINGS)},
            "environment": {name: {"value": value, "set_by": "dfmp2" if name in _SET_BY_DFMP2 else "user"}
                            for name, value in recorded.items() if value is not None}}
