"""Checkpoint/restart: a directory that keeps a run's expensive intermediates across processes.

    DIR/manifest.json      what the checkpoint belongs to, one section per layer:
                             "run"      molecule, bases, charge, spin, reference, SCF, xc, frozen,
                                        dfmp2 version (driver)
                             "pipeline" hashes of the orbitals and the metric, active spaces,
                                        device, precision, transform (pipeline)
                             "B"        the whitened tensors are complete: their shapes, the
                                        metric factorisation
                             "pairs"    the pair-task list the journal indexes (occupied block)
    DIR/scf.npz            the converged reference (mo_coeff, mo_energy, mo_occ, e_tot)
    DIR/B_<channel>.h5     B [nocc, nvir, naux] per spin channel (storage.DiskStore, kept)
    DIR/pairs.journal      finished pair tasks: (task index, E_os part, E_ss part) records,
                           appended as each task finishes (fp64)
With several ranks (dfmp2.distributed), DIR must be one directory every rank sees (a shared
file system: each run checks that every rank reads the random stamp rank 0 writes). Rank 0
alone reads and writes the manifest and scf.npz; each rank r keeps its own rows and journal:
    DIR/B_<channel>.rank<r>.h5   rank r's whitened occupied blocks (one dataset per block)
    DIR/pairs.rank<r>.journal    the pair tasks rank r finished
The "B" and "pairs" sections then also record the number of ranks and the occupied block:
another layout (rank count, budget) recomputes B and the pair tasks (the SCF is reused).

A section written by an earlier run must equal this run's, else the run is refused (InputError,
naming what differs). Every file is written atomically (temporary name, then rename) except the
journal, which is append-only: a record torn by a kill is ignored on reading.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import struct
import tempfile
import time

import numpy as np

from . import __version__
from .errors import InputError

MANIFEST = "manifest.json"
FILES = {"B": ("B_*.h5", ".B_*"), "pairs": ("pairs*.journal",)}  # each section's files (and temporaries)
RECORD = struct.Struct("<qdd")  # task index, E_os part, E_ss part
SYNC_SECONDS = 5.0  # the journal is fsync'ed at most this often (a kill of the process loses nothing)


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


class Checkpoint:
    """The checkpoint directory `directory` (created if missing; its parent must exist)."""

    def __init__(self, directory, read=True):
        """read=False: a rank other than 0, which writes its own files here but leaves the
        manifest to rank 0 (`sees_stamp` checks that it sees rank 0's)."""
        self.directory = os.path.abspath(directory)
        self.label = directory
        self.tag = "ck" + hashlib.sha256(self.directory.encode()).hexdigest()[:12]  # names its scratch
        self.manifest = {}
        if read:
            self.open()

    def open(self):
        """Create the directory if missing (its parent must exist) and read the manifest."""
        if not os.path.isdir(self.directory):
            parent = os.path.dirname(self.directory)
            if not os.path.isdir(parent):
                raise InputError(f"--checkpoint {self.label}: directory {parent} does not exist")
            os.makedirs(self.directory, exist_ok=True)
        self.manifest = self._read_manifest()

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _read_manifest(self) -> dict:
        try:
            with open(self.path(MANIFEST), encoding="utf-8") as handle:
                manifest = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise InputError(f"--checkpoint {self.label}: unreadable {MANIFEST} ({error})") from None
        if not isinstance(manifest, dict):
            raise InputError(f"--checkpoint {self.label}: {MANIFEST} is not a dfmp2 checkpoint")
        return manifest

    def _write_manifest(self):
        self._atomic_write(MANIFEST, lambda handle: handle.write(
            json.dumps(self.manifest, indent=1, sort_keys=True).encode()))

    def _atomic_write(self, name, write):
        handle, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        try:
            with os.fdopen(handle, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path(name))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

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
            diff = [key for key in sorted(set(held) | set(identity)) if held.get(key) != identity.get(key)]
            shown = "; ".join(f"{key}: {_short(held.get(key))} there, {_short(identity.get(key))} now"
                              for key in diff[:3])
            raise InputError(f"--checkpoint {self.label} belongs to another run ({section} differs: {shown}); "
                             "use another directory, or delete it to start over")
        return True

    def holds(self, section: str) -> bool:
        return section in self.manifest

    def drop(self, section: str):
        if self.manifest.pop(section, None) is not None:
            self._write_manifest()

    def save_arrays(self, name: str, **arrays):
        """DIR/name.npz, atomically."""
        self._atomic_write(f"{name}.npz", lambda handle: np.savez(handle, **arrays))

    def load_arrays(self, name: str) -> dict | None:
        path = self.path(f"{name}.npz")
        if not os.path.exists(path):
            return None
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}

    def reset(self, section: str):
        """Forget `section` and delete its files (FILES): the files first, so that no file
        outlives the section that says what it holds."""
        for pattern in FILES[section]:
            for path in glob.glob(os.path.join(glob.escape(self.directory), pattern)):
                os.unlink(path)
        self.drop(section)

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

    def claim_pairs(self, tasks_identity: dict):
        """Make the "pairs" section this task list's. Journals kept for another list (another
        occupied block after a budget change, another rank count) or for none are deleted."""
        if self.manifest.get("pairs") != json.loads(json.dumps(tasks_identity)):
            self.reset("pairs")
            self.claim("pairs", tasks_identity)

    @staticmethod
    def b_name(channel: str, rank: int | None = None) -> str:
        """The B file of a spin channel ("" restricted, "alpha", "beta") without ".h5": of one
        process (rank None) or of rank `rank`'s blocks."""
        return f"B_{channel or 'restricted'}" + ("" if rank is None else f".rank{rank}")

    def journal(self, ntasks: int, rank: int | None = None) -> PairJournal:
        """The journal of one process (rank None) or of rank `rank`; claim_pairs first."""
        return PairJournal(self.path("pairs.journal" if rank is None else f"pairs.rank{rank}.journal"), ntasks)

    def save_blocks(self, name: str, blocks: dict, to_host=np.asarray):
        """DIR/name.h5 with one dataset per block {b: array} (to_host(array): a host copy, made
        one block at a time), atomically and fsync'ed."""
        import h5py

        handle, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        os.close(handle)
        try:
            with h5py.File(tmp, "w") as out:
                for b, block in blocks.items():
                    out.create_dataset(f"block_{b}", data=to_host(block))
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())
            os.replace(tmp, self.path(f"{name}.h5"))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def load_blocks(self, name: str, shapes: dict) -> dict | None:
        """{b: host array} from DIR/name.h5 if it holds every block with the expected shape
        {b: shape}; None if it is missing, unreadable or different."""
        import h5py

        try:
            with h5py.File(self.path(f"{name}.h5"), "r") as held:
                if set(held) != {f"block_{b}" for b in shapes}:
                    return None
                blocks = {b: held[f"block_{b}"][...] for b in shapes}
        except (OSError, ValueError, KeyError):
            return None
        if any(tuple(blocks[b].shape) != tuple(shape) for b, shape in shapes.items()):
            return None
        return blocks


