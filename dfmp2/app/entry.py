"""The `dfmp2` command's entry point (and `python -m dfmp2`'s).

Ctrl-C at any moment ends the command with one line and exit status 130: during the start-up
imports (torch and PySCF take a second or two) nothing needs cleaning, so the process exits at
once; once a command computes, the CLI's own handler takes over (scratch removed first). A
signal the parent process ignores (e.g. SIGHUP under nohup, SIGINT in a background job) stays
ignored.

An rlimit (ulimit -d, -v) too small for what the command's libraries map is refused here, before
they load (`util.start_up.check_command`: numpy's and SciPy's OpenBLAS spin for ever where their
thread buffers cannot be mapped): one line, exit status 2.
"""

import os
import signal
import sys


def _interrupted_at_start_up(signum, frame):
    os.write(2, b"dfmp2: error: interrupted (SIGINT)\n")
    os._exit(128 + signal.SIGINT)


def main(argv=None):
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupted_at_start_up)
    from ..util.errors import MemoryBudgetError
    from ..util.start_up import check_command

    try:
        check_command(sys.argv[1:] if argv is None else list(argv))
    except MemoryBudgetError as error:
        sys.stderr.write(f"dfmp2: error: {error}\n")
        sys.exit(2)
    from .cli import main as cli_main

    cli_main(argv)
