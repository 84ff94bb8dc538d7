"""Where the three-index tensor (ia|P) -> B_ia^P lives between pipeline steps.

Layout [nocc, nvir, naux] (occupied index slowest), written in auxiliary blocks by the
AO->MO transform and read/written in occupied blocks by whitening and the pair energies.
`MemoryStore` keeps it on the compute device; `DiskStore` in an HDF5 scratch file that is
deleted when the store closes.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


class MemoryStore:
    """The tensor held on the backend's device."""

    kind = "memory"

    def __init__(self, backend, shape):
        self.backend = backend
        # each backend lays the tensor out its own way (NKI: [nocc, naux, nvir] storage, the pair
        # kernel's rows) behind the same [nocc, nvir, naux] view
        self.data = backend.three_center_layout(shape)

    def write_aux(self, p0, p1, block):
        self.backend.copy_into(self.data[:, :, p0:p1], block)

    def write_occ(self, i0, i1, block):
        self.backend.copy_into(self.data[i0:i1, :, : block.shape[2]], block)

    def read_occ(self, i0, i1, naux=None):
        block = self.data[i0:i1]
        return block if naux is None or naux == block.shape[2] else block[:, :, :naux].contiguous()

    def close(self):
        self.data = None


class DiskStore:
    """The tensor held in an HDF5 file under `directory` (default: the system temp dir)."""

    kind = "disk"

    def __init__(self, backend, shape, directory=None):
        import h5py

        self.backend = backend
        self._tmpdir = tempfile.TemporaryDirectory(prefix="dfmp2-", dir=directory)
        self.path = os.path.join(self._tmpdir.name, "three_center.h5")
        self._file = h5py.File(self.path, "w")
        dtype = np.float64 if backend.itemsize == 8 else np.float32
        chunk = (1, shape[1], shape[2])
        self.data = self._file.create_dataset("B", shape=shape, dtype=dtype, chunks=chunk)

    def write_aux(self, p0, p1, block):
        self.data[:, :, p0:p1] = self.backend.to_host(block)

    def write_occ(self, i0, i1, block):
        self.data[i0:i1, :, : block.shape[2]] = self.backend.to_host(block)

    def read_occ(self, i0, i1, naux=None):
        naux = self.data.shape[2] if naux is None else naux
        return self.backend.to_device(self.data[i0:i1, :, :naux])

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tmpdir.cleanup()
