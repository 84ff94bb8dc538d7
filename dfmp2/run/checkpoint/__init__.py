"""The checkpoint, in one package: a directory that keeps a run's expensive intermediates (the
SCF, B, the pair journal, an optimisation's steps) across processes.

    directory   the directory: manifest, lock, the files it vouches for (`Checkpoint`, `open_checkpoint`)
    journal     the pair journal (`PairJournal`)
    policy      the checkpoint as a run uses it: `NoCheckpoint`, `RunCheckpoint` (one process),
                `open_run_checkpoint` composing them; `checkpoint_scratch`
    ranks       `RankCheckpoint`, around each rank's `RunCheckpoint`

This namespace holds what the other layers import."""

from .directory import FILE_SOURCES, Checkpoint, array_digest, open_checkpoint, version_identity
from .journal import RECORD, PairJournal
from .policy import SCF_RECORD, NoCheckpoint, RunCheckpoint, checkpoint_scratch, open_run_checkpoint, pipeline_identity
from .ranks import RankCheckpoint

__all__ = ["FILE_SOURCES", "RECORD", "SCF_RECORD", "Checkpoint", "NoCheckpoint", "PairJournal", "RankCheckpoint",
           "RunCheckpoint", "array_digest", "checkpoint_scratch", "open_checkpoint", "open_run_checkpoint",
           "pipeline_identity", "version_identity"]
