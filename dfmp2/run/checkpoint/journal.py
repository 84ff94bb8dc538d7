"""The pair journal: each finished pair task's (E_os, E_ss) appended with a CRC, fsync'ed at most
every SYNC_SECONDS, read back up to the first damaged record. Each record is appended whole or
not at all (`util.appends.Appender`): a full disk (or quota, RLIMIT_FSIZE) is one ComputationError
naming the journal, which keeps its earlier records whole."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from ...util.appends import Appender, failure_reason
from ...util.errors import ComputationError
from ...util.files import display, one_line
from ...util.provenance import JOURNAL_HEADER_BYTES, journal_digest, journal_header
from ..context import clock

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
        """Append task `index`'s sums (after the header, if the journal is empty), fsync'ed if the
        last fsync is SYNC_SECONDS old. ComputationError if it cannot be written (none of it is)."""
        if self._handle is None:
            self._handle = self._writing(lambda: Appender.open(self.path, sync=False))
            if os.fstat(self._handle.fd).st_size == 0:
                self._writing(lambda: self._handle.append(self.header))
        due = clock() - self._synced > SYNC_SECONDS
        self._writing(lambda: self._handle.append(RECORD.pack(index, e_os, e_ss, _crc(index, e_os, e_ss)), sync=due))
        if due:
            self._synced = clock()

    def _writing(self, write):
        """write(), an OSError of it as one line naming the journal (ComputationError)."""
        try:
            return write()
        except OSError as error:
            raise ComputationError(f"{display(self.path)}: {one_line(failure_reason(error))}; this pair task's record "
                                   "was not written (the journal's records before it stay whole)") from None

    def close(self):
        """fsync and close. A failed fsync is not an error of the run: a record it lost is a task
        a resume recomputes (each record carries its crc32)."""
        if self._handle is not None:
            try:
                self._handle.sync()
            except OSError:
                pass
            self._handle.close()
            self._handle = None


def _crc(index, e_os, e_ss) -> int:
    return zlib.crc32(struct.pack("<qdd", index, e_os, e_ss))
