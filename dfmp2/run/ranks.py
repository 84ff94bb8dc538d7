"""Many processes through torch.distributed: gloo on CPUs (and the NKI emulator), NCCL on NVIDIA GPUs.

    torchrun --nproc-per-node N -m dfmp2 run molecule.xyz ...

One SCF (rank 0), broadcast. Then the pipeline's steps, split over the ranks:
  1. every rank factors the metric (naux^2, small);
  2. rank q transforms a contiguous share of the auxiliary blocks: (ia|P) for all i, a and
     its P [nocc, nvir, nP_q];
  3. an all-to-all (pairwise sends) gives each rank its occupied blocks with every P, which
     it whitens: B_I [rows, nvir, naux] for the blocks it owns (dealt out by the pair work
     each brings, so that the triangle I >= J is shared evenly: `block_owners`);
  4. pair tasks (I, J) are computed by the owner of I: the B_J blocks travel around a ring,
     one rank's blocks per step, N steps; each task's fp64 sums are all-reduced and added in
     the canonical order (math.fsum), so the energy is that of one process.
Each rank holds ~2/N of the tensor (its rows plus one visiting rank's), plus one block.
With --checkpoint, rank 0 decides over the checkpoint for all (`Team.on_root`) and each rank
keeps its own B blocks and pair journal there (dfmp2.checkpoint).
Collectives time out after `timeout` seconds and any failure of another rank (a dead
process closes its connections) becomes a ComputationError: no rank hangs.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np

from ..util.errors import ComputationError, InputError, option
from ..util.files import RowFile
from ..util.system_memory import MB, peak_resident_bytes

DEFAULT_TIMEOUT_S = 1800  # a collective waits this long (the SCF on rank 0 included)


def launched_ranks() -> int:
    """WORLD_SIZE of a torchrun/srun launch (1 when not launched as several processes)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise InputError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of processes") from None


def communication_backend(device: str, simulate: bool) -> str:
    """nccl for cuda (device memory moves between GPUs); gloo otherwise: CPUs, the NKI emulator
    and NeuronCores, whose blocks are staged through host memory (`Staging`): gloo is the one
    engine here whose point-to-point sends could be run, and torch-xla's process group lacks
    receives in some releases."""
    return "nccl" if device == "cuda" else "gloo"


def pin_neuron_core() -> str | None:
    """Give this rank its own NeuronCore: NEURON_RT_VISIBLE_CORES = LOCAL_RANK unless the launch
    set it (the Neuron runtime otherwise reserves every core for the first process). Must run
    before the runtime starts (before the NKI backend makes its device). Returns the value."""
    if "NEURON_RT_VISIBLE_CORES" not in os.environ:
        os.environ["NEURON_RT_VISIBLE_CORES"] = os.environ.get("LOCAL_RANK", "0")
    return os.environ["NEURON_RT_VISIBLE_CORES"]


class Staging:
    """How blocks cross ranks. NCCL and CPU tensors go as they are; with gloo, the blocks of a
    device backend (NeuronCores, or the emulator, where it is modelled) go through host memory:
    to_wire before a send (backend.to_host: a counted device -> host transfer), from_wire after
    a receive (backend.to_device)."""

    def __init__(self, backend, team):
        self.backend = backend
        self.staged = team.backend == "gloo" and backend.device_name != "cpu"

    def to_wire(self, tensor):
        import torch

        return torch.from_numpy(np.ascontiguousarray(self.backend.to_host(tensor))) if self.staged else tensor

    def from_wire(self, tensor):
        return self.backend.to_device(tensor.numpy()) if self.staged else tensor

    def wire_device(self, device):
        """Where blocks of `device` travel (send and receive buffers): the host when staged."""
        import torch

        return torch.device("cpu") if self.staged else device


def join_launched_team(device: str, simulate: bool, timeout_s: float = DEFAULT_TIMEOUT_S):
    """The Team of a launch with several processes (torchrun, or srun with the rendezvous
    variables), or None for one process: the one place that decides whether a run is distributed."""
    return Team.join(device, simulate, timeout_s) if launched_ranks() > 1 else None


