"""The run context: what a run uses beside its Settings, built once at an entry point (the CLI,
the plugin, the bench, or a caller of the driver) and handed down.

    context = RunContext(team=Team.join(...), progress=show)
    result = run_xyz("water.xyz", settings, context)

Settings say what a run is asked to do (and belong to its checkpoint); the context holds the
companions that do not: the ranks of a distributed run, the progress callback and the timer.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable

from ..util.clock import clock  # noqa: F401 (dfmp2's one clock; re-exported: run.context.clock)


@dataclass
class Lap:
    """The wall seconds of one timed stretch (`Timer.lap`), set when it ends."""

    seconds: float = 0.0


@dataclass
class Timer:
    """Seconds spent per named step (PySCF's log.timer habit), the one clock of dfmp2's timings:
    `with timer.step("transform"): ...` adds the step's wall time to timings[name], after
    `synchronize()` (a device backend's queue drained, so that the time is the step's and not
    the next one's); `with timer.lap() as lap: ...` measures a stretch for a record of its own
    (lap.seconds) without naming a step. Laps hold no state in the timer: threads may take them."""

    timings: dict = field(default_factory=dict)
    synchronize: Callable[[], None] = lambda: None

    @contextmanager
    def lap(self):
        lap, start = Lap(), clock()
        try:
            yield lap
        finally:
            self.synchronize()
            lap.seconds = clock() - start

    @contextmanager
    def step(self, name: str, out_of: str | None = None):
        """out_of: the step this one runs inside, whose time it is taken from (B whitened slab
        by slab inside the pair stage is "whiten", not "pair_energies")."""
        try:
            with self.lap() as lap:
                yield lap
        finally:
            self.add(name, lap.seconds)
            if out_of is not None:
                self.add(out_of, -lap.seconds)

    def add(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    def synchronized_with(self, synchronize: Callable[[], None]) -> "Timer":
        """A timer that adds to the same timings and drains `synchronize` (a backend's queue) at the
        end of each step; this one is left as it is."""
        return replace(self, synchronize=synchronize)


@dataclass
class RunContext:
    """team: a dfmp2.run.ranks.Team of several ranks, or None for one process (a team of one
    rank is one process: it is dropped here, the one place that decides it); progress(step,
    done, total): a callback for long steps, or None; timer: the run's `Timer`; agreed: parts
    {part: {aspect: value}} the caller adds to the digest its team agrees on before any work
    (`dfmp2.api.agreement`; the CLI: the file's fragments). One context per run: its timer adds
    up every step it times (a result's timings are the run's)."""

    team: object = None
    progress: Callable[[str, int, int], None] | None = None
    timer: Timer = field(default_factory=Timer)
    agreed: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.team is not None and self.team.size <= 1:
            self.team = None

    @property
    def ranks(self) -> int:
        return 1 if self.team is None else self.team.size

    def agreeing(self):
        """Within: the run whose team agrees on it before any work (`run.ranks.Team.agreeing`: an
        error this rank raises first is sent to the others); nothing to do in one process."""
        return nullcontext() if self.team is None else self.team.agreeing()

    def report(self, step: str, done: int, total: int) -> None:
        """Tell the progress callback (if any) that `done` of `total` parts of `step` are done."""
        if self.progress is not None:
            self.progress(step, done, total)


def context_from(context: RunContext | None) -> RunContext:
    """`context`, or a fresh one-process context."""
    return context if context is not None else RunContext()
