"""B's rows over the ranks of a team: who holds which occupied blocks, and how blocks travel
(the all-to-all of step 3, the ring of step 4, the lockstep of step 5)."""

from __future__ import annotations

import numpy as np

from ...util.scratch import RowFile
from ...util.system_memory import MB, peak_resident_bytes, released_after_each
from ...run.context import Timer
from ...run.ranks import Staging, Team


def rows_from_columns(team: Team, columns, blocks: list, owners: list, column_ranges: list, naux: int,
                      staging: Staging, dtype, device, nvir: int):
    """The all-to-all of step 3, one round per owned block: this rank's transform output
    `columns` (a storage store of [nocc, nvir, its P], auxiliary columns column_ranges[rank])
    -> (b, [rows of block b, nvir, naux]) for each occupied block b it owns, every P, gathered
    from all ranks; in round r each rank receives its r-th block (every rank takes every round,
    yielding (None, None) where it has no r-th block). One block is held at a time."""
    import torch

    size, rank = team.size, team.rank
    mine = [[b for b, owner in enumerate(owners) if owner == q] for q in range(size)]
    wire_device = staging.wire_device(device)
    c0, c1 = column_ranges[rank]

    def my_columns(b):  # my columns of block b
        return staging.to_wire(columns.read_occ(*blocks[b]).to(dtype).contiguous())

    for r in range(max(len(m) for m in mine)):
        b = mine[rank][r] if r < len(mine[rank]) else None
        full = None
        if b is not None:
            i0, i1 = blocks[b]
            full = torch.empty((i1 - i0, nvir, naux), dtype=dtype, device=wire_device)
            if c1 > c0:
                full[:, :, c0:c1] = my_columns(b)
        for k in range(1, size):
            dst, src = (rank + k) % size, (rank - k) % size
            theirs = mine[dst][r] if r < len(mine[dst]) else None
            send = my_columns(theirs) if theirs is not None and c1 > c0 else None
            s0, s1 = column_ranges[src]
            recv = torch.empty((i1 - i0, nvir, s1 - s0), dtype=dtype, device=wire_device) \
                if b is not None and s1 > s0 else None
            team.swap(send, dst, recv, src)
            if recv is not None:
                full[:, :, s0:s1] = recv
            del send, recv
        yield b, None if full is None else staging.from_wire(full)


def pass_blocks(team: Team, visiting, arriving: list, shape_of, dtype, device, staging: Staging, into):
    """One ring step: send the blocks of `visiting` (RankBlocks) to rank + 1 while receiving the
    blocks `arriving` [b] (shape_of(b), on `device`) from rank - 1 into `into` (RankBlocks),
    one block at a time (each sent block released once it has left). Returns `into`."""
    import torch

    sending = sorted(visiting.keys())
    wire_device = staging.wire_device(device)
    for n in range(max(len(sending), len(arriving))):
        send = None
        if n < len(sending):
            send = staging.to_wire(visiting[sending[n]])
            visiting.release(sending[n])
        recv = None
        if n < len(arriving):
            recv = torch.empty(shape_of(arriving[n]), dtype=dtype, device=wire_device)
        team.swap(send, (team.rank + 1) % team.size, recv, (team.rank - 1) % team.size)
        del send
        if recv is not None:
            into[arriving[n]] = staging.from_wire(recv)
    return into


