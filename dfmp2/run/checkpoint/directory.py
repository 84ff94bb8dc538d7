"""Checkpoint/restart: a directory that keeps a run's expensive intermediates across processes.

    DIR/manifest.json      what the checkpoint belongs to and which files dfmp2 wrote there:
                             "format"   "dfmp2-checkpoint" (a manifest of anything else is refused)
                             "files"    every file this program created in DIR, with its section
                                        and, once complete, its size and sha256: nothing else in
                                        DIR is ever read, replaced or deleted
                             "run"      molecule, bases, ECPs, charge, spin, reference, SCF, xc,
                                        frozen, dfmp2 version (driver)
                             "pipeline" hashes of the orbitals and the metric, active spaces,
                                        device, precision, transform (pipeline)
                             "B"        the whitened tensors are complete: their shapes, the
                                        metric factorisation
                             "pairs"    the pair-task list the journal indexes (occupied block)
                             "scratch_id"  random, made with the manifest: names the scratch
                                        directories of the checkpoint's runs (`scratch_prefix`),
                                        so that a resume finds its killed run's and no other
                                        checkpoint's (dfmp2.util.scratch)
    DIR/dfmp2.lock         held (flock) by the run using DIR; a second run is refused at once
    DIR/scf.npz            the converged reference (mo_coeff, mo_energy, mo_occ, e_tot)
    DIR/optimize.npz       `dfmp2 optimize`: its finished steps (section "optimize"; dfmp2.app.optimize)
    DIR/B_<channel>.h5     B [nocc, nvir, naux] per spin channel (storage.DiskStore, kept)
    DIR/pairs.journal      finished pair tasks: (task index, E_os part, E_ss part, crc32)
                           records, appended as each task finishes (fp64)
With several ranks (dfmp2.run.ranks), DIR must be one directory every rank sees (a shared
file system: each run checks that every rank reads the random stamp rank 0 writes). Rank 0
alone reads and writes the manifest and scf.npz (and lists every rank's files in it before
they are written); each rank r keeps its own rows and journal:
    DIR/B_<channel>.rank<r>.h5   rank r's whitened occupied blocks (one dataset per block)
    DIR/pairs.rank<r>.journal    the pair tasks rank r finished
The "B" and "pairs" sections then also record the number of ranks and the occupied block:
another layout (rank count, budget) recomputes B and the pair tasks (the SCF is reused).

Trust: a file is used only when the manifest (of format "dfmp2-checkpoint", in a section
that equals this run's identity) vouches for it, and only after its size and sha256 match
(journal records: each its crc32). A damaged or missing file is recomputed and announced
(`notes`). A section written by an earlier run must equal this run's, else the run is refused
(InputError, naming what differs). An existing non-empty directory without a manifest is
refused unless allow_other_files (dfmp2 then writes beside the other files, never over them).
Every file is written atomically (".NAME.partial", then rename) except the journal, which is
append-only: a record torn by a kill is ignored on reading.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re

import numpy as np

from ...util.errors import InputError, option
from ...util.files import display, write_atomically
from ...util.provenance import arrays_identity, difference, h5_identity, mismatch, stamp_h5, stamped
from ...util.scratch import is_scratch_directory, run_name
from ...util.version import __version__
from .journal import PairJournal

MANIFEST = "manifest.json"
LOCK = "dfmp2.lock"
FORMAT = "dfmp2-checkpoint"
FORMAT_VERSION = 3  # 3: every file carries its identity (dfmp2.util.provenance; journals a header)
# the manifest sections each section's files are made from: their file identity (`Checkpoint.file_identity`)
FILE_SOURCES = {"run": ("run",), "optimize": ("optimize",), "B": ("run", "pipeline"),
                "pairs": ("run", "pipeline", "pairs")}
# the names dfmp2 writes in a checkpoint directory (and their temporaries), beside the manifest
# (and .manifest.json.partial) and the lock
OUR_NAMES = re.compile(r"^\.?(scf\.npz|optimize\.npz|B_(restricted|alpha|beta)(\.rank\d+)?\.h5"
                       r"|pairs(\.rank\d+)?\.journal)(\.partial)?$")
_HELD = {}  # directory -> [Checkpoint, users]: one open checkpoint (and lock) per directory per process


def array_digest(*arrays) -> str:
    """sha256 of the arrays' shapes, dtypes and bytes (identifies orbitals, metrics)."""
    digest = hashlib.sha256()
    for array in arrays:
        if array is None:
            digest.update(b"none")
            continue
        array = np.ascontiguousarray(array)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def file_digest(path) -> dict:
    """{"size": bytes, "sha256": hex} of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return {"size": os.path.getsize(path), "sha256": digest.hexdigest()}


def open_checkpoint(directory, allow_other_files=False) -> Checkpoint:
    """The checkpoint in `directory`, opened and locked for this process (one object per
    directory: the driver and the pipeline share it); close() when done."""
    key = os.path.abspath(directory)
    if key not in _HELD:
        checkpoint = Checkpoint(directory)
        checkpoint.open(allow_other_files)
        _HELD[key] = [checkpoint, 0]
    _HELD[key][1] += 1
    return _HELD[key][0]


class Checkpoint:
    """The checkpoint directory `directory` (created if missing; its parent must exist).
    open_checkpoint() opens and locks it; unopened, it is a rank other than 0, which writes its
    own files there but leaves the manifest to rank 0 (`sees_stamp` checks that it sees rank 0's)."""

    def __init__(self, directory):
        self.directory = os.path.abspath(directory)
        self.label = display(directory)  # (as messages show it: one line, UTF-8)
        self.manifest = {}
        self.notes = []  # what was found damaged and recomputed (for the result's notes)
        self._lock = None

    # -- opening, locking, closing

    def open(self, allow_other_files=False):
        """Check and create the directory, lock it (InputError if another process holds it)
        and read the manifest; a non-empty directory without one is refused unless
        allow_other_files."""
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise InputError(f"{option('checkpoint', self.label)}: is a file, not a directory")
        if not os.path.isdir(self.directory):
            parent = os.path.dirname(self.directory)
            if not os.path.isdir(parent):
                raise InputError(f"{option('checkpoint', self.label)}: directory {parent} does not exist")
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as error:
                raise InputError(f"{option('checkpoint', self.label)}: cannot create it ({error.strerror})") from None
        try:
            entries = set(os.listdir(self.directory))
        except OSError as error:
            raise InputError(f"{option('checkpoint', self.label)}: cannot read it ({error.strerror})") from None
        # (a scratch root inside DIR holds dfmp2's scratch directories: not the user's files)
        others = sorted(name for name in entries - {LOCK} if not is_scratch_directory(self.path(name)))
        if MANIFEST not in entries and others:
            if not allow_other_files:
                shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
                raise InputError(f"{option('checkpoint', self.label)}: the directory holds files ({shown}) but no dfmp2 "
                                 f"{MANIFEST}: give a new or empty directory (or {option('checkpoint_allow_other_files')} "
                                 "to write beside them; dfmp2 never touches files it did not write)")
            self._refuse_look_alikes(entries, {})
        self._read_manifest()  # a manifest of something else is refused before anything is written here
        self._acquire_lock()
        try:
            self.manifest = self._read_manifest()
            self._refuse_look_alikes(entries, self.manifest.get("files", {}))
            if not self.manifest:
                self.manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                                 "files": {LOCK: {"section": None, "state": "lock"}}}
            if "scratch_id" not in self.manifest:  # (a new manifest, or one an older dfmp2 wrote)
                self.manifest["scratch_id"] = os.urandom(8).hex()
                self._write_manifest()
        except BaseException:
            self._release_lock()
            raise

    def _refuse_look_alikes(self, entries, files):
        """InputError if a file of the directory bears a name dfmp2 would write (OUR_NAMES) but
        the manifest's `files` do not list it: it is someone else's and would be overwritten."""
        foreign = sorted(name for name in entries if OUR_NAMES.match(name) and name not in files)
        if foreign:
            raise InputError(f"{option('checkpoint', self.label)}: {foreign[0]} there was not written by dfmp2 (the "
                             "manifest does not list it) and would be overwritten: move it, or use another "
                             "directory")

    def _acquire_lock(self):
        try:
            fd = os.open(self.path(LOCK), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise InputError(f"{option('checkpoint', self.label)}: cannot write there ({error.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise InputError(f"{option('checkpoint', self.label)} is in use by process {holder}: wait for it, "
                                 "or give another directory") from None
            raise InputError(f"{option('checkpoint', self.label)}: cannot lock {LOCK} ({error.strerror})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock = fd

    def close(self):
        """Release this process's use of the directory (the lock goes with the last user)."""
        held = _HELD.get(self.directory)
        if held is not None and held[0] is self:
            held[1] -= 1
            if held[1] > 0:
                return
            del _HELD[self.directory]
        self._release_lock()

    def _release_lock(self):
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def scratch_prefix(self) -> str | None:
        """The name of the scratch directories of this checkpoint's runs (`scratch.run_name` of the
        manifest's "scratch_id"), once the manifest is read (rank 0's: None on an unopened one)."""
        identity = self.manifest.get("scratch_id")
        return run_name(identity) if isinstance(identity, str) and identity.isalnum() else None

    # -- the manifest

    def _read_manifest(self) -> dict:
        try:
            with open(self.path(MANIFEST), encoding="utf-8") as handle:
                manifest = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise InputError(f"{option('checkpoint', self.label)}: unreadable {MANIFEST} ({error}); delete the "
                             "directory to start over") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
                or not isinstance(manifest.get("files"), dict):
            raise InputError(f"{option('checkpoint', self.label)}: {MANIFEST} is not a dfmp2 checkpoint manifest (of "
                             "this version); give another directory, or delete it to start over")
        return manifest

    def _write_manifest(self):
        text = json.dumps(self.manifest, indent=1, sort_keys=True).encode()
        self._atomic_write(MANIFEST, lambda handle: handle.write(text))

    def _atomic_write(self, name, write):
        """DIR/name written whole (`files.write_atomically`) through DIR/.name.partial, a name the
        manifest lists: write(handle) writes its bytes."""
        def write_file(tmp):
            with open(tmp, "wb") as out:
                write(out)

        write_atomically(self.path(name), write_file, self.path(f".{name}.partial"))

    # -- the files dfmp2 wrote

    def register(self, section: str | None, *names):
        """List `names` as files of `section` that this program is about to write (before any
        is created, so that a killed run's files are known to be its own). A file of that name
        that the manifest does not list is not dfmp2's: InputError, it is never overwritten."""
        files = self.manifest["files"]
        for name in names:
            if name not in files and os.path.lexists(self.path(name)):
                raise InputError(f"{option('checkpoint', self.label)}: {name} there was not written by dfmp2 (the "
                                 f"manifest does not list it) and would be overwritten: move it, or use "
                                 "another directory")
        for name in names:
            files[name] = {"section": section, "state": "writing"}
        self._write_manifest()

    def vouch(self, name: str, digest: dict | None = None):
        """Record that DIR/name is complete, with its size and sha256 (`file_digest`, computed
        here unless given: another rank's file)."""
        self.manifest["files"][name] = {"section": self.manifest["files"][name]["section"], "state": "complete",
                                        **(digest or file_digest(self.path(name)))}
        self._write_manifest()

    def check(self, name: str, entry: dict | None = None) -> str | None:
        """None if DIR/name is what the manifest (or `entry`, rank 0's record of it) vouches
        for, size and sha256; else why not ("missing", "damaged: ...")."""
        entry = entry if entry is not None else self.manifest.get("files", {}).get(name)
        if not entry or entry.get("state") != "complete":
            return "not complete"
        path = self.path(name)
        if not os.path.isfile(path):
            return "missing"
        size = os.path.getsize(path)
        if size != entry["size"]:
            return f"damaged: {size} bytes where {entry['size']} were written"
        if file_digest(path)["sha256"] != entry["sha256"]:
            return "damaged: its sha256 differs from the one recorded when it was written"
        return None

    def damaged(self, name: str, reason: str, what: str):
        """Announce that DIR/name could not be used (`reason`) and `what` was recomputed."""
        self.notes.append(f"checkpoint {self.label}: {name} {reason}; {what} recomputed")

    def reset(self, section: str):
        """Forget `section` and delete its files (those the manifest lists for it, and only
        those): the section first, so that no section vouches for a file being deleted."""
        self.drop(section)
        files = self.manifest["files"]
        mine = [name for name, entry in files.items() if entry.get("section") == section]
        for name in mine:
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass
            del files[name]
        if mine:
            self._write_manifest()

    # -- sections

    def claim(self, section: str, identity: dict) -> bool:
        """Record that this run is `identity` in `section`; True if an earlier run recorded the
        same (resuming), False if the section is new. A different earlier identity: InputError."""
        identity = json.loads(json.dumps(identity))  # what JSON keeps (tuples -> lists)
        held = self.manifest.get(section)
        if held is None:
            self.manifest[section] = identity
            self._write_manifest()
            return False
        if held != identity:
            raise InputError(f"{option('checkpoint', self.label)} belongs to another run ({section} differs: "
                             f"{difference(held, identity)}); use another directory, or delete it to start over")
        return True

    def file_identity(self, section: str) -> dict:
        """The identity every file of `section` carries (`dfmp2.util.provenance`): the manifest
        sections it was made from (FILE_SOURCES), as they stand when it is written."""
        return {"format": FORMAT_VERSION, "section": section,
                **{source: self.manifest[source] for source in FILE_SOURCES[section] if source in self.manifest}}

    def holds(self, section: str) -> bool:
        return section in self.manifest

    def drop(self, section: str):
        if self.manifest.pop(section, None) is not None:
            self._write_manifest()

    def save_arrays(self, name: str, section: str, **arrays):
        """DIR/name.npz of `section`, atomically, vouched for."""
        self.register(section, f"{name}.npz", f".{name}.npz.partial")
        arrays = stamped(arrays, self.file_identity(section))
        self._atomic_write(f"{name}.npz", lambda handle: np.savez(handle, **arrays))
        del self.manifest["files"][f".{name}.npz.partial"]
        self.vouch(f"{name}.npz")

    def load_arrays(self, name: str, what: str, section: str | None = None) -> dict | None:
        """DIR/name.npz of `section` (default: name) if the manifest vouches for it (size,
        sha256), it reads back and it carries this run's identity (`file_identity`); else None,
        and where a file was there but unusable, a note naming it and `what` is redone."""
        reason = self.check(f"{name}.npz")
        if reason is None:
            try:
                with np.load(self.path(f"{name}.npz"), allow_pickle=False) as data:
                    identity, arrays = arrays_identity({key: data[key] for key in data.files})
                reason = mismatch(identity, self.file_identity(section or name))
                if reason is None:
                    return arrays
            except (OSError, ValueError, KeyError) as error:
                reason = f"unreadable ({error})"
        if reason != "not complete":
            self.damaged(f"{name}.npz", reason, what)
        return None

    def stamp(self) -> str:
        """Write a new random stamp into the manifest (rank 0 of several); returns it."""
        self.manifest["stamp"] = os.urandom(8).hex()
        self._write_manifest()
        return self.manifest["stamp"]

    def sees_stamp(self, stamp: str) -> bool:
        """This process reads `stamp` in the manifest: it sees the directory rank 0 writes."""
        try:
            return self._read_manifest().get("stamp") == stamp
        except InputError:
            return False

    def claim_pairs(self, tasks_identity: dict, journals):
        """Make the "pairs" section this task list's, its journals the files `journals` (names).
        Journals kept for another list (another occupied block after a budget change, another
        rank count) or for none are deleted."""
        if self.manifest.get("pairs") != json.loads(json.dumps(tasks_identity)):
            self.reset("pairs")
            self.claim("pairs", tasks_identity)
        fresh = [name for name in journals if name not in self.manifest["files"]]
        if fresh:
            self.register("pairs", *fresh)

    @staticmethod
    def b_name(channel: str, rank: int | None = None) -> str:
        """The B file of a spin channel ("" restricted, "alpha", "beta") without ".h5": of one
        process (rank None) or of rank `rank`'s blocks."""
        return f"B_{channel or 'restricted'}" + ("" if rank is None else f".rank{rank}")

    @staticmethod
    def journal_name(rank: int | None = None) -> str:
        return "pairs.journal" if rank is None else f"pairs.rank{rank}.journal"

    def journal(self, ntasks: int, rank: int | None = None, identity: dict | None = None) -> PairJournal:
        """The journal of one process (rank None) or of rank `rank`, for the file identity
        `identity` (default: file_identity("pairs"); ranks other than 0 are given rank 0's);
        claim_pairs first."""
        return PairJournal(self.path(self.journal_name(rank)), ntasks,
                           identity if identity is not None else self.file_identity("pairs"))

    def save_blocks(self, name: str, blocks: dict, identity: dict, to_host=np.asarray) -> dict:
        """DIR/name.h5 with one dataset per block {b: array} (to_host(array): a host copy, made
        one block at a time) and the file identity `identity` (rank 0's file_identity("B")),
        atomically and fsync'ed (rank 0 listed both names beforehand). Returns its
        `file_digest`, for rank 0 to vouch for it."""
        import h5py

        def write_blocks(tmp):
            with h5py.File(tmp, "w") as out:
                stamp_h5(out, identity)
                for b, block in blocks.items():
                    out.create_dataset(f"block_{b}", data=to_host(block))

        write_atomically(self.path(f"{name}.h5"), write_blocks, self.path(f".{name}.h5.partial"))
        return file_digest(self.path(f"{name}.h5"))

    def load_blocks(self, name: str, shapes: dict, entry: dict | None, identity: dict) -> tuple:
        """({b: host array}, None) from DIR/name.h5 if `entry` (rank 0's manifest record of the
        file) vouches for it, it carries the file identity `identity` and it holds every block
        with the expected shape {b: shape}; (None, why not) otherwise."""
        import h5py

        reason = self.check(f"{name}.h5", entry or {})
        if reason is not None:
            return None, reason
        try:
            with h5py.File(self.path(f"{name}.h5"), "r") as held:
                reason = mismatch(h5_identity(held), identity)
                if reason is not None:
                    return None, reason
                if set(held) != {f"block_{b}" for b in shapes}:
                    return None, "holds other blocks"
                blocks = {b: held[f"block_{b}"][...] for b in shapes}
        except (OSError, ValueError, KeyError) as error:
            return None, f"unreadable ({error})"
        if any(tuple(blocks[b].shape) != tuple(shape) for b, shape in shapes.items()):
            return None, "holds blocks of other shapes"
        return blocks, None


def version_identity() -> dict:
    return {"dfmp2": __version__}


# ----------------------------------------------------------------------------- the resume policy


