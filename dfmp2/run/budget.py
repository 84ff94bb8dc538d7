"""The one memory budget rule of every entry point (the CLI, the Python API, the PySCF drop-ins,
QCEngine, ASE): how much the whole process may hold (bytes of resident set; MB = 10^6 bytes, as
PySCF counts), `memory_budget`. Each limit the process has (`util.memory_limits`: free memory,
each cgroup level's memory.max/memory.high or limit_in_bytes/memsw, RLIMIT_AS and RLIMIT_DATA, a
Slurm job's memory; a caller's figure such as QCEngine's task memory, `caller_limit`) allows what
is resident plus HEADROOM_SHARE of its room; the budget is the smallest, or --max-memory where no
hard limit stops the process below it (warned up front where one does). An rlimit too small for
what a run maps before its plan is refused before its libraries load, torch loads and PySCF's
SCF starts (`util.start_up`). `memory` turns the budget into block sizes.
"""

from __future__ import annotations

import contextvars
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..util import environment
from ..util.errors import InputError, MemoryBudgetError, option
from ..util.files import one_line
from ..util.memory_limits import MemoryLimit, cgroup_limits, free_memory, rlimits, slurm_limit
from ..util.start_up import start_up_bytes
from ..util.system_memory import MB, resident_bytes

MAX_BUDGET_MB = 1e12  # --max-memory above an exabyte is a typo, not a machine
# of each limit's headroom the default budget takes: the rest is for what the plan does not
# count (allocator slack, PySCF's temporaries, the page cache a limit charges)
HEADROOM_SHARE = 0.8


def check_max_memory(max_memory) -> float | None:
    """max_memory (MB) as a float, or None (the default budget); InputError for anything that is
    not a positive, finite number of MB up to MAX_BUDGET_MB (a string such as '4000' included)."""
    if max_memory is None:
        return None
    if isinstance(max_memory, (bool, np.bool_)) or not isinstance(max_memory, (int, float, np.integer, np.floating)):
        raise InputError(f"{option('max_memory')} must be a number of MB, got {max_memory!r} "
                         f"({type(max_memory).__name__})")
    if not np.isfinite(max_memory) or not 0 < max_memory <= MAX_BUDGET_MB:
        raise InputError(f"{option('max_memory')} must be a positive number of MB up to {MAX_BUDGET_MB:.0e} "
                         f"(an exabyte), got {max_memory:g}")
    return float(max_memory)


@dataclass(frozen=True)
class MemoryBudget:
    """The whole process's budget (`memory_budget`): size (bytes of resident set); source, what set
    it (--max-memory, or the limit that allowed least, with its figures: for the record and the
    messages); note, the user's figure lowered by a limit or above free memory (warned on stderr
    when first found, and recorded), else ""; limits, every limit taken, each with what it allows;
    binding, the limit that set it (None where --max-memory did: `limit_needed`)."""

    size: int
    source: str
    note: str = ""
    limits: tuple = ()
    binding: MemoryLimit | None = None  # the limit that set it (None: --max-memory)


def local_ranks() -> int:
    """The processes sharing this node's memory: LOCAL_WORLD_SIZE (torchrun), else 1."""
    return environment.whole_number("LOCAL_WORLD_SIZE", 1)


_CALLER_LIMITS = contextvars.ContextVar("dfmp2_caller_limits", default=())


@contextmanager
def caller_limit(size_bytes, source):
    """Within: `size_bytes` for the whole process is one more limit of every budget (its source, e.g.
    "QCEngine's task_config memory 0.5 GiB: 537 MB"): a figure a caller gives that is not the
    user's --max-memory (QCEngine's memory, PySCF's default max_memory), so that it never raises
    the budget above the system's limits, and is the budget where it is the smallest."""
    token = _CALLER_LIMITS.set(_CALLER_LIMITS.get() + ((int(size_bytes), source),))
    try:
        yield
    finally:
        _CALLER_LIMITS.reset(token)


