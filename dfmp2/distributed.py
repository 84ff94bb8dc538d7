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
from dataclasses import replace
from datetime import timedelta

import numpy as np

from .errors import ComputationError, InputError, option
from .memory import MB, peak_resident_bytes, release_freed_memory
from .steps import block_ranges, factor_metric, transform_aux_blocks, whiten_three_center
from .storage import MemoryStore

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
                      staging: Staging) -> dict:
    """The all-to-all of step 3: this rank's transform output `columns` [nocc, nvir, its P]
    (auxiliary columns column_ranges[rank]) -> {b: [rows of block b, nvir, naux]} for the
    occupied blocks b it owns, every P, gathered from all ranks."""
    import torch

    mine = [b for b, owner in enumerate(owners) if owner == team.rank]
    nrows = [sum(blocks[b][1] - blocks[b][0] for b, owner in enumerate(owners) if owner == q)
             for q in range(team.size)]
    nvir = columns.shape[1]
    device = staging.wire_device(columns.device)
    full = torch.empty((nrows[team.rank], nvir, naux), dtype=columns.dtype, device=device)

    def rows_of(q):  # my columns of rank q's blocks, stacked
        parts = [staging.to_wire(columns[blocks[b][0]:blocks[b][1]]) for b, owner in enumerate(owners) if owner == q]
        return torch.cat(parts) if parts else None

    c0, c1 = column_ranges[team.rank]
    if nrows[team.rank]:
        full[:, :, c0:c1] = rows_of(team.rank)
    for k in range(1, team.size):
        dst, src = (team.rank + k) % team.size, (team.rank - k) % team.size
        send = rows_of(dst) if nrows[dst] and c1 > c0 else None
        s0, s1 = column_ranges[src]
        recv = (torch.empty((nrows[team.rank], nvir, s1 - s0), dtype=columns.dtype, device=device)
                if nrows[team.rank] and s1 > s0 else None)
        team.swap(send, dst, recv, src)
        if recv is not None:
            full[:, :, s0:s1] = recv
        del send, recv
    out, row = {}, 0
    for b in mine:
        n = blocks[b][1] - blocks[b][0]
        out[b] = staging.from_wire(full[row:row + n])
        row += n
    return out


def pass_blocks(team: Team, visiting: dict, arriving: list, shape_of, dtype, device, staging: Staging) -> dict:
    """One ring step: send the blocks `visiting` {b: tensor} to rank + 1 while receiving the
    blocks `arriving` [b] (shape_of(b), on `device`) from rank - 1, one block at a time (each
    sent block is dropped once it has left)."""
    import torch

    sending = sorted(visiting)
    received = {}
    wire_device = staging.wire_device(device)
    for n in range(max(len(sending), len(arriving))):
        send = staging.to_wire(visiting.pop(sending[n])) if n < len(sending) else None
        recv = None
        if n < len(arriving):
            recv = torch.empty(shape_of(arriving[n]), dtype=dtype, device=wire_device)
        team.swap(send, (team.rank + 1) % team.size, recv, (team.rank - 1) % team.size)
        if recv is not None:
            received[arriving[n]] = staging.from_wire(recv)
    return received


# ----------------------------------------------------------------------------- B over the ranks

