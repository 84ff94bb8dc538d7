"""The checkpoint as a run uses it: B and the pair journal kept, found and checked against
the run's identity (`pipeline_identity`). Three policies, composed by `open_run_checkpoint`:
`NoCheckpoint` where none was asked for, `RunCheckpoint` for one process (it knows nothing of
ranks), and over a team `ranks.RankCheckpoint` around each rank's `RunCheckpoint`.
`checkpoint_scratch` locks DIR before the run makes any scratch, and names that scratch by it."""

from __future__ import annotations

import contextlib
import json

import numpy as np

from ...util.files import display
from ...util.provenance import canonical
from .directory import array_digest, open_checkpoint, version_identity
from .journal import PairJournal
from .ranks import RankCheckpoint, open_shared_checkpoint
from ...util.scratch import named_by
from ..storage import DiskStore

SCF_RECORD = "scf_record"  # the member of scf.npz that says what made the SCF (`resume_scf`)


def pipeline_identity(backend, refs, selected, fock_mo, metric, nao, screening=None) -> dict:
    """What a checkpoint's B and pair sums belong to: the orbitals (hashed), the active spaces,
    the auxiliary metric (hashed), the screening (its threshold and kept pair blocks; None:
    dense), the backend's arithmetic and the dfmp2 version."""
    return {**version_identity(), "nao": nao, "naux": int(metric.shape[0]),
            "screening": None if screening is None else [screening.threshold, len(screening.pairs)],
            "orbitals": array_digest(*[a for ref in refs for a in ref],
                                     *(fock_mo if fock_mo is not None else [None])),
            "active": array_digest(*[a for occ, vir, _ in selected for a in (occ, vir)]),
            "spaces": [[int(o.size), int(v.size)] for o, v, _ in selected],
            "metric": array_digest(np.asarray(metric)), "device": backend.device_name,
            "backend": backend.name, "precision": backend.precision, "transform": backend.transform,
            "nki_api": backend.record().nki_api}


class NoCheckpoint:
    """The resume policy of a run without --checkpoint: nothing is held, nothing is kept."""

    keeps_b = False
    scratch_prefix = None  # its scratch directories take the name util.scratch.named_by gives

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def resume_scf(self, identity, run_scf, arrays_of, record_of=None):
        return run_scf(), False

    def claim_pipeline(self, identity_of):
        pass

    # -- B of one process

    def held_b(self, backend, channels, shapes):
        return []

    def b_path(self, channel):
        return None

    def b_identity(self):
        return None

    def keep_b(self, channels, nkept, metric_label):
        pass

    # -- the pair stage's task loop

    def resume_pairs(self, ntasks, layout, owned):
        return set(), np.zeros((ntasks, 2))

    def forget_reused(self):
        pass

    def record(self, k, e_os, e_ss):
        pass

    def close_journal(self):
        pass

    def summary(self, reused_b, ntasks):
        return None


