"""How a command ends: one line and exit 2 (bad input) or 1 (failure), no traceback unless --debug;
SIGINT, SIGTERM and SIGHUP stop it with scratch removed, no output written, exit 128 + N."""

from __future__ import annotations

import signal
import sys

import click

from ..util.appends import failure_reason
from ..util.errors import DFMP2Error
from ..util.files import one_line
from ..util.log import show_decisions


def fail(message: str, code: int):
    click.echo(f"dfmp2: error: {one_line(message)}", err=True)  # one line, whatever a name or a library put in it
    sys.exit(code)


class SignalExit(SystemExit):
    """Exit status 128 + N after a signal, once cleanup has run (main leaves with os._exit)."""


def stop_with(message: str, code: int):
    click.echo(f"dfmp2: error: {one_line(message)}", err=True)
    raise SignalExit(code)


class Terminated(BaseException):
    """SIGTERM (or SIGHUP), raised in the main thread so that cleanup (finally blocks) runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


SIGNALS_RECEIVED = []  # the stopping signals seen, in order (a library may turn the exception into another)
CPU_ALLOCATOR_FAILED = "can't allocate memory"  # torch's CPU allocator: a RuntimeError, not a MemoryError


def raise_terminated(signum, frame):
    SIGNALS_RECEIVED.append(signum)
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the cleanup
        signal.signal(other, signal.SIG_IGN)
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


def stop_for_signal(signum):
    if signum == signal.SIGINT:
        stop_with("interrupted (SIGINT); scratch removed", 128 + signal.SIGINT)
    stop_with(f"stopped by {signal.Signals(signum).name}; scratch removed", 128 + signum)


def raise_if_signalled():
    """Stop (KeyboardInterrupt, or Terminated) if a stopping signal arrived that the code it
    interrupted swallowed: a C extension's module init turns the KeyboardInterrupt into an
    ImportError, which a library's optional `try: import ... except ImportError` then drops (a
    Ctrl-C 0.15 s into `dfmp2 run` was lost so, about 1 run in 10, and the run went on to exit 0)."""
    if SIGNALS_RECEIVED:
        signum = SIGNALS_RECEIVED[0]
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


def shown(show, debug=False):
    """show() (it prints a command's text: `report`); an OSError writing standard output (a full
    disk under `> file`, a closed pipe) is one line, exit 1, not a traceback or an exit 0 with the
    text cut (each piece is written whole or not at all: `appends.write_stdout`)."""
    try:
        show()
    except OSError as error:
        if debug:
            raise
        fail(f"standard output: {failure_reason(error)}: the summary could not be written (the files the command "
             "wrote are in place)", 1)


def guarded(compute, debug, outputs):
    """Run `compute`; errors become one line (exit 2 bad input, 1 failure) unless --debug, which
    also shows the run's decisions on standard error (`util.log.show_decisions`).
    SIGINT, SIGTERM and SIGHUP stop the run: scratch files are removed on the way out (a
    --checkpoint directory is kept), no output file is written, exit 128 + signal number; a
    signal the interrupted code swallowed stops it before its outputs are written
    (`raise_if_signalled`, which `outputs` calls before it writes anything) or once it returns.
    `outputs` staged but not committed are discarded whatever happens."""
    if debug:
        show_decisions()
    stopping = [signum for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
                if signal.getsignal(signum) is not signal.SIG_IGN]  # an inherited ignore (nohup) is respected
    SIGNALS_RECEIVED.clear()
    for signum in stopping:
        signal.signal(signum, raise_terminated)
    outputs.before_writing = raise_if_signalled
    try:
        record = compute()
        for signum in stopping:  # the outputs are in place: the run has succeeded, whatever comes now
            signal.signal(signum, signal.SIG_IGN)
        if not outputs.written():  # a signal swallowed, and nothing of the run's in place yet: stop now
            raise_if_signalled()
        return record
    except DFMP2Error as error:
        if debug:
            raise
        if getattr(error, "reported_by_rank0", False):  # rank 0 says it once for every rank
            sys.exit(error.exit_code)
        fail(str(error), error.exit_code)
    except KeyboardInterrupt:
        stop_for_signal(signal.SIGINT)
    except Terminated as stop:
        stop_for_signal(stop.signum)
    except (click.exceptions.Exit, click.ClickException):
        raise
    except Exception as error:  # an unexpected failure: one line (exit 1), traceback only with --debug
        if SIGNALS_RECEIVED and not debug:  # the signal surfaced as another error (e.g. a C extension's
            stop_for_signal(SIGNALS_RECEIVED[0])  # module init turns it into "ImportError: initialization failed")
        if debug:
            raise
        if isinstance(error, MemoryError) or CPU_ALLOCATOR_FAILED in str(error):  # (a MemoryError's text: often none)
            fail(f"out of memory: an allocation failed ({type(error).__name__}" + (f": {error}" if str(error) else "")
                 + ") beyond what the memory budget planned; give a smaller --max-memory, or more memory", 1)
        fail(f"{type(error).__name__}: {error} (rerun with --debug for the traceback)", 1)
    finally:
        outputs.discard()
