"""Scratch: the directories dfmp2 makes and removes (under --scratch, else the system's temporary
directory), which of them a run holds, and `RowFile`, a matrix kept in a file a block of rows at a time."""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np

from . import environment
from .errors import ComputationError, InputError, option
from .files import display, one_line


def scratch_root(scratch=None) -> str:
    """Where a run's scratch directories go: `scratch` (--scratch), else PySCF's temporary
    directory by PySCF's rule (PYSCF_TMPDIR, else TMPDIR, else the system's)."""
    if scratch is not None:
        return os.fspath(scratch)
    return environment.get("PYSCF_TMPDIR") or tempfile.gettempdir()


def _scratch_label(scratch) -> str:
    if scratch is not None:
        return f"{option('scratch')} {display(scratch)}"
    return f"the temporary directory {display(scratch_root())} (PYSCF_TMPDIR, TMPDIR)"


def check_scratch(scratch=None) -> None:
    """InputError unless a scratch directory can be made under `scratch` (default: `scratch_root`)."""
    with scratch_directory("dfmp2-probe-", scratch):
        pass


def scratch_directory(prefix: str, scratch=None) -> tempfile.TemporaryDirectory:
    """A new temporary directory `prefix`* under `scratch_root(scratch)` (cleanup() removes it);
    InputError, one line naming the directory, where it cannot be made."""
    root = scratch_root(scratch)
    if not os.path.isdir(root):
        raise InputError(f"{_scratch_label(scratch)}: no such directory")
    try:
        return tempfile.TemporaryDirectory(prefix=prefix, dir=root)
    except OSError as error:
        raise InputError(f"{_scratch_label(scratch)}: cannot write there ({one_line(error.strerror or str(error))})") \
            from None


def scratch_failure(error: OSError, where, scratch=None) -> ComputationError:
    """The one-line runtime error for an OSError met writing or reading scratch in `where` (a
    directory or file under scratch_root(scratch)): a full disk, a quota, an I/O error."""
    text = str(error)
    reason = (os.strerror(error.errno) if error.errno else
              os.strerror(28) if "errno = 28" in text else  # HDF5 names the C library's errno in its message
              text.splitlines()[0] if text else "input/output error")
    return ComputationError(f"{display(where)} ({_scratch_label(scratch)}): {one_line(reason)}")


def scratch_prefix(checkpoint=None) -> str:
    """The name prefix of a run's scratch directories: "dfmp2-", or with a checkpoint directory
    "dfmp2-ck<hash of its path>-", so that the next run of that checkpoint finds and removes what a
    killed one left behind (`storage.remove_scratch`)."""
    if checkpoint is None:
        return "dfmp2-"
    import hashlib

    return "dfmp2-ck" + hashlib.sha256(os.path.abspath(os.fspath(checkpoint)).encode()).hexdigest()[:12] + "-"


_HELD = []  # the scratch directories held now (`held_directory`), innermost last


def in_use(path) -> bool:
    """`path` is a scratch directory this process holds now (never removed as a leftover)."""
    return any(os.path.exists(held) and os.path.samefile(path, held) for held in _HELD)


def holding() -> list:
    """The scratch directories held now, innermost last."""
    return list(_HELD)


@contextlib.contextmanager
def held_directory(prefix: str, scratch=None):
    """A new scratch directory prefix* under `scratch_root(scratch)` (InputError, one line, where
    it cannot be made), held (`in_use`) while the block runs and removed when it ends, however
    it ends (a signal included: the command line turns them into exceptions)."""
    directory = scratch_directory(prefix, scratch)
    _HELD.append(directory.name)
    try:
        yield directory.name
    finally:
        _HELD.pop()
        directory.cleanup()


class RowFile:
    """An array [nrows, ncols] (fp64 unless dtype says) in a raw file of a scratch directory, row-major: read and
    written by blocks of rows (one contiguous read or write) or of columns (one per row), with
    positioned reads and writes, so that its pages stay in the page cache and out of the
    process's resident set (a memory map would count them). For the SCF's whitened JK-fit
    integrals where the budget does not hold them (dfmp2.chem.jk), and the blocks of B a rank keeps
    out of core (dfmp2.run.ranks). The directory is removed by close(). bytes_read /
    bytes_written count the array bytes moved."""

    def __init__(self, shape, scratch=None, prefix="dfmp2-scf-", dtype=np.float64):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.scratch = scratch
        self._tmpdir = scratch_directory(prefix, scratch)
        self.path = os.path.join(self._tmpdir.name, "rows.bin")
        self.bytes_read = self.bytes_written = 0
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            self._tmpdir.cleanup()
            raise scratch_failure(error, self._tmpdir.name, scratch) from None

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.itemsize

    def _io(self, move, buffer, offset):
        """One positioned read or write of `buffer` (a C-contiguous array) at byte `offset`, whole."""
        view, done = memoryview(buffer).cast("B"), 0
        try:
            while done < len(view):
                moved = move(self._fd, view[done:], offset + done)
                if moved == 0:
                    raise OSError(5, "short read")
                done += moved
        except OSError as error:
            raise scratch_failure(error, self.path, self.scratch) from None

    def write_rows(self, r0, block):
        """Rows [r0, r0 + len(block)) = block [n, ncols]."""
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self._io(lambda fd, view, at: os.pwrite(fd, view, at), block, r0 * self.shape[1] * self.itemsize)
        self.bytes_written += block.nbytes

    def read_rows(self, r0, r1, out=None) -> np.ndarray:
        """Rows [r0, r1): [r1 - r0, ncols] (into `out`, C-contiguous, where given)."""
        out = np.empty((r1 - r0, self.shape[1]), dtype=self.dtype) if out is None else out[:r1 - r0]
        self._io(lambda fd, view, at: os.preadv(fd, [view], at), out, r0 * self.shape[1] * self.itemsize)
        self.bytes_read += out.nbytes
        return out

    def read_columns(self, c0, c1) -> np.ndarray:
        """Columns [c0, c1) of every row: [nrows, c1 - c0]."""
        out = np.empty((self.shape[0], c1 - c0), dtype=self.dtype)
        for r in range(self.shape[0]):
            self._io(lambda fd, view, at: os.preadv(fd, [view], at), out[r],
                     (r * self.shape[1] + c0) * self.itemsize)
        self.bytes_read += out.nbytes
        return out

    def write_columns(self, c0, block):
        """Columns [c0, c0 + block.shape[1]) of every row = block [nrows, n]."""
        for r in range(self.shape[0]):
            row = np.ascontiguousarray(block[r], dtype=self.dtype)
            self._io(lambda fd, view, at: os.pwrite(fd, view, at), row, (r * self.shape[1] + c0) * self.itemsize)
        self.bytes_written += block.shape[0] * block.shape[1] * self.itemsize

    def io(self) -> dict:
        return {"bytes_written": int(self.bytes_written), "bytes_read": int(self.bytes_read)}

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass
