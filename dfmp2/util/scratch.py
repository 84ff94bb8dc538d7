"""Scratch: the directories dfmp2 makes and removes (under --scratch, else PYSCF_TMPDIR, else
TMPDIR, else the system's temporary directory), and `RowFile`, a matrix kept in a file a block
of rows at a time.

Ownership: every scratch directory a run makes comes from `scratch_directory(kind)` (the SCF's
RowFile "scf", the gradient's "gradient", an optimisation's "optimize", a rank's blocks "rank", a
DiskStore "b", PySCF's temporary files "pyscf": `chem.pyscf_scratch`). It is named
<run><kind>-<random>, where <run> is the run's name (`run_name`): "dfmp2-", or within
`named_by(name)` that name (a checkpoint's "dfmp2-ck<its id>-": `checkpoint.policy.checkpoint_scratch`,
an optimisation's), and it holds LOCK_NAME, a file locked (flock, exclusive) on a descriptor kept
open for the directory's lifetime. The kernel releases that lock when its holder dies, however
it dies (SIGKILL included); it is the file's, whatever mount or PID namespace looks at it (on a
shared file system, one whose clients share locks: NFS, Lustre mounted with flock). `sweep(name)`
removes the directories named <name>* whose lock it can take without waiting (a dead run's),
holding it while it removes them; the first `named_by(name)` of a process sweeps, so that a
resume removes what its killed run left. A directory is locked before its lock file bears its
name (made as LOCKING, locked, then renamed), and one without that file is never swept (it is
not provably a dead dfmp2 run's): no sweep removes a live or half-made directory. A process
never opens the lock of a directory it holds itself (`in_use`): where flock is emulated with
per-process locks (NFS), closing that descriptor would drop its own lock. Forks: an flock
belongs to the open file description, which a forked child shares, so the directory stays held
while either lives, and only the process that made it removes it (classic fcntl locks are
avoided: they are the process's and go when any of its descriptors of the file closes).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import tempfile
import threading
import weakref

import numpy as np

from . import environment
from .appends import failure_reason
from .errors import ComputationError, InputError, option
from .files import display, one_line

RUN = "dfmp2-"  # the name of a run's scratch directories outside `named_by`
LOCK_NAME = ".dfmp2-scratch.lock"  # in each scratch directory: held (flock) by the process that made it
LOCKING = ".dfmp2-scratch.lock.new"  # the lock file while it is being locked (no sweep looks at it)
_NAMES = []  # the run names `named_by` holds now, innermost last
_HELD = set()  # the paths of the scratch directories this process holds now
_GUARD = threading.Lock()  # (_NAMES and _HELD are the process's: threads share them)


def _new_guard():
    global _GUARD
    _GUARD = threading.Lock()  # a forked child's: another thread may have held the parent's at the fork


os.register_at_fork(after_in_child=_new_guard)


def scratch_root(scratch=None) -> str:
    """Where a run's scratch directories go: `scratch` (--scratch), else PYSCF_TMPDIR, else TMPDIR
    (PySCF's rule), else the system's temporary directory. A variable set to something unusable is
    refused where a directory is made (`scratch_directory`), never passed over."""
    if scratch is not None:
        return os.fspath(scratch)
    return environment.get("PYSCF_TMPDIR") or environment.get("TMPDIR") or tempfile.gettempdir()


def _scratch_label(scratch) -> str:
    """What chose the scratch root, as messages name it: --scratch DIR, PYSCF_TMPDIR=DIR, ..."""
    if scratch is not None:
        return f"{option('scratch')} {display(scratch)}"
    for name in ("PYSCF_TMPDIR", "TMPDIR"):
        if environment.get(name):
            return f"{name}={display(environment.get(name))}"
    return f"the temporary directory {display(scratch_root())} (neither PYSCF_TMPDIR nor TMPDIR is set)"


def check_scratch(scratch=None) -> None:
    """InputError unless a scratch directory can be made (and locked) under `scratch_root(scratch)`."""
    with scratch_directory("probe", scratch):
        pass


def run_name(identity: str | None = None) -> str:
    """The name of a run's scratch directories: "dfmp2-", or "dfmp2-ck<identity>-" for the run of a
    checkpoint of that identity (hex: `checkpoint.Checkpoint.scratch_prefix`)."""
    return RUN if identity is None else f"dfmp2-ck{identity}-"


def current_name() -> str:
    """The run name the scratch directories made now take (the innermost `named_by`'s, or RUN)."""
    with _GUARD:
        return _NAMES[-1] if _NAMES else RUN


@contextlib.contextmanager
def named_by(name: str | None, scratch=None):
    """Within: the scratch directories this process makes are named `name`* (`run_name`; None:
    unchanged). The first `named_by` of a name in the process first removes what a dead run of
    that name left under scratch_root(scratch) (`sweep`). Nested uses stack."""
    if name is None:
        yield current_name()
        return
    with _GUARD:
        first = name not in _NAMES
        _NAMES.append(name)
    try:
        if first and name != RUN:
            sweep(name, scratch)
        yield name
    finally:
        with _GUARD:
            del _NAMES[len(_NAMES) - 1 - _NAMES[::-1].index(name)]


def in_use(path) -> bool:
    """`path` is a scratch directory this process holds now (or is making)."""
    with _GUARD:
        held = list(_HELD)
    if os.path.abspath(path) in held:
        return True
    try:
        return any(os.path.samefile(path, h) for h in held if os.path.exists(h))
    except OSError:  # (gone meanwhile)
        return False


def holding() -> list:
    """The scratch directories this process holds now."""
    with _GUARD:
        return sorted(_HELD)


def is_scratch_directory(path) -> bool:
    """`path` is a directory dfmp2 made through `scratch_directory` (its name and its lock file):
    dfmp2's, never a user's file."""
    return (os.path.basename(os.fspath(path)).startswith(RUN) and os.path.isdir(path) and not os.path.islink(path)
            and os.path.lexists(os.path.join(path, LOCK_NAME)))


class ScratchDirectory:
    """A scratch directory this process made and holds (`scratch_directory`): name, its path.
    cleanup() removes it, once, whatever is in it (in a forked child it only closes the child's
    descriptor of the lock: the directory is the maker's); so does collection and the
    interpreter's exit. A context manager giving the path."""

    def __init__(self, path: str, lock: int):
        self.name = path
        self._finalizer = weakref.finalize(self, _release, path, lock, os.getpid())

    def cleanup(self):
        self._finalizer()

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc):
        self.cleanup()
        return False


def _release(path, lock, maker):
    with _GUARD:
        _HELD.discard(path)
    try:
        if os.getpid() == maker:
            _remove(path)  # under the lock, the lock file last
    finally:
        with contextlib.suppress(OSError):
            os.close(lock)  # (the maker's last descriptor: the kernel releases the flock)


def _remove(path):
    """Remove directory `path`, its lock file last (what cannot be removed stays: an error here
    must not hide the run's own)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(path, LOCK_NAME))
    with contextlib.suppress(OSError):
        os.rmdir(path)


def scratch_directory(kind: str, scratch=None, name: str | None = None) -> ScratchDirectory:
    """A new scratch directory <name><kind>-<random> (name: the run's, default `current_name`) under
    `scratch_root(scratch)`, locked by this process (module docstring) until cleanup(). InputError,
    one line naming the directory and what chose it, where it cannot be made or locked there."""
    root, label = scratch_root(scratch), _scratch_label(scratch)
    if not os.path.lexists(root):
        raise InputError(f"{label}: no such directory")
    if not os.path.isdir(root):
        raise InputError(f"{label}: not a directory")
    try:
        path = os.path.abspath(tempfile.mkdtemp(prefix=f"{name or current_name()}{kind}-", dir=root))
    except OSError as error:
        raise InputError(f"{label}: cannot write there ({one_line(error.strerror or str(error))})") from None
    with _GUARD:
        _HELD.add(path)  # (before its lock file bears its name: this process's own sweeps never open it)
    try:
        lock = _lock_new(path)
    except BaseException as error:  # (a signal included: nothing is left half-made)
        _remove(path)
        with _GUARD:
            _HELD.discard(path)
        if not isinstance(error, OSError):
            raise
        reason = one_line(error.strerror or str(error))
        if error.errno in _NO_LOCKS:
            raise InputError(f"{label}: cannot lock a file there (flock: {reason}); dfmp2 locks each scratch "
                             f"directory it makes: give a {option('scratch')} on a file system with file locks") from None
        raise InputError(f"{label}: cannot write there ({reason})") from None
    return ScratchDirectory(path, lock)


_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}  # flock refused by the file system


def _lock_new(path) -> int:
    """The descriptor of directory `path`'s lock file, made as LOCKING, locked, then renamed LOCK_NAME."""
    making = os.path.join(path, LOCKING)
    lock = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(lock, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)  # (for people; never read)
        os.rename(making, os.path.join(path, LOCK_NAME))
    except BaseException:
        os.close(lock)
        raise
    return lock


def sweep(name: str, scratch=None) -> list:
    """Remove the scratch directories named `name`* (a run's name: `run_name` of an identity, not
    RUN) under scratch_root(scratch) whose lock can be taken at once: a dead run's, removed under
    its lock. Passed over: those this process holds, those locked (a live run's, on any node
    that shares the file system's locks), those without a lock file. Returns the paths removed."""
    if not name.startswith(RUN) or name == RUN:
        raise ValueError(f"sweep({name!r}): only a run's own name is swept")
    try:
        entries = list(os.scandir(scratch_root(scratch)))
    except OSError:
        return []
    removed = []
    for entry in entries:
        if entry.name.startswith(name) and entry.is_dir(follow_symlinks=False) and not in_use(entry.path) \
                and _remove_if_dead(entry.path):
            removed.append(entry.path)
    return removed


def _remove_if_dead(path) -> bool:
    """Take directory `path`'s lock without waiting and, holding it, remove the directory: True;
    False where it has no lock file, its lock is held, or the lock file changed meanwhile."""
    lock_path = os.path.join(path, LOCK_NAME)
    try:
        lock = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, named = os.fstat(lock), os.lstat(lock_path)
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            return False  # removed and made anew between the open and the lock
        _remove(path)
        return True
    except OSError:
        return False
    finally:
        os.close(lock)


def scratch_failure(error: OSError, where, scratch=None) -> ComputationError:
    """The one-line runtime error for an OSError met writing or reading scratch in `where` (a
    directory or file under scratch_root(scratch)): a full disk, a quota, an I/O error."""
    return ComputationError(f"{display(where)} ({_scratch_label(scratch)}): {one_line(failure_reason(error))}")


class RowFile:
    """An array [nrows, ncols] (fp64 unless dtype says) in a raw file of a scratch directory, row-major: read and
    written by blocks of rows (one contiguous read or write) or of columns (one per row), with
    positioned reads and writes, so that its pages stay in the page cache and out of the
    process's resident set (a memory map would count them). For the SCF's whitened JK-fit
    integrals where the budget does not hold them (dfmp2.chem.jk), and the blocks of B a rank keeps
    out of core (dfmp2.run.ranks), in a scratch directory of `kind` ("scf", "rank": `scratch_directory`)
    removed by close(). bytes_read / bytes_written count the array bytes moved."""

    def __init__(self, shape, scratch=None, kind="scf", dtype=np.float64):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.scratch = scratch
        self._tmpdir = scratch_directory(kind, scratch)
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
