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
the error is raised: a run leaves all of its outputs or none. `Outputs.append_line` (a batch's
JSON Lines) and whatever goes to standard output, a FIFO or a device are written by
`appends.Appender`: each line whole or not at all, even when the disk fills. A write that fails
(a full disk, a quota, RLIMIT_FSIZE) is one ComputationError naming the file and why.

Files in directories dfmp2 owns (a checkpoint's manifest, arrays, B and journals):
`write_atomically`. Scratch (dfmp2.util.scratch): `scratch_directory` (every scratch directory,
named and locked by its run; one line naming the directory when it cannot be made),
`scratch_failure` (a write that failed there, e.g. a full disk) and `RowFile` (a raw fp64 array in
a scratch directory: the SCF's integrals out of core). PySCF's own temporary files (out-of-core
DF tensors) go to a scratch directory of the run's (through `chem.pyscf_scratch`) that is removed
when the run ends, however it ends. Names in messages and
JSON records: `display` (one line, valid UTF-8 whatever the name's bytes).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from dataclasses import dataclass

from .appends import Appender, failure_reason
from .errors import ComputationError, InputError

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
    handle: object = None  # the Appender `append_line` writes with
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
        self.before_writing = None  # called before anything is put in place (the CLI: a swallowed signal stops it)
        self.staging = None  # where an output written in place (stdout, a FIFO) is staged (the CLI: its scratch root)
        self._written = False
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

    def protect(self, inputs) -> None:
        """Add files the run reads, found after the outputs were added (a directory's molecules):
        InputError if an output already added is one of them."""
        added = [(path, _identity(path)) for path in inputs if path is not None]
        self._inputs += added
        for target in self._targets.values():
            if target.real != "-":
                self._check_not_input(target.option, target.path, target.real, added)

    def _check_not_input(self, option, path, real, inputs) -> None:
        for source, identity in inputs:
            if real == os.path.realpath(source) or (identity is not None and _identity(real) == identity):
                raise InputError(f"{option} {display(path)}: is the input file {display(source)}; dfmp2 never "
                                 "writes over its input")

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
        self._check_not_input(option, path, real, self._inputs)
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
        directory = (self.staging or tempfile.gettempdir()) if target.in_place else os.path.dirname(target.real)
        try:
            handle, staged = tempfile.mkstemp(prefix=".dfmp2-", suffix=".partial", dir=directory)
            os.close(handle)
            target.staged = staged
            write(staged)
            if not target.in_place:
                os.chmod(staged, _mode_for(target.real))
        except OSError as error:
            raise ComputationError(f"{target.option} {display(target.path)}: {one_line(failure_reason(error))}; "
                                   "no output file was written") from None

    def append_line(self, option: str, line: str) -> None:
        """Add one line (a JSON Lines record, without its newline) to `option`'s output now, whole
        or not at all (`appends.Appender`): a regular file is staged with its first line and
        renamed into place (what it replaces stays until then), later lines are appended to it,
        each fsync'ed, so that whatever stops the run, the file holds every line appended so far
        and only whole lines. Standard output, a FIFO or a device: written at once. A line that
        cannot be written (a full disk, a quota, RLIMIT_FSIZE): ComputationError naming the
        file and the reason; the line is not in the file, the lines before it stay, whole."""
        target = self._targets[option]
        data = (line + "\n").encode("utf-8")
        if self.before_writing is not None:
            self.before_writing()
        try:
            if target.handle is None:
                target.handle, target.staged = _appender_for(target)
            target.handle.append(data)
            if target.staged is not None:  # the first line: the file goes in place
                os.chmod(target.staged, _mode_for(target.real))
                os.replace(target.staged, target.real)
                target.staged = None
                _sync_directory(target.real)
        except OSError as error:
            raise ComputationError(_append_failure(target, error)) from None
        self._written = True

    def commit(self):
        """Put every staged output in place (module docstring); on failure none stays."""
        targets = [t for t in self._targets.values() if t.staged is not None]
        if targets and self.before_writing is not None:
            self.before_writing()
        self._written = self._written or bool(targets)
        done, current = [], None
        try:
            for current in (t for t in targets if t.in_place):
                with open(current.staged, "rb") as source:
                    _write_in_place(current, source.read())
            for current in (t for t in targets if not t.in_place):
                if os.path.exists(current.real):  # kept until the commit is done, to undo it (named once made:
                    backup = current.staged + ".previous"  # a file that can be neither linked nor moved has none)
                    try:
                        os.link(current.real, backup)
                    except OSError:  # a file system without hard links: moved aside instead
                        os.replace(current.real, backup)
                    current.backup = backup
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
                                       f"{one_line(failure_reason(error))}; no output file was written") from None
            raise
        self.discard()

    def written(self) -> bool:
        """Whether anything has been put in place (committed, or a line appended)."""
        return self._written

    def discard(self):
        """Remove whatever is still staged (a failed or interrupted run writes nothing; lines
        `append_line` has put in place stay)."""
        for target in self._targets.values():
            if target.handle is not None:
                target.handle.close()
                target.handle = None
            for name in ("staged", "backup"):
                path = getattr(target, name)
                if path is not None:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                    setattr(target, name, None)


def _mode_for(real) -> int:
    """The mode a staged output takes: the replaced file's, or a new file's (0666 less the umask)."""
    return stat.S_IMODE(os.stat(real).st_mode) if os.path.exists(real) else 0o666 & ~current_umask()


def _write_in_place(target, data: bytes):
    """`data` written at once to standard output ("-"), a FIFO or a device (`appends.Appender`:
    unbuffered, nothing left to flush at close or at exit)."""
    appender, _ = _appender_for(target)
    try:
        appender.append(data)
    finally:
        appender.close()


def _appender_for(target) -> tuple:
    """(the writer of `target`'s lines, the staged file's path or None): standard output's
    descriptor, the FIFO or device opened for writing, or (a regular file) a new staged file in
    its directory, renamed into place once its first line is written."""
    if target.real == "-":
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor (one in memory)
            return _StreamWriter(sys.stdout), None
        sys.stdout.flush()  # (nothing of the text layer's may come after what is written below it)
        return Appender(fd, owned=False), None
    if target.in_place:
        return Appender(os.open(target.real, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)), None
    handle, staged = tempfile.mkstemp(prefix=".dfmp2-", suffix=".partial", dir=os.path.dirname(target.real))
    import fcntl

    fcntl.fcntl(handle, fcntl.F_SETFL, fcntl.fcntl(handle, fcntl.F_GETFL) | os.O_APPEND)
    return Appender(handle), staged


class _StreamWriter:
    """Standard output replaced by a stream without a descriptor (in memory: an embedding
    program's, a test runner's): written and flushed, as the Appender's interface; no disk fills."""

    def __init__(self, stream):
        self.stream, self.records, self.left_cut = stream, 0, None

    def append(self, data: bytes):
        self.stream.flush()
        self.stream.buffer.write(data)
        self.stream.flush()
        self.records += 1

    def close(self):
        pass


def _append_failure(target, error) -> str:
    """The one line of an append to `target` that failed with `error`: the file, the reason,
    what the file holds now."""
    writer = target.handle
    kept = 0 if writer is None or target.staged is not None else writer.records
    said = f"{target.option} {display(target.path)}: {one_line(failure_reason(error))}; this line was not written"
    if writer is not None and writer.left_cut is not None:
        return f"{said} whole ({one_line(writer.left_cut)})"
    return said + (f" (the {kept} line{'s' if kept != 1 else ''} before it stay{'s' if kept == 1 else ''}, whole)"
                   if kept else " (nothing was written)")


def _sync_directory(path) -> None:
    """fsync the directory holding `path` (a rename into it is then on disk), where the file
    system allows it (some refuse a directory's fsync: nothing else depends on it)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    and renamed into place (the directory fsync'ed after, where the file system allows it). On
    any failure the temporary file is deleted and `path` is untouched; an OSError (a full disk,
    a quota, RLIMIT_FSIZE: HDF5's too) is raised as a ComputationError naming `path` and why."""
    path = os.fspath(path)
    try:
        if partial is None:
            handle, partial = tempfile.mkstemp(prefix=".dfmp2-", suffix=".partial",
                                               dir=os.path.dirname(os.path.abspath(path)))
            os.close(handle)
        write(partial)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    except OSError as error:
        raise ComputationError(f"{display(path)}: {one_line(failure_reason(error))}; it was not written (what was "
                               "there stays)") from None
    finally:
        if partial is not None and os.path.lexists(partial):
            os.unlink(partial)
    _sync_directory(path)


# ----------------------------------------------------------------------------- scratch


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


