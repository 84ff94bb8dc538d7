"""The pair journal: each finished pair task's (E_os, E_ss) appended with a CRC, fsync'ed at most
every SYNC_SECONDS, read back up to the first damaged record."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from ..util.provenance import JOURNAL_HEADER_BYTES, journal_digest, journal_header
from .context import clock

RECORD = struct.Struct("<qddI")  # task index, E_os part, E_ss part, crc32 of the first three


SYNC_SECONDS = 5.0  # the journal is fsync'ed at most this often (a kill of the process loses nothing)


class PairJournal:
    """Append-only record of finished pair tasks (fp64 partial sums) of one file identity: a
    header (`provenance.journal_header`: the identity's digest), then records, each with the
    crc32 of its contents."""

    def __init__(self, path, ntasks, identity):
        self.path = path
        self.ntasks = ntasks
        self.header = journal_header(identity)
        self._handle = None
        self._synced = clock()

    def restore(self, sums: np.ndarray) -> tuple:
        """Fill sums[k] = (E_os part, E_ss part) of the finished tasks; returns (their indices,
        the number of damaged records: a wrong crc32 or index; those tasks are recomputed, None
        if the journal is not this identity's: none of it is used and it starts over). A torn
        last record (a kill in mid-write) is ignored."""
        if not os.path.exists(self.path):
            return [], 0
        with open(self.path, "rb") as handle:
            data = handle.read()
        if journal_digest(data) != self.header[-32:]:  # another run's journal (or none of dfmp2's)
            with open(self.path, "r+b") as handle:
                handle.truncate(0)
            return [], None
        body = data[JOURNAL_HEADER_BYTES:]
        done, damaged = [], 0
        for offset in range(0, len(body) - RECORD.size + 1, RECORD.size):
            index, e_os, e_ss, crc = RECORD.unpack_from(body, offset)
            if crc != _crc(index, e_os, e_ss) or not 0 <= index < self.ntasks \
                    or not (np.isfinite(e_os) and np.isfinite(e_ss)):
                damaged += 1
                continue
            sums[index] = (e_os, e_ss)
            done.append(index)
        if len(body) % RECORD.size:  # drop the torn tail so that appends stay aligned
            with open(self.path, "r+b") as handle:
                handle.truncate(len(data) - len(body) % RECORD.size)
        return done, damaged

    def record(self, index: int, e_os: float, e_ss: float):
        if self._handle is None:
            self._handle = open(self.path, "ab", buffering=0)
            if self._handle.tell() == 0:
                self._handle.write(self.header)
        self._handle.write(RECORD.pack(index, e_os, e_ss, _crc(index, e_os, e_ss)))
        if clock() - self._synced > SYNC_SECONDS:
            os.fsync(self._handle.fileno())
            self._synced = clock()

    def close(self):
        if self._handle is not None:
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None


def _crc(index, e_os, e_ss) -> int:
    return zlib.crc32(struct.pack("<qdd", index, e_os, e_ss))
