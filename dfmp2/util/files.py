"""Every file dfmp2 writes, by one set of rules, for the command line and the API alike.

Outputs a user names (--json, --natorbs, `dfmp2 optimize`'s --output and --trajectory,
`DFMP2.ao2mo(ovL_to_save=...)`) go through `Outputs` (several, one transaction) or
`write_output` (one):
  - checked before anything is computed (`Outputs.add`; InputError naming the option): refused
    are a directory, a socket, a place that cannot be written, a name the file system would
    reject (a component longer than its NAME_MAX bytes, a path longer than PATH_MAX), the run's
    input (the molecule's XYZ file, also through a link or a second name), anything inside the
    run's checkpoint directory, standard output for anything but --json (as "-" or as a path
    that is the process's standard output, such as /dev/stdout), two outputs that are one file;
  - a regular file, or a new name: staged as a temporary file in the directory of the file it
    will replace (through any symlink: the link stays, its target is replaced), then renamed
    into place; a new file gets mode 0666 less the umask, a replaced one keeps its mode;
  - an existing FIFO or device (e.g. /dev/stdout): written in place, never replaced (a writer
    that reads its file back, ovL_to_save, takes regular files only);
  - "-" (--json only): standard output.
`Outputs.commit` writes the in-place ones first, then renames the staged files; if anything
fails (or a signal stops it) the files already renamed get their previous contents back and
the error is raised: a run leaves all of its outputs or none.

Files in directories dfmp2 owns (a checkpoint's manifest, arrays, B and journals):
`write_atomically`. Scratch: `scratch_directory` (one line naming the directory when it cannot be
made), `scratch_failure` (a write that failed there, e.g. a full disk) and `RowFile` (a raw fp64
array in a scratch directory: the SCF's integrals out of core). PySCF's own temporary
files (out-of-core DF tensors) go to a directory of the run's (`held_directory`, through
`chem.pyscf_scratch`) that is removed when the run ends, however it ends. Names in messages and
JSON records: `display` (one line, valid UTF-8 whatever the name's bytes).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from .errors import ComputationError, InputError, option

NAME_MAX, PATH_MAX = 255, 4096  # where pathconf cannot say (Linux's values)


# ----------------------------------------------------------------------------- names, shown

def display(path) -> str:
    """`path` as one printable line: bytes that are not UTF-8 as \\xNN, control characters
    (newlines, tabs, escapes) as \\n, \\t, \\x1b: what messages and JSON records carry."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace") if not isinstance(path, int) else str(path)
    return one_line(text)


def one_line(text: str) -> str:
    """`text` with every control character (C0, DEL, C1) written as an escape: one line."""
    out = []
    for char in text:
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0:
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}"))
        elif 0xD800 <= code < 0xE000:  # a lone surrogate (an undecodable byte kept by surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}" if code >= 0xDC80 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


# ----------------------------------------------------------------------------- output files