class PairJournal:
    """Append-only record of finished pair tasks (fp64 partial sums)."""

    def __init__(self, path, ntasks):
        self.path = path
        self.ntasks = ntasks
        self._handle = None
        self._synced = time.monotonic()

    def restore(self, sums: np.ndarray) -> list:
        """Fill sums[k] = (E_os part, E_ss part) of the finished tasks; returns their indices.
        A torn last record (a kill in mid-write) is ignored."""
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as handle:
            data = handle.read()
        done = []
        for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
            index, e_os, e_ss = RECORD.unpack_from(data, offset)
            if 0 <= index < self.ntasks:
                sums[index] = (e_os, e_ss)
                done.append(index)
        if len(data) % RECORD.size:  # drop the torn tail so that appends stay aligned
            with open(self.path, "r+b") as handle:
                handle.truncate(len(data) - len(data) % RECORD.size)
        return done

    def record(self, index: int, e_os: float, e_ss: float):
        if self._handle is None:
            self._handle = open(self.path, "ab", buffering=0)
        self._handle.write(RECORD.pack(index, e_os, e_ss))
        if time.monotonic() - self._synced > SYNC_SECONDS:
            os.fsync(self._handle.fileno())
            self._synced = time.monotonic()

    def close(self):
        if self._handle is not None:
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None


def _short(value):
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def version_identity() -> dict:
    return {"dfmp2": __version__}