class Team:
    """The ranks of one run. rank 0 prints and writes the results."""

    def __init__(self, rank: int, size: int, backend: str, timeout_s: float):
        self.rank, self.size, self.backend, self.timeout_s = rank, size, backend, timeout_s
        self.bytes_sent = 0
        self.bytes_received = 0
        self.neuron_cores = None

    @classmethod
    def join(cls, device: str, simulate: bool, timeout_s: float = DEFAULT_TIMEOUT_S) -> Team:
        """Join the process group torchrun (or srun with MASTER_ADDR/PORT, RANK, WORLD_SIZE)
        describes."""
        import torch
        import torch.distributed as dist

        backend = communication_backend(device, simulate)
        neuron_cores = pin_neuron_core() if device in ("trn1", "trn2") and not simulate else None
        if backend == "nccl":
            if not dist.is_nccl_available():
                raise ComputationError(f"{option('device', 'cuda')} with several ranks needs NCCL, which this torch lacks")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
            if missing:
                raise InputError(f"WORLD_SIZE is set but {', '.join(missing)} is not: launch with torchrun "
                                 "(or set the rendezvous variables, see infra/README.md)")
            try:
                dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
            except Exception as error:  # rendezvous failures surface as assorted exception types
                raise ComputationError(f"could not join the {backend} process group: {error}") from None
        team = cls(dist.get_rank(), dist.get_world_size(), backend, timeout_s)
        team.neuron_cores = neuron_cores  # NEURON_RT_VISIBLE_CORES of this rank (Trainium hardware)
        return team

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def _run(self, what, operation, *args, **kwargs):
        try:
            return operation(*args, **kwargs)
        except Exception as error:
            raise ComputationError(f"rank {self.rank}/{self.size}: {what} failed; another rank stopped or "
                                   f"timed out ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None

    def broadcast_object(self, obj):
        """rank 0's `obj` on every rank (pickled)."""
        import torch.distributed as dist

        box = [obj if self.is_root else None]
        self._run("broadcast", dist.broadcast_object_list, box, src=0)
        return box[0]

    def barrier(self):
        """Wait until every rank has reached this point."""
        import torch.distributed as dist

        self._run("barrier", dist.barrier)

    def on_root(self, work):
        """work() run by rank 0 alone; its value on every rank. An error it raises is raised on
        every rank (an InputError/ComputationError as itself, anything else as a
        ComputationError naming it; rank 0 raises the original): rank 0 decides, e.g. over a
        checkpoint, for all, and no rank waits for an answer that will not come."""
        if self.is_root:
            try:
                value = work()
            except Exception as error:
                kind = type(error).__name__ if isinstance(error, (InputError, ComputationError)) else None
                self.broadcast_object(("error", kind, str(error) if kind else
                                       f"rank 0 failed: {type(error).__name__}: {error}"))
                raise
            self.broadcast_object(("value", value))
            return value
        outcome = self.broadcast_object(None)
        if outcome[0] == "error":
            error = InputError(outcome[2]) if outcome[1] == "InputError" else ComputationError(outcome[2])
            error.reported_by_rank0 = True  # the CLI prints it on rank 0 only
            raise error
        return outcome[1]

    def agree(self, ok: bool, message: str):
        """Raise InputError(message) on every rank unless `ok` holds on every rank (printed by
        rank 0 alone)."""
        if self.all_reduce_sum(np.array([0.0 if ok else 1.0]))[0]:
            error = InputError(message)
            error.reported_by_rank0 = not self.is_root
            raise error

    def gather_objects(self, obj) -> list | None:
        """[obj of rank 0, ..., obj of rank N-1] on rank 0; None elsewhere."""
        import torch.distributed as dist

        if self.backend == "nccl":  # gather_object is not supported by NCCL
            everything = [None] * self.size
            self._run("all_gather_object", dist.all_gather_object, everything, obj)
            return everything if self.is_root else None
        box = [None] * self.size if self.is_root else None
        self._run("gather_object", dist.gather_object, obj, box, dst=0)
        return box

    def all_reduce_sum(self, array: np.ndarray) -> np.ndarray:
        """The elementwise fp64 sum of `array` over the ranks."""
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64)).to(self._device())
        self._run("all_reduce", dist.all_reduce, tensor, op=dist.ReduceOp.SUM)
        return tensor.cpu().numpy()

    def broadcast(self, tensor, src: int):
        """Rank src's `tensor` into `tensor` on every rank (same shape and dtype there; in place
        on the receivers, which give contiguous buffers). Returns the tensor broadcast."""
        import torch.distributed as dist

        nbytes = tensor.numel() * tensor.element_size()
        if self.rank == src:
            tensor = tensor.contiguous()  # the wire carries storage order: a strided view would arrive permuted
            self.bytes_sent += nbytes * (self.size - 1)
        else:
            self.bytes_received += nbytes
        self._run("broadcast", dist.broadcast, tensor, src=src)
        return tensor

    def swap(self, send, dst, recv, src):
        """Send `send` to rank dst while receiving into `recv` from rank src (either may be None),
        as one batch (NCCL would deadlock on a blocking receive from the rank it sends to)."""
        import torch.distributed as dist

        operations = []
        if send is not None:
            send = send.contiguous()
            operations.append(dist.P2POp(dist.isend, send, dst))
            self.bytes_sent += send.numel() * send.element_size()
        if recv is not None:
            operations.append(dist.P2POp(dist.irecv, recv, src))
            self.bytes_received += recv.numel() * recv.element_size()
        if operations:
            for request in self._run("send/receive", dist.batch_isend_irecv, operations):
                self._run("send/receive", request.wait)

    def _device(self):
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def close(self):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- who owns what