class RankBlocks:
    """Occupied blocks of B a rank holds, {b: [rows_b, nvir, ncols]}: on the device (storage
    "memory"), or in a scratch scratch.RowFile (storage "disk", up to `capacity` rows: each
    block's rows one contiguous piece, read back each time it is asked for). Reads never
    remove a block; release(b) lets a visiting block's memory go once it has been sent on."""

    def __init__(self, backend, storage, capacity=0, scratch=None, visiting=False):
        self.backend, self.kind, self.capacity, self.scratch = backend, storage, capacity, scratch
        self._visiting = visiting  # a ring step's copy: release() drops (memory) blocks
        self._held = {}  # b -> device tensor (memory) or (first row, rows, nvir, ncols) on disk
        self._file, self._next_row, self._shared = None, 0, False  # shared: another's file (a view)

    def view(self):
        """The same blocks as a visiting set (memory: a shallow copy whose release() drops its
        own references; disk: the same file, which release() leaves as it is)."""
        copy = RankBlocks(self.backend, self.kind, self.capacity, self.scratch, visiting=True)
        copy._held, copy._file, copy._next_row = dict(self._held), self._file, self._next_row
        copy._shared = True
        return copy

    def __setitem__(self, b, block):
        if self.kind == "memory":
            self._held[b] = block
            return
        host = np.ascontiguousarray(self.backend.to_host(block))
        rows, nvir, ncols = host.shape
        if self._file is None:
            self._file = RowFile((self.capacity, nvir * ncols), self.scratch, kind="rank", dtype=host.dtype)
        self._file.write_rows(self._next_row, host.reshape(rows, nvir * ncols))
        self._held[b] = (self._next_row, rows, nvir, ncols)
        self._next_row += rows

    def __getitem__(self, b):
        if self.kind == "memory":
            return self._held[b]
        r0, rows, nvir, ncols = self._held[b]
        return self.backend.to_device(self._file.read_rows(r0, r0 + rows).reshape(rows, nvir, ncols))

    def keys(self):
        return list(self._held)

    def items(self):
        """(b, block) in order of b, each block made (read) when reached."""
        for b in sorted(self._held):
            yield b, self[b]

    def release(self, b):
        if self._visiting and self.kind == "memory":
            self._held.pop(b, None)

    def clear(self):
        """Forget every block (disk: the file is written over from its first row again)."""
        self._held, self._next_row = {}, 0

    def io(self) -> dict:
        if self._file is None or self._shared:
            return {"bytes_written": 0, "bytes_read": 0}
        return self._file.io()

    def close(self):
        self._held = {}
        if self._file is not None and not self._shared:
            self._file.close()
        self._file = None


