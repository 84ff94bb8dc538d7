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
keeps its own B blocks and pair journal there (dfmp2.run.checkpoint).
Collectives time out after `timeout` seconds and any failure of a collective becomes a
ComputationError that says what happened (`collective_failure`): a time-out, another rank's
death (a dead process closes its connections), or the error torch.distributed raised (a
mismatched collective, an NCCL error), chained to it. No rank hangs.
Before any work (the first collective of a run) the ranks compare their digests of it
(`Team.agree_on`; `dfmp2.api.agreement.run_digest`), and a rank that failed before tells the
others why (`Team.fail`): a mismatch or one rank's bad input stops every rank with one line, exit
2, not a wrong energy, a shape error or gloo's abort. The team takes the tightest rank's memory
plan (`Team.tightest_plan`).
"""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager
from datetime import timedelta

import numpy as np

from ..kernels import collective_backend, runs_nki
from ..util import environment
from ..util.errors import ComputationError, DFMP2Error, InputError, option
from ..util.files import one_line

DEFAULT_TIMEOUT_S = 1800  # a collective waits this long (the SCF on rank 0 included)


def launched_ranks() -> int:
    """WORLD_SIZE of a torchrun/srun launch (1 when not launched as several processes)."""
    return environment.whole_number("WORLD_SIZE", 1)


def pin_neuron_core() -> str | None:
    """Give this rank its own NeuronCore: NEURON_RT_VISIBLE_CORES = LOCAL_RANK unless the launch
    set it (the Neuron runtime otherwise reserves every core for the first process). Must run
    before the runtime starts (before the NKI backend makes its device). Returns the value."""
    environment.set_default("NEURON_RT_VISIBLE_CORES", environment.get("LOCAL_RANK", "0"))
    return environment.get("NEURON_RT_VISIBLE_CORES")


# how torch.distributed's engines word a time-out (gloo: "Timed out waiting 2000ms for recv operation", NCCL's
# watchdog: "collective operation timeout", the store: "Timed out after 1801 seconds") and the loss of a peer (gloo:
# "Connection closed by peer", "Connection reset by peer"; NCCL: "remote process exited")
_TIMED_OUT = re.compile(r"\btime[sd]? ?out\b", re.IGNORECASE)
_PEER_LOST = ("closed by peer", "reset by peer", "broken pipe", "remote process exited")


def _cause(error: BaseException) -> str:
    """'RuntimeError: its first line' (without gloo's [source:line] prefix; at most 300 characters)."""
    lines = str(error).strip().splitlines()
    text = re.sub(r"^\[[^\]]*[/\\][^\]]*:\d+\]\s*", "", lines[0] if lines else "")
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def collective_failure(error: BaseException, rank: int, size: int, what: str, timeout_s: float) -> str:
    """The one-line message of collective `what` that raised `error` on `rank` of `size`: a time-out
    (after the team's `timeout_s`), another rank's death (its connection closed), or anything else (a
    collective the ranks called with different shapes or dtypes, an NCCL error), each naming the cause."""
    where = f"rank {rank}/{size}: {what}"
    if isinstance(error, TimeoutError) or _TIMED_OUT.search(str(error)):
        return (f"{where} timed out after {timeout_s:g} s ({option('rank_timeout')}): another rank stopped, "
                f"hangs or is still working ({_cause(error)})")
    if any(marker in str(error).lower() for marker in _PEER_LOST):
        return f"{where} failed: another rank stopped (its connection closed: {_cause(error)})"
    return f"{where} failed: {_cause(error)}"


class Staging:
    """How blocks cross ranks. NCCL and CPU tensors go as they are; with gloo, the blocks of a
    device backend (NeuronCores, or the emulator, where it is modelled) go through host memory:
    to_wire before a send (backend.to_host: a counted device -> host transfer), from_wire after
    a receive (backend.to_device)."""

    def __init__(self, backend, team):
        self.backend = backend
        self.staged = team.backend == "gloo" and not backend.on_host

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


def fail_unjoined(error: Exception, device: str, simulate: bool, timeout_s: float) -> None:
    """Where this process is a rank of a launch and `error` stopped it before it joined its team
    (a file or an option only this rank has wrong): join the team, tell the others why and leave
    (`Team.fail`, which raises), so that they do not wait at the rendezvous for `timeout_s`.
    Nothing where it runs alone, has tried to join its team already (Team.fail tells the others;
    or the rendezvous itself failed: a second try would wait as long again) or cannot join it (the
    error stands as it is)."""
    try:
        team = Team.join(device, simulate, timeout_s) if launched_ranks() > 1 and not _JOIN_TRIED else None
    except Exception:
        return
    if team is not None:
        try:
            team.fail(error)
        finally:
            team.close()


_JOIN_TRIED = []  # set by `Team.join`: this process has tried to join its team (once is enough)


class Team:
    """The ranks of one run. rank 0 prints and writes the results."""

    def __init__(self, rank: int, size: int, backend: str, timeout_s: float):
        self.rank, self.size, self.backend, self.timeout_s = rank, size, backend, timeout_s
        self.bytes_sent = 0
        self.bytes_received = 0
        self.neuron_cores = None
        self.agreement_pending = True  # until the ranks have agreed on the run (`agree_on`)

    @classmethod
    def join(cls, device: str, simulate: bool, timeout_s: float = DEFAULT_TIMEOUT_S) -> Team:
        """Join the process group torchrun (or srun with MASTER_ADDR/PORT, RANK, WORLD_SIZE)
        describes."""
        import torch
        import torch.distributed as dist

        _JOIN_TRIED.append(device)
        backend = collective_backend(device)
        neuron_cores = pin_neuron_core() if runs_nki(device) and not simulate else None
        if backend == "nccl":
            if not dist.is_nccl_available():
                raise ComputationError(f"{option('device', 'cuda')} with several ranks needs NCCL, which this torch lacks")
            torch.cuda.set_device(environment.whole_number("LOCAL_RANK", 0))
        if not dist.is_initialized():
            missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not environment.is_set(name)]
            if missing:
                raise InputError(f"WORLD_SIZE is set but {', '.join(missing)} is not: launch with torchrun "
                                 "(or set the rendezvous variables, see infra/README.md)")
            try:
                dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
            except Exception as error:  # rendezvous failures surface as assorted exception types
                raise ComputationError(f"could not join the {backend} process group: {type(error).__name__}: {error}") from error
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
            raise ComputationError(collective_failure(error, self.rank, self.size, what, self.timeout_s)) from error

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

    @contextmanager
    def agreeing(self):
        """Around one run on this team: `agree_on` within it is the run's first collective, and an
        error this rank raises before it is sent to the other ranks in its place (`fail`)."""
        self.agreement_pending = True
        try:
            yield
        except Exception as error:
            self.fail(error)

    def agree_on(self, digest: dict) -> None:
        """Compare this rank's `digest` of its run ({part: {aspect: value}}, `api.agreement.run_digest`;
        the collective backend added) with every other rank's, before any work: InputError on every
        rank (printed by rank 0 alone) naming what differs, e.g. "rank 1's molecule differs from rank
        0's (geometry)"; where a rank failed before the agreement (`fail`), its error on every rank."""
        self.agreement_pending = False
        digest = {**digest, "backend": {**digest.get("backend", {}), "collectives": self.backend}}
        outcomes = self.all_gather_objects(("digest", fingerprints(digest)), AGREEMENT)
        error = disagreement(outcomes)
        if error is not None:
            error.reported_by_rank0 = not self.is_root
            raise error

    def fail(self, error: Exception):
        """Raise `error` (in an `except` block), having told the other ranks, waiting in `agree_on`,
        that this rank failed before the team agreed on its run: rank 0 then says why for every rank,
        so on another rank a DFMP2Error is raised as a copy marked reported_by_rank0 (the CLI prints
        nothing more). Once the team has agreed, only the raise: a later failure reaches the others
        through the collectives they wait in (`collective_failure`)."""
        if not self.agreement_pending:
            raise error
        self.agreement_pending = False
        kind = "InputError" if isinstance(error, InputError) else type(error).__name__
        try:
            self.all_gather_objects(("failed", kind, one_line(str(error)) or type(error).__name__), AGREEMENT)
            told = True
        except ComputationError:
            told = False  # the others are gone already: this rank's own error is the one to report
        if not told or self.is_root or not isinstance(error, DFMP2Error):
            raise error
        try:
            reported = type(error)(str(error))
        except TypeError:
            reported = (InputError if isinstance(error, InputError) else ComputationError)(str(error))
        reported.reported_by_rank0 = True
        raise reported from error

    def tightest_plan(self, plan):
        """The memory plan (run.memory.MemoryPlan) of the rank with the least room (its budget less its
        baseline; ties: the lowest rank), on every rank: each rank plans its blocks from its own
        budget (--max-memory, its node's limits), and the block sizes the collectives carry must be
        one for the team, small enough for every rank's budget."""
        from dataclasses import replace

        plans = self.all_gather_objects(plan)
        rank = min(range(self.size), key=lambda r: (plans[r].budget - plans[r].baseline, r))
        chosen = plans[rank]
        return chosen if rank == 0 else replace(chosen, budget_source=f"{chosen.budget_source}, rank {rank}'s")

    def all_gather_objects(self, obj, what: str = "all_gather_object") -> list:
        """[obj of rank 0, ..., obj of rank N-1] on every rank (pickled; any sizes); what: the
        collective's name in a failure's message."""
        import torch.distributed as dist

        everything = [None] * self.size
        self._run(what, dist.all_gather_object, everything, obj)
        return everything

    def gather_objects(self, obj) -> list | None:
        """[obj of rank 0, ..., obj of rank N-1] on rank 0; None elsewhere."""
        import torch.distributed as dist

        if self.backend == "nccl":  # gather_object is not supported by NCCL
            everything = self.all_gather_objects(obj)
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


