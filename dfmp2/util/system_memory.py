"""This process's memory as the operating system sees it: resident and peak sizes, and giving
freed heap pages back (the limits on it: `memory_limits`). Sizes in bytes; MB = 10^6 bytes, as
PySCF counts."""

from __future__ import annotations

import os

MB = 1_000_000  # memory budgets are in MB = 10^6 bytes, as in PySCF


_LIBC = []


def release_freed_memory() -> None:
    """Give the heap's freed pages back to the operating system (glibc malloc_trim; nothing
    elsewhere). glibc keeps freed blocks of a few MB in its heap once its dynamic mmap threshold
    has risen, so a loop that allocates and frees them grows the resident set by one block per
    pass (1.8 GB instead of 0.3 GB over 150 transform blocks, measured): the pipeline calls
    this after each block of a step, so that the budget holds."""
    if not _LIBC:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            _LIBC.append(libc.malloc_trim)
        except (OSError, AttributeError):
            _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)



def released_after_each(blocks):
    """Each of `blocks` in turn; once the caller asks for the next one (or the loop ends), the heap's freed
    pages go back to the system (release_freed_memory): what a step made of a block is freed by then."""
    for block in blocks:
        yield block
        release_freed_memory()

def resident_bytes() -> int:
    """The process's resident set size now (bytes; Linux /proc, else the peak so far)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_resident_bytes()


def peak_resident_bytes() -> int:
    """The process's peak resident set size so far (bytes): VmHWM on Linux (getrusage's
    ru_maxrss would include the parent's resident set at fork time, inherited through exec),
    else ru_maxrss."""
    peak = proc_field_bytes("/proc/self/status", "VmHWM:")
    if peak is not None:
        return peak
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def proc_field_bytes(path, key):
    """The `key ... N kB` line of a /proc file in bytes; None where there is no such file or line."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
