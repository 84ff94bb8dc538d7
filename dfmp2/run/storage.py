"""Where the three-index tensor (ia|P) -> B_ia^P lives between pipeline steps.

Layout [nocc, nvir, naux] (occupied index slowest), written in auxiliary blocks by the
AO->MO transform and read/written in occupied blocks by whitening and the pair energies.
`MemoryStore` keeps it on the compute device; `DiskStore` in an HDF5 scratch file that is
deleted when the store closes.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..util.provenance import h5_identity, mismatch, stamp_h5
from ..util.scratch import scratch_directory, scratch_failure


class MemoryStore:
    """The tensor held on the backend's device."""

    kind = "memory"

    def __init__(self, backend, shape):
        self.backend = backend
        # each backend lays the tensor out its own way (NKI: [nocc, naux, nvir] storage, the pair
        # kernel's rows) behind the same [nocc, nvir, naux] view
        self.data = backend.ovL_layout(shape)

    def write_aux(self, p0, p1, block):
        self.backend.copy_into(self.data[:, :, p0:p1], block)

    def write_occ(self, i0, i1, block):
        self.backend.copy_into(self.data[i0:i1, :, : block.shape[2]], block)

    def read_occ(self, i0, i1, naux=None):
        block = self.data[i0:i1]
        return block if naux is None or naux == block.shape[2] else block[:, :, :naux].contiguous()

    def io(self) -> dict:
        return {"bytes_written": 0, "bytes_read": 0}  # nothing leaves memory

    def close(self):
        self.data = None


class DiskStore:
    """The tensor in HDF5 files, laid out for how the pipeline moves it, so that every byte is
    written at most twice and read in contiguous pieces:
      - the transform's block [nocc, nvir, p1 - p0] of each auxiliary block is one contiguous
        dataset of a scratch file, written sequentially once (no chunk is rewritten later);
      - whitening reads occupied rows [i0:i1] of every block (contiguous within each) and
        writes B [nocc, nvir, nkept] row-contiguous, once, to its own file; the scratch file
        is deleted when the last row is written;
      - the pair stage reads contiguous occupied slabs of B (out of core without a checkpoint,
        each slab's rows of (ia|P) are read once, whitened and written as the pair stage
        reaches them, so that (ia|P) is read once in all).
    Both files live in a scratch directory of kind "b" under `directory` (default:
    `scratch.scratch_root`; `scratch.scratch_directory`), deleted on close(), unless `path` names
    where to keep B (a checkpoint): that file is kept and marked complete once every row is written
    (`reopen` reads it back). `prefix`: the run's name for that directory (`scratch.run_name`; None:
    the one `scratch.named_by` gives now). bytes_written / bytes_read count the array bytes moved."""

    kind = "disk"

    def __init__(self, backend, shape, directory=None, path=None, prefix=None, identity=None):
        import h5py

        self.backend = backend
        self.shape = tuple(shape)
        self.scratch = directory
        self._tmpdir = scratch_directory("b", directory, prefix)
        self.path = path or os.path.join(self._tmpdir.name, "B.h5")
        self._kept = path is not None
        self._aux_file = self._file = None
        with self._scratch_errors(self._tmpdir.name):
            self._aux_file = h5py.File(os.path.join(self._tmpdir.name, "three_center.h5"), "w")
            self._file = h5py.File(self.path, "w")
            if identity is not None:  # a kept B (a checkpoint's): what it was made from (dfmp2.util.provenance)
                stamp_h5(self._file, identity)
        self._dtype = np.float64 if backend.itemsize == 8 else np.float32
        self._blocks = []  # [(p0, p1, dataset)] of the transform's output
        self._b = None  # whitened B [nocc, nvir, nkept]
        self._whitened = np.zeros(shape[0], dtype=bool)
        self.bytes_written = 0
        self.bytes_read = 0

    @classmethod
    def reopen(cls, backend, path, shape, identity) -> tuple:
        """(the complete B a kept store wrote, read only, None) if the file carries the file
        identity `identity`; else (None, why not: missing, unreadable (a kill while it was
        written), incomplete, or made for another run)."""
        import h5py

        try:
            handle = h5py.File(path, "r")
        except (OSError, ValueError) as error:
            return None, f"unreadable ({error})"
        reason = mismatch(h5_identity(handle), identity)
        if reason is None and (not handle.attrs.get("complete", False) or "B" not in handle
                               or tuple(handle["B"].shape[:2]) != tuple(shape[:2])):
            reason = "incomplete, or of other shapes"
        if reason is not None:
            handle.close()
            return None, reason
        store = cls.__new__(cls)
        store.backend, store.shape, store._tmpdir, store.path, store._kept = backend, tuple(shape), None, path, True
        store._aux_file, store._file, store._b, store._blocks = None, handle, handle["B"], []
        store._dtype = handle["B"].dtype
        store._whitened = np.ones(shape[0], dtype=bool)
        store.bytes_written = store.bytes_read = 0
        store.scratch = None
        return store, None

    @contextlib.contextmanager
    def _scratch_errors(self, where):
        """An OSError writing or reading the file `where` (a full disk) as one line naming it."""
        try:
            yield
        except OSError as error:
            raise scratch_failure(error, where, self.scratch) from None

    def whitened(self, i0, i1) -> bool:
        """Rows [i0, i1) of B are written."""
        return bool(self._whitened[i0:i1].all())

    def write_aux(self, p0, p1, block):
        data = np.ascontiguousarray(self.backend.to_host(block), dtype=self._dtype)
        with self._scratch_errors(self._aux_file.filename):
            self._blocks.append((p0, p1, self._aux_file.create_dataset(f"aux_{p0}", data=data)))
            self._aux_file.flush()  # (a full disk shows here, not at close)
        self.bytes_written += data.nbytes

    def write_occ(self, i0, i1, block):
        with self._scratch_errors(self.path):
            self._write_occ(i0, i1, block)

    def _write_occ(self, i0, i1, block):
        data = np.ascontiguousarray(self.backend.to_host(block), dtype=self._dtype)
        if self._b is None:
            self._b = self._file.create_dataset("B", shape=(self.shape[0], self.shape[1], data.shape[2]),
                                                dtype=self._dtype)
        self._b[i0:i1] = data
        self._file.flush()
        self._whitened[i0:i1] = True
        self.bytes_written += data.nbytes
        if self._whitened.all():  # the transform's blocks are no longer needed
            self._blocks = []
            self._close_aux()
            self._file.attrs["complete"] = True
            self._file.flush()
            os.fsync(self._file.id.get_vfd_handle())  # on disk before a checkpoint says B is complete
            if self._kept:  # a checkpoint's B:
                # closed, so that its bytes are final when the checkpoint takes their digest, and
                # read back read-only
                import h5py

                self._file.close()
                self._file = h5py.File(self.path, "r")
                self._b = self._file["B"]

    def read_occ(self, i0, i1, naux=None):
        if self._whitened[i0:i1].all():
            naux = self._b.shape[2] if naux is None else naux
            data = self._b[i0:i1, :, :naux]
        else:
            if naux is not None:  # only B is read with a column count: never hand out (ia|P) as B
                raise RuntimeError(f"rows {i0}:{i1} of B are not whitened yet")
            data = np.empty((i1 - i0, self.shape[1], self.shape[2]), dtype=self._dtype)
            for p0, p1, dataset in self._blocks:
                data[:, :, p0:p1] = dataset[i0:i1]
            data = data if naux is None else data[:, :, :naux]
        self.bytes_read += data.nbytes
        return self.backend.to_device(data)

    def io(self) -> dict:
        return {"bytes_written": self.bytes_written, "bytes_read": self.bytes_read}

    def _close_aux(self):
        if self._aux_file is not None:
            name = self._aux_file.filename
            self._aux_file.close()
            self._aux_file = None
            os.unlink(name)

    def close(self):
        try:
            self._close_aux()
        except OSError:  # (a full disk: the directory goes below all the same)
            self._aux_file = None
        self._file, self._tmpdir = close_scratch(self._file, self._tmpdir)