def aux_shares(aux_blocks: list, size: int) -> list:
    """Split the auxiliary blocks [(p0, p1)] into `size` contiguous runs of about equal width:
    [[(p0, p1), ...] of rank 0, ...]."""
    naux = aux_blocks[-1][1]
    shares = [[] for _ in range(size)]
    for p0, p1 in aux_blocks:
        shares[min(size - 1, (p0 + p1) // 2 * size // naux)].append((p0, p1))
    return shares


def block_owners(nblocks: list, size: int) -> list:
    """Owner rank of each occupied block of each spin channel ([[rank of block b] per channel]):
    the owner of block I computes its pair tasks, I against every J <= I of its channel (I + 1
    tasks) and, for the alpha channel of an unrestricted reference, against every beta block.
    Blocks are dealt largest work first to the least loaded rank (ties: lowest rank)."""
    work = []
    for s, n in enumerate(nblocks):
        cross = nblocks[1] if s == 0 and len(nblocks) == 2 else 0
        work += [(b + 1 + cross, s, b) for b in range(n)]
    owners = [[0] * n for n in nblocks]
    load = [0] * size
    for weight, s, b in sorted(work, key=lambda item: (-item[0], item[1], item[2])):
        rank = min(range(size), key=lambda r: (load[r], r))
        owners[s][b] = rank
        load[rank] += weight
    return owners


# ----------------------------------------------------------------------------- moving B

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
    "memory"), or in a scratch files.RowFile (storage "disk", up to `capacity` rows: each
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
            self._file = RowFile((self.capacity, nvir * ncols), self.scratch, prefix="dfmp2-rank-", dtype=host.dtype)
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


# ----------------------------------------------------------------------------- B over the ranks

class RankThreeCenter:
    """The ThreeCenterProvider of a team (`dfmp2.providers`): rows[s] (RankBlocks) = {b: B of
    occupied block b of channel s} for the blocks this rank owns (`block_owners`), in memory or
    on disk as the plan says; the pair tasks (I, J) are computed by the owner of I while the B_J
    blocks travel around the ring, one rank's blocks per step (`pass_blocks`; on disk through
    two scratch files a visiting set alternates between); each task's fp64 sums are
    all-reduced (`combine`)."""

    def __init__(self, backend, team, channels, blocks, owners, occ_block, staging, shares, storage="memory",
                 scratch=None):
        self.backend, self.team, self.channels = backend, team, channels
        self.blocks, self.owners, self.occ_block, self.staging = blocks, owners, occ_block, staging
        self.storage, self.scratch = storage, scratch
        self.layout = {"ranks": team.size, "occ_block": occ_block}  # what B and the journals depend on
        self.aux_functions = sum(p1 - p0 for p0, p1 in shares[team.rank])
        self.rows, self.nkept, self.metric_label, self.reused = None, 0, "", False
        self.pair_seconds, self.ntasks_mine = 0.0, 0
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
        team, size, rank, occ_block = self.team, self.team.size, self.team.rank, self.occ_block
        todo, mine, start = set(todo), self.owned(tasks), time.perf_counter()
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
        self.pair_seconds = time.perf_counter() - start

    def combine(self, sums):
        return self.team.all_reduce_sum(sums)  # every task's sums, each from exactly one rank

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
    """How `steps.mp2_densities` reaches B over the ranks (the schedule `steps.LocalDensities` is
    in one process), in lockstep rounds: in each round every rank takes one of its own occupied
    blocks as the k block (or none, once it has used them all), and the blocks of every i are
    broadcast by their owners, in order, to every rank; P and Gbar are summed over the ranks
    (combine); each rank fits the G rows of its own blocks (held), and `gather_on_root` brings
    them to rank 0, where the gradient runs. B crosses the wire once per round."""

    def __init__(self, provider: RankThreeCenter):
        self.provider = provider
        self.team = provider.team

    def _mine(self, s) -> list:
        return [b for b, owner in enumerate(self.provider.owners[s]) if owner == self.team.rank]

    def k_blocks(self, other) -> list:
        owners = self.provider.owners[other]
        rounds = max(sum(1 for owner in owners if owner == q) for q in range(self.team.size))
        mine = [self.provider.blocks[other][b] for b in self._mine(other)]
        return mine + [None] * (rounds - len(mine))

    def held(self, s) -> list:
        return [self.provider.blocks[s][b] for b in self._mine(s)]

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


