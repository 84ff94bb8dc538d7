"""The one writer of appended records: `Appender`, whose every append is whole or nothing.

What dfmp2 appends to a file as it goes (a batch's JSON Lines to --json, the pair journal of a
checkpoint) and what it writes to standard output, a FIFO or a device goes through it:
  - the descriptor is unbuffered (os.write): nothing waits in a buffer, so closing it writes
    nothing and cannot fail a second time;
  - append(data) writes `data` (one record: a JSON line with its newline, a journal record)
    with os.write until all of it is written. A regular file: opened O_APPEND (a file dfmp2
    opens), its length before the append is kept; if any write fails (ENOSPC, EDQUOT, EFBIG past
    RLIMIT_FSIZE, EIO; a short write is retried, so the rest fails with the reason), or the
    fsync after it does, or a signal stops it between writes, the file is truncated back to
    that length and the error raised: the file holds every earlier record, whole, and nothing
    of this one. (A file it did not open, standard output sent to a file, is cut back only
    where the append started at the file's end: nothing after it is someone else's.) Standard
    output as a pipe or terminal, a FIFO, a device: what a reader already took cannot be
    taken back; a record of at most PIPE_BUF bytes (4096) is one write a pipe keeps whole;
  - fsync policy: sync=True (default) fsyncs a regular file after each record, so that a
    record reported written is on disk; sync=False leaves it to `sync()` (the journal: at most
    every few seconds, a kill losing nothing but what a power cut would). A failed fsync
    undoes the record as a failed write does;
  - a SIGKILL (or a power cut) in the middle of one write() can still leave a cut last record:
    the kernel stops where it stopped. Readers of these files take whole records only (the
    journal drops a torn tail; a JSON Lines reader sees a last line without its newline).
`failure_reason(error)` is the one-line reason messages give for such an OSError; `write_stdout`
prints a command's text (its summary) through it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys


def failure_reason(error: BaseException) -> str:
    """Why `error` (an OSError writing a file) happened, as a message says it: the C library's
    text of its errno ("No space left on device", "File too large", "Disk quota exceeded"); an
    HDF5 error names the errno only in its text ("errno = 28"); else its first line."""
    number = getattr(error, "errno", None)
    if number is None:
        found = re.search(r"errno = (\d+)", str(error))
        number = int(found.group(1)) if found else None
    if number:
        return os.strerror(number)
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Appender:
    """Records appended to the open descriptor `fd`, each whole or not at all (the module
    docstring); owned: close() closes fd (else it belongs to someone else: standard output)."""

    def __init__(self, fd: int, owned: bool = True, sync: bool = True):
        self.fd, self.owned, self.sync_each = fd, owned, sync
        self.records = 0  # appended so far, whole
        self.left_cut = None  # why a failed append could not be cut back (its record's start stays), or None

    @classmethod
    def open(cls, path, sync: bool = True, mode: int = 0o666) -> Appender:
        """Append to the file at `path` (created with `mode` less the umask where missing)."""
        return cls(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, mode), sync=sync)

    def append(self, data: bytes, sync: bool | None = None) -> None:
        """Write `data` whole (fsync'ed, a regular file, unless sync is False: default the
        appender's), or raise the OSError with the file as it was before (module docstring)."""
        start = self._undo_point()
        try:
            view, done = memoryview(data), 0
            while done < len(data):
                written = os.write(self.fd, view[done:])
                if written == 0:  # (a regular file that takes nothing more: no room)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += written
            if start is not None and (self.sync_each if sync is None else sync):
                os.fsync(self.fd)
        except BaseException:  # a failed write, fsync, or a signal between writes: none of it stays
            if start is not None:
                self._cut_back(start)
            raise
        self.records += 1

    def _undo_point(self) -> int | None:
        """Where this append starts, if the file is regular and what follows it is ours to cut
        (None: a pipe, terminal, FIFO or device, or a file written in its middle)."""
        info = os.fstat(self.fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        import fcntl

        if fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_APPEND:
            return info.st_size
        here = os.lseek(self.fd, 0, os.SEEK_CUR)
        return here if here == info.st_size else None

    def _cut_back(self, start: int) -> None:
        """The file back to its `start` bytes (and the offset there): what this append wrote goes."""
        try:
            os.ftruncate(self.fd, start)
            os.lseek(self.fd, start, os.SEEK_SET)
        except OSError as error:  # (truncating needs no room; an I/O error may still refuse it)
            self.left_cut = failure_reason(error)

    def sync(self) -> None:
        """fsync a regular file now (OSError if the file system cannot keep what was written)."""
        if stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.fsync(self.fd)

    def close(self) -> None:
        """Close the descriptor (if owned). Nothing is buffered, so nothing is written now; an
        error the file system reports at close (NFS) is dropped: each record was fsync'ed
        (sync=True) or its owner synced before (`sync`)."""
        if self.owned and self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None


def write_stdout(text: str) -> None:
    """`text` and a newline on standard output, written through an Appender (unbuffered: nothing is
    left for the interpreter to flush at exit, where a full disk under `> file` went unsaid, exit
    0): OSError where it cannot be written (a full disk, a closed pipe), for the command to say in
    one line (`app.signals.shown`). A stream without a descriptor (in memory) is written to as it is."""
    data = (text + "\n").encode(getattr(sys.stdout, "encoding", None) or "utf-8", "backslashreplace")
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        sys.stdout.write(text + "\n")
        return
    sys.stdout.flush()  # (what the text layer holds goes first)
    Appender(fd, owned=False, sync=False).append(data)