class RankThreeCenter:
    """The ThreeCenterProvider of a team (`dfmp2.providers`): rows[s] = {b: B of occupied block
    b of channel s} for the blocks this rank owns (`block_owners`); the pair tasks (I, J) are
    computed by the owner of I while the B_J blocks travel around the ring, one rank's blocks
    per step (`pass_blocks`); each task's fp64 sums are all-reduced (`combine`)."""

    def __init__(self, backend, team, channels, blocks, owners, occ_block, staging, shares):
        self.backend, self.team, self.channels = backend, team, channels
        self.blocks, self.owners, self.occ_block, self.staging = blocks, owners, occ_block, staging
        self.layout = {"ranks": team.size, "occ_block": occ_block}  # what B and the journals depend on
        self.aux_functions = sum(p1 - p0 for p0, p1 in shares[team.rank])
        self.rows, self.nkept, self.metric_label, self.reused = None, 0, "", False
        self.pair_seconds, self.ntasks_mine = 0.0, 0

    def owned(self, tasks) -> list:
        return [k for k, task in enumerate(tasks) if self.owners[task.s][task.i0 // self.occ_block] == self.team.rank]

    def pair_blocks(self, tasks, todo):
        """(k, task, B_I, B_J) of this rank's tasks `todo`, by channel pair and ring step: at step
        k the blocks of rank (rank - k) visit. Every rank takes every step (the ring moves
        whatever is left to compute)."""
        team, size, rank, occ_block = self.team, self.team.size, self.team.rank, self.occ_block
        todo, mine, start = set(todo), self.owned(tasks), time.perf_counter()
        self.ntasks_mine = len(mine)
        b_dtype = self.backend.zeros((1,)).dtype
        for s, t in dict.fromkeys((task.s, task.t) for task in tasks):  # channel pairs, canonical order
            visiting = dict(self.rows[t])
            for step in range(size):
                source = (rank - step) % size
                if step:
                    arriving = [b for b, owner in enumerate(self.owners[t]) if owner == source]
                    visiting = pass_blocks(team, visiting, arriving, lambda b: (
                        self.blocks[t][b][1] - self.blocks[t][b][0], self.channels[t].nvir, self.nkept),
                        b_dtype, self.channels[t].e_vir.device, self.staging)
                for k in mine:
                    task = tasks[k]
                    j = task.j0 // occ_block
                    if (task.s, task.t) != (s, t) or self.owners[t][j] != source or k not in todo:
                        continue
                    b_i = self.rows[s][task.i0 // occ_block]
                    yield k, task, b_i, b_i if task.diagonal else visiting[j]
            visiting = None
        self.pair_seconds = time.perf_counter() - start

    def combine(self, sums):
        return self.team.all_reduce_sum(sums)  # every task's sums, each from exactly one rank

    def summary(self) -> dict:
        """Scratch traffic (none: B stays in memory) and, on rank 0, every rank's record."""
        team = self.team
        mine = {"rank": team.rank, "pair_tasks": self.ntasks_mine,
                "occ_block": self.occ_block, "pair_seconds": self.pair_seconds,
                "occupied_blocks": [sum(1 for o in owner if o == team.rank) for owner in self.owners],
                "aux_functions": self.aux_functions, "bytes_sent": team.bytes_sent,
                "bytes_received": team.bytes_received, "staged_through_host": self.staging.staged,
                "neuron_cores": team.neuron_cores, "peak_rss_mb": peak_resident_bytes() / MB,
                "kernels": dict(self.backend.calls)}
        per_rank = team.gather_objects(mine)
        return {"io": {"bytes_written": 0, "bytes_read": 0},
                "distributed": {"ranks": team.size, "backend": team.backend, "per_rank": per_rank}}

    def close(self):
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
                self.team.broadcast(p.staging.to_wire(p.rows[s][b]), owner)
                yield p.rows[s][b]
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


def three_center_over_ranks(backend, integrals, metric, channels, plan, team, checkpoint, context):
    """Steps 1-3 split over the ranks (module docstring): every rank factors the metric,
    transforms its share of the auxiliary blocks, receives its occupied blocks with every P
    (the all-to-all) and whitens them; or takes them from the checkpoint of an earlier run of
    the same layout. Returns the RankThreeCenter holding this rank's blocks."""
    naux, size, rank = metric.shape[0], team.size, team.rank
    # blocks small enough to give every rank a share: >= 1 auxiliary block and ~4 occupied blocks
    shares = aux_shares(integrals.aux_blocks(min(plan.aux_block, -(-naux // size))), size)
    backend.prepare(replace(plan, aux_block=max(p1 - p0 for share in shares for p0, p1 in share)))
    occ_block = min(plan.occ_block, max(1, -(-max(ch.nocc for ch in channels) // (4 * size))))
    column_ranges = [(share[0][0], share[-1][1]) if share else (0, 0) for share in shares]
    blocks = [block_ranges(ch.nocc, occ_block) for ch in channels]
    owners = block_owners([len(b) for b in blocks], size)
    provider = RankThreeCenter(backend, team, channels, blocks, owners, occ_block, Staging(backend, team), shares)
    held = checkpoint.held_rows(provider.layout, blocks, owners, channels)
    if held is not None:  # B of this layout, kept by an earlier run (every rank's)
        rows, provider.nkept, provider.metric_label = held
        provider.rows = [{b: backend.to_device(block) for b, block in channel_rows.items()} for channel_rows in rows]
        provider.reused = True
        return provider
    with context.timer.step("metric"):
        factor = factor_metric(backend, metric)  # 1. J = L L^T, on every rank
    c0, c1 = column_ranges[rank]
    columns = [MemoryStore(backend, (ch.nocc, ch.nvir, c1 - c0)) for ch in channels]  # this rank's P
    transform_aux_blocks(backend, integrals, shares[rank], channels, columns, context.timer, context.report,
                         first=c0)  # 2. (ia|P) = C_mi C_na (mn|P)
    with context.timer.step("whiten"):
        provider.rows = []
        for s, ch in enumerate(channels):  # the all-to-all, then 3. B = (ia|P) L^-T on my rows
            mine = rows_from_columns(team, columns[s].data, blocks[s], owners[s], column_ranges, naux,
                                     provider.staging)
            columns[s].close()
            provider.rows.append({b: whiten_three_center(backend, factor, block) for b, block in mine.items()})
            release_freed_memory()
        provider.nkept, provider.metric_label = factor.nkept, factor.describe()
        checkpoint.keep_rows(channels, provider.rows, provider.nkept, provider.metric_label, provider.layout,
                             backend.to_host)
    return provider
