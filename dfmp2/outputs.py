"""A run's output files (--json, --natorbs): checked before the run, written all together or
not at all once it has succeeded.

Where each goes:
  - a regular file, or a new name: staged as a temporary file in the directory of the file it
    will replace (through any symlink: the link stays, its target is replaced), then renamed
    into place; a new file gets mode 0666 less the umask, a replaced one keeps its mode;
  - an existing FIFO or device (e.g. /dev/stdout): written in place, never replaced;
  - "-" (--json only): standard output.
`Outputs.commit` writes the in-place ones first, then renames the staged files; if anything
fails (or a signal stops it) the files already renamed get their previous contents back and
the error is raised: a run leaves all of its outputs or none.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from dataclasses import dataclass

from .errors import ComputationError, InputError


@dataclass
class _Target:
    option: str  # the command-line option that named it, e.g. "--json"
    path: str  # as given
    real: str  # with every symlink resolved ("-": standard output)
    in_place: bool  # a FIFO, device or standard output: written, not replaced
    staged: str | None = None  # the temporary file holding its contents
    backup: str | None = None  # a hard link to the replaced file, until the commit is done


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Outputs:
    """The output files of one run. add() checks a path at once (InputError, exit 2, naming
    the option); write() stages its contents; commit() puts them all in place."""

    def __init__(self):
        self._targets = {}

    def add(self, option: str, path: str, stdout_ok: bool = False):
        """Check that `path` can be written as `option`'s output, before anything is computed."""
        if path == "-":
            if not stdout_ok:
                raise InputError(f"{option} -: standard output is only for --json")
            target = _Target(option, path, "-", True)
        else:
            real = os.path.realpath(path)
            if os.path.isdir(real):
                raise InputError(f"{option} {path}: is a directory")
            if os.path.exists(real) and not os.path.isfile(real):
                kind = os.stat(real).st_mode
                if stat.S_ISSOCK(kind):
                    raise InputError(f"{option} {path}: is a socket")
                if not os.access(real, os.W_OK):
                    raise InputError(f"{option} {path}: not writable")
                target = _Target(option, path, real, True)
            else:
                directory = os.path.dirname(real)
                if not os.path.isdir(directory):
                    raise InputError(f"{option} {path}: directory {directory} does not exist")
                try:  # can a file be created (and renamed) there?
                    handle, probe = tempfile.mkstemp(prefix=".dfmp2-", dir=directory)
                    os.close(handle)
                    os.unlink(probe)
                except OSError as error:
                    raise InputError(f"{option} {path}: cannot write in {directory} ({error.strerror})") from None
                target = _Target(option, path, real, False)
        for other in self._targets.values():
            if other.real == target.real and target.real != "-":
                raise InputError(f"{option} {path} and {other.option} {other.path} name the same file")
            if other.real == target.real == "-":
                raise InputError(f"{option} and {other.option} cannot both write to standard output")
        self._targets[option] = target

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
            raise ComputationError(f"{option} {target.path}: {error.strerror or error}; no output file was "
                                   "written") from None

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
                raise ComputationError(f"{current.option} {current.path}: {error.strerror or error}; no output "
                                       "file was written") from None
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