def process_limits(now) -> list:
    """Every limit this process has (`util.memory_limits`: free memory, each cgroup level's, the
    rlimits, a Slurm job's; and the callers' figures, `caller_limit`); now: its resident set (bytes)."""
    limits = [free_memory(), *cgroup_limits(), *rlimits()]
    slurm = slurm_limit(now * local_ranks())  # the job's processes on this node, each counted as this one
    limits += [slurm] if slurm is not None else []
    return limits + [MemoryLimit(max(0, size - now), size, False, source, "whole", now)
                     for size, source in _CALLER_LIMITS.get()]


@dataclass(frozen=True)
class _Allowed:
    """What one limit allows the process (bytes of resident set): allowance, what a budget takes of
    it (the default's); ceiling, where the limit stops the process; limit; why, the figures."""

    allowance: int
    ceiling: int
    limit: MemoryLimit
    why: str


def _allowed(limit, resident, now, ranks, virtual) -> _Allowed:
    """What `limit` allows a process planned to hold `resident` bytes (it holds `now`): its headroom
    (shared: each of `ranks`' part) and what the process will give back before then (now - resident;
    negative: what it will add), less the address space it will map beyond its arrays (an
    rlimit's: virtual[limit.counts], `start_up_bytes`), of which the budget takes HEADROOM_SHARE.
    A "whole" limit (`caller_limit`) allows its figure."""
    if limit.counts == "whole":
        return _Allowed(limit.limit, limit.limit, limit, limit.source)
    share = limit.headroom // (ranks if limit.shared else 1)
    mapped = (virtual or {}).get(limit.counts, 0) if limit.counts in ("VmData", "VmSize") else 0  # an rlimit's
    room = max(0, share + now - resident - mapped)
    allowance = resident + int(HEADROOM_SHARE * room)
    parts = [f"{share / MB:.0f} MB left to each of {ranks} ranks"] if limit.shared and ranks > 1 else []
    if now > resident:
        parts.append(f"{(now - resident) / MB:.0f} MB more that the run gives back before then")
    elif now < resident:
        parts.append(f"less {(resident - now) / MB:.0f} MB that the run adds before then")
    if mapped:
        parts.append(f"less {mapped / MB:.0f} MB that the run will map beyond its arrays (torch, BLAS buffers, "
                     "thread stacks)")
    if limit.held is not None and limit.counts == "resident" and limit.held < now:
        parts.append(f"it counts {limit.held / MB:.0f} MB of the {now / MB:.0f} MB resident: the rest is shared "
                     "pages charged elsewhere")
    why = (f"{limit.source}; the budget: {resident / MB:.0f} MB resident + {HEADROOM_SHARE:.0%} of {room / MB:.0f} MB"
           + (f" ({'; '.join(parts)})" if parts else ""))
    return _Allowed(allowance, resident + room, limit, why)