class RunCheckpoint(NoCheckpoint):
    """The resume policy of one process with --checkpoint DIR, around the steps: the SCF
    (driver), B (steps 1-3) and the finished pair tasks (step 4) are taken from DIR when its
    manifest vouches for them and belong to this run, else computed and kept there. It knows
    nothing of ranks: over a team, `RankCheckpoint` wraps each rank's. Use as a context
    manager (closes the checkpoint)."""

    keeps_b = True

    def __init__(self, checkpoint, scratch=None):
        self.checkpoint, self.scratch = checkpoint, scratch
        self.scratch_prefix = checkpoint.scratch_prefix
        self._journal = None
        self.reused_pair_tasks = 0

    def __exit__(self, *exc):
        self.close_journal()
        self.checkpoint.close()
        return False

    # -- the SCF

    def resume_scf(self, identity, run_scf, arrays_of, record_of=dict):
        """(the SCF's arrays the checkpoint holds for this run, with SCF_RECORD: what made that
        SCF (a dict), True), or (run_scf(), False) with its arrays (arrays_of(mf)) and what made
        it (record_of(mf), JSON-able) kept together in scf.npz, the one file the manifest vouches
        for. Another run's checkpoint is refused (InputError) before the SCF; a held SCF without
        its record is recomputed (a note); sections made from the orbitals of a lost SCF are dropped."""
        checkpoint = self.checkpoint
        if checkpoint.claim("run", identity):
            held = _with_record(checkpoint, checkpoint.load_arrays("scf", "the SCF was", "run"))
            if held is not None:
                return held, True
            for section in ("pairs", "B", "pipeline"):
                checkpoint.reset(section)
        mf = run_scf()
        checkpoint.save_arrays("scf", "run", **arrays_of(mf), **{SCF_RECORD: np.array(canonical(record_of(mf)))})
        return mf, False

    def claim_pipeline(self, identity_of):
        """Claim the "pipeline" section for the identity identity_of() gives (`pipeline_identity`;
        InputError if the section is another run's)."""
        self.checkpoint.claim("pipeline", identity_of())

    # -- B of one process

    def held_b(self, backend, channels, shapes) -> list:
        """The stores of the complete B files the manifest vouches for (size and sha256 checked),
        or [] (then the B section is reset and its files registered for this run to write)."""
        checkpoint = self.checkpoint
        names = [self.b_path(ch, full=False) for ch in channels]
        if "ranks" not in checkpoint.manifest.get("B", {"ranks": None}):  # a section of one process's B
            reasons = [checkpoint.check(name) for name in names]
            opened = [DiskStore.reopen(backend, checkpoint.path(name), shape, self.b_identity())
                      if reason is None else (None, reason) for name, shape, reason in zip(names, shapes, reasons)]
            stores, reasons = [store for store, _ in opened], [why for _, why in opened]
            if all(store is not None for store in stores):
                return stores
            for name, store, reason in zip(names, stores, reasons):
                if store is None:
                    checkpoint.damaged(name, reason or "unreadable", "B (transform and whitening) was")
                else:
                    store.close()
        checkpoint.reset("B")  # none, another layout's (ranks), a killed run's or a damaged one
        checkpoint.register("B", *names)
        return []

    def b_identity(self) -> dict:
        """The file identity of this run's B files (`Checkpoint.file_identity`)."""
        return self.checkpoint.file_identity("B")

    def held_b_label(self) -> tuple:
        """(nkept, metric label) of the B the manifest vouches for."""
        return self.checkpoint.manifest["B"]["nkept"], self.checkpoint.manifest["B"]["metric"]

    def b_path(self, channel, full=True):
        """Where channel's B is kept: DIR/B_<channel>.h5 (full path), or its name."""
        name = self.checkpoint.b_name(channel.name) + ".h5"
        return self.checkpoint.path(name) if full else name

    def keep_b(self, channels, nkept, metric_label):
        """Vouch for each B file (size, sha256), then claim the section that vouches for them."""
        for ch in channels:
            self.checkpoint.vouch(self.b_path(ch, full=False))
        self.checkpoint.claim("B", {"nkept": nkept, "metric": metric_label})

    # -- the pair stage's task loop

    def resume_pairs(self, ntasks, layout, owned) -> tuple:
        """(finished task indices, sums [ntasks, 2] holding their E_os, E_ss parts) of the tasks
        `owned` by this process that the journal of this task list (`layout`, ntasks) holds;
        journals of another list go. Later `record` calls append to this process's journal."""
        name = self.checkpoint.journal_name()
        done, journaled, damaged = self.open_journal(ntasks, name, self.claim_pairs(ntasks, layout, [name]))
        self.note_damaged_journals([name], [damaged])
        return self.take_finished(done, journaled, owned)

    def claim_pairs(self, ntasks, layout, journals) -> dict:
        """Make the "pairs" section this task list's, with the journals `journals` (names);
        returns the file identity the journals carry."""
        self.checkpoint.claim_pairs({**layout, "ntasks": ntasks}, journals)
        return self.checkpoint.file_identity("pairs")

    def open_journal(self, ntasks, name, identity) -> tuple:
        """Open the journal DIR/name (of file identity `identity`; `record` appends to it):
        (the finished task indices it holds, sums [ntasks, 2] with theirs, its damage count:
        None if it belongs to another identity)."""
        self._journal = PairJournal(self.checkpoint.path(name), ntasks, identity)
        journaled = np.zeros((ntasks, 2))
        done, damaged = self._journal.restore(journaled)
        return done, journaled, damaged

    def note_damaged_journals(self, journals, counts):
        """Note each journal (names) whose damage count (`open_journal`) is None or not 0."""
        for name, count in zip(journals, counts):
            if count is None:
                self.checkpoint.damaged(name, "was not written for this run (its header names another identity, "
                                        "or none, or is damaged); none of its records was used", "its pair blocks were")
            elif count:
                self.checkpoint.damaged(name, f"had {count} damaged record(s)", "those pair blocks were")

    def take_finished(self, done, journaled, owned) -> tuple:
        """(the finished tasks this process owns, sums [ntasks, 2] with theirs alone): each
        task's sums from its owner only."""
        finished = set(done) & set(owned)
        sums = np.zeros(journaled.shape)
        kept = sorted(finished)
        sums[kept] = journaled[kept]
        self.reused_pair_tasks = len(finished)
        return finished, sums

    def forget_reused(self):
        """Every task is formed again (t2 needs each one's amplitudes): none counts as reused."""
        self.reused_pair_tasks = 0

    def record(self, k, e_os, e_ss):
        self._journal.record(k, e_os, e_ss)

    def close_journal(self):
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def summary(self, reused_b, ntasks) -> dict:
        """The result's checkpoint record: its directory, what this run reused, the notes."""
        return {"directory": display(self.checkpoint.directory), "reused_B": reused_b,
                "reused_pair_tasks": self.reused_pair_tasks, "pair_tasks": ntasks, "notes": list(self.checkpoint.notes)}