# ----------------------------------------------------------------------------- what the ranks agree on

AGREEMENT = "the ranks' agreement on the run"  # (its collective, as a failure names it)
# parts of a digest named in the plural ("rank 1's settings differ"); SIZES, derived from the others,
# is named only where nothing else differs (a different basis also changes the sizes)
PLURAL_PARTS = ("basis sets", "settings", "sizes")
SIZES = "sizes"


def fingerprints(digest: dict) -> dict:
    """{part: {aspect: sha-256 of the value's repr}}: what a rank sends of its digest (exact:
    coordinates equal to the last bit; a few bytes per aspect whatever the molecule's size)."""
    return {part: {aspect: hashlib.sha256(repr(value).encode()).hexdigest()[:24]
                   for aspect, value in aspects.items()} for part, aspects in digest.items()}


def differences(ours: dict, theirs: dict) -> dict:
    """{part: [aspects]} where the fingerprints `theirs` differ from `ours` (one missing on either side too)."""
    found = {}
    for part in list(ours) + [p for p in theirs if p not in ours]:
        mine, other = ours.get(part, {}), theirs.get(part, {})
        aspects = [a for a in list(mine) + [a for a in other if a not in mine] if mine.get(a) != other.get(a)]
        if aspects:
            found[part] = aspects
    if len(found) > 1:
        found.pop(SIZES, None)
    return found