def memory_budget(max_memory, resident=None, virtual=None) -> MemoryBudget:
    """The one budget rule of every entry point (docs/memory.md): each limit the process has
    (`process_limits`) allows resident + HEADROOM_SHARE of its room (`_allowed`); without
    --max-memory the budget is the smallest allowance. --max-memory (`max_memory` MB, the user's)
    is the budget where no hard limit (a cgroup's, an rlimit, a Slurm job's, a caller's figure)
    stops the process below it; once found above one (its ceiling) it is not usable for the rest
    of the process (_ABOVE), and the budget is the smallest allowance, with a note, warned on
    stderr the first time (`warn_once`) and recorded by the caller. resident: the bytes the
    process is planned to hold (default: now; a check made before the SCF plans for what the SCF
    will leave); virtual: {"VmData", "VmSize": bytes} of address space the run will still map
    beyond its arrays, taken from the rlimits' room (`start_up_bytes`)."""
    figure = check_max_memory(max_memory)
    now = resident_bytes()
    resident = now if resident is None else resident
    ranks = local_ranks()
    allowed = [_allowed(limit, resident, now, ranks, virtual) for limit in process_limits(now)]
    tightest = min(allowed, key=lambda a: a.allowance)
    limits = tuple(a.why for a in allowed)
    if figure is None:
        return MemoryBudget(tightest.allowance, tightest.why, "", limits, tightest.limit)
    size = int(figure * MB)
    for found in sorted((a for a in allowed if a.limit.limit is not None), key=lambda a: a.ceiling):
        key = (figure, found.limit.source.split(":")[0])  # the figure and which limit (its kind and path)
        if size > found.ceiling and key not in _ABOVE:
            _ABOVE[key] = (f"{option('max_memory')} {figure:g} MB is above what the {found.limit.source} lets this "
                           f"process hold ({found.ceiling / MB:.0f} MB of resident set): the budget is what the "
                           f"limits allow, as without {option('max_memory')}")
            warn_once(key, f"{_ABOVE[key]} ({tightest.allowance / MB:.0f} MB now)")
    above = [_ABOVE[key] for key in ((figure, a.limit.source.split(":")[0]) for a in allowed) if key in _ABOVE]
    if above:
        return MemoryBudget(tightest.allowance, tightest.why, above[0], limits, tightest.limit)
    free = [a for a in allowed if a.limit.limit is None and size > a.ceiling]
    note = (f"{option('max_memory')} {figure:g} MB is above the {free[0].limit.source} (no limit of the process's "
            "own, so kept): the machine may swap, or its OOM killer stop a process" if free else "")
    if note:
        warn_once((figure, "free memory"), note)
    return MemoryBudget(size, option("max_memory"), note, limits)


def limit_needed(binding, size, need) -> str:
    """What a refusal adds where the limit `binding` (a MemoryLimit, or None: --max-memory) set a
    budget of `size` bytes and the run needs `need`: the figure that limit would need, in its own
    terms (the budget counts the process's resident set, a cgroup only what it charges), or ""."""
    if binding is None or need <= size:
        return ""
    if binding.counts == "whole":  # a caller's figure is the budget itself
        return f"; {binding.source.split(':')[0]} would need to be at least {math.ceil(need / MB)} MB"
    more = -(-(need - size) * (local_ranks() if binding.shared else 1) // HEADROOM_SHARE)
    if binding.limit is None:
        return f"; it needs about {math.ceil(more / MB)} MB more free memory"
    least = binding.limit + int(more)
    if binding.counts in ("VmData", "VmSize"):
        return f"; {binding.source.split(':')[0]} would need to be at least {-(-least // 1024)} kB"
    return f"; {binding.source.split(':')[0]} would need to be at least {-(-least // MB)} MB"


# a --max-memory found above a hard limit: (figure, the limit's kind and path) -> the note, kept for the
# rest of the process, so that a run's budget is one decision: the ceilings move by tens of MB during a
# run (the resident set counts shared library pages a cgroup may charge elsewhere as torch loads)
_ABOVE = {}


def early_room(max_memory, stages) -> int:
    """Bytes the budget will leave once the START_UP `stages` to come have added to the resident set
    (the backend's libraries), their address space taken from the rlimits (the early integrals'
    test: `jk.early_integrals_fit`)."""
    added = start_up_bytes(stages)
    footprint = resident_bytes() + added.get("resident", 0)
    return memory_budget(max_memory, footprint, added).size - footprint


_WARNED = set()


def warn_once(key, note) -> None:
    """`note` as one line on stderr ("dfmp2: warning: ..."), the first time `key` is met in this
    process: a budget is computed many times a run (and a batch runs many), the warning comes when
    it is first made, before the SCF. The run's record keeps the note (MemoryPlan.budget_note)."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    sys.stderr.write(f"dfmp2: warning: {one_line(note)}\n")
    sys.stderr.flush()


def budget_bytes(max_memory, resident=None) -> int:
    """The whole process's budget in bytes now (`memory_budget`, the one rule)."""
    return memory_budget(max_memory, resident).size


def pyscf_max_memory(max_memory) -> float:
    """PySCF's max_memory for a run (MB, the whole process's, as PySCF means it): the budget now
    (`memory_budget`: PySCF's own default, 4000 MB, knows none of the process's limits)."""
    return budget_bytes(max_memory) / MB