def _with_record(checkpoint, held):
    """The arrays `held` of scf.npz (None: none usable) with SCF_RECORD read back as a dict; None,
    with a note, where they carry no record of what made the SCF."""
    if held is None:
        return None
    try:
        return {**held, SCF_RECORD: json.loads(str(held[SCF_RECORD]))}
    except (KeyError, ValueError):
        checkpoint.damaged("scf.npz", "holds no record of what made the SCF", "the SCF was")
        return None


def open_run_checkpoint(settings, team=None):
    """The resume policy of a run: NoCheckpoint without settings.checkpoint; else DIR opened and
    locked (one process: a RunCheckpoint), or over a team a RankCheckpoint around each rank's
    RunCheckpoint of DIR opened by rank 0 (`open_shared_checkpoint`)."""
    if settings.checkpoint is None:
        return NoCheckpoint()
    if team is None:
        return RunCheckpoint(open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files),
                             settings.scratch)
    return RankCheckpoint(RunCheckpoint(open_shared_checkpoint(settings, team), settings.scratch), team)


@contextlib.contextmanager
def checkpoint_scratch(settings, team=None):
    """Within: a run's scratch. With settings.checkpoint, DIR is opened and locked first (over a
    team, by rank 0: InputError "in use by process N" before this run makes any scratch), and every
    scratch directory made within is named by DIR's identity (`Checkpoint.scratch_prefix`,
    `scratch.named_by`), what a killed run of DIR left under the same scratch root removed first.
    Without one, nothing changes (an enclosing name, e.g. an optimisation's, stays)."""
    if settings.checkpoint is None:
        yield
        return
    opened = []

    def lock_and_name():
        opened.append(open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files))
        return opened[0].scratch_prefix

    try:
        name = lock_and_name() if team is None else team.on_root(lock_and_name)
        with named_by(name, settings.scratch):
            yield
    finally:
        for checkpoint in opened:
            checkpoint.close()
