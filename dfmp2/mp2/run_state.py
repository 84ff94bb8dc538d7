"""The per-run state of one DF-MP2 energy (`CorrelationRun`): what every step of
`pipeline.correlation_energy` shares, made once after the plan and the metric factor, and
handed whole to the B provider (`b.provider.b_provider`) and the stages in place of their
long argument lists."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CorrelationRun:
    """One run's state, built once (`pipeline.correlation_energy`; steps 1-3 alone:
    `b.provider.ovL_of_orbitals`). Frozen: a step that needs another value makes its own
    (`dataclasses.replace`), as `b.provider.b_over_ranks` does for its plan's aux_block.

    backend        the device's kernels, precision and counters (the one thing the steps drive)
    integrals      the IntegralProvider (`dfmp2.run.providers`): (mn|P) blocks, the metric, naux, nao
    selected       [(occ_index, vir_index, nfrozen)] per spin channel (`orbitals.active_spaces`)
    channels       the SpinChannel of each spin channel on the device (`orbitals.device_channels`)
    plan           the MemoryPlan (`dfmp2.run.memory`): B in memory or on disk, block sizes (orbitals, P)
    settings       the run's Settings (`dfmp2.run.settings`): frozen, scratch, with_rdm1, ...
    context        the RunContext (`dfmp2.run.context`): team (None: one process), progress, timer
    checkpoint     the open checkpoint policy (`dfmp2.run.checkpoint`; NoCheckpoint without one)
    metric_factor  the run's `b.provider.MetricFactorOnce` (step 1, J = L L^T, made at most once)
    given          B given by the caller per spin channel ([nocc * nvir, naux], PySCF's ovL), or None
    notes          the plan's announcements (`pipeline.plan_run`: t2 not kept, a budget above a limit)
    keep_t2        whether the pair stage keeps t2 [nocc, nocc, nvir, nvir] (fp64, host)
    """

    backend: object
    integrals: object
    selected: list
    channels: list
    plan: object
    settings: object
    context: object
    checkpoint: object
    metric_factor: object
    given: object = None
    notes: tuple = ()
    keep_t2: bool = False