def disagreement(outcomes: list) -> DFMP2Error | None:
    """The error every rank raises after `Team.agree_on` gathered `outcomes` (per rank: ("digest",
    fingerprints) or ("failed", kind, message)), or None where every rank agrees with rank 0."""
    failed = [(rank, outcome) for rank, outcome in enumerate(outcomes) if outcome[0] == "failed"]
    if failed:
        rank, (_, kind, message) = failed[0]
        more = f" (and {len(failed) - 1} more rank{'s' * (len(failed) > 2)})" if len(failed) > 1 else ""
        if kind == "InputError":
            return InputError(f"rank {rank}: {message}{more}")
        return ComputationError(f"rank {rank} failed before the ranks agreed on the run: {kind}: {message}{more}")
    found = [(rank, differences(outcomes[0][1], outcome[1])) for rank, outcome in enumerate(outcomes)][1:]
    found = [(rank, parts) for rank, parts in found if parts]
    if not found:
        return None
    said = "; ".join(_difference_line(rank, parts) for rank, parts in found[:3])
    more = f"; and {len(found) - 3} more ranks" if len(found) > 3 else ""
    return InputError(f"{said}{more}: every rank must be started with the same molecule, basis and settings")


def _difference_line(rank: int, parts: dict) -> str:
    """"rank 1's molecule differs from rank 0's (geometry)", or several parts in one clause."""
    def shown(part):
        return ", ".join(option(a) if part == "settings" else a for a in parts[part])

    if len(parts) == 1:
        part = next(iter(parts))
        return f"rank {rank}'s {part} {'differ' if part in PLURAL_PARTS else 'differs'} from rank 0's ({shown(part)})"
    named = [f"{part} ({shown(part)})" for part in parts]
    return f"rank {rank}'s {', '.join(named[:-1])} and {named[-1]} differ from rank 0's"


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
