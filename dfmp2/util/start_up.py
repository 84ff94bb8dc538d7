"""What a dfmp2 process maps before its memory plan can count anything, and the one check that an
rlimit (RLIMIT_DATA, RLIMIT_AS) leaves room for it (`check_start_up`). Standard library only: the
command's entry point checks the imports themselves before it makes them (numpy's and SciPy's
OpenBLAS spin for ever in blas_memory_alloc where their thread buffers cannot be mapped: `ulimit -d
150000` hung a run at 100% CPU), the driver checks torch and the SCF before loading and running them
(`run.budget` takes the model from here).

START_UP, by stage to come: "imports" (the interpreter to dfmp2's command line and PySCF loaded:
numpy's and SciPy's OpenBLAS map a 32 MB buffer and an 8 MB stack per thread, at most one thread per
CPU), "torch" (importing it and starting its backend), "scf" (PySCF's SCF and the MP2 steps after
it); per measure ("resident"; "VmData", "VmSize": what RLIMIT_DATA and RLIMIT_AS count: thread
stacks, BLAS buffers, malloc arenas, libraries, beyond what is resident): (fixed MB, MB per thread).
Measured on water/cc-pVDZ, this 2-core machine, OMP_NUM_THREADS 1 / 2 (docs/memory.md, "rlimits"):
the imports VmData 127 / 209 MB from the interpreter's 8, VmSize 361 / 443 (at 2 threads 214 / 454
under the limits themselves, on a Zen 5; the imports hung below RLIMIT_DATA 160 MB, failed below
240); the backend VmData +138 / +156 MB, VmSize +575 / +727, resident +197; the SCF and MP2 VmData
+115 (27 resident), VmSize +121; PySCF's OpenBLAS 0.3.3 a 32 MB buffer and an 8 MB stack per thread
calling dgemm (it calls a null pointer where that mmap fails: the segfault under `ulimit -d
450000`). Smallest limits water ran with, against the least check_start_up lets it start with:
RLIMIT_DATA 384 / 515 MB -> 414 / 558 (8% more); RLIMIT_AS 1062 / 1188-1250 MB -> 1128 / 1406 (6%,
12-18% more); the entry's least at 2 threads (554 MB, 1395 MB) ran.
"""

from __future__ import annotations

import os
import sys

from . import environment
from .errors import MemoryBudgetError
from .memory_limits import rlimits
from .system_memory import MB

START_UP = {
    "imports": {"VmData": (44, 82), "VmSize": (275, 82)},
    "torch": {"resident": (197, 0), "VmData": (120, 18), "VmSize": (420, 152)},
    "scf": {"VmData": (40, 40), "VmSize": (80, 40)},
}
STAGE_NAMES = {"imports": "dfmp2's libraries", "torch": "loading torch", "scf": "the SCF and MP2 steps"}
PER_CPU = {"imports"}  # stages whose threads are at most one per CPU (OpenBLAS's pools)
START_UP_PLAN = 20 * MB  # the smallest plan's blocks, with the budget's share of headroom (water's: 0.4 MB)
# what the SCF adds to the process's resident set once its integrals are released (modules, caches,
# thread stacks; measured 15 MB on benzene/cc-pVTZ): allowed for when the budget is checked before the
# SCF (`run.memory`), and here
SCF_GROWTH = 48 * MB
# the stages each command has ahead besides its imports (bench: the MP2 steps, no SCF, and none of its growth)
COMMAND_STAGES = {command: ("torch", "scf") for command in ("run", "grad", "optimize", "bench")}
SCF_COMMANDS = ("run", "grad", "optimize")
HELP = ("--help", "-h")


def threads() -> int:
    """The threads each runtime (PySCF's OpenMP, torch's, the BLAS pools) starts: OMP_NUM_THREADS's
    first figure where set, else the CPUs this process may run on."""
    text = (environment.get("OMP_NUM_THREADS") or "").split(",")[0].strip()
    return int(text) if text.isdigit() and int(text) > 0 else len(os.sched_getaffinity(0))


def start_up_bytes(stages, count=None) -> dict:
    """{measure: bytes} the `stages` of START_UP still to come add, for `count` threads (`threads()`;
    a PER_CPU stage's at most the CPUs this process may run on)."""
    count = count or threads()
    total = {}
    for stage in stages:
        each_count = min(count, len(os.sched_getaffinity(0))) if stage in PER_CPU else count
        for measure, (fixed, each) in START_UP[stage].items():
            total[measure] = total.get(measure, 0) + (fixed + each * each_count) * MB
    return total


def stages_to_come(scf) -> tuple:
    """The START_UP stages a run has ahead: "torch" unless it is loaded, "scf" if `scf` (its SCF to run)."""
    return (("torch",) if "torch" not in sys.modules else ()) + (("scf",) if scf else ())


def check_start_up(stages, growth) -> None:
    """MemoryBudgetError (bad input, before the libraries load, torch loads or PySCF's SCF starts) where
    an rlimit (RLIMIT_DATA, RLIMIT_AS) leaves less than the run needs: what its `stages` map
    (`start_up_bytes`), `growth` bytes of resident set and START_UP_PLAN. The message names the least
    limit that passes (ulimit's kB)."""
    mapped = start_up_bytes(stages)
    for limit in rlimits():
        maps = mapped.get(limit.counts, 0)
        need = maps + growth + START_UP_PLAN
        if limit.headroom < need:
            parts = ([f"{maps / MB:.0f} MB that {' and '.join(STAGE_NAMES[stage] for stage in stages)} map for "
                      f"{threads()} threads"] if maps else []) + (
                [f"{growth / MB:.0f} MB the SCF leaves"] if growth else []) + ["the smallest blocks"]
            raise MemoryBudgetError(
                f"{limit.source}: a run needs about {need / MB:.0f} MB more of it ({', '.join(parts)}); raise it to "
                f"at least {-(-((limit.held or 0) + need) // 1024)} kB "
                f"(ulimit {'-d' if limit.counts == 'VmData' else '-v'})")


def check_command(words) -> None:
    """The entry point's check, before it imports anything but the standard library: the imports and
    the stages the command (`words`, the command line's) has ahead (COMMAND_STAGES; a --help none),
    with the SCF's growth where it runs one (`check_start_up`)."""
    ahead = () if not words or any(word in HELP for word in words) else COMMAND_STAGES.get(words[0], ())
    check_start_up(("imports", *ahead), SCF_GROWTH if ahead and words[0] in SCF_COMMANDS else 0)