class RankB:
    """The BProvider of a team (`dfmp2.mp2.b.protocol`): rows[s] (RankBlocks) = {b: B of
    occupied block b of channel s} for the blocks this rank owns (`block_owners`), in memory or
    on disk as the plan says; the pair tasks (I, J) are computed by the owner of I while the B_J
    blocks travel around the ring, one rank's blocks per step (`pass_blocks`; on disk through
    two scratch files a visiting set alternates between); each task's fp64 sums are
    all-reduced (`combine`). run: the `CorrelationRun` (its backend, team, channels, plan's storage
    and settings' scratch)."""

    def __init__(self, run, blocks, owners, occ_block, staging, shares):
        self.backend, self.team, self.channels = run.backend, run.context.team, run.channels
        self.blocks, self.owners, self.occ_block, self.staging = blocks, owners, occ_block, staging
        self.storage, self.scratch = run.plan.storage, run.settings.scratch
        team = self.team
        self.layout = {"ranks": team.size, "occ_block": occ_block}  # what B and the journals depend on
        self.aux_functions = sum(p1 - p0 for p0, p1 in shares[team.rank])
        self.rows, self.nkept, self.metric_label, self.reused = None, 0, "", False
        self.pair_seconds, self.ntasks_mine, self.timer = 0.0, 0, Timer()
        self.io = {"bytes_written": 0, "bytes_read": 0}  # of files closed so far (transform columns, visiting sets)

    def new_blocks(self, s, visiting=False) -> RankBlocks:
        """Empty RankBlocks for channel s's blocks this rank owns (visiting: room for the most any
        rank owns)."""
        rows = [sum(i1 - i0 for b, (i0, i1) in enumerate(self.blocks[s]) if self.owners[s][b] == q)
                for q in range(self.team.size)]
        capacity = max(rows) if visiting else rows[self.team.rank]
        return RankBlocks(self.backend, self.storage, capacity, self.scratch, visiting=visiting)

    def add_io(self, io):
        for key in self.io:
            self.io[key] += io[key]

    def owned(self, tasks) -> list:
        return [k for k, task in enumerate(tasks) if self.owners[task.s][task.i0 // self.occ_block] == self.team.rank]

    def pair_blocks(self, tasks, todo):
        """(k, task, B_I, B_J) of this rank's tasks `todo`, by channel pair and ring step: at step
        k the blocks of rank (rank - k) visit. Every rank takes every step (the ring moves
        whatever is left to compute). On disk B_I is read once per ring step and I, B_J once per task."""
        with self.timer.lap() as lap:
            yield from self._ring_blocks(tasks, todo)
        self.pair_seconds = lap.seconds

    def _ring_blocks(self, tasks, todo):
        """pair_blocks' loop: the ring steps of every channel pair (the time they take is pair_seconds)."""
        team, size, rank, occ_block = self.team, self.team.size, self.team.rank, self.occ_block
        todo, mine = set(todo), self.owned(tasks)
        self.ntasks_mine = len(mine)
        b_dtype = self.backend.zeros((1,)).dtype
        for s, t in dict.fromkeys((task.s, task.t) for task in tasks):  # channel pairs, canonical order
            visiting, spares = self.rows[t].view(), []
            try:
                for step in range(size):
                    source = (rank - step) % size
                    if step:
                        arriving = [b for b, owner in enumerate(self.owners[t]) if owner == source]
                        if self.storage == "memory":
                            into = self.new_blocks(t, visiting=True)
                        else:  # the spare file that is not being sent from
                            if len(spares) < 2:
                                spares.append(self.new_blocks(t, visiting=True))
                            into = next(spare for spare in spares if spare is not visiting)
                            into.clear()
                        visiting = pass_blocks(team, visiting, arriving, lambda b: (
                            self.blocks[t][b][1] - self.blocks[t][b][0], self.channels[t].nvir, self.nkept),
                            b_dtype, self.channels[t].e_vir.device, self.staging, into)
                    held_i = held_j = (None, None)
                    for k in mine:
                        task = tasks[k]
                        j = task.j0 // occ_block
                        if (task.s, task.t) != (s, t) or self.owners[t][j] != source or k not in todo:
                            continue
                        i = task.i0 // occ_block
                        if held_i[0] != i:
                            held_i = (i, self.rows[s][i])
                        if not task.diagonal and held_j[0] != j:
                            held_j = (j, visiting[j])
                        yield k, task, held_i[1], held_i[1] if task.diagonal else held_j[1]
                    held_i = held_j = None
            finally:
                for spare in spares:
                    self.add_io(spare.io())
                    spare.close()
            visiting = None

    def combine(self, sums):
        return self.team.all_reduce_sum(sums)  # every task's sums, each from exactly one rank

    def held_blocks(self, s, occ_rows=None):
        """(i0, i1, B rows) of the occupied blocks of channel s this rank owns, in order (its own
        blocks whatever occ_rows says: each is a tensor of its own)."""
        for b, (i0, i1) in enumerate(self.blocks[s]):
            if self.owners[s][b] == self.team.rank:
                yield i0, i1, self.rows[s][b]

    def sum_over_ranks(self, backend, tensor):
        """tensor (on the device) replaced by its fp64 sum over the ranks (through the host)."""
        total = self.team.all_reduce_sum(backend.to_host(tensor))
        backend.copy_into(tensor, tensor.new_tensor(total))
        return tensor

    def summary(self) -> dict:
        """Scratch traffic of this rank (B in memory: none) and, on rank 0, every rank's record."""
        team = self.team
        io = dict(self.io)
        for rows in self.rows or []:
            for key, value in rows.io().items():
                io[key] += value
        mine = {"rank": team.rank, "pair_tasks": self.ntasks_mine,
                "occ_block": self.occ_block, "pair_seconds": self.pair_seconds,
                "occupied_blocks": [sum(1 for o in owner if o == team.rank) for owner in self.owners],
                "aux_functions": self.aux_functions, "bytes_sent": team.bytes_sent,
                "bytes_received": team.bytes_received, "staged_through_host": self.staging.staged,
                "neuron_cores": team.neuron_cores, "peak_rss_mb": peak_resident_bytes() / MB,
                "storage": self.storage, "io": io, "kernels": dict(self.backend.calls)}
        per_rank = team.gather_objects(mine)
        total = {key: sum(r["io"][key] for r in per_rank) for key in io} if per_rank else io
        return {"io": total, "distributed": {"ranks": team.size, "backend": team.backend, "per_rank": per_rank}}

    def close(self):
        for rows in self.rows or []:
            rows.close()
        self.rows = None


class RankDensities:
    """How `steps.mp2_densities` reaches B over the ranks (a `protocol.DensitySchedule`; the schedule
    `provider.LocalDensities` is in one process), in lockstep rounds: in each round every rank takes one of its own occupied
    blocks as the k block (or none, once it has used them all), and the blocks of every i are
    broadcast by their owners, in order, to every rank; P and Gbar are summed over the ranks
    (combine); each rank fits the G rows of its own blocks (held), and `gather_on_root` brings
    them to rank 0, where the gradient runs. B crosses the wire once per round."""

    def __init__(self, provider: RankB):
        self.provider = provider
        self.team = provider.team

    def _mine(self, s) -> list:
        return [b for b, owner in enumerate(self.provider.owners[s]) if owner == self.team.rank]

    def k_blocks(self, other):
        """This rank's own blocks of channel `other`, one per round; in the rounds after them (another rank
        has more blocks) it takes no k block but still passes every i block on, so that the broadcasts
        stay in lockstep."""
        owners = self.provider.owners[other]
        rounds = max(sum(1 for owner in owners if owner == q) for q in range(self.team.size))
        mine = [self.provider.blocks[other][b] for b in self._mine(other)]
        yield from released_after_each(mine)
        for _ in range(rounds - len(mine)):
            for s in range(len(self.provider.channels)):
                for _ in self.slabs(s):
                    pass

    def held(self, s) -> list:
        return [self.provider.blocks[s][b] for b in self._mine(s)]

    def fit_blocks(self, s):
        """The G rows this rank fits: its own blocks, one at a time."""
        yield from released_after_each(self.held(s))

    def rows(self, s, i0, i1):
        """B of one of this rank's own blocks (i0 its first row)."""
        return self.provider.rows[s][i0 // self.provider.occ_block]

    def slabs(self, s):
        """B of every i of channel s, block by block in order, each broadcast by its owner."""
        import torch

        p, rank = self.provider, self.team.rank
        dtype, device = p.backend.zeros((1,)).dtype, p.channels[s].e_vir.device
        for b, (i0, i1) in enumerate(p.blocks[s]):
            owner = p.owners[s][b]
            if owner == rank:
                block = p.rows[s][b]  # (out of core: one read)
                self.team.broadcast(p.staging.to_wire(block), owner)
                yield block
                del block
            else:
                wire = torch.empty((i1 - i0, p.channels[s].nvir, p.nkept), dtype=dtype,
                                   device=p.staging.wire_device(device))
                yield p.staging.from_wire(self.team.broadcast(wire, owner))

    def combine(self, array):
        return self.team.all_reduce_sum(array)

    def gather_on_root(self, arrays):
        """arrays[s] [nocc_s, ...] (fp64, host or HDF5), whose rows each rank wrote for its own
        blocks: every block's rows on rank 0, sent by their owners."""
        import torch

        team, p = self.team, self.provider
        for s, owners in enumerate(p.owners):
            for b, owner in enumerate(owners):
                if owner == 0 or team.rank not in (0, owner):
                    continue
                i0, i1 = p.blocks[s][b]
                if team.rank == owner:
                    team.swap(torch.from_numpy(np.ascontiguousarray(arrays[s][i0:i1])).to(team._device()), 0, None, 0)
                else:
                    recv = torch.empty(arrays[s][i0:i1].shape, dtype=torch.float64, device=team._device())
                    team.swap(None, owner, recv, owner)
                    arrays[s][i0:i1] = recv.cpu().numpy()