@dataclass
class _Target:
    option: str  # how the user named it, e.g. "--json" or "ovL_to_save"
    path: str  # as given
    real: str  # with every symlink resolved ("-": standard output)
    in_place: bool  # a FIFO, device or standard output: written, not replaced
    staged: str | None = None  # the temporary file holding its contents
    backup: str | None = None  # a hard link to the replaced file, until the commit is done


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _identity(path):
    """(device, inode) of what `path` names now (links followed), or None where nothing is."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _stdout_identity():
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_dev, st.st_ino


def _limit(directory, name, default):
    try:
        return os.pathconf(directory, name)
    except (OSError, ValueError):
        return default


class Outputs:
    """The output files of one run. add() checks a path at once (InputError naming the option);
    write() stages its contents; commit() puts them all in place; discard() drops what is staged.

    inputs: files the run reads (never an output); directories: directories whose contents the
    run owns (its checkpoint: never an output inside)."""

    def __init__(self, inputs=(), directories=()):
        self._targets = {}
        self._inputs = [(path, _identity(path)) for path in inputs if path is not None]
        self._directories = [os.path.realpath(d) for d in directories if d is not None]

    def add(self, option: str, path, stdout_ok: bool = False, regular_only: bool = False):
        """Check that `path` can be written as `option`'s output, before anything is computed
        (the module docstring's rules); regular_only: a FIFO or device is refused too (the
        writer reads the file back)."""
        path = os.fspath(path)
        shown = f"{option} {display(path)}"
        if path == "-" or (path and _identity(path) is not None and _identity(path) == _stdout_identity()):
            if not stdout_ok:
                what = "-" if path == "-" else f"{display(path)} (standard output)"
                raise InputError(f"{option} {what}: standard output is only for --json")
            target = _Target(option, path, "-", True)
        else:
            target = self._file_target(option, path, shown, regular_only)
        for other in self._targets.values():
            if target.real == "-" and other.real == "-":
                raise InputError(f"{option} and {other.option} cannot both write to standard output")
            if target.real != "-" and other.real != "-" and (
                    other.real == target.real or (_identity(target.real) is not None
                                                  and _identity(target.real) == _identity(other.real))):
                raise InputError(f"{shown} and {other.option} {display(other.path)} name the same file")
        self._targets[option] = target

    def _file_target(self, option, path, shown, regular_only) -> _Target:
        if not path:
            raise InputError(f"{option}: an empty file name")
        real = os.path.realpath(path)
        directory, name = os.path.split(real)
        if os.path.isdir(real):
            raise InputError(f"{shown}: is a directory")
        if len(os.fsencode(name)) > _limit(directory if os.path.isdir(directory) else "/", "PC_NAME_MAX", NAME_MAX):
            raise InputError(f"{shown}: the file name is longer than the file system allows "
                             f"({len(os.fsencode(name))} bytes)")
        if len(os.fsencode(real)) >= _limit("/", "PC_PATH_MAX", PATH_MAX):
            raise InputError(f"{shown}: the path is longer than the file system allows")
        for source, identity in self._inputs:
            if real == os.path.realpath(source) or (identity is not None and _identity(real) == identity):
                raise InputError(f"{shown}: is the input file {display(source)}; dfmp2 never writes over its input")
        for owned in self._directories:
            if real == owned or real.startswith(owned.rstrip(os.sep) + os.sep):
                raise InputError(f"{shown}: lies inside the checkpoint directory {display(owned)}, whose files "
                                 "belong to the checkpoint; write it elsewhere")
        if os.path.exists(real) and not os.path.isfile(real):
            kind = os.stat(real).st_mode
            if stat.S_ISSOCK(kind):
                raise InputError(f"{shown}: is a socket")
            if regular_only:
                raise InputError(f"{shown}: is not a regular file (a device or a FIFO), and this file is read back "
                                 "once written: give a file name")
            if not os.access(real, os.W_OK):
                raise InputError(f"{shown}: not writable")
            return _Target(option, path, real, True)
        if not os.path.isdir(directory):
            raise InputError(f"{shown}: directory {display(directory)} does not exist")
        try:  # can a file be created (and renamed) there?
            handle, probe = tempfile.mkstemp(prefix=".dfmp2-", dir=directory)
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            raise InputError(f"{shown}: cannot write in {display(directory)} ({error.strerror})") from None
        return _Target(option, path, real, False)

    def path(self, option: str) -> str:
        """The path `option` was given (as given)."""
        return self._targets[option].path

    def to_stdout(self) -> bool:
        """Some output goes to standard output (then nothing else is printed there)."""
        return any(t.real == "-" for t in self._targets.values())

    def write(self, option: str, write):
        """Stage `option`'s contents: write(path) writes the whole file at `path`."""
        target = self._targets[option]
        directory = tempfile.gettempdir() if target.in_place else os.path.dirname(target.real)
        try:
            handle, staged = tempfile.mkstemp(prefix=".dfmp2-", suffix=".partial", dir=directory)
            os.close(handle)
            target.staged = staged
            write(staged)
            if not target.in_place:
                mode = (stat.S_IMODE(os.stat(target.real).st_mode) if os.path.exists(target.real)
                        else 0o666 & ~current_umask())
                os.chmod(staged, mode)
        except OSError as error:
            raise ComputationError(f"{target.option} {display(target.path)}: {one_line(error.strerror or str(error))}; "
                                   "no output file was written") from None

    def commit(self):
        """Put every staged output in place (module docstring); on failure none stays."""
        targets = [t for t in self._targets.values() if t.staged is not None]
        done, current = [], None
        try:
            for current in (t for t in targets if t.in_place):
                with open(current.staged, "rb") as source:
                    _write_in_place(current, source.read())
            for current in (t for t in targets if not t.in_place):
                if os.path.exists(current.real):  # kept until the commit is done, to undo it
                    current.backup = current.staged + ".previous"
                    try:
                        os.link(current.real, current.backup)
                    except OSError:  # a file system without hard links: moved aside instead
                        os.replace(current.real, current.backup)
                os.replace(current.staged, current.real)
                current.staged = None
                done.append(current)
        except BaseException as error:
            unfinished = [current] if current is not None and not current.in_place and current not in done else []
            for target in reversed(done + unfinished):  # the previous contents back
                if target.backup is not None:
                    if os.path.exists(target.real) and os.path.samefile(target.backup, target.real):
                        os.unlink(target.backup)  # never replaced (rename between links of one file does nothing)
                    else:
                        os.replace(target.backup, target.real)
                    target.backup = None
                elif target in done:  # it did not exist before
                    os.unlink(target.real)
            self.discard()
            if isinstance(error, OSError):
                raise ComputationError(f"{current.option} {display(current.path)}: "
                                       f"{one_line(error.strerror or str(error))}; no output file was written") from None
            raise
        self.discard()

    def discard(self):
        """Remove whatever is still staged (a failed or interrupted run writes nothing)."""
        for target in self._targets.values():
            for name in ("staged", "backup"):
                path = getattr(target, name)
                if path is not None:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                    setattr(target, name, None)