def close_scratch(handle, directory) -> tuple:
    """Close an HDF5 file and remove its temporary directory, each where there is one (None):
    -> (None, None), what the owner keeps afterwards. The directory goes even when closing the
    file fails (a full disk)."""
    try:
        if handle is not None:
            handle.close()
    except OSError:
        pass
    finally:
        if directory is not None:
            directory.cleanup()
    return None, None


def new_store(backend, shape, storage, scratch=None, path=None, prefix=None, identity=None):
    """An empty store of the [nocc, nvir, naux] tensor where the memory plan puts it: storage
    "memory" (MemoryStore) or "disk" (DiskStore under `scratch`, its directory named by the run
    `prefix`, B kept at `path` if given, carrying the file identity `identity`)."""
    if storage == "memory":
        return MemoryStore(backend, shape)
    return DiskStore(backend, shape, scratch, path, prefix, identity)


class ScratchArrays:
    """fp64 arrays for the gradient's large intermediates: host arrays (storage "memory"), or
    (storage "disk", the energy's B out of core) HDF5 datasets in a scratch directory of kind
    "gradient" under `scratch` (`scratch.scratch_directory`), deleted by close() (and when the
    object is collected). A context manager."""

    def __init__(self, storage, scratch=None):
        self.kind, self.scratch, self._tmpdir, self._file = storage, scratch, None, None
        if storage == "disk":
            self._open()

    def _open(self):
        import h5py

        self._tmpdir = scratch_directory("gradient", self.scratch)
        try:
            self._file = h5py.File(os.path.join(self._tmpdir.name, "arrays.h5"), "w")
        except OSError as error:
            self._tmpdir.cleanup()
            raise scratch_failure(error, self._tmpdir.name, self.scratch) from None

    def new(self, shape, chunks=None, on_disk=False):
        """A zeroed [shape] array; chunks: the HDF5 chunk shape on disk (how it will be read).
        on_disk: in the scratch file even where the others are in memory (one the budget does not
        hold; the file is made then)."""
        if self.kind != "disk" and not on_disk:
            return np.zeros(shape)
        if self._file is None:
            self._open()
        return self._file.create_dataset(f"a{len(self._file)}", shape=shape, dtype=np.float64, chunks=chunks)

    def close(self):
        self._file, self._tmpdir = close_scratch(self._file, self._tmpdir)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ThreeIndexDensity:
    """The three-index two-particle density G_ia^P [nocc_s, nvir_s, naux] of each spin channel,
    fp64 (steps.mp2_densities writes it in blocks of occupied rows; the gradient reads it in
    auxiliary slices G[:, :, p0:p1]): in ScratchArrays of `storage` (HDF5 with B out of core,
    chunked for both directions), deleted by close(). Indexing and iteration give the
    per-channel arrays, as a list of them would; gamma_aux: Gbar_PQ [naux, naux], once known."""

    def __init__(self, shapes, storage, scratch=None):
        self.gamma_aux = None
        self._arrays = ScratchArrays(storage, scratch)
        self.arrays = [self._arrays.new(shape, chunks=(1, shape[1], min(shape[2], 128))) for shape in shapes]

    @property
    def kind(self) -> str:
        """"memory" or "disk": where the arrays are."""
        return self._arrays.kind

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, s):
        return self.arrays[s]

    def __iter__(self):
        return iter(self.arrays)

    def close(self):
        self._arrays.close()
