"""The checkpoint as a run uses it: B and the pair journal kept, found and checked against
the run's identity (`pipeline_identity`); `NoCheckpoint` where none was asked for."""

from __future__ import annotations

import numpy as np

from ..util.errors import option
from ..util.files import display
from .checkpoint import Checkpoint, array_digest, open_checkpoint, version_identity
from .storage import DiskStore, remove_scratch


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
    scratch_prefix = "dfmp2-"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def resume_scf(self, identity, run_scf, arrays_of):
        return run_scf(), False

    def claim_pipeline(self, identity_of):
        pass

    def held_b(self, backend, channels, shapes):
        return []

    def b_path(self, channel):
        return None

    def b_identity(self):
        return None

    def keep_b(self, channels, nkept, metric_label):
        pass

    def held_rows(self, layout, blocks, owners, channels):
        return None

    def keep_rows(self, channels, rows, nkept, metric_label, layout, to_host):
        pass

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
    """The resume policy of a run with --checkpoint DIR, around the steps: the SCF (driver), B
    (steps 1-3) and the finished pair tasks (step 4) are taken from DIR when its manifest
    vouches for them and belong to this run, else computed and kept there. With a team of
    several ranks rank 0 reads and writes the manifest for all (`Team.on_root`), and each rank
    keeps its own B blocks and journal. Use as a context manager (closes the checkpoint)."""

    keeps_b = True

    def __init__(self, checkpoint: Checkpoint, team=None, scratch=None):
        self.checkpoint, self.team, self.scratch = checkpoint, team, scratch
        self.scratch_prefix = checkpoint.scratch_prefix
        self._journal = None
        self._reused_pair_tasks = 0

    def __exit__(self, *exc):
        self.close_journal()
        self.checkpoint.close()
        return False

    def _on_root(self, work):
        return work() if self.team is None else self.team.on_root(work)

    # -- the SCF (one process, or rank 0 for all)

    def resume_scf(self, identity, run_scf, arrays_of):
        """(the SCF's arrays the checkpoint holds for this run, True), or (run_scf(), False)
        with its arrays (arrays_of(mf)) kept. Another run's checkpoint is refused (InputError)
        before the SCF; sections made from the orbitals of a lost SCF are dropped."""
        checkpoint = self.checkpoint
        if checkpoint.claim("run", identity):
            held = checkpoint.load_arrays("scf", "the SCF was", "run")
            if held is not None:
                return held, True
            for section in ("pairs", "B", "pipeline"):
                checkpoint.reset(section)
        mf = run_scf()
        checkpoint.save_arrays("scf", "run", **arrays_of(mf))
        return mf, False

    def claim_pipeline(self, identity_of):
        """Claim the "pipeline" section for the identity identity_of() gives (`pipeline_identity`;
        InputError if the section is another run's)."""
        identity = identity_of()
        self._on_root(lambda: self.checkpoint.claim("pipeline", identity))

    # -- B of one process

    def held_b(self, backend, channels, shapes) -> list:
        """The stores of the complete B files the manifest vouches for (size and sha256 checked),
        or [] (then the B section is reset and its files registered for this run to write). The
        scratch a killed run of this checkpoint left behind is deleted first."""
        checkpoint = self.checkpoint
        remove_scratch(self.scratch, self.scratch_prefix)
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

    # -- B of several ranks

    def held_rows(self, layout, blocks, owners, channels):
        """This rank's whitened blocks as an earlier run of the same layout kept them (each file
        checked against rank 0's manifest record: size and sha256): ([{b: host array} per
        channel], nkept, metric label), or None on every rank unless every rank holds all of
        its blocks (then rank 0 resets the B section, and notes a damaged file)."""
        team, checkpoint = self.team, self.checkpoint
        held, files, identity = team.on_root(lambda: (checkpoint.manifest.get("B"), {
            name: entry for name, entry in checkpoint.manifest["files"].items() if entry.get("section") == "B"},
            checkpoint.file_identity("B")))
        if held is not None and all(held.get(key) == value for key, value in layout.items()):
            loaded = [(name, *checkpoint.load_blocks(name, {
                b: (i1 - i0, ch.nvir, held["nkept"]) for b, (i0, i1) in enumerate(blocks[s])
                if owners[s][b] == team.rank}, files.get(name + ".h5"), identity))
                for s, ch in enumerate(channels) for name in [checkpoint.b_name(ch.name, team.rank)]]
            failures = [(name + ".h5", reason) for name, rows, reason in loaded if rows is None]
            if not team.all_reduce_sum(np.array([float(bool(failures))]))[0]:
                return [rows for _, rows, _ in loaded], held["nkept"], held["metric"]
            every = team.gather_objects(failures)
            if team.is_root:
                for name, reason in (f for rank_failures in every for f in rank_failures):
                    checkpoint.damaged(name, reason, "B (transform and whitening) was")
        team.on_root(lambda: checkpoint.reset("B"))
        return None

    def keep_rows(self, channels, rows, nkept, metric_label, layout, to_host):
        """Rank 0 lists every rank's B files, each rank writes its own ({b: block} per channel),
        then rank 0 records their digests and the section that vouches for them."""
        team, checkpoint = self.team, self.checkpoint
        names = [checkpoint.b_name(ch.name, r) for r in range(team.size) for ch in channels]
        identity = team.on_root(lambda: (checkpoint.register("B", *[n for name in names for n in (
            f"{name}.h5", f".{name}.h5.partial")]), checkpoint.file_identity("B"))[1])
        digests = {f"{checkpoint.b_name(ch.name, team.rank)}.h5": checkpoint.save_blocks(
            checkpoint.b_name(ch.name, team.rank), rows[s], identity, to_host) for s, ch in enumerate(channels)}
        every = team.gather_objects(digests)

        def vouch_for_every_rank():
            for rank_digests in every:
                for name, digest in rank_digests.items():
                    checkpoint.vouch(name, digest)
            checkpoint.claim("B", {"nkept": nkept, "metric": metric_label, **layout})
        team.on_root(vouch_for_every_rank)

    # -- the pair tasks

    def resume_pairs(self, ntasks, layout, owned) -> tuple:
        """(finished task indices, sums [ntasks, 2] holding their E_os, E_ss parts) of the tasks
        `owned` by this process that the journal of this task list (`layout`, ntasks) holds;
        journals of another list go. Later `record` calls append to this process's journal."""
        team, checkpoint = self.team, self.checkpoint
        rank = None if team is None else team.rank
        journals = [checkpoint.journal_name()] if team is None else [checkpoint.journal_name(r)
                                                                     for r in range(team.size)]
        identity = self._on_root(lambda: (checkpoint.claim_pairs({**layout, "ntasks": ntasks}, journals),
                                          checkpoint.file_identity("pairs"))[1])
        self._journal = checkpoint.journal(ntasks, rank, identity)
        journaled = np.zeros((ntasks, 2))
        done, damaged = self._journal.restore(journaled)
        every = [damaged] if team is None else team.gather_objects(damaged)
        if team is None or team.is_root:
            for r, count in enumerate(every):
                if count is None:
                    checkpoint.damaged(journals[r], "was not written for this run (its header names another "
                                       "identity, or none, or is damaged); none of its records was used", "its pair blocks were")
                elif count:
                    checkpoint.damaged(journals[r], f"had {count} damaged record(s)", "those pair blocks were")
        finished = set(done) & set(owned)  # each task's sums from its owner only
        sums = np.zeros((ntasks, 2))
        kept = sorted(finished)
        sums[kept] = journaled[kept]
        self._reused_pair_tasks = len(finished)
        return finished, sums

    def forget_reused(self):
        """Every task is formed again (t2 needs each one's amplitudes): none counts as reused."""
        self._reused_pair_tasks = 0

    def record(self, k, e_os, e_ss):
        self._journal.record(k, e_os, e_ss)

    def close_journal(self):
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def summary(self, reused_b, ntasks) -> dict:
        """The result's checkpoint record: its directory, what this run reused, the notes
        (every rank takes part: the reused tasks are added over the ranks)."""
        reused = self._reused_pair_tasks
        if self.team is not None:
            reused = int(self.team.all_reduce_sum(np.array([reused]))[0])
        return {"directory": display(self.checkpoint.directory), "reused_B": reused_b, "reused_pair_tasks": reused,
                "pair_tasks": ntasks, "notes": list(self.checkpoint.notes)}


def open_run_checkpoint(settings, team=None):
    """The resume policy of a run: NoCheckpoint without settings.checkpoint; else DIR opened and
    locked (one process), or opened by rank 0, which stamps it, every rank checking that it
    sees the stamp (several ranks need one directory on a shared file system)."""
    if settings.checkpoint is None:
        return NoCheckpoint()
    if team is None:
        return RunCheckpoint(open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files),
                             None, settings.scratch)
    opened = []

    def open_and_stamp():
        opened.append(open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files))
        return opened[0].stamp()

    try:
        stamp = team.on_root(open_and_stamp)
        checkpoint = opened[0] if opened else Checkpoint(settings.checkpoint)  # others: unopened
        team.agree(checkpoint.sees_stamp(stamp), f"{option('checkpoint', settings.checkpoint)}: not every rank sees the "
                   "directory rank 0 writes (several ranks need one directory on a shared file system)")
    except BaseException:
        for held in opened:
            held.close()
        raise
    return RunCheckpoint(checkpoint, team, settings.scratch)