def _write_in_place(target, data: bytes):
    if target.real == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    with open(target.real, "wb") as out:  # a FIFO or device: O_TRUNC does not apply
        out.write(data)


def write_output(name: str, path, write, inputs=(), directories=(), regular_only=False) -> None:
    """One output file named by the user (an API's keyword `name`, e.g. "ovL_to_save"), by the
    same rules as the command line's (`Outputs`): checked, staged with write(tmp_path), put in
    place whole or not at all."""
    outputs = Outputs(inputs, directories)
    outputs.add(name, path, regular_only=regular_only)
    try:
        outputs.write(name, write)
        outputs.commit()
    finally:
        outputs.discard()


# ----------------------------------------------------------------------------- dfmp2's own files

def write_atomically(path, write, partial=None) -> None:
    """Write the file at `path` (in a directory dfmp2 owns: a checkpoint's) whole or not at all:
    write(tmp) writes it at the temporary path tmp beside it (`partial`, a name the caller has
    recorded, e.g. in a checkpoint's manifest; default: a fresh hidden name), which is fsync'ed
    and renamed into place. On any failure the temporary file is deleted and the error raised;
    `path` is untouched."""
    path = os.fspath(path)
    if partial is None:
        handle, partial = tempfile.mkstemp(prefix=".dfmp2-", suffix=".partial",
                                           dir=os.path.dirname(os.path.abspath(path)))
        os.close(handle)
    try:
        write(partial)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


# ----------------------------------------------------------------------------- scratch

def scratch_root(scratch=None) -> str:
    """Where a run's scratch directories go: `scratch` (--scratch), else PySCF's temporary
    directory by PySCF's rule (PYSCF_TMPDIR, else TMPDIR, else the system's)."""
    if scratch is not None:
        return os.fspath(scratch)
    return os.environ.get("PYSCF_TMPDIR") or tempfile.gettempdir()


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


def package_versions(names) -> dict:
    """{name: installed version, or None} of the distribution packages `names`."""
    from importlib import metadata

    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class RowFile:
    """An array [nrows, ncols] (fp64 unless dtype says) in a raw file of a scratch directory, row-major: read and
    written by blocks of rows (one contiguous read or write) or of columns (one per row), with
    positioned reads and writes, so that its pages stay in the page cache and out of the
    process's resident set (a memory map would count them). For the SCF's whitened JK-fit
    integrals where the budget does not hold them (dfmp2.scf), and the blocks of B a rank keeps
    out of core (dfmp2.distributed). The directory is removed by close(). bytes_read /
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
