"""The checkpoint over the ranks of a team: `RankCheckpoint` wraps the one-process policy of
each rank (`checkpoint.policy.RunCheckpoint`) with what several ranks add. Rank 0 alone reads and
writes the manifest and decides for all (`Team.on_root`); each rank keeps its own B blocks
(DIR/B_<channel>.rank<r>.h5) and pair journal (DIR/pairs.rank<r>.journal), which rank 0 lists
and vouches for after gathering them; the reused pair tasks are added over the ranks."""

from __future__ import annotations

import numpy as np

from ...util.errors import option
from .directory import Checkpoint, open_checkpoint


def open_shared_checkpoint(settings, team) -> Checkpoint:
    """DIR opened by rank 0, which stamps it, every rank checking that it sees the stamp
    (several ranks need one directory on a shared file system); the other ranks' Checkpoint
    is unopened (it leaves the manifest to rank 0)."""
    opened = []

    def open_and_stamp():
        opened.append(open_checkpoint(settings.checkpoint, settings.checkpoint_allow_other_files))
        return opened[0].stamp()

    try:
        stamp = team.on_root(open_and_stamp)
        checkpoint = opened[0] if opened else Checkpoint(settings.checkpoint)  # others: unopened
        team.agree(checkpoint.sees_stamp(stamp), f"{option('checkpoint', settings.checkpoint)}: not every rank sees "
                   "the directory rank 0 writes (several ranks need one directory on a shared file system)")
    except BaseException:
        for held in opened:
            held.close()
        raise
    return checkpoint


class RankCheckpoint:
    """The resume policy of a rank of `team` with --checkpoint DIR, around `local` (this rank's
    RunCheckpoint of DIR): the pipeline and pair sections claimed by rank 0 for all, B as each
    rank's own blocks (`held_rows`, `keep_rows`), the pair journal one per rank. Use as a
    context manager (closes the local one)."""

    keeps_b = True

    def __init__(self, local, team):
        self.local, self.team = local, team

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.local.__exit__(*exc)

    def claim_pipeline(self, identity_of):
        """Rank 0 claims the "pipeline" section (every rank forms the identity)."""
        identity = identity_of()
        self.team.on_root(lambda: self.local.claim_pipeline(lambda: identity))

    # -- B of several ranks

    def held_rows(self, layout, blocks, owners, channels):
        """This rank's whitened blocks as an earlier run of the same layout kept them (each file
        checked against rank 0's manifest record: size and sha256): ([{b: host array} per
        channel], nkept, metric label), or None on every rank unless every rank holds all of
        its blocks (then rank 0 resets the B section, and notes a damaged file)."""
        team, checkpoint = self.team, self.local.checkpoint
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
        team, checkpoint = self.team, self.local.checkpoint
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

    # -- the pair stage's task loop

    def resume_pairs(self, ntasks, layout, owned) -> tuple:
        """`RunCheckpoint.resume_pairs` over the ranks: rank 0 claims the "pairs" section with
        every rank's journal, each rank opens its own, rank 0 notes the damaged ones."""
        team, local = self.team, self.local
        journals = [local.checkpoint.journal_name(r) for r in range(team.size)]
        identity = team.on_root(lambda: local.claim_pairs(ntasks, layout, journals))
        done, journaled, damaged = local.open_journal(ntasks, journals[team.rank], identity)
        every = team.gather_objects(damaged)
        if team.is_root:
            local.note_damaged_journals(journals, every)
        return local.take_finished(done, journaled, owned)

    def forget_reused(self):
        self.local.forget_reused()

    def record(self, k, e_os, e_ss):
        self.local.record(k, e_os, e_ss)

    def close_journal(self):
        self.local.close_journal()

    def summary(self, reused_b, ntasks) -> dict:
        """The local record, its reused pair tasks added over the ranks (every rank takes part)."""
        reused = int(self.team.all_reduce_sum(np.array([self.local.reused_pair_tasks]))[0])
        return {**self.local.summary(reused_b, ntasks), "reused_pair_tasks": reused}
